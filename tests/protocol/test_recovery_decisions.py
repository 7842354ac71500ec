"""Recovery decisions: coverage-based fencing, LAC from fenced answers, start
point (#2615), missing-entry rule."""
import itertools

from pybk_spark.protocol import recovery as rc
from pybk_spark.protocol.distribution import is_covered, write_set


def test_fence_phase_done_on_coverage_not_everyone():
    ph = rc.FenceLacPhase(3, 2, 2)
    ph.on_answer(0, rc.OK, 10)
    assert not ph.covered
    ph.on_answer(1, rc.OK, 11)
    assert ph.covered and ph.max_lac == 11      # slot 2 hangs: not needed (#1067)


def test_lac_only_from_fenced_answers_and_no_ledger_counts():
    ph = rc.FenceLacPhase(3, 3, 2)
    ph.on_answer(0, rc.ERROR)
    ph.on_answer(1, rc.NO_LEDGER)
    assert not ph.covered and not ph.impossible
    ph.on_answer(2, rc.OK, 4)
    assert ph.covered and ph.max_lac == 4


def test_fence_phase_impossible():
    ph = rc.FenceLacPhase(3, 2, 2)
    ph.on_answer(0, rc.ERROR)
    ph.on_answer(1, rc.ERROR)
    assert ph.impossible


def test_fence_phase_exhaustive_matches_coverage():
    for E in range(1, 6):
        for Qw in range(1, E + 1):
            for Qa in range(1, Qw + 1):
                for kinds in itertools.product([rc.OK, rc.NO_LEDGER, rc.ERROR, None], repeat=E):
                    ph = rc.FenceLacPhase(E, Qw, Qa)
                    for s, k in enumerate(kinds):
                        if k is not None:
                            ph.on_answer(s, k, s)
                    answered = {s for s, k in enumerate(kinds) if k in (rc.OK, rc.NO_LEDGER)}
                    assert ph.covered == is_covered(E, Qw, Qa, answered)
                    alive = {s for s, k in enumerate(kinds) if k != rc.ERROR}
                    assert ph.impossible == (not is_covered(E, Qw, Qa, alive))


def test_recovery_start_2615():
    assert rc.recovery_start(-1, 0) == -1
    assert rc.recovery_start(7, 0) == 7
    assert rc.recovery_start(-1, 12) == 11      # empty new fragment answers -1
    assert rc.recovery_start(20, 12) == 20


def test_entry_probe():
    p = rc.EntryProbe(12, 3, 2, 2)
    a, b = p.slots
    assert p.on_answer(a, rc.NO_ENTRY) == rc.MISSING          # Qw-Qa+1 = 1
    p = rc.EntryProbe(12, 3, 2, 2)
    assert p.on_answer(b, rc.OK) == rc.EXISTS
    assert p.on_answer(a, rc.NO_ENTRY) == rc.EXISTS           # any positive wins
    p = rc.EntryProbe(5, 5, 3, 2)
    s = p.slots
    assert p.on_answer(s[0], rc.NO_ENTRY) == rc.UNDECIDED
    assert p.on_answer(s[1], rc.ERROR) == rc.UNDECIDED
    assert p.on_answer(s[2], rc.ERROR) == rc.UNRECOVERABLE
    p = rc.EntryProbe(5, 5, 3, 2)
    p.on_answer(s[0], rc.NO_ENTRY)
    assert p.on_answer(s[1], rc.NO_ENTRY) == rc.MISSING
    assert p.on_answer((s[2] + 1) % 5, rc.OK) == rc.MISSING    # outside the write set: ignored
    assert write_set(5, 5, 3) == s


def _naive_probe_status(ws, Qa, kinds):
    """What the answers of write set ``ws`` say about an entry above the LAC:
    any copy exists; missing iff fewer than Qa slots may still hold it (it
    was never acknowledged); undecidable once all answered otherwise."""
    said = {s: kinds[s] for s in ws if kinds[s] is not None}
    if rc.OK in said.values():
        return rc.EXISTS
    no = {s for s, k in said.items() if k in (rc.NO_ENTRY, rc.NO_LEDGER)}
    if len(set(ws) - no) < Qa:
        return rc.MISSING
    if len(said) == len(ws):
        return rc.UNRECOVERABLE
    return rc.UNDECIDED


def test_entry_probe_exhaustive_against_oracle():
    """Every answer combination over small ensembles, slots outside the write
    set included (they are ignored), checked after each answer."""
    kinds_all = [rc.OK, rc.NO_ENTRY, rc.NO_LEDGER, rc.ERROR, None]
    checked = 0
    for E in range(1, 5):
        for Qw in range(1, E + 1):
            for Qa in range(1, Qw + 1):
                for e in range(E):
                    ws = write_set(e, E, Qw)
                    for kinds in itertools.product(kinds_all, repeat=E):
                        p = rc.EntryProbe(e, E, Qw, Qa)
                        so_far = [None] * E
                        for s, k in enumerate(kinds):
                            if k is None:
                                continue
                            so_far[s] = k
                            got = p.on_answer(s, k)
                            assert got == _naive_probe_status(ws, Qa, so_far), (E, Qw, Qa, e, so_far)
                            checked += 1
                        assert p.status == _naive_probe_status(ws, Qa, kinds)
    assert checked > 10000


def test_pure_core_imports_no_io():
    import ast
    import pathlib
    root = pathlib.Path(__file__).resolve().parents[2] / "pybk_spark" / "protocol"
    forbidden = {"grpc", "pyetcd", "etcd3", "threading", "time", "socket", "asyncio", "random"}
    names = sorted(p.name for p in root.glob("*.py"))
    assert {"distribution.py", "pending_adds.py", "recovery.py", "read_decisions.py",
            "ledger_state.py"} <= set(names)
    for name in names:
        tree = ast.parse((root / name).read_text())
        for node in ast.walk(tree):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                mods = [node.module or ""]
            for m in mods:
                assert m.split(".")[0] not in forbidden, (name, m)


def test_slot_answers_say_no_only_when_every_holder_does():
    s = rc.SlotAnswers(2)
    assert s.on_answer(rc.NO_ENTRY) is None          # the replacement lacks it...
    assert s.on_answer(rc.OK) == rc.OK               # ...the writer's bookie has it
    s = rc.SlotAnswers(2)
    s.on_answer(rc.NO_ENTRY)
    assert s.on_answer(rc.NO_LEDGER) == rc.NO_ENTRY
    s = rc.SlotAnswers(2)
    s.on_answer(rc.NO_ENTRY)
    assert s.on_answer(rc.ERROR) == rc.ERROR         # undecidable, never "no"
    assert rc.SlotAnswers(1).on_answer(rc.NO_ENTRY) == rc.NO_ENTRY


def test_recovery_start_rewrites_a_tail_an_earlier_recovery_replaced():
    assert rc.recovery_start(30, 19, tail_replaced=True) == 18   # even below the LAC
    assert rc.recovery_start(30, 19, tail_replaced=False) == 30
