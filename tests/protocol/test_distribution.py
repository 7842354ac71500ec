"""Write sets, holders and coverage against naive oracles (exhaustive, E <= 6)."""
import numpy as np

from pybk_spark.protocol.distribution import AckSet, holds, is_covered, write_quorums, write_set


def test_seed_example_write_quorums():
    ens = ["B1", "B2", "B3", "B4"]
    expected = {0: "B1 B2 B3", 1: "B2 B3 B4", 2: "B3 B4 B1",
                3: "B4 B1 B2", 4: "B1 B2 B3", 5: "B2 B3 B4"}
    for e, names in expected.items():
        assert " ".join(ens[s] for s in write_set(e, 4, 3)) == names


def test_e_distinct_quorums_and_single_when_qw_equals_e():
    for E in range(1, 7):
        for Qw in range(1, E + 1):
            qs = {frozenset(q) for q in write_quorums(E, Qw)}
            assert len(qs) == (1 if Qw == E else E)


def _naive_covered(E, Qw, Qa, responders):
    """An old writer could still reach Qa acks somewhere iff some write quorum
    has >= Qa members that did NOT respond.  Covered iff no such quorum."""
    for start in range(E):
        members = [(start + i) % E for i in range(Qw)]
        silent = [m for m in members if m not in responders]
        if len(silent) >= Qa:
            return False
    return True


def test_coverage_exhaustive_against_oracle():
    checked = 0
    for E in range(1, 7):
        for Qw in range(1, E + 1):
            for Qa in range(1, Qw + 1):
                for mask in range(1 << E):
                    resp = {i for i in range(E) if mask >> i & 1}
                    assert is_covered(E, Qw, Qa, resp) == _naive_covered(E, Qw, Qa, resp), (E, Qw, Qa, resp)
                    checked += 1
    assert checked > 1000


def test_holds_matches_write_set_exhaustive():
    ids = np.arange(0, 40, dtype=np.int64)
    for E in range(1, 7):
        for Qw in range(1, E + 1):
            for slot in range(E):
                mask = holds(ids, E, Qw, slot)
                assert mask.dtype == bool
                assert mask.tolist() == [slot in write_set(int(e), E, Qw) for e in ids]


def test_ackset():
    a = AckSet(write_set(2, 4, 3), 2)
    assert not a.ack(1)          # slot 1 not in write set of entry 2 (2,3,0)
    assert not a.ack(2)
    assert not a.ack(2)          # duplicate
    assert a.ack(0)
    a.forget(0)
    assert not a.complete
