"""The checkpoint's vectorised decode of lone adds gives the batch (and the
segment bytes) the one-record-at-a-time decode gives."""
import os
import random

import pytest

from bookie_server.storage import flush_slices
from pybk_spark.wire.entries import batch_to_bytes, entry_record_head, records_to_batch


@pytest.mark.parametrize("digest_sizes", [[4], [0], [0, 4, 20]])
def test_decode_matches_records_to_batch(digest_sizes):
    rng = random.Random(7)
    records = []
    for i in range(700):
        digest = os.urandom(rng.choice(digest_sizes))
        payload = os.urandom(rng.choice([0, 1, 1024, 5000]))
        rec = entry_record_head(7, i, i - 1, i * 3, digest) + payload
        records.append(rec if i % 3 else memoryview(b"xx" + rec)[2:])   # views as in frames
    for part in (records, records[:1], records[5:261]):
        got = flush_slices.decode(part)
        want = records_to_batch(part)
        assert got.equals(want)
        assert batch_to_bytes(got) == batch_to_bytes(want)


def test_in_slices_covers_every_item_once():
    items = list(range(1000))
    parts = list(flush_slices.in_slices(items, 256))
    assert [len(p) for p in parts] == [256, 256, 256, 232]
    assert [x for p in parts for x in p] == items
