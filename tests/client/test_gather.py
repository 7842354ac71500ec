"""``read_handle._gather`` (the merge of striped read answers) returns exactly
what ``Table.take`` returns, on both of its paths: a table of row slices for
windows of few (large) entries, take for many."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings, strategies as st

from pybk_spark.ledger import read_handle
from pybk_spark.wire.entries import cumulative_lengths, make_batch, one_batch


@given(sizes=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=st.integers(0, 2**32 - 1),
       many=st.booleans())
@settings(max_examples=100, deadline=None)
def test_gather_equals_take(sizes, seed, many):
    rng = np.random.default_rng(seed)
    batches, base = [], 0
    for n in sizes:
        payloads = [rng.bytes(int(rng.integers(0, 50))) for _ in range(n)]
        batches.append(make_batch(3, range(base, base + n), [0] * n,
                                  cumulative_lengths(0, payloads), payloads, [b""] * n))
        base += n
    table = pa.Table.from_batches(batches)
    rows = rng.permutation(table.num_rows)[:int(rng.integers(1, table.num_rows + 1))]
    got = read_handle._gather(batches, table, rows, slice_max_rows=0 if many else 10**6)
    assert one_batch(got).equals(table.take(pa.array(rows)).combine_chunks().to_batches()[0])
    if not many:          # row slices of the answers, not yet copied
        assert isinstance(got, pa.Table) and got.num_rows == len(rows)
