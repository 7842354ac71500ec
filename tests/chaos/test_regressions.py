"""Known BookKeeper protocol bugs as named scenarios against real processes
(etcd + bookie-server from the shared ``cluster`` fixture), judged by the
chaos checker.  Message loss is scripted with SIGSTOP / SIGKILL + restart
(a request queued in a stopped bookie dies with it: a lost message) and
with a wire-level writer (scenario.RawWriter) that sends an entry only to
the bookies the scenario names.

  test_bk2614_lost_fence_request_qw_gt_qa
  test_bk2614_fencing_waits_for_coverage
  test_tla_defect1_recovery_reads_must_fence
  test_bk2615_recovery_when_current_ensemble_returns_lac_minus_one
  test_tla_defect2_recovery_never_rewrites_an_earlier_fragment
  test_bk1067_hanging_bookie_during_fencing
  test_bk1591_ensemble_change_metadata_write_stalls
  test_chaos_run7_close_after_an_aborted_ensemble_change_recovers
  test_chaos_run8_recovery_after_a_crashed_recoverys_ensemble_change
The deterministic simulation (tests/sim) covers the same classes over
thousands of seeded schedules; these pin the exact interleavings.
"""
from __future__ import annotations

import concurrent.futures as cf
import threading

import pytest

from pybk_spark import errors
from pybk_spark.ledger import recovery_op
from pybk_spark.wire.digest import Digester
from pybk_spark.metadata.store import ledger_key
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import recovery as rc

from .history import History
from .scenario import (HANG_GUARD_S, RawWriter, RecordedWriter, client, ensure_bookies,
                       final_check, restart_bookie, sigcont_etcd, sigstop_etcd)

pytestmark = pytest.mark.slow


@pytest.fixture
def hist_dir(tmp_path):
    d = tmp_path / "history"
    d.mkdir()
    return d


def _in_recovery(bk, lid) -> lm.LedgerMetadata:
    raw, _ = bk.metadata_store.update(
        ledger_key(lid), lambda r: lm.to_in_recovery(lm.LedgerMetadata.from_json(r)).to_json())
    return lm.LedgerMetadata.from_json(raw)


def _close_by_recovery(bk, lid, last, length) -> lm.LedgerMetadata:
    raw, _ = bk.metadata_store.update(
        ledger_key(lid),
        lambda r: lm.close_by_recovery(lm.LedgerMetadata.from_json(r), last, length).to_json())
    return lm.LedgerMetadata.from_json(raw)


def _lost_fence_scenario(cluster, hist_dir, lost: int):
    """Ledger (3,3,2), writer alive and idle after 10 acked entries.  The
    fence request to ``lost`` bookies is lost (SIGSTOP during fencing, then
    SIGKILL + restart).  Recovery is driven step by step with the real
    recovery functions; afterwards the old writer tries one more add while
    the bookie that surely got the fence is frozen.  Returns (outcome of
    that add, violations)."""
    bk, bk2 = client(cluster), client(cluster, read_timeout_s=3.0)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    try:
        w = RecordedWriter(hist, bk.create_ledger(3, 3, 2))
        lid = w.lh.ledger_id
        for _ in range(10):
            assert w.add() == "ok"
        ensemble = w.lh.metadata.current_ensemble
        fenced, lost_bookies = ensemble[0], ensemble[1:1 + lost]
        for b in lost_bookies:
            cluster.stop_bookie(b)
        md = _in_recovery(bk2, lid)
        key = lm.master_key(b"")
        try:
            lac = recovery_op.fence_and_read_lac(bk2.context, md, key)
        finally:
            for b in lost_bookies:
                restart_bookie(cluster, [bk, bk2], b)
        start = rc.recovery_start(lac, md.last_fragment_first_entry)
        rows = recovery_op.read_forward(bk2.context, md, key, Digester(md.digest_type, b""), start)
        last = start
        length = recovery_op.closing_length(bk2.context, md, b"", start, rows)
        if rows is not None and rows.num_rows:
            last = start + rows.num_rows
            recovery_op.rewrite(bk2.context, md, key, start, rows)
        _close_by_recovery(bk2, lid, last, length)
        cluster.stop_bookie(fenced)
        try:
            fut = w.add_async()
            others = [b for b in ensemble if b != fenced]
            # the add is decided by the two unfrozen bookies' answers
            try:
                fut.result(HANG_GUARD_S)
                outcome = "ok"
            except errors.BKError as exc:
                outcome = exc
        finally:
            cluster.resume_bookie(fenced)
        assert others
        hist.close()
        return outcome, final_check(cluster, hist_dir, [lid])
    finally:
        bk.close()
        bk2.close()


def test_bk2614_lost_fence_request_qw_gt_qa(cluster, hist_dir):
    """One fence request lost with Qw=3 > Qa=2: coverage needs 2 fenced
    bookies, so the old writer can reach at most one unfenced bookie and its
    add cannot be acknowledged; nothing acknowledged is lost."""
    outcome, violations = _lost_fence_scenario(cluster, hist_dir, lost=1)
    assert outcome != "ok" and not outcome.outcome_known
    assert violations == []


def test_bk2614_fencing_waits_for_coverage(cluster, hist_dir):
    """With two of three bookies frozen (Qw=3, Qa=2: coverage needs two fenced
    answers) the fencing phase cannot reach coverage and refuses to decide."""
    bk = client(cluster, read_timeout_s=2.0)
    try:
        lh = bk.create_ledger(3, 3, 2)
        lh.add_entry(b"x")
        ens = lh.metadata.current_ensemble
        md = _in_recovery(bk, lh.ledger_id)
        for b in ens[1:]:
            cluster.stop_bookie(b)
        try:
            with pytest.raises(errors.LedgerRecoveryError):
                recovery_op.fence_and_read_lac(bk.context, md, lm.master_key(b""))
        finally:
            for b in ens[1:]:
                cluster.resume_bookie(b)
    finally:
        bk.close()


def test_tla_defect1_recovery_reads_must_fence(cluster, hist_dir):
    """Vanlightly/bookkeeper-tlaplus defect 1 (Qw=3, Qa=2): e0 reaches b2
    only; the fence to b3 is lost, b1 and b2 are fenced (coverage holds);
    recovery reads e0: b1 and b3 answer NoSuchEntry before b2 answers, so
    the ledger is closed empty; then the writer's e0 reaches b3, which is
    still unfenced unless the recovery READ fenced it -> e0 would be
    acknowledged (b2 + b3) yet not in the closed ledger."""
    bk, bk2 = client(cluster), client(cluster, read_timeout_s=5.0)
    hist = History(str(hist_dir / "w1.jsonl"), "w1")
    try:
        md = bk.get_ledger_metadata(bk.create_ledger(3, 3, 2).ledger_id)
        lid = md.ledger_id
        b1, b2, b3 = md.current_ensemble
        w1 = RawWriter(bk, hist, md)
        md = _in_recovery(bk2, lid)                              # w2: mark in recovery
        key = lm.master_key(b"")
        phase = rc.FenceLacPhase(3, 3, 2)
        for slot, b in ((0, b1), (1, b2)):
            if b == b2:
                assert w1.send(0, -1, b2) == "ok"                # w1 -> b2: e0 written
            res = bk2.transports.get(b).read_lac(lid, fence=True, master_key=key).result(30)
            phase.on_answer(slot, rc.OK, res.lac)
        assert phase.covered                                      # the fence to b3 is lost
        cluster.stop_bookie(b2)                                   # b2's read answer comes late
        try:
            from pybk_spark.wire.digest import Digester
            rows = recovery_op.read_forward(bk2.context, md, key, Digester(md.digest_type, b""),
                                            rc.recovery_start(phase.max_lac, 0))
            assert rows is None or rows.num_rows == 0
            _close_by_recovery(bk2, lid, -1, 0)                   # closed as empty
        finally:
            cluster.resume_bookie(b2)
        w1.send(0, -1, b3)                                        # w1 -> b3: e0
        w1.finish()
        hist.close()
        violations = final_check(cluster, hist_dir, [lid])
        assert violations == [], "acknowledged e0 lost: recovery reads do not fence"
    finally:
        bk.close()
        bk2.close()


def test_bk2615_recovery_when_current_ensemble_returns_lac_minus_one(cluster, hist_dir):
    """The writer changed the whole ensemble at entry 20 ({A,B} -> {C,D}) and
    died before anything reached C or D: the current ensemble answers LAC -1.
    Recovery must start at 19 (first entry of the last fragment - 1), close
    at 19 and leave the earlier fragment alone."""
    ensure_bookies(cluster, 4)
    bk, bk2 = client(cluster), client(cluster)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    try:
        w = RecordedWriter(hist, bk.create_ledger(2, 2, 2))
        lid = w.lh.ledger_id
        for _ in range(20):
            assert w.add() == "ok"
        old = w.lh.metadata.current_ensemble
        new = [b for b in cluster.bookie_ids if b not in old][:2]
        bk.metadata_store.update(ledger_key(lid), lambda r: lm.replace_bookies(
            lm.LedgerMetadata.from_json(r), 20, {0: new[0], 1: new[1]}).to_json())
        rh = bk2.open_ledger(lid, recovery=True)
        md = rh.metadata
        assert md.last_entry_id == 19
        assert [f for f, _ in md.ensembles] == [0, 20]
        assert md.ensembles[0][1] == tuple(old)
        hist.close()
        assert final_check(cluster, hist_dir, [lid]) == []
    finally:
        bk.close()
        bk2.close()


def test_tla_defect2_recovery_never_rewrites_an_earlier_fragment(cluster, hist_dir):
    """TLA+ defect 2: as above, but entry 20 reached C only and D is down
    during recovery.  Recovery re-writes entry 20 and must replace D in a
    fragment starting at 20, never one starting at 0 (an invalid fragment)."""
    ensure_bookies(cluster, 5)
    bk, bk2 = client(cluster), client(cluster, add_timeout_s=3.0)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    try:
        w = RecordedWriter(hist, bk.create_ledger(2, 2, 2))
        lid = w.lh.ledger_id
        for _ in range(20):
            assert w.add() == "ok"
        old = w.lh.metadata.current_ensemble
        c, d = [b for b in cluster.bookie_ids if b not in old][:2]
        raw, _ = bk.metadata_store.update(ledger_key(lid), lambda r: lm.replace_bookies(
            lm.LedgerMetadata.from_json(r), 20, {0: c, 1: d}).to_json())
        raw_writer = RawWriter(bk, hist, lm.LedgerMetadata.from_json(raw), first_entry=20,
                               base_length=w.lh.length)
        assert raw_writer.send(20, 19, c) == "ok"               # e20 at Qa-1
        raw_writer.finish()
        cluster.kill_bookie(d)
        try:
            rh = bk2.open_ledger(lid, recovery=True)
        finally:
            cluster.start_bookie(d)
        md = rh.metadata
        firsts = [f for f, _ in md.ensembles]
        assert firsts[:2] == [0, 20] and all(f >= 20 for f in firsts[1:]), md.ensembles
        assert md.ensembles[0][1] == tuple(old)
        assert md.last_entry_id in (19, 20)
        hist.close()
        assert final_check(cluster, hist_dir, [lid]) == []
    finally:
        bk.close()
        bk2.close()


def test_bk1067_hanging_bookie_during_fencing(cluster, hist_dir):
    """A bookie frozen (SIGSTOP) during recovery must not block it: fencing
    and read-forward proceed on coverage.  The recovering client's read
    timeout is far longer than the hang guard, so waiting for the frozen
    bookie anywhere would show up as a hang; its add timeout is short so the
    re-write replaces the frozen bookie (an ensemble change in recovery)."""
    ensure_bookies(cluster, 4)
    bk = client(cluster)
    bk2 = client(cluster, read_timeout_s=3600.0, add_timeout_s=3.0,
                 speculative_read_timeout_ms=100)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    try:
        w = RecordedWriter(hist, bk.create_ledger(3, 2, 2))
        lid = w.lh.ledger_id
        futs = [w.add_async() for _ in range(50)]
        for f in futs:
            f.result(HANG_GUARD_S)
        frozen = w.lh.metadata.current_ensemble[0]
        cluster.stop_bookie(frozen)
        result: dict = {}

        def recover():
            try:
                result["rh"] = bk2.open_ledger(lid, recovery=True)
            except BaseException as exc:  # noqa: BLE001
                result["error"] = exc
        t = threading.Thread(target=recover, daemon=True)
        t.start()
        t.join(HANG_GUARD_S)
        still_frozen = t.is_alive()
        cluster.resume_bookie(frozen)
        t.join(HANG_GUARD_S)
        assert not still_frozen, "recovery blocked on the frozen bookie"
        assert "error" not in result, result.get("error")
        assert result["rh"].metadata.last_entry_id == 49
        hist.close()
        assert final_check(cluster, hist_dir, [lid]) == []
    finally:
        bk.close()
        bk2.close()


def _ten_acked_adds(hist, bk):
    """A (3, 2, 2) ledger with ids 0-9 acknowledged: entry 10's write set is slots (1, 2)."""
    w = RecordedWriter(hist, bk.create_ledger(3, 2, 2))
    for _ in range(10):
        assert w.add() == "ok"
    return w, w.lh.ledger_id


def test_bk1591_ensemble_change_metadata_write_stalls(cluster, hist_dir):
    """etcd frozen while a bookie dies under a writer: the ensemble change's
    CAS stalls (and times out).  No add may be acknowledged through the
    unrecorded ensemble: after etcd returns and the ledger is recovered,
    every acknowledged add is in it."""
    ensure_bookies(cluster, 4)
    bk = client(cluster, metadata_timeout_s=3.0, add_timeout_s=3.0)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    try:
        w, lid = _ten_acked_adds(hist, bk)
        victim = w.lh.metadata.current_ensemble[1]
        sigstop_etcd(cluster)
        try:
            cluster.kill_bookie(victim)
            futs = [w.add_async() for _ in range(20)]
            # entry 10's write set (slots 1, 2) holds the victim: no id >= 10 can
            # be acknowledged before the change is durable in etcd (frozen).
            # Observe for a bounded while (an observation window, not a threshold).
            cf.wait(futs, timeout=30)
            acked = [f.result() for f in futs if f.done() and f.exception() is None]
            assert acked == [], f"acknowledged through an unrecorded ensemble: {acked}"
        finally:
            sigcont_etcd(cluster)
        for f in futs:
            try:
                f.result(HANG_GUARD_S)
            except errors.BKError:
                pass
        cluster.start_bookie(victim)
        hist.close()
        assert final_check(cluster, hist_dir, [lid]) == []
    finally:
        sigcont_etcd(cluster)
        bk.close()


def test_chaos_run7_close_after_an_aborted_ensemble_change_recovers(cluster, hist_dir):
    """Chaos seed 2026112207 (30 minutes, ledger 4058):
    a bookie is paused with adds in flight and etcd is frozen, so the
    ensemble change's CAS fails and the handle aborts its adds (unknown
    outcome).  The writer then closes.  Closed at its LAC, the ledger would
    end before entry LAC+1, which the paused bookie stores on resuming: LAC+1
    on its whole write set (I2).  The close must fence and recover instead."""
    ensure_bookies(cluster, 4)
    bk = client(cluster, metadata_timeout_s=2.0, add_timeout_s=2.0, read_timeout_s=3.0)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    victim = None
    try:
        w, lid = _ten_acked_adds(hist, bk)
        acked_length = w.lh.length
        # entry 10's write set is slots (1, 2): slot 2 stores it, slot 1 holds
        # it queued in its socket until SIGCONT
        victim = w.lh.metadata.current_ensemble[1]
        cluster.stop_bookie(victim)
        sigstop_etcd(cluster)
        try:
            futs = [w.add_async() for _ in range(3)]
            outcomes = []
            for f in futs:
                try:
                    f.result(HANG_GUARD_S)
                    outcomes.append("ok")
                except errors.BKError as exc:
                    outcomes.append(exc.outcome_known)
            assert outcomes == [False] * 3, outcomes
        finally:
            sigcont_etcd(cluster)
        w.lh.close()                    # while the victim is still paused
        md = bk.get_ledger_metadata(lid)
        assert md.is_closed and md.last_entry_id >= 9
        cluster.resume_bookie(victim)
        cluster.wait_registered(victim)  # its session lapsed while paused
        # The paused bookie now stores the in-flight add it had received (in
        # run 7 it was mid-request; here gRPC dropped the cancelled stream's
        # queued message, so the late landing is replayed at the wire level,
        # the same entry with the writer's own payload and LAC).
        bk.transports.invalidate(victim)
        # "ok", or LedgerFenced once the recovery's fence reached it: both correct
        RawWriter(bk, hist, md, first_entry=10, base_length=acked_length).send(
            10, 9, victim, b"w:10:x", record=False)
        victim = None
        hist.close()
        assert final_check(cluster, hist_dir, [lid]) == []
    finally:
        sigcont_etcd(cluster)
        if victim is not None:
            cluster.resume_bookie(victim)
        bk.close()


def test_chaos_run8_recovery_after_a_crashed_recoverys_ensemble_change(cluster, hist_dir):
    """Chaos seed 2026112207 (30 minutes, ledger 3537): a
    recovery replaced a failed bookie in a new fragment and failed before
    re-writing the entries beyond that boundary.  The next recovery started
    at the LAC and asked only the new ensemble, where the replacement
    answered NoSuchEntry, and closed before acknowledged entries (I1).  Here
    the crashed recovery is scripted as its two metadata CASes."""
    ensure_bookies(cluster, 6)
    bk = client(cluster)
    bk2 = client(cluster, add_timeout_s=2.0, read_timeout_s=3.0)
    hist = History(str(hist_dir / "w.jsonl"), "w")
    frozen = None
    try:
        w = RecordedWriter(hist, bk.create_ledger(4, 2, 2))
        lid = w.lh.ledger_id
        for _ in range(20):             # the bookies' LAC is 18; entry 19 is acknowledged
            assert w.add() == "ok"
        writer_ensemble = w.lh.metadata.current_ensemble
        spare = next(b for b in cluster.bookie_ids if b not in writer_ensemble)
        _in_recovery(bk2, lid)
        bk2.metadata_store.update(ledger_key(lid), lambda r: lm.replace_bookies(
            lm.LedgerMetadata.from_json(r), 19, {3: spare}, by_writer=False).to_json())
        frozen = writer_ensemble[0]     # entry 19's write set is slots (3, 0)
        cluster.stop_bookie(frozen)
        rh = bk2.open_ledger(lid)
        assert rh.metadata.last_entry_id == 19, "closed before an acknowledged entry"
        cluster.resume_bookie(frozen)
        frozen = None
        hist.close()
        assert final_check(cluster, hist_dir, [lid]) == []
    finally:
        if frozen is not None:
            cluster.resume_bookie(frozen)
        bk.close()
        bk2.close()


def test_chaos_found_invalidate_inside_a_grpc_callback_does_not_deadlock(cluster):
    """Found by the 12-minute chaos run (seed 2026, worker loga-28 hung):
    LedgerWriter._on_failed runs in a gRPC callback (the channel's own spin
    thread) and calls transports.invalidate(bookie), which closed the
    channel in place; grpc's channel.close() waits for that very thread, so
    the add never failed over and the writer hung forever."""
    bk = client(cluster)
    try:
        b = cluster.bookie_ids[0]
        invalidated = cf.Future()
        # long polls on an unknown ledger: the short one's answer (an error)
        # arrives later, so its callback runs on the channel's thread while
        # the others are still in flight (close() must cancel them)
        t = bk.transports.get(b)
        others = [t.read_lac(987654321, wait_for_lac_above=5, wait_ms=10000)  # noqa: F841
                  for _ in range(3)]               # kept in flight while the short one answers
        f = t.read_lac(987654321, wait_for_lac_above=5, wait_ms=300)

        def on_done(_f):
            bk.transports.invalidate(b)
            invalidated.set_result(True)
        f.add_done_callback(on_done)
        assert invalidated.result(HANG_GUARD_S)
    finally:
        bk.close()
