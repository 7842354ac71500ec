"""The planted ``reuse_id_on_timeout`` rewrites ids as its docstring says
(faulty_client.py): no processes, the request bytes only."""
from __future__ import annotations

from types import SimpleNamespace

from pybk_spark.wire.digest import Digester
from pybk_spark.wire.entries import batch_from_bytes, batch_to_buffer, make_batch

from .faulty_client import _Rewinds

KEY = b"k" * 20


def _request(first: int, n: int, lac: int):
    ids = range(first, first + n)
    payloads = [f"p{i}".encode() for i in ids]
    lengths = [10 * (i + 1) for i in ids]
    dig = Digester.with_key("crc32c", KEY).compute(7, ids, [lac] * n, lengths, payloads)
    return batch_to_buffer(make_batch(7, ids, [lac] * n, lengths, payloads, dig))


def _rewinds():
    md = SimpleNamespace(digest_type="crc32c")
    return _Rewinds(SimpleNamespace(get_ledger_metadata=lambda lid: md))


def test_after_a_timeout_later_ids_reuse_the_timed_out_ones():
    rw = _rewinds()
    data, first = rw.outgoing(7, KEY, _request(0, 3, -1))
    assert first == 0 and data is not None           # nothing rewound yet: sent as is
    rw.timed_out(7, 1)                               # the add from id 1 timed out
    rw.timed_out(7, 1)                               # (a second bookie: same rewind)
    out, first = rw.outgoing(7, KEY, _request(3, 2, 2))
    batch = batch_from_bytes(out)
    assert first == 3
    assert batch.column("entry_id").to_pylist() == [1, 2]      # ids 1, 2 reused
    assert batch.column("payload").to_pylist() == [b"p3", b"p4"]
    assert batch.column("lac").to_pylist() == [0, 1]              # each below its id
    assert Digester.with_key("crc32c", KEY).verify_batch(batch).all()


def test_resends_of_ids_before_the_rewind_keep_their_ids():
    rw = _rewinds()
    rw.outgoing(7, KEY, _request(0, 5, -1))
    rw.timed_out(7, 2)
    out, _ = rw.outgoing(7, KEY, _request(2, 3, 1))      # the client's own resend
    assert batch_from_bytes(out).column("entry_id").to_pylist() == [2, 3, 4]
