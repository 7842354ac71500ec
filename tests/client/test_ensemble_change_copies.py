"""An ensemble change during pipelined adds leaves the replacement bookie
holding every entry of its new fragment, on a private cluster of real
``bookie-server`` processes (destructive: a bookie is SIGKILLed).

The race this guards: a bookie of E=3 Qw=3 Qa=2 dies
while three 1000-entry chunks are in flight.  The other two bookies
acknowledge chunks while the change is pending; nothing is released then
(#1591), but ``commit_change`` releases them at once.  A writer that drops
their chunks before taking the ones to resend, or completes the adds
before sending the resends (so ``close()`` does not wait for them), closes
the ledger with only Qa copies of up to 2,500 entries while its
metadata names Qw.  Several rounds, since the interleaving varies."""
import os

import pytest

from pybk_spark.admin.operations import rereplicate as rr
from pybk_spark.ledger.client import BookKeeper

ROUNDS = 6


@pytest.fixture(scope="module")
def four_bookies(tmp_path_factory):
    from pybk_spark.testing.fixtures import bookie_server_available, private_cluster
    if not bookie_server_available():
        pytest.skip("bookie_server is not available")
    yield from private_cluster(tmp_path_factory.mktemp("change-cluster"), num_bookies=4)


def _payloads(tag: str, n: int, size: int = 300) -> list[bytes]:
    return [(f"{tag}-{i}-".encode() + os.urandom(size))[:size] for i in range(n)]


def test_the_replacement_holds_every_entry_of_its_fragment(four_bookies):
    with BookKeeper(four_bookies.metadata_uri) as bk:
        for round_ in range(ROUNDS):
            four_bookies.heal()
            with BookKeeper(four_bookies.metadata_uri) as writer:
                lh = writer.create_ledger(3, 3, 2)
                first, second = _payloads(f"a{round_}", 2500), _payloads(f"b{round_}", 2500)
                lh.add_entries(first)
                dead = lh.metadata.current_ensemble[0]
                four_bookies.kill_bookie(dead)
                lh.add_entries(second)          # fails on `dead`: ensemble change
                lh.close()
            md = bk.get_ledger_metadata(lh.ledger_id)
            assert len(md.ensembles) == 2, md.ensembles
            short = [u for u in rr.verify_ledger(bk, lh.ledger_id) if u["bookie"] != dead]
            assert short == [], (round_, md.ensembles, short)
            rh = bk.open_ledger(lh.ledger_id, recovery=False)
            assert [e.payload for e in rh.read(2500, 4999)] == second


def test_lone_adds_keep_their_copies_through_an_ensemble_change(four_bookies):
    """Sync adds travel as entry records (wire/entries.py); the ones a dead
    bookie never answered are re-sent to its replacement as a batch decoded
    from those records, with the writer's digests, LACs and lengths."""
    four_bookies.heal()
    with BookKeeper(four_bookies.metadata_uri) as bk:
        lh = bk.create_ledger(3, 3, 2)
        data = _payloads("lone", 40)
        ids = [lh.add_entry(p) for p in data[:20]]
        dead = lh.metadata.current_ensemble[1]
        four_bookies.kill_bookie(dead)
        ids += [lh.add_entry(p) for p in data[20:]]
        lh.close()
        assert ids == list(range(40))
        md = bk.get_ledger_metadata(lh.ledger_id)
        assert len(md.ensembles) == 2 and md.length == 300 * 40, md
        assert [u for u in rr.verify_ledger(bk, lh.ledger_id) if u["bookie"] != dead] == []
        rh = bk.open_ledger(lh.ledger_id, recovery=False)
        got = rh.read(0, 39)
        assert [e.payload for e in got] == data
        assert [e.length for e in got] == [300 * (i + 1) for i in range(40)]
