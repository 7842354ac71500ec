"""Re-replication of fragments that had a replica on a lost (or decommissioned)
bookie, and the ``--verify`` replicas check (``pybk rereplicate``,
``pybk decommission``, jobs/rereplicate.py).

Theory of operation
-------------------
Driver (``run_audit``, pure decisions in ``admin.audit``):
  1. registered = writable + read-only registrations; known = cookies +
     every bookie named in some ensemble.  Missing bookies get their
     first-seen time recorded (``audit/missing/<id>``, put-if-absent), ones
     that came back have it removed (CAS delete).  Lost = missing for
     >= ``delay_s``, decommissioned (``audit/decommissioned/<id>``) or named.
  2. Per ledger: complete fragments touching a lost bookie become work; the
     last fragment of a not-closed ledger is DEFERred or FENCEd (recovered,
     which closes it; then the driver audits again).
  3. A replacement per work item from the placement policy, outside the
     fragment's ensemble and every lost bookie.
Task (``copy_fragment``, one per work item; a Spark task or in-process):
  4'. Bookie to bookie first (admin/operations/bookie_copy.py): the replacement pulls
     the ids from the same replicas, in the same order, as stored Arrow
     rows, checks digests and journals them (``PullEntries``); no entry
     passes through this client.  If the pull path cannot finish (an older
     bookie, TLS, a failure) steps 4-5 run instead, the client path:
  4. The ids the lost slot must hold (``entry_sets.slot_entries``) are read
     from replicas, largest holder first (the lost bookie itself first when
     it is still up, as in a decommission), rows kept byte-for-byte (lac and
     digest unchanged) iff their digest verifies and the id is still wanted
     (``read_decisions.copy_rows``; a corrupt row is read from the next
     source).
  5. They are written to the replacement with RECOVERY adds (the ledger may
     be fenced) in Arrow batches of up to ``batch_entries`` rows, each one
     durable before it is acknowledged.
  6. Only then the fragment's ensemble is CASed (``replace_fragment_bookie``;
     re-decided on every conflict, a no-op if someone already did it).
Verify (``verify_ledger``): every slot of every complete fragment is read
for the ids it must hold; ids it lacks are reported (bookie, ranges).
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from pybk_spark.ledger.port import LedgerClient
from pybk_spark import errors
from pybk_spark.admin.decisions import audit
from pybk_spark.admin.decisions import entry_sets as es
from pybk_spark.admin.operations.bookie_copy import pull_fragment
from pybk_spark.admin.operations.recover import access_key, recover_with
from pybk_spark.admin.operations.replica_reads import read_ids
from pybk_spark.wire.digest import Digester
from pybk_spark.metadata.store import MetadataStore, ledger_key
from pybk_spark.ledger.placement import writable_bookies
from pybk_spark.protocol import ledger_metadata as lm
from pybk_spark.protocol import read_decisions as rd
from pybk_spark.wire.entries import ENTRY_SCHEMA, batch_to_bytes, one_batch
from pybk_spark.metadata import keys

SPARSE_READ_ENTRIES = 5000      # ids per sparse read (bookie cap: max_read_entries)
COPY_COLUMNS = ["ledger", "fragment", "lost", "replacement", "entries", "mb", "seconds",
                "outcome", "error"]
VERIFY_COLUMNS = ["ledger", "fragment", "bookie", "missing", "entries"]


# -- registry / marks -------------------------------------------------------------------------
def registered_bookies(store: MetadataStore) -> set[str]:
    out = set()
    for mode in ("writable", "readonly"):
        out |= {k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.bookies_prefix(mode))}
    return out


def read_marks(store: MetadataStore, prefix: str) -> dict[str, tuple[float, int]]:
    """bookie -> (time, version) recorded under ``prefix``."""
    out = {}
    for key, v in store.list_prefix(prefix):
        try:
            t = float(json.loads(v.value)["since"])
        except (ValueError, KeyError, TypeError):
            t = 0.0
        out[key.rsplit("/", 1)[1]] = (t, v.version)
    return out


def mark_decommissioned(store: MetadataStore, bookie_id: str, now: float) -> None:
    try:
        store.put_if_absent(audit.DECOMMISSIONED_PREFIX + bookie_id,
                            json.dumps({"since": now}).encode())
    except errors.MetadataVersion:
        pass  # already marked


def clear_decommissioned(store: MetadataStore, bookie_id: str) -> None:
    store.delete(audit.DECOMMISSIONED_PREFIX + bookie_id)


# -- audit ----------------------------------------------------------------------------------------
@dataclass
class AuditResult:
    lost: dict = field(default_factory=dict)          # bookie -> lost since
    registered: set = field(default_factory=set)
    work: list = field(default_factory=list)          # [FragmentWork] with replacements
    fence: list = field(default_factory=list)         # ledger ids to fence+recover
    deferred: list = field(default_factory=list)      # [{ledger, reason}]
    unplaced: list = field(default_factory=list)      # [copy rows] no replacement available
    ledgers: int = 0


def run_audit(bk: LedgerClient, *, delay_s: float = 0.0, grace_s: float = 30.0, named: Iterable[str] = (),
              now: float | None = None, mark: bool = True, plan: bool = True) -> AuditResult:
    store = bk.metadata_store
    now = time.time() if now is None else now
    res = AuditResult(registered=registered_bookies(store))
    mds = []
    for lid in bk.list_ledgers():
        try:
            mds.append(bk.get_ledger_metadata(lid))
        except errors.NoSuchLedger:
            continue
    res.ledgers = len(mds)
    cookies = [k.rsplit("/", 1)[1] for k, _ in store.list_prefix(keys.COOKIES_PREFIX)]
    known = audit.known_bookies(cookies, mds)
    marks = read_marks(store, audit.MISSING_PREFIX)
    if mark:
        changes = audit.track_missing(known, res.registered, {b: t for b, (t, _v) in marks.items()})
        for b in changes.mark:
            try:
                store.put_if_absent(audit.MISSING_PREFIX + b, json.dumps({"since": now}).encode())
            except errors.MetadataVersion:
                pass                      # another auditor saw it first: its time stands
        for b in changes.clear:
            try:
                store.delete(audit.MISSING_PREFIX + b, expected_version=marks[b][1])
            except errors.MetadataVersion:
                pass
        marks = read_marks(store, audit.MISSING_PREFIX)
    first_seen = {b: t for b, (t, _v) in marks.items() if b not in res.registered}
    decom = {b: t for b, (t, _v) in read_marks(store, audit.DECOMMISSIONED_PREFIX).items()}
    res.lost = audit.lost_bookies(first_seen, now, delay_s, decommissioned=list(decom),
                                  named=list(named))
    for b, t in decom.items():
        res.lost[b] = min(res.lost[b], t)
    work = []
    for md in mds:
        la = audit.audit_ledger(md, res.lost, now, grace_s, bk.is_writer_alive(md.ledger_id))
        work.extend(la.work)
        if la.open_action == audit.FENCE:
            res.fence.append(md.ledger_id)
        elif la.open_action == audit.DEFER:
            res.deferred.append({"ledger": md.ledger_id, "reason": la.reason})
    if plan and work:
        candidates = {b: reg for b, reg in writable_bookies(store).items() if b not in res.lost}
        why_not = _not_candidates(store, res, decom, now)

        def choose(ens: tuple[str, ...], slot: int, ex: set[str]) -> str:
            try:
                return bk.placement.replace(ens, slot, candidates, ex)
            except errors.NotEnoughBookies as exc:
                raise exc.excluding(why_not) from None
        res.work, unplaced = audit.plan_replacements(work, res.lost, choose)
        # plan_replacements leaves unplaced only what the placement refused
        res.unplaced = [{"ledger": w.ledger_id, "fragment": f"{w.first}-{w.last}",
                         "lost": w.lost, "replacement": None, "entries": 0, "bytes": 0,
                         "mb": 0.0, "seconds": 0.0, "outcome": "failed",
                         "error": f"{type(exc).__name__}: {exc}",
                         "reason": type(exc).__name__, "ensemble": list(exc.ensemble),
                         "excluded": exc.excluded}
                        for w, exc in unplaced]
    else:
        res.work = work
    return res


def _not_candidates(store: MetadataStore, res: AuditResult, decom: dict, now: float) -> dict[str, str]:
    """Every known bookie that cannot take a replacement -> why (named in a
    NotEnoughBookies, so an operator sees what would fix it)."""
    readonly = {keys.last_part(k) for k, _ in store.list_prefix(keys.bookies_prefix("readonly"))}
    out = {b: (f"lost (unregistered for {now - t:.0f}s)" if b not in decom else
               "lost (being decommissioned)") for b, t in res.lost.items()}
    for b in sorted(decom):
        out.setdefault(b, "being decommissioned")
    for b in sorted(readonly):
        out.setdefault(b, "registered read-only")
    return out


def failed_ledgers(rows: Iterable[dict]) -> list[dict]:
    """One entry per ledger with a failed copy row, in ledger order: its
    first failure's ``reason`` and ``error`` (which names what would fix
    it), how many fragments failed, and the ``excluded`` bookies of a
    NotEnoughBookies."""
    out: dict[int, dict] = {}
    for r in rows:
        if r["outcome"] != "failed":
            continue
        got = out.get(r["ledger"])
        if got is None:
            out[r["ledger"]] = got = {"ledger": r["ledger"], "reason": r.get("reason") or "unknown",
                                      "error": r.get("error", ""), "fragments": 0}
            if r.get("excluded") is not None:
                got["ensemble"], got["excluded"] = r.get("ensemble", []), r["excluded"]
        got["fragments"] += 1
    return [out[k] for k in sorted(out)]


def failed_ledgers_text(failed: list[dict], limit: int = 5) -> str:
    """``ledger 12: NotEnoughBookies: ...; ledger 13: ...; and 4 more``."""
    shown = [f"ledger {f['ledger']}: {f['error'] or f['reason']}" for f in failed[:limit]]
    if len(failed) > limit:
        shown.append(f"and {len(failed) - limit} more (--json lists all)")
    return "; ".join(shown)


# -- copy one fragment -------------------------------------------------------------------------
def copy_fragment(bk: LedgerClient, w: audit.FragmentWork, password: Optional[bytes] = None, *,
                  batch_entries: int = 5000, batch_bytes: int = 8 << 20,
                  clock: Callable[[], float] = time.monotonic, pull: bool = True,
                  pull_timeout_s: float = 600.0) -> dict:
    """Copy the lost slot's entries to the replacement, then CAS the fragment.
    Bookie to bookie when ``pull`` and the bookies can (row ``path`` =
    ``pull``), else through this client (``client``; ``pull_error`` says why).
    Never raises: the outcome is in the row (a failure's ``reason``: the
    error's class name, ``error``: with its message)."""
    t0 = clock()
    row: dict = {"ledger": w.ledger_id, "fragment": f"{w.first}-{w.last}", "lost": w.lost,
           "replacement": w.replacement, "entries": 0, "bytes": 0, "mb": 0.0, "seconds": 0.0,
           "outcome": "failed", "error": "", "reason": ""}
    try:
        md = bk.get_ledger_metadata(w.ledger_id)
        if not _fragment_still_has(md, w):
            row["outcome"] = "already-done"
            return row
        key, digester = access_key(bk, md, password)
        pulled = None
        if pull:
            try:
                pulled = pull_fragment(bk, w, md.write_quorum, key, digester.digest_type,
                                       w.lost in registered_bookies(bk.metadata_store),
                                       pull_timeout_s)
            except errors.BKError as exc:      # fall back to the client path
                row["pull_error"] = f"{type(exc).__name__}: {exc}"
        if pulled is not None:
            row["entries"], row["bytes"], row["path"] = pulled[0], pulled[1], "pull"
        else:
            rows = _gather(bk, md, w, key, digester)
            row["entries"], row["bytes"], row["path"] = rows.num_rows, int(rows.nbytes), "client"
            _write(bk, w, key, rows, batch_entries, batch_bytes)
        store = bk.metadata_store
        store.update(ledger_key(w.ledger_id), lambda raw: lm.replace_fragment_bookie(
            lm.LedgerMetadata.from_json(raw), w.first, w.lost, w.replacement).to_json())
        row["outcome"] = "replicated"
    except errors.NoSuchLedger:
        row.update(outcome="deleted", error="ledger deleted meanwhile")
    except errors.BKError as exc:
        row.update(error=f"{type(exc).__name__}: {exc}", reason=type(exc).__name__)
    except Exception as exc:  # noqa: BLE001 - a task reports, it does not crash the job
        row.update(error=f"unexpected {type(exc).__name__}: {exc}", reason=type(exc).__name__)
    finally:
        row["seconds"] = round(clock() - t0, 3)
        row["mb"] = round(row["bytes"] / 1e6, 3)
    return row


def _fragment_still_has(md: lm.LedgerMetadata, w: audit.FragmentWork) -> bool:
    for first, bookies in md.ensembles:
        if first == w.first:
            return w.lost in bookies
    return False


def _gather(bk: LedgerClient, md: lm.LedgerMetadata, w: audit.FragmentWork, key: bytes,
            digester: Digester, wanted: Optional[np.ndarray] = None) -> pa.Table:
    """Entries of ``w.slot`` (or just ``wanted``) read from surviving replicas."""
    E, Qw = len(w.ensemble), md.write_quorum
    remaining = es.slot_entries(w.first, w.last, E, Qw, w.slot) if wanted is None else wanted
    pieces: list[pa.Table] = []
    conf = bk.conf
    sources = es.ReplicaSources(E, Qw, w.slot, lost_first=(
        wanted is None and w.lost in registered_bookies(bk.metadata_store)))
    tried_errors = []
    while (nxt := sources.next(remaining)) is not None:
        slot, ids = nxt
        got = read_ids(bk.transports.get(w.ensemble[slot]), w.ledger_id, ids, key,
                       max_entries=SPARSE_READ_ENTRIES, max_bytes=conf.read_batch_bytes,
                       timeout=conf.read_timeout_s)
        if got.unreachable:
            tried_errors.append(f"{w.ensemble[slot]}: {got.unreachable}")
        t = got.table()
        if t is None:
            continue
        keep = rd.copy_rows(t.column("entry_id").to_numpy(), digester.verify_batch(t), remaining)
        t = t.filter(pa.array(keep))
        pieces.append(t)
        remaining = np.setdiff1d(remaining, t.column("entry_id").to_numpy())
    if len(remaining):
        raise errors.ReadError(f"no surviving intact replica for entries "
                               f"{es.ranges_text(remaining)}" +
                               (f" ({'; '.join(tried_errors)})" if tried_errors else ""),
                               ledger_id=w.ledger_id)
    if not pieces:
        return ENTRY_SCHEMA.empty_table()
    table = pa.concat_tables(pieces)
    return table.sort_by("entry_id").combine_chunks()


def _write(bk: LedgerClient, w: audit.FragmentWork, key: bytes, rows: pa.Table, batch_entries: int,
           batch_bytes: int) -> None:
    if rows.num_rows == 0:
        return
    target = bk.transports.get(w.replacement)
    futs = []
    for batch in _chunks(rows, batch_entries, batch_bytes):
        futs.append(target.add(w.ledger_id, key, batch_to_bytes(batch), recovery=True,
                               timeout=max(bk.conf.add_timeout_s, 30.0)))
    for f in futs:
        f.result()            # raises the typed error of a failed add


def _chunks(rows: pa.Table, max_entries: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
    batch = one_batch(rows) if rows.num_rows else None
    if batch is None:
        return
    sizes = np.cumsum(pc.binary_length(batch.column("payload")).to_numpy(
        zero_copy_only=False))
    start = 0
    n = batch.num_rows
    while start < n:
        base = sizes[start - 1] if start else 0
        by_bytes = int(np.searchsorted(sizes, base + max_bytes, side="right"))
        end = max(start + 1, min(n, start + max_entries, by_bytes))
        yield batch.slice(start, end - start)
        start = end


# -- verify ------------------------------------------------------------------------------------------
def verify_ledger(bk: LedgerClient, ledger_id: int, password: Optional[bytes] = None, *,
                  repair: bool = False, bookies: Optional[set[str]] = None,
                  copied: Optional[list[np.ndarray]] = None) -> list[dict]:
    """Under-replicated (fragment, bookie) rows of one ledger; [] if healthy.

    With ``repair``, copies a live bookie lacks (an entry acknowledged at Qa
    whose other writes failed before an ensemble change, or one it lost to
    damage) are filled in from the other replicas with recovery adds, like
    BookKeeper's auditor does; only what could not be repaired is reported.
    ``bookies``: check only these bookies' slots; ``copied``: gets the id
    array of every fill-in."""
    try:
        md = bk.get_ledger_metadata(ledger_id)
    except errors.NoSuchLedger:
        return []
    key, digester = access_key(bk, md, password, check=False)
    conf = bk.conf
    out: list[dict] = []
    only = bookies
    for first, last, ensemble in md.fragments():
        if last == -1:
            continue            # still being written: checked once closed
        E, Qw = len(ensemble), md.write_quorum
        for slot, b in enumerate(ensemble):
            if only is not None and b not in only:
                continue
            want = es.slot_entries(first, last, E, Qw, slot)
            got = read_ids(bk.transports.get(b), ledger_id, want, key,
                           max_entries=SPARSE_READ_ENTRIES,
                           max_bytes=conf.read_batch_bytes, timeout=conf.read_timeout_s)
            missing = np.setdiff1d(want, got.present_ids())
            if len(missing) and repair and not got.unreachable:
                before = missing
                missing = _fill_in(bk, md, first, last, ensemble, slot, missing, key, digester)
                if copied is not None and len(before) > len(missing):
                    copied.append(np.setdiff1d(before, missing))
            if len(missing):
                out.append({"ledger": ledger_id, "fragment": f"{first}-{last}", "bookie": b,
                            "missing": int(len(missing)), "entries": es.ranges_text(missing),
                            "error": got.unreachable})
    return out


def _fill_in(bk: LedgerClient, md: lm.LedgerMetadata, first: int, last: int,
             bookies: Sequence[str], slot: int,
             missing: np.ndarray, key: bytes, digester: Digester) -> np.ndarray:
    """Recovery-add ``missing`` to the live bookie at ``slot``; what is still missing."""
    w = audit.FragmentWork(md.ledger_id, first, last, tuple(bookies), slot,
                           lost=bookies[slot], replacement=bookies[slot])
    try:
        rows = _gather(bk, md, w, key, digester, wanted=missing)
        _write(bk, w, key, rows, 5000, 8 << 20)
    except errors.BKError:
        return missing
    return np.setdiff1d(missing, rows.column("entry_id").to_numpy())


# -- in-process driver ----------------------------------------------------------------------------
def fence_open_ledgers(bk: LedgerClient, ids: Iterable[int], password: Optional[bytes] = None) -> list[dict]:
    return [recover_with(bk, lid, password) for lid in ids]


def failure_reasons(rows: Iterable[dict]) -> dict[str, int]:
    """Failed copy rows counted by ``reason`` (an error class name;
    "unknown" for a row without one), most frequent first."""
    counts: dict[str, int] = {}
    for r in rows:
        if r["outcome"] == "failed":
            reason = r.get("reason") or "unknown"
            counts[reason] = counts.get(reason, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def copy_summary(rows: list[dict], seconds: float) -> dict:
    total = sum(r["bytes"] for r in rows)
    return {"fragments": len(rows), "entries": sum(r["entries"] for r in rows),
            "bytes": total, "seconds": round(seconds, 3),
            "mb_per_s": round((total / 1e6) / seconds, 2) if seconds > 0 else 0.0,
            "failed": sum(1 for r in rows if r["outcome"] == "failed")}
