"""The CRC-32C algebra that checks a batch with one CRC (wire/crc_combine.py)."""
from __future__ import annotations

import google_crc32c
import numpy as np
from hypothesis import given, settings, strategies as st

from pybk_spark.wire import crc_combine

# byte counts that use every digit level of ``shift``, and their edges
_COUNTS = st.one_of(st.integers(0, 70_000),
                    st.sampled_from([255, 256, 257, 65_535, 65_536, 1 << 20, (1 << 24) - 1,
                                     1 << 24, (1 << 24) + 257, (1 << 32) - 1]))


@given(heads=st.lists(st.binary(max_size=64), min_size=1, max_size=20),
       counts=st.lists(_COUNTS, min_size=20, max_size=20))
@settings(max_examples=60, deadline=None)
def test_shift_joins_crcs_as_the_crc_of_the_joined_bytes(heads, counts):
    """``crc(A || B) = shift(crc(A), |B|) ^ crc(B)``, on tails of zeros up
    to 70,000 bytes (the longer counts are in the next two tests)."""
    crcs = np.array([google_crc32c.value(h) for h in heads], np.uint32)
    small = [c if c <= 70_000 else c % 4099 for c in counts[:len(heads)]]
    got = crc_combine.shift(crcs, np.array(small))
    for head, n, moved in zip(heads, small, got.tolist()):
        tail = bytes(n)
        assert google_crc32c.value(head + tail) == moved ^ google_crc32c.value(tail)


def test_shift_past_megabytes_of_bytes():
    heads = [b"", b"x", bytes(range(40))]
    crcs = np.array([google_crc32c.value(h) for h in heads], np.uint32)
    for n in (1 << 20, (1 << 24) + 257):
        tail = np.random.default_rng(n).bytes(n)
        for head, moved in zip(heads, crc_combine.shift(crcs, np.full(3, n)).tolist()):
            assert google_crc32c.value(head + tail) == moved ^ google_crc32c.value(tail)


def test_shift_by_a_sum_is_shift_by_each_part():
    """``Z(m + n) = Z(m) Z(n)``: counts past 2**24 (the fourth digit level)
    agree with the same distance in two steps."""
    rng = np.random.default_rng(5)
    values = rng.integers(0, 1 << 32, 64, dtype=np.uint64).astype(np.uint32)
    big = rng.integers(0, 1 << 32, 64, dtype=np.int64)
    part = big // 3
    assert (crc_combine.shift(values, big)
            == crc_combine.shift(crc_combine.shift(values, part), big - part)).all()


def _rows(payloads, headers):
    digests = np.array([google_crc32c.extend(google_crc32c.value(h), p)
                        for h, p in zip(headers, payloads)], np.uint32)
    hcrcs = np.array([google_crc32c.value(h) for h in headers], np.uint32)
    ends = np.concatenate(([0], np.cumsum([len(p) for p in payloads])))
    return digests, hcrcs, ends


@given(payloads=st.lists(st.binary(max_size=300), min_size=1, max_size=60),
       data=st.data())
@settings(max_examples=80, deadline=None)
def test_one_crc_of_the_payloads_agrees_with_every_correct_digest_only(payloads, data):
    headers = [i.to_bytes(32, "big") for i in range(len(payloads))]
    digests, hcrcs, ends = _rows(payloads, headers)
    whole = google_crc32c.value(b"".join(payloads))
    assert crc_combine.digests_agree(whole, digests, hcrcs, ends)
    # any one flipped payload bit, digest bit or header CRC bit is seen
    i = data.draw(st.integers(0, len(payloads) - 1))
    bit = data.draw(st.integers(0, 31))
    wrong = digests.copy()
    wrong[i] ^= np.uint32(1 << bit)
    assert not crc_combine.digests_agree(whole, wrong, hcrcs, ends)
    wrong_h = hcrcs.copy()
    wrong_h[i] ^= np.uint32(1 << bit)
    assert not crc_combine.digests_agree(whole, digests, wrong_h, ends)
    if payloads[i]:
        at = data.draw(st.integers(0, len(payloads[i]) * 8 - 1))
        flipped = bytearray(payloads[i])
        flipped[at // 8] ^= 1 << (at % 8)
        bad = payloads[:i] + [bytes(flipped)] + payloads[i + 1:]
        assert not crc_combine.digests_agree(google_crc32c.value(b"".join(bad)),
                                             digests, hcrcs, ends)


def test_payloads_in_another_order_do_not_agree():
    payloads = [b"first entry", b"second one!"]        # same length
    headers = [bytes(32), bytes(31) + b"\1"]
    digests, hcrcs, ends = _rows(payloads, headers)
    swapped = google_crc32c.value(payloads[1] + payloads[0])
    assert not crc_combine.digests_agree(swapped, digests, hcrcs, ends)


def test_empty_payloads_and_no_rows():
    headers = [bytes(32), b"\7" * 32]
    digests, hcrcs, ends = _rows([b"", b""], headers)
    assert crc_combine.digests_agree(0, digests, hcrcs, ends)
    assert crc_combine.digests_agree(0, np.empty(0, np.uint32), np.empty(0, np.uint32),
                                     np.zeros(1, np.int64))


@given(data=st.binary(max_size=5000), cut=st.data())
@settings(max_examples=80, deadline=None)
def test_around_and_concat_give_the_crc_of_the_whole(data, cut):
    """``around``: the CRC of a buffer from the CRC of a span in it and the
    bytes around it; ``concat``: of two buffers from their CRCs."""
    start = cut.draw(st.integers(0, len(data)))
    length = cut.draw(st.integers(0, len(data) - start))
    inner = google_crc32c.value(data[start:start + length])
    assert crc_combine.around(data, start, length, inner) == google_crc32c.value(data)
    head, tail = data[:start], data[start:]
    assert (crc_combine.concat(google_crc32c.value(head), google_crc32c.value(tail), len(tail))
            == google_crc32c.value(data))


def test_a_checked_batch_hashes_its_ipc_bytes_with_the_digest_checks_crc():
    """``Digester.check_batch`` of a batch read in place from its IPC bytes
    names its payloads' CRC and where they lie in those bytes, and
    ``around`` makes the CRC of the whole stream from it (what a pull
    journals); a corrupt row leaves no CRC to reuse."""
    from pybk_spark.wire.digest import Digester
    from pybk_spark.wire.entries import batch_from_bytes, batch_to_buffer
    rng = np.random.default_rng(3)
    d = Digester("crc32c")
    payloads = [rng.bytes(int(n)) for n in rng.integers(0, 2000, 600)]
    raw = batch_to_buffer(d.run_batch(7, 100, 99, 0, payloads))
    check = d.check_batch(batch_from_bytes(raw))
    assert check.ok.all() and check.payloads_crc is not None
    start = check.payloads_at - raw.address
    assert 0 <= start and start + check.payloads_len <= raw.size
    assert check.payloads_len == sum(map(len, payloads))
    assert (crc_combine.around(raw, start, check.payloads_len, check.payloads_crc)
            == google_crc32c.value(raw))
    bad = bytearray(raw.to_pybytes())
    bad[start + 5] ^= 1
    check = d.check_batch(batch_from_bytes(bytes(bad)))
    assert check.payloads_crc is None and not check.ok.all() and check.ok.sum() == 599
