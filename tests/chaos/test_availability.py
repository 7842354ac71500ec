"""I9 and I10 (availability.py) without processes: the gap judge on hand-made
samples, the nemesis's fault windows on a fake network and cluster, the
registry watch on a store that fails now and then, and the autorecovery
standby judge on hand-made rounds."""
from __future__ import annotations

import random
import time

from .availability import (FaultWindow, RegistryWatch, check_autorecovery,
                           check_registration, leadership_of, registered_ids,
                           registration_gaps, registration_totals, standby_stalls)
from .test_link_nemesis import _setup

ALL = frozenset({"b1", "b2", "b3"})


def _samples(*rows):
    return [(float(t), None if ids is None else frozenset(ids)) for t, ids in rows]


def test_a_healthy_bookie_that_drops_out_is_a_violation():
    samples = _samples((0, ALL), (1, ALL), (2, {"b1", "b2"}), (3, {"b1", "b2"}), (4, ALL))
    [v] = check_registration(samples, [], grace_s=15.0)
    assert v.invariant == "I9 availability" and "b3" in v.message
    assert "t=2.0s to t=3.0s (1.0s)" in v.message
    assert registration_totals(samples, [], 15.0)["gaps_unexcused"] == 1


def test_a_gap_inside_its_own_fault_window_is_excused():
    samples = _samples((0, ALL), (1, {"b1", "b2"}), (5, {"b1", "b2"}), (12, ALL))
    windows = [FaultWindow("b3", 0.5, 4.0, "pause")]     # back 8 s after the resume
    assert check_registration(samples, windows, grace_s=15.0) == []
    [g] = registration_gaps(samples, windows, 15.0)
    assert g.excused_by == "pause" and g.seconds == 4.0
    # another bookie's window excuses nothing
    assert len(check_registration(samples, [FaultWindow("b2", 0.5, 4.0)], 15.0)) == 1


def test_a_bookie_not_back_within_the_grace_after_its_repair_is_a_violation():
    samples = _samples((0, ALL), (1, {"b1", "b2"}), (30, {"b1", "b2"}), (31, ALL))
    assert len(check_registration(samples, [FaultWindow("b3", 0.5, 4.0)], 15.0)) == 1
    assert check_registration(samples, [FaultWindow("b3", 0.5)], 15.0) == []   # still open


def test_failed_reads_neither_make_nor_break_a_gap():
    samples = _samples((0, ALL), (1, None), (2, None), (3, ALL))
    assert registration_gaps(samples, [], 15.0) == []
    samples = _samples((0, ALL), (1, {"b1", "b2"}), (2, None), (3, {"b1", "b2"}), (4, ALL))
    [g] = registration_gaps(samples, [], 15.0)
    assert (g.start, g.end) == (1.0, 3.0)


def test_a_bookie_is_judged_only_once_it_was_seen_and_a_gap_may_run_to_the_end():
    samples = _samples((0, {"b1"}), (1, {"b1", "b2"}), (2, {"b1"}))
    [g] = registration_gaps(samples, [], 15.0)
    assert (g.bookie, g.start, g.end) == ("b2", 2.0, 2.0)


def test_both_modes_count_as_registered_and_damage_markers_do_not():
    listing = [("bookies/writable/b1", None), ("bookies/readonly/b2", None),
               ("bookies/damaged/b3", None), ("bookies/cookies/b4", None),
               ("ledgers/00/1", None)]
    assert registered_ids(listing) == {"b1", "b2"}


def test_the_nemesis_records_a_window_for_every_fault_that_may_unregister_a_bookie():
    nem, faults = _setup(11, ["partition:bookie-etcd", "loss"])
    nem.run(until=200.0)
    windows = nem.all_windows()
    assert windows and not nem._open_windows          # every one closed by its heal
    cut = [f for f in faults.log if f[1] == "partition" or (f[1] == "loss"
                                                            and f[2].startswith("bookie"))]
    assert len(windows) == len(cut)
    assert all(w.bookie.startswith("bookie-") and w.start < w.end for w in windows)
    # a writer's packet loss cuts no bookie's path to etcd
    writer_losses = [f for f in faults.log if f[1] == "loss" and not f[2].startswith("bookie")]
    assert len(faults.log) == len(cut) + len(writer_losses)


def test_a_killed_bookie_is_excused_until_its_restart_is_repaired():
    nem, _ = _setup(2, ["bookie_kill", "bookie_pause", "bookie_disk_full"])
    done = []
    nem.cluster.kill_bookie = lambda b, sig: None
    nem.cluster.stop_bookie = nem.cluster.resume_bookie = lambda b: None
    nem.cluster.start_bookie = lambda b: done.append((b, nem.clock()))
    nem.cluster.wait_registered = lambda b, **kw: {}
    nem.cluster.bookie_pid = lambda b: None
    nem.cluster.data_dir = _Dir()
    nem.run(until=60.0)
    kinds = {w.what for w in nem.all_windows()}
    assert kinds and kinds <= {"kill", "pause"}          # a disk-full bookie stays registered
    assert not nem._open_windows
    kills = [w for w in nem.windows if w.what == "kill"]
    assert [(w.bookie, w.end) for w in kills] == done[:len(kills)]


class _Dir:
    def __truediv__(self, name):
        return _Conf()


class _Conf:
    text = ""

    def read_text(self):
        return self.text

    def write_text(self, text):
        self.text = text


def test_the_watch_samples_and_records_failed_reads():
    rng = random.Random(4)

    class Store:
        def list_prefix(self, prefix):
            assert prefix == "bookies/"
            if rng.random() < 0.3:
                raise ConnectionError("etcd restarting")
            return [("bookies/writable/b1", None)]
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]
    watch = RegistryWatch(Store, interval_s=0.001, clock=clock).start()
    while len(watch.samples) < 40:
        time.sleep(0.01)
    watch.stop()
    got = {ids for _, ids in watch.samples}
    assert got == {None, frozenset({"b1"})}
    assert [t for t, _ in watch.samples] == sorted(t for t, _ in watch.samples)


def _rounds(*rows):
    return [{"op": "autorecovery", "t": float(t), "leadership": state} for t, state in rows]


def test_a_round_row_names_its_leadership():
    assert leadership_of({"leader": True, "lost": []}) == "leader"
    assert leadership_of({"leader": False}) == "standby"
    assert leadership_of({"leader": False, "leadership": "unknown", "error": "x"}) == "unknown"
    assert leadership_of({"leader": False, "error": "MetadataUnavailable: x"}) == "error"


def test_a_lone_daemon_standing_by_for_good_is_a_violation():
    """A dropped, unrevoked lease that keeps audit/leader alive is caught."""
    ops = _rounds((0, "leader"), (2, "unknown"), (4, "standby"),
                  *[(t, "standby") for t in range(6, 100, 2)])
    [v] = check_autorecovery(ops, daemons=1, limit_s=40.0)
    assert v.invariant == "I10 autorecovery leadership"
    assert "t=4.0s to t=98.0s (94.0s)" in v.message
    assert check_autorecovery(ops, daemons=2, limit_s=40.0) == []   # standby is normal there


def test_standby_behind_an_expiring_key_and_etcd_outages_are_not_stalls():
    ops = _rounds((0, "leader"), (2, "unknown"), (4, "error"), (6, "standby"), (8, "standby"),
                  (10, "leader"), (12, "unknown"), *[(t, "error") for t in range(14, 90, 2)],
                  (90, "leader"))
    assert standby_stalls(sorted((o["t"], o["leadership"]) for o in ops)) == [(6.0, 10.0)]
    assert check_autorecovery(ops, daemons=1, limit_s=40.0) == []
