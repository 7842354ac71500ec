"""Chaos worker processes: each records its own history (history.py).

    python -m tests.chaos.workers KIND --uri URI --hist FILE --proc NAME
                                  --seed S --until EPOCH [--log NAME]

KIND:
  ledger-writer  creates ledgers with (E, Qw, Qa) drawn from CONFIGS, adds
                 pipelined single entries and batches, closes most ledgers and
                 abandons some (a crashed writer); a handle that failed is
                 abandoned too (its ledger is left to the recoverers).
  log-writer     becomes leader of ``--log`` (fencing the previous leader's
                 ledgers), appends until ``--until`` or until it loses the
                 log (LedgerFenced / any error: it then exits and the runner
                 starts a successor, like a leader-election loop).
  tail-reader    non-fencing: follows OPEN ledgers up to their LAC and tails
                 every log from the earliest position with LogReader.
  recoverer      fencing: recovers OPEN ledgers whose writer's lease is gone,
                 and now and then one whose writer is alive (a false
                 suspicion, the fencing wiki's scenario); reads each
                 recovered ledger completely.
  autorecovery   ``pybk autorecovery``'s loop (admin/operations/autorecovery.py) in a
                 chaos process: a round every ``--interval`` s with no lost-
                 bookie delay, so a bookie whose registration lapses (a
                 bookie <-> etcd partition past its 5 s registration TTL) is
                 re-replicated while it still serves clients (no verify
                 rounds: a round stays short and the worker stops near
                 ``--until``; the final check verifies).  Its open-ledger grace
                 outlasts the run: it copies fragments, it never fences a
                 live writer (the recoverer does that, recording its
                 decisions).  Each round is one history note.
  offloader      offloads every log's closed segments to Parquet files at
                 ``--offload-location`` (logs/offload.py) over and over, with
                 a short grace period so that ledgers leave the bookies while
                 readers and writers run; now and then it stops a segment's
                 offload after one of its steps (stage, verify, publish,
                 commit) as a killed offloader would, leaving the next run
                 orphans to clean.  Each run is one history operation.
Every worker stops by itself at ``--until``; all randomness comes from --seed.
``--plant NAME`` plants a test-only client fault (faulty_client.py) into the
worker's BookKeeper: how the chaos tests check that the checker sees it.
"""
from __future__ import annotations

import argparse
import collections
import concurrent.futures as cf
import faulthandler
import os
import signal
import random
import sys
import time

from pybk_spark import errors
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.logs.log_writer import LogWriter, RollPolicy
from pybk_spark.logs.log_reader import LogReader
from pybk_spark.protocol import ledger_metadata as lm

from . import availability as avail
from .history import History, digest, make_payload

# (E, Qw, Qa): every config has Qa >= 2 (one bookie fault never loses an ack),
# E <= 4 so that with 5 bookies and one faulty an ensemble change always finds
# a replacement.
CONFIGS = [(3, 2, 2), (3, 3, 2), (4, 3, 2), (4, 2, 2), (3, 3, 3)]
CLIENT_CONF = {"explicit_lac_interval_ms": 500}
WINDOW = 16                 # pipelined operations per writer
HANG_GUARD_S = 60.0         # a client future not done by then: dump threads, exit 3


class HungClient(RuntimeError):
    pass


_PLANT: str | None = None          # --plant (faulty_client.py), test-only
_ADD_PAUSE_S = 0.0                 # --add-pause: a ledger writer's pause after each add


def _bk(uri: str, hist: History) -> BookKeeper:
    """Every fencing recovery this client runs (recoverer opens, a log
    leader's take-over, closes by recovery) records its own decision."""
    bk = BookKeeper(uri, conf=CLIENT_CONF, recovery_listener=hist.recovery)
    if _PLANT:
        from .faulty_client import plant
        plant(bk, _PLANT)
    return bk


def _settle(fut: cf.Future) -> None:
    try:
        fut.result(timeout=HANG_GUARD_S)
    except cf.TimeoutError:
        print(f"worker: a client future did not complete in {HANG_GUARD_S}s", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        raise HungClient("client future hung") from None
    except BaseException:  # noqa: BLE001 - recorded by the callback
        pass


# -- ledger writer ------------------------------------------------------------------------
def ledger_writer(uri, hist: History, rng: random.Random, until: float) -> None:
    bk = _bk(uri, hist)
    seq = 0
    while time.time() < until:
        e, qw, qa = rng.choice(CONFIGS)
        op = hist.invoke("create", ensemble=e, wq=qw, aq=qa)
        try:
            lh = bk.create_ledger(e, qw, qa)
        except Exception as exc:  # noqa: BLE001
            hist.error(op, "create", exc)
            time.sleep(rng.uniform(0.2, 1.0))
            continue
        lid = lh.ledger_id
        hist.ok(op, "create", ledger=lid, ensemble=e, wq=qw, aq=qa)
        bad = []
        pending: collections.deque = collections.deque()
        for _ in range(rng.randrange(20, 150)):
            if bad or time.time() >= until:
                break
            n = 1 if rng.random() < 0.6 else rng.randrange(2, 25)
            payloads = [make_payload(hist.proc, seq + i, rng) for i in range(n)]
            seq += n
            op = hist.invoke("add", ledger=lid, digests=[digest(p) for p in payloads])
            if n == 1:
                fut = lh.add_entry_async(payloads[0])
            else:
                fut = lh.add_entries_async(payloads)[0]  # < add_batch_entries: one chunk
            fut.add_done_callback(_add_done(hist, op, lid, bad))
            pending.append(fut)
            while len(pending) > WINDOW:
                _settle(pending.popleft())
            if rng.random() < 0.05:
                time.sleep(rng.uniform(0.0, 0.3))
            if _ADD_PAUSE_S:
                time.sleep(_ADD_PAUSE_S)
        for fut in pending:
            _settle(fut)
        if bad or rng.random() < 0.15:
            hist.note("abandon", ledger=lid)
            continue            # left OPEN: a recoverer must close it
        op = hist.invoke("close", ledger=lid)
        try:
            lh.close()
            hist.ok(op, "close", ledger=lid, last=lh.metadata.last_entry_id)
        except Exception as exc:  # noqa: BLE001
            hist.error(op, "close", exc, ledger=lid)
    bk.close()


def _add_done(hist: History, op: int, lid: int, bad: list):
    def done(f: cf.Future) -> None:
        exc = f.exception()
        if exc is None:
            res = f.result()
            first = res if isinstance(res, int) else res[0]
            hist.ok(op, "add", ledger=lid, entry=first)
        else:
            bad.append(hist.error(op, "add", exc, ledger=lid))
    return done


# -- log writer -----------------------------------------------------------------------------
def log_writer(uri, hist: History, rng: random.Random, until: float, log: str) -> None:
    bk = _bk(uri, hist)
    e, qw, qa = rng.choice(CONFIGS)
    writer = LogWriter(bk, log, ensemble=e, write_quorum=qw, ack_quorum=qa,
                       roll_policy=RollPolicy(max_entries=rng.randrange(30, 150)))
    op = hist.invoke("lead", log=log)
    try:
        writer.open()
    except Exception as exc:  # noqa: BLE001
        hist.error(op, "lead", exc, log=log)
        return
    hist.ok(op, "lead", log=log, ledger=writer.current_ledger_id)
    bad: list = []
    pending: collections.deque = collections.deque()
    seq = 0
    while time.time() < until and not bad:
        payload = make_payload(hist.proc, seq, rng)
        seq += 1
        op = hist.invoke("append", log=log, digests=[digest(payload)])
        try:
            fut = writer.append_async(payload)
        except Exception as exc:  # noqa: BLE001 - roll failed / lost leadership
            bad.append(hist.error(op, "append", exc, log=log))
            break
        fut.add_done_callback(_append_done(hist, op, log, bad))
        pending.append(fut)
        while len(pending) > WINDOW // 2:
            _settle(pending.popleft())
        if rng.random() < 0.05:
            time.sleep(rng.uniform(0.0, 0.2))
    for fut in pending:
        _settle(fut)
    if not bad:
        op = hist.invoke("close", log=log)
        try:
            writer.close()
            hist.ok(op, "close", log=log)
        except Exception as exc:  # noqa: BLE001
            hist.error(op, "close", exc, log=log)
    bk.close()


def _append_done(hist: History, op: int, log: str, bad: list):
    def done(f: cf.Future) -> None:
        exc = f.exception()
        if exc is None:
            p = f.result()
            hist.ok(op, "append", log=log, ledger=p.ledger_id, entry=p.entry_id,
                    pos=[p.ledger_index, p.ledger_id, p.entry_id])
        else:
            bad.append(hist.error(op, "append", exc, log=log))
    return done


# -- readers --------------------------------------------------------------------------------
def _read_range(hist: History, rh, lid: int, first: int, last: int) -> int:
    """Read [first, last] recording one read op; returns the next id to read."""
    op = hist.invoke("read", ledger=lid, entry=first)
    try:
        got = rh.read(first, last)
    except Exception as exc:  # noqa: BLE001
        hist.error(op, "read", exc, ledger=lid, entry=first)
        return first
    from .checker import log_payload
    hist.ok(op, "read", ledger=lid, entry=first,
            digests=[digest(log_payload(rh.metadata.custom, x.payload)) for x in got])
    return first + len(got)


def tail_reader(uri, hist: History, rng: random.Random, until: float) -> None:
    bk = _bk(uri, hist)
    log_readers: dict[str, list] = {}     # log -> [LogReader, session, offset]
    sessions = 0
    while time.time() < until:
        try:
            _tail_one_ledger(bk, hist, rng, until)
        except Exception:  # noqa: BLE001 - metadata hiccup etc.
            pass
        try:
            logs = [k.split("/", 1)[1] for k, _ in bk.metadata_store.list_prefix("logs/")]
        except Exception:  # noqa: BLE001
            logs = []
        for name in logs:
            state = log_readers.get(name)
            if state is None:
                try:
                    state = [LogReader(bk, name, poll_timeout_s=0.5), sessions, 0]
                except Exception:  # noqa: BLE001
                    continue
                sessions += 1
                log_readers[name] = state
            reader, session, offset = state
            op = hist.invoke("read", log=name, session=session, offset=offset)
            try:
                recs = reader.read_available(max_entries=2000)
            except Exception as exc:  # noqa: BLE001 - restart this reader from scratch
                hist.error(op, "read", exc, log=name, session=session, offset=offset)
                log_readers.pop(name, None)
                continue
            hist.ok(op, "read", log=name, session=session, offset=offset,
                    digests=[digest(r.payload) for r in recs])
            state[2] = offset + len(recs)
        time.sleep(rng.uniform(0.1, 0.5))
    bk.close()


def _tail_one_ledger(bk, hist, rng, until) -> None:
    ids = bk.list_ledgers()
    if not ids:
        return
    lid = rng.choice(ids[-20:])
    try:
        rh = bk.open_ledger(lid, recovery=False)
    except errors.NoSuchLedger:
        return
    nxt = 0
    for _ in range(rng.randrange(1, 6)):
        if time.time() >= until:
            return
        lac = rh.read_last_add_confirmed()
        if lac >= nxt:
            nxt = _read_range(hist, rh, lid, nxt, min(lac, nxt + 999))
        if rh.is_closed and nxt > rh.last_add_confirmed:
            return
        time.sleep(rng.uniform(0.05, 0.3))


def recoverer(uri, hist: History, rng: random.Random, until: float,
              p_fence_live: float = 0.03) -> None:
    bk = _bk(uri, hist)
    while time.time() < until:
        try:
            ids = bk.list_ledgers()
        except Exception:  # noqa: BLE001
            ids = []
        rng.shuffle(ids)
        for lid in ids[:30]:
            if time.time() >= until:
                break
            try:
                md = bk.get_ledger_metadata(lid)
                if md.state == lm.CLOSED:
                    continue
                if bk.is_writer_alive(lid) and rng.random() >= p_fence_live:
                    continue
            except Exception:  # noqa: BLE001
                continue
            recover_and_read(bk, hist, lid)
        time.sleep(rng.uniform(0.3, 1.0))
    bk.close()


def recover_and_read(bk, hist: History, lid: int):
    op = hist.invoke("recover", ledger=lid)
    try:
        rh = bk.open_ledger(lid, recovery=True)
    except Exception as exc:  # noqa: BLE001
        hist.error(op, "recover", exc, ledger=lid)
        return None
    last = rh.last_add_confirmed
    hist.ok(op, "recover", ledger=lid, last=last)
    nxt = 0
    while nxt <= last:
        got = _read_range(hist, rh, lid, nxt, min(last, nxt + 999))
        if got == nxt:
            break
        nxt = got
    return rh


AUTORECOVERY_LEADER_TTL_S = 15     # the daemon's default (--leader-ttl)


def autorecovery(uri, hist: History, rng: random.Random, until: float,
                 interval: float = 2.0) -> None:
    from pybk_spark.admin.operations.autorecovery import AutoRecovery, AutoRecoveryConfig
    bk = _bk(uri, hist)
    conf = AutoRecoveryConfig(interval_s=interval, lost_bookie_delay_s=0.0, grace_s=3600.0,
                              leader_ttl_s=AUTORECOVERY_LEADER_TTL_S, verify_every=0)
    ar = AutoRecovery(bk, uri, conf, identity=hist.proc)

    def wait(seconds: float) -> bool:
        left = until - time.time()
        time.sleep(max(0.0, min(seconds, left)))
        return time.time() >= until

    def emit(row: dict) -> None:
        hist.note("autorecovery", leadership=avail.leadership_of(row),
                  **{k: row[k] for k in ("lost", "fragments_copied", "fragments_failed",
                                         "failed_by_reason", "error")
                     if k in row})
        print(f"autorecovery: {row}", flush=True)
    try:
        ar.run_forever(wait, emit)
    finally:
        bk.close()


# -- offloader --------------------------------------------------------------------------------
OFFLOAD_GRACE_S = 3.0          # commit -> ledger deletion: readers that planned on it finish
OFFLOAD_STOP_CHANCE = 0.2      # a run that stops one segment's offload after a step
OFFLOAD_STEPS = ("stage", "verify", "publish", "commit")


def offloader(uri, hist: History, rng: random.Random, until: float, location: str) -> None:
    from pybk_spark.logs import offload
    from pybk_spark.logs.log import list_logs, read_log
    from pybk_spark.protocol import offload as decide
    # one offloader: its own stopped runs' files are orphans at once
    policy = decide.OffloadPolicy(keep_segments=2, grace_s=OFFLOAD_GRACE_S, orphan_age_s=0)
    bk = _bk(uri, hist)
    try:
        while time.time() < until:
            try:
                names = list_logs(bk.metadata_store)
            except Exception:  # noqa: BLE001 - etcd restarting
                names = []
            for name in names:
                if time.time() >= until:
                    break
                if rng.random() < OFFLOAD_STOP_CHANCE:
                    step = rng.choice(OFFLOAD_STEPS)
                    op = hist.invoke("offload_stopped", log=name, step=step)
                    try:
                        md = read_log(bk.metadata_store, name)[0]
                        picks = decide.candidates(md, policy, int(time.time() * 1e6))
                        if picks:
                            staged = offload.stage_segment(bk, name, picks[0], location)
                            if step != "stage":
                                offload.verify_staged(staged)
                            if step in ("publish", "commit"):
                                offload.publish_staged(bk, staged)
                            if step == "commit":
                                offload.commit_staged(bk, staged)
                        hist.ok(op, "offload_stopped", log=name, step=step, segments=picks[:1])
                    except Exception as exc:  # noqa: BLE001 - faults: the next run carries on
                        hist.error(op, "offload_stopped", exc, log=name, step=step)
                    continue
                op = hist.invoke("offload", log=name)
                try:
                    report = offload.offload_log(bk, name, location, policy)
                    hist.ok(op, "offload", log=name, offloaded=report.offloaded,
                            deleted=report.ledgers_deleted, orphans=len(report.orphans_removed))
                except Exception as exc:  # noqa: BLE001 - faults: the next run carries on
                    hist.error(op, "offload", exc, log=name)
            time.sleep(rng.uniform(0.5, 2.0))
    finally:
        bk.close()


# -- entry point ------------------------------------------------------------------------------
KINDS = {"ledger-writer": ledger_writer, "log-writer": log_writer,
         "tail-reader": tail_reader, "recoverer": recoverer, "autorecovery": autorecovery,
         "offloader": offloader}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tests.chaos.workers")
    p.add_argument("kind", choices=sorted(KINDS))
    p.add_argument("--uri", required=True)
    p.add_argument("--hist", required=True)
    p.add_argument("--proc", required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--until", type=float, required=True)
    p.add_argument("--log")
    p.add_argument("--plant", help="a test-only client fault (faulty_client.PLANTS)")
    p.add_argument("--fence-live", type=float, default=0.03,
                   help="recoverer: chance to recover a ledger whose writer is alive")
    p.add_argument("--lease-ttl", type=int, help="writer_lease_ttl_s of this worker's client")
    p.add_argument("--offload-location", help="offloader: where the Parquet files go")
    p.add_argument("--add-pause", type=float, default=0.0,
                   help="ledger-writer: seconds to pause after each add (longer-lived ledgers)")
    a = p.parse_args(argv)
    global _PLANT, _ADD_PAUSE_S
    _PLANT, _ADD_PAUSE_S = a.plant, a.add_pause
    if a.lease_ttl:
        CLIENT_CONF["writer_lease_ttl_s"] = a.lease_ttl
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    hist = History(a.hist, a.proc)
    rng = random.Random(a.seed)
    try:
        if a.kind == "log-writer":
            log_writer(a.uri, hist, rng, a.until, a.log)
        elif a.kind == "offloader":
            offloader(a.uri, hist, rng, a.until, a.offload_location)
        elif a.kind == "recoverer":
            recoverer(a.uri, hist, rng, a.until, p_fence_live=a.fence_live)
        else:
            KINDS[a.kind](a.uri, hist, rng, a.until)
    except HungClient:
        hist.note("hung")
        hist.close()
        sys.stdout.flush()
        os._exit(3)   # pending operations stay invoke-only = unknown
    finally:
        hist.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
