"""The damage marker's pure rules, and how recovery reads a damaged
bookie's answer (an error, never "no such entry")."""
from pybk_spark.protocol import damage_marker as dm
from pybk_spark.protocol import recovery as rc


def test_merge_keeps_ledgers_apart_and_open_ranges_swallow_later_ones():
    assert dm.merge([(2, 0, 0), (1, 5, 9), (1, 10, 12), (1, 20, dm.OPEN), (1, 25, 30)]) == \
        [(1, 5, 12), (1, 20, dm.OPEN), (2, 0, 0)]


def test_marker_round_trip():
    raw = dm.marker_value([(1, 3, 4), (1, 0, 2)], True)
    assert dm.parse_marker(raw) == ([(1, 0, 4)], True)
    assert dm.parse_marker(None) == ([], False)


def test_unattributed_damage_checks_every_ledger_on_the_bookie():
    assert dm.ledgers_to_check([(5, 0, 1)], False, [1, 2]) == [5]
    assert dm.ledgers_to_check([(5, 0, 1)], True, [1, 2]) == [1, 2, 5]


def test_remaining_keeps_unrepaired_ledgers_and_ledgers_still_written():
    ranges = [(1, 0, 9), (2, 5, 5), (3, 7, dm.OPEN)]
    assert dm.remaining(ranges, unrepaired=[2], still_written={4: 100}) == \
        [(2, 5, 5), (4, 100, dm.OPEN)]
    assert dm.remaining(ranges, unrepaired=[], still_written={}) == []


def test_a_damaged_bookies_error_never_makes_an_entry_missing():
    """Qw=3, Qa=2: (Qw-Qa)+1 = 2 NoSuchEntry make an entry missing.  The
    damaged bookie answers BookieIOError (ERROR): with one other NoSuchEntry
    the entry stays undecided (its third replica may hold it)."""
    probe = rc.EntryProbe(entry_id=0, ensemble_size=3, write_quorum=3, ack_quorum=2)
    assert probe.on_answer(0, rc.ERROR) == rc.UNDECIDED
    assert probe.on_answer(1, rc.NO_ENTRY) == rc.UNDECIDED
    assert probe.on_answer(2, rc.OK) == rc.EXISTS


def test_remaining_keeps_all_of_an_unrepaired_ledger_checked_only_as_unattributed():
    """A ledger checked because the damage was unattributed (a formatted
    bookie) has no range of its own: unrepaired, all of it stays, since
    the marker written back no longer says unattributed."""
    assert dm.remaining([(1, 4, 5)], unrepaired=[1, 7], still_written={}) == \
        [(1, 4, 5), (7, 0, dm.OPEN)]
