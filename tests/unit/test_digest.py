"""Digests (pybk_spark/wire/digest.py): ``verify_batch`` hashes payloads where
they lie in the batch's Arrow buffer, and must agree row for row with the
per-entry ``one`` on bytes, for sliced batches (non-zero array offsets),
empty payloads and every digest type."""
from __future__ import annotations

import struct

import pyarrow as pa
import pytest
from hypothesis import given, settings, strategies as st

from pybk_spark.wire.digest import Digester, header_crcs, payload_views
from pybk_spark.wire.entries import (PayloadColumn, batch_to_bytes, column_ends, cumulative_lengths,
                                     make_batch)


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac", "none"])
@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=120),
       cut=st.integers(0, 40), corrupt=st.integers(0, 130))
@settings(max_examples=60, deadline=None)
def test_verify_batch_agrees_with_one_on_bytes(digest_type, payloads, cut, corrupt):
    d = Digester(digest_type, b"pw")
    n = len(payloads)
    ids, lacs = range(100, 100 + n), [99 + i for i in range(n)]
    lengths = cumulative_lengths(5000, payloads)
    digests = d.compute(7, ids, lacs, lengths, payloads)
    if digest_type != "none" and corrupt < n:          # one wrong digest: that row only fails
        digests[corrupt] = bytes(len(digests[corrupt]))
    batch = make_batch(7, ids, lacs, lengths, payloads, digests)
    cut = min(cut, n - 1)
    sliced = batch.slice(cut)                           # offsets no longer start at 0
    want = [d.one(7, 100 + i, 99 + i, lengths[i], payloads[i]) == digests[i]
            for i in range(cut, n)]
    assert d.verify_batch(sliced).tolist() == want
    # a table of single-row slices (read_handle._gather on striped reads)
    rows = pa.Table.from_batches([batch.slice(i, 1) for i in reversed(range(cut, n))])
    assert d.verify_batch(rows).tolist() == want[::-1]


@given(sizes=st.lists(st.integers(0, 2000), min_size=300, max_size=700), cut=st.integers(0, 30),
       fault=st.sampled_from(["none", "payload", "digest", "length", "two"]), data=st.data())
@settings(max_examples=40, deadline=None)
def test_a_large_batch_checked_with_one_crc_names_the_same_rows(sizes, cut, fault, data):
    """From ``_COMBINE_MIN_ROWS`` rows a batch is checked with one CRC over
    its payloads first, row by row only when that disagrees: the mask is the
    row-by-row one, whatever is damaged."""
    d = Digester("crc32c")
    payloads = [bytes([i % 251]) * s for i, s in enumerate(sizes)]
    n = len(payloads)
    lacs = [i - 1 for i in range(n)]
    lengths = cumulative_lengths(10, payloads)
    digests = d.compute(9, range(n), lacs, lengths, payloads)
    bad = data.draw(st.lists(st.integers(cut, n - 1), min_size=1, max_size=2 if fault == "two" else 1))
    for i in bad if fault != "none" else []:
        if fault in ("payload", "two") and payloads[i]:
            payloads[i] = bytes([payloads[i][0] ^ 1]) + payloads[i][1:]
        elif fault in ("digest", "two"):
            digests[i] = bytes([digests[i][0] ^ 0x80]) + digests[i][1:]
        elif fault == "length":
            lengths[i] += 1
    batch = make_batch(9, range(n), lacs, lengths, payloads, digests).slice(cut)
    want = [d.one(9, i, lacs[i], lengths[i], payloads[i]) == digests[i] for i in range(cut, n)]
    assert d.verify_batch(batch).tolist() == want


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac"])
def test_a_replica_with_the_wrong_length_fails_its_digest(digest_type):
    d = Digester(digest_type, b"pw")
    payloads = [b"a", b"bb", b"ccc"]
    lengths = cumulative_lengths(0, payloads)
    digests = d.compute(7, range(3), [-1, 0, 1], lengths, payloads)
    good = make_batch(7, range(3), [-1, 0, 1], lengths, payloads, digests)
    assert d.verify_batch(good).tolist() == [True, True, True]
    bad = make_batch(7, range(3), [-1, 0, 1], [1, 3, 7], payloads, digests)
    assert d.verify_batch(bad).tolist() == [True, True, False]


def test_payload_views_are_zero_copy_slices():
    arr = pa.array([b"abc", b"", b"defg", None], pa.binary()).slice(1)
    views = payload_views(arr)
    assert [bytes(v) for v in views] == [b"", b"defg", b""]
    assert isinstance(views[1], pa.Buffer)
    assert views[1].address == arr.buffers()[2].address + 3


@given(rows=st.lists(st.tuples(*[st.integers(-(1 << 63), (1 << 63) - 1)] * 4), max_size=30))
@settings(max_examples=80, deadline=None)
def test_header_crcs_match_the_packed_header(rows):
    """The batch-wide header hash (32 table gathers) equals hashing each packed
    header, negative and extreme values included."""
    import google_crc32c
    cols = list(zip(*rows)) if rows else [(), (), (), ()]
    want = [google_crc32c.value(struct.pack(">qqqq", *r)) for r in rows]
    assert header_crcs(*cols).tolist() == want


@given(bases=st.tuples(*[st.integers(-(1 << 63), (1 << 63) - 1 - (1 << 20))] * 4),
       steps=st.lists(st.tuples(*[st.integers(0, 1 << 20)] * 4), min_size=1, max_size=30))
@settings(max_examples=80, deadline=None)
def test_header_crcs_of_columns_in_narrow_ranges(bases, steps):
    """Rows whose columns share their high bytes (as in any one batch: one
    ledger, neighbouring ids, LACs and lengths; negative ranges and ranges
    across zero included) hash as each packed header does."""
    import google_crc32c
    rows = [tuple(b + s for b, s in zip(bases, st_)) for st_ in steps]
    want = [google_crc32c.value(struct.pack(">qqqq", *r)) for r in rows]
    assert header_crcs(*zip(*rows)).tolist() == want


def test_a_digest_of_another_size_never_matches_in_a_large_batch():
    d = Digester("crc32c")
    payloads = [bytes([i]) * 10 for i in range(100)]
    lengths = cumulative_lengths(0, payloads)
    digests = d.compute(7, range(100), range(-1, 99), lengths, payloads)
    digests[10] = digests[10] + b"\0"
    digests[20] = b""
    batch = make_batch(7, range(100), range(-1, 99), lengths, payloads, digests)
    assert d.verify_batch(batch).tolist() == [i not in (10, 20) for i in range(100)]


def test_a_digest_of_another_size_never_matches():
    d = Digester("crc32c")
    payloads = [b"a", b"bb", b"ccc"]
    lengths = cumulative_lengths(0, payloads)
    digests = d.compute(7, range(3), [-1, 0, 1], lengths, payloads)
    digests[1] = digests[1] + b"\0"
    digests[2] = b""
    batch = make_batch(7, range(3), [-1, 0, 1], lengths, payloads, digests)
    assert d.verify_batch(batch).tolist() == [True, False, False]


@pytest.mark.parametrize("n", [1, 63, 64, 65, 300])
def test_small_and_large_batches_hash_alike(n):
    """Below ``_BATCH_HASH_MIN_ROWS`` rows the batch is hashed row by row,
    from it on with the table gathers: both give the same mask."""
    d = Digester("crc32c")
    payloads = [bytes([i % 251]) * (i % 50) for i in range(n)]
    lengths = cumulative_lengths(0, payloads)
    digests = d.compute(3, range(n), [i - 1 for i in range(n)], lengths, payloads)
    digests[n // 2] = b"\0\0\0\0"
    batch = make_batch(3, range(n), [i - 1 for i in range(n)], lengths, payloads, digests)
    want = [i != n // 2 for i in range(n)]
    assert d.verify_batch(batch).tolist() == want
    assert d.verify_batch(pa.Table.from_batches([batch.slice(0, n // 2 + 1),
                                                 batch.slice(n // 2 + 1)])).tolist() == want


def test_a_table_of_large_chunks_is_hashed_chunk_by_chunk_without_a_copy():
    d = Digester("crc32c")
    n = 400
    payloads = [bytes([i % 251]) * 30 for i in range(n)]
    lengths = cumulative_lengths(0, payloads)
    digests = d.compute(3, range(n), [-1] * n, lengths, payloads)
    digests[250] = b"\0\0\0\0"
    batch = make_batch(3, range(n), [-1] * n, lengths, payloads, digests)
    table = pa.Table.from_batches([batch.slice(0, 200), batch.slice(200)])
    assert d.verify_batch(table).tolist() == [i != 250 for i in range(n)]


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac", "none"])
@given(payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=150),
       first=st.integers(0, 1 << 40), base=st.integers(0, 1 << 40))
@settings(max_examples=40, deadline=None)
def test_run_batch_is_the_batch_and_bytes_of_the_row_by_row_path(digest_type, payloads, first,
                                                                  base):
    """``run_batch`` builds a writer's batch from column buffers (and a long
    crc32c run's digests from column header CRCs): the same batch and IPC
    bytes as digests by ``compute`` and ``make_batch``, on both sides of
    the row count where the column hashing starts."""
    d = Digester(digest_type, b"pw")
    n = len(payloads)
    ids, lacs = range(first, first + n), [first - 1] * n
    lengths = cumulative_lengths(base, payloads)
    want = make_batch(7, ids, lacs, lengths, payloads, d.compute(7, ids, lacs, lengths, payloads))
    got = d.run_batch(7, first, first - 1, base, payloads)
    got.validate(full=True)
    assert got.equals(want)
    assert batch_to_bytes(got) == batch_to_bytes(want)
    assert d.verify_batch(got).all()


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac", "none"])
@given(payloads=st.lists(st.binary(max_size=200), min_size=1, max_size=150),
       skip=st.integers(0, 5), base=st.integers(0, 1 << 40))
@settings(max_examples=40, deadline=None)
def test_run_batch_of_a_binary_column_is_the_batch_and_bytes_of_its_values(digest_type, payloads,
                                                                           skip, base):
    """Payloads given as a binary column (sliced: a non-zero array offset)
    make the same batch and IPC bytes as the same values given as bytes."""
    d = Digester(digest_type, b"pw")
    column = pa.array([b"lead"] * skip + payloads, pa.binary()).slice(skip)
    want = d.run_batch(7, 40, 39, base, payloads)
    got = d.run_batch(7, 40, 39, base, column)
    got.validate(full=True)
    assert got.equals(want)
    assert batch_to_bytes(got) == batch_to_bytes(want)


@pytest.mark.parametrize("digest_type", ["crc32c", "hmac", "none"])
@given(payloads=st.lists(st.binary(max_size=200), min_size=2, max_size=150),
       data=st.data(), base=st.integers(0, 1 << 40))
@settings(max_examples=40, deadline=None)
def test_a_payload_column_slice_carries_its_own_ends(digest_type, payloads, data, base):
    """A ``PayloadColumn``'s ends are computed once and rebased by a slice:
    a request cut from it (``add_entries_async``) has the sizes and the
    batch of the same values given as bytes."""
    column = PayloadColumn.of(pa.array([b"lead"] + payloads, pa.binary()).slice(1))
    assert column.sizes() == [len(p) for p in payloads]
    start = data.draw(st.integers(0, len(payloads) - 1))
    stop = data.draw(st.integers(start + 1, len(payloads)))
    part = column.slice(start, stop)
    assert part.ends.tolist() == column_ends(part.values).tolist()
    assert part.nbytes == sum(map(len, payloads[start:stop]))
    d = Digester(digest_type, b"pw")
    got = d.run_batch(7, 40, 39, base, part)
    got.validate(full=True)
    assert got.equals(d.run_batch(7, 40, 39, base, payloads[start:stop]))
    assert d.verify_batch(got).all()
    assert column.slice(0, len(payloads)) is column
