"""Pending-add ordering and ensemble-change decisions (property tests)."""
import numpy as np
from hypothesis import given, settings, strategies as st

from pybk_spark.protocol.pending_adds import PendingAdds


def test_release_in_order_only():
    p = PendingAdds(2, 2, ("a", "b", "c"))
    ids = p.assign(3)
    assert ids == [0, 1, 2]
    # entry 1 fully acked first: not released before 0
    for t in p.targets(1):
        assert p.on_ack(1, t.slot, t.bookie) == []
    t0 = p.targets(0)
    assert p.on_ack(0, t0[0].slot, t0[0].bookie) == []
    assert p.on_ack(0, t0[1].slot, t0[1].bookie) == [0, 1]
    assert p.lac == 1


def test_assigned_beyond_lac_survives_abort():
    """The close decision after an abort: ids handed out but never released
    have an unknown outcome, so the writer must close by fencing recovery."""
    p = PendingAdds(2, 2, ("a", "b", "c"))
    assert not p.assigned_beyond_lac
    p.assign(2)
    for t in p.targets(0):
        p.on_ack(0, t.slot, t.bookie)
    assert p.lac == 0 and p.assigned_beyond_lac
    assert p.abort() == [1]
    assert p.assigned_beyond_lac            # still true: entry 1 may land later
    q = PendingAdds(2, 2, ("a", "b", "c"))
    q.assign(1)
    for t in q.targets(0):
        q.on_ack(0, t.slot, t.bookie)
    q.abort()
    assert not q.assigned_beyond_lac        # everything handed out was released


def test_ensemble_change_boundary_and_hold():
    p = PendingAdds(2, 2, ("a", "b", "c"))
    p.assign(4)
    for e in (0,):
        for t in p.targets(e):
            p.on_ack(e, t.slot, t.bookie)
    assert p.lac == 0
    ch = p.on_failure(1, "b")
    assert ch.first_entry == 1 and ch.slots == (1,)
    assert p.on_failure(1, "b") is None                  # duplicate report
    # acks from healthy slots are held while the change is pending (#1591)
    for e in (2, 3):
        for t in p.targets(e):
            assert t.slot != 1
            assert p.on_ack(e, t.slot, t.bookie) == []
    assert p.on_ack(1, 1, "b") == []                     # replaced slot ignored (#4651)
    released, resends, nxt = p.commit_change(("a", "d", "c"))
    assert nxt is None
    assert [(r.slot, r.bookie, r.first, r.last) for r in resends] == [(1, "d", 1, 3)]
    assert resends[0].entry_ids().tolist() == [1, 3]    # write sets with slot 1
    assert released == []                                # 1 still needs slot 1 (now d)
    assert p.on_ack(1, 1, "b") == []                     # old bookie, same slot: ignored
    assert p.on_ack(1, 2, "c") == []
    assert p.on_ack(1, 1, "d") == [1, 2]                 # 2 was complete on slots 2, 0
    assert p.on_ack(3, 1, "d") == [3]
    assert p.lac == 3


def test_failure_queued_during_pending_change():
    p = PendingAdds(3, 2, ("a", "b", "c"))
    p.assign(2)
    ch = p.on_failure(0, "a")
    assert p.on_failure(2, "c") is None
    _, resends, nxt = p.commit_change(("x", "b", "c"))
    assert nxt is not None and nxt.slots == (2,) and nxt.first_entry == ch.first_entry
    assert all(s.slot != 2 for s in resends)


def _check_durable_acks(p, released, acks, Qa, after_commit=False):
    """Each released entry has Qa acks from bookies that hold its slots in the
    (durable) ensemble at release time, and no change is pending (#1591)."""
    if released and not after_commit:     # commit may decide the next queued change
        assert p.change is None
    for e in released:
        live = {(s, b) for s, b in acks.get(e, ()) if p.ensemble[s] == b}
        assert len(live) >= Qa, (e, acks.get(e), p.ensemble)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_released_prefix_property(data):
    """Random ack/failure interleavings: releases are ascending and gap-free,
    and every released entry had Qa acks from the durable ensemble slots."""
    E = data.draw(st.integers(1, 5))
    Qw = data.draw(st.integers(1, E))
    Qa = data.draw(st.integers(1, Qw))
    ens = tuple(f"b{i}" for i in range(E))
    p = PendingAdds(Qw, Qa, ens)
    n = data.draw(st.integers(1, 12))
    p.assign(n)
    fresh = iter(f"n{i}" for i in range(100))
    released = []
    acks = {}
    for _ in range(data.draw(st.integers(0, 60))):
        op = data.draw(st.sampled_from(["ack", "ack", "ack", "range", "ids", "fail", "commit"]))
        if op == "ack":
            e = data.draw(st.integers(0, n - 1))
            slot = data.draw(st.integers(0, E - 1))
            bookie = p.ensemble[slot]
            if slot not in p.unavailable_slots and slot in p.write_set(e):
                acks.setdefault(e, set()).add((slot, bookie))
            got = p.on_ack(e, slot, bookie)
            _check_durable_acks(p, got, acks, Qa)
            released += got
        elif op in ("range", "ids"):
            slot = data.draw(st.integers(0, E - 1))
            bookie = p.ensemble[slot]
            if op == "range":
                lo = data.draw(st.integers(0, n - 1))
                hi = data.draw(st.integers(lo, n - 1))
                chosen = list(range(lo, hi + 1))
                got = p.on_ack_range(lo, hi, slot, bookie)
            else:
                chosen = sorted(data.draw(st.sets(st.integers(0, n - 1), max_size=n)))
                got = p.on_ack_ids(np.array(chosen, dtype=np.int64), slot, bookie)
            for e in chosen:
                if slot not in p.unavailable_slots and slot in p.write_set(e):
                    acks.setdefault(e, set()).add((slot, bookie))
            _check_durable_acks(p, got, acks, Qa)
            released += got
        elif op == "fail":
            slot = data.draw(st.integers(0, E - 1))
            p.on_failure(slot, p.ensemble[slot])
        elif p.change is not None:
            new = list(p.ensemble)
            for s in p.change.slots:
                new[s] = next(fresh)
            got, _, _ = p.commit_change(tuple(new))
            _check_durable_acks(p, got, acks, Qa, after_commit=True)
            released += got
    assert released == list(range(len(released)))
    assert p.lac == len(released) - 1


def test_vectorised_acks_match_per_entry_acks():
    """One chunk acked by ranges/id arrays releases exactly what per-entry acks do."""
    a = PendingAdds(2, 2, ("a", "b", "c"))
    b = PendingAdds(2, 2, ("a", "b", "c"))
    a.assign(9)
    b.assign_run(9)
    got_a, got_b = [], []
    for slot, bookie in enumerate(("a", "b", "c")):
        ids = np.array([e for e in range(9) if slot in b.write_set(e)], dtype=np.int64)
        for e in ids:
            got_a += a.on_ack(int(e), slot, bookie)
        got_b += b.on_ack_ids(ids, slot, bookie)
    assert got_a == got_b == list(range(9))
    assert a.pending == b.pending == [] and a.pending_count == 0


@settings(max_examples=200)
@given(st.integers(2, 5), st.data())
def test_resend_ranges_match_per_entry_resends(E, data):
    """The core's per-slot resend ranges name exactly the (entry, slot) pairs
    a per-entry rule would: every unreleased id whose write set holds a
    replaced slot that did not fail again."""
    Qw = data.draw(st.integers(1, E))
    ens = tuple(f"b{i}" for i in range(E))
    p = PendingAdds(Qw, 1, ens)
    p.assign(data.draw(st.integers(1, 12)))
    released = data.draw(st.integers(0, 3))
    for e in range(released):
        for s in p.write_set(e):
            p.on_ack(e, s, ens[s])
    slot = data.draw(st.integers(0, E - 1))
    p.on_failure(slot, ens[slot])
    again = data.draw(st.sets(st.integers(0, E - 1)))
    for s in again:
        p.on_failure(s, ens[s])
    pending = p.pending
    new = tuple(f"n{i}" if i == slot else b for i, b in enumerate(ens))
    _released, resends, _nxt = p.commit_change(new)
    want = {(e, s) for e in pending for s in p.write_set(e) if s == slot and s not in again - {slot}}
    got = {(int(e), r.slot) for r in resends for e in r.entry_ids()}
    assert got == want
    assert all(r.bookie == new[r.slot] for r in resends)


class _ReferenceAcks:
    """The pending-add rules written plainly, one set of acking slots per id:
    an ack counts when its bookie holds a slot of the id's write set that is
    not being replaced; ids are released in order once they have Qa acks and
    no change is pending; a failure forgets that slot's acks of unreleased
    ids; an abort leaves the ids it failed unreleasable."""

    def __init__(self, Qw, Qa, ensemble):
        self.Qw, self.Qa, self.ensemble = Qw, Qa, list(ensemble)
        self.lac, self.next_id = -1, 0
        self.acks: dict[int, set[int]] = {}
        self.aborted: set[int] = set()
        self.changing: set[int] | None = None
        self.queued: set[int] = set()

    def _unavailable(self):
        return self.queued | (self.changing or set())

    def _write_set(self, e):
        E = len(self.ensemble)
        return {(e + i) % E for i in range(self.Qw)}

    def assign(self, count):
        self.next_id += count

    def ack(self, e, slot, bookie):
        if (self.lac < e < self.next_id and e not in self.aborted
                and self.ensemble[slot] == bookie and slot not in self._unavailable()
                and slot in self._write_set(e)):
            self.acks.setdefault(e, set()).add(slot)
            self._release()

    def _release(self):
        while (self.changing is None and self.lac + 1 not in self.aborted
               and len(self.acks.get(self.lac + 1, ())) >= self.Qa):
            self.lac += 1

    def fail(self, slot, bookie):
        if self.ensemble[slot] != bookie or slot in self._unavailable():
            return
        if self.changing is not None:
            self.queued.add(slot)
        else:
            self._decide({slot})

    def _decide(self, slots):
        self.changing = set(slots)
        for got in self.acks.values():
            got -= slots

    def commit(self, new):
        self.ensemble, self.changing = list(new), None
        self._release()
        if self.queued:
            self._decide(self.queued)
            self.queued = set()

    def abort(self):
        self.aborted |= set(range(self.lac + 1, self.next_id))
        self.changing, self.queued = None, set()


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_one_id_acks_match_a_reference_model(data):
    """``ack_one`` (the one-id ack a lone add's answer takes) moves the LAC
    as a plain model of the rules does, and as the vectorised ``on_ack_ids``
    of a one-id array does, through runs of one id and of many, failures,
    pending changes and their commits, aborts, stale bookies and
    stragglers' answers below the LAC."""
    E = data.draw(st.integers(1, 5))
    Qw = data.draw(st.integers(1, E))
    Qa = data.draw(st.integers(1, Qw))
    ens = tuple(f"b{i}" for i in range(E))
    a, b = PendingAdds(Qw, Qa, ens), PendingAdds(Qw, Qa, ens)
    model = _ReferenceAcks(Qw, Qa, ens)
    fresh = iter(f"n{i}" for i in range(100))
    for _ in range(data.draw(st.integers(1, 60))):
        op = data.draw(st.sampled_from(
            ["assign", "ack", "ack", "ack", "stale", "fail", "commit", "abort"]))
        if op == "assign":
            count = data.draw(st.sampled_from([1, 1, 1, 3]))
            assert a.assign_run(count) == b.assign_run(count)
            model.assign(count)
        elif op in ("ack", "stale") and a.next_entry_id:
            e = data.draw(st.integers(0, a.next_entry_id - 1))
            slot = data.draw(st.integers(0, E - 1))
            bookie = a.ensemble[slot] if op == "ack" else "gone"
            a.ack_one(e, slot, bookie)
            b.on_ack_ids(np.array([e], dtype=np.int64), slot, bookie)
            model.ack(e, slot, bookie)
        elif op == "fail":
            slot = data.draw(st.integers(0, E - 1))
            assert a.on_failure(slot, a.ensemble[slot]) == b.on_failure(slot, b.ensemble[slot])
            model.fail(slot, a.ensemble[slot])
        elif op == "commit" and a.change is not None:
            new = list(a.ensemble)
            for s in a.change.slots:
                new[s] = next(fresh)
            ra, _, na = a.commit_change(tuple(new))
            rb, _, nb = b.commit_change(tuple(new))
            assert (ra, na) == (rb, nb)
            model.commit(new)
        elif op == "abort" and data.draw(st.booleans()):
            assert a.abort() == b.abort()
            model.abort()
        assert a.lac == b.lac == model.lac
        assert a.pending == b.pending and list(a.ensemble) == model.ensemble
        assert a.unavailable_slots == b.unavailable_slots == model._unavailable()


def test_on_ack_reports_what_ack_one_released():
    """``on_ack`` is ``ack_one`` returning the released ids: an entry acked
    out of order is released with the one before it."""
    p = PendingAdds(3, 2, ("a", "b", "c"))
    p.assign_run(1)
    p.assign_run(1)
    assert p.on_ack(1, 0, "a") == [] and p.on_ack(1, 1, "b") == []
    assert p.on_ack(0, 2, "c") == []
    assert p.on_ack(0, 0, "a") == [0, 1]
    assert p.on_ack(0, 1, "b") == [] and p.lac == 1          # a straggler
