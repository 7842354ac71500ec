"""Roles at a bookie (protocol/access.py): pure rules."""
import pytest

from pybk_spark import errors
from pybk_spark.protocol import access
from pybk_spark.protocol.access import OPERATOR_KEY, Peer, Policy, check, may_learn_key, role_of

KEY = b"k" * 32
W, O, S = Peer(frozenset({"writer", "10.0.0.1"})), Peer(frozenset({"ops"})), \
    Peer(frozenset({"stranger"}))


def test_plaintext_everyone_writes_nobody_operates():
    p = Policy()
    assert role_of(p, access.ANONYMOUS) == access.WRITER
    for op in access.OPS:
        assert check(p, O, op, OPERATOR_KEY) is False     # no key-less path, no refusal here
    assert not may_learn_key(p, O, b"", fence=False)


def test_allow_lists():
    p = Policy(tls=True, writers=access.parse_identities(" writer , other"),
               operators=frozenset({"ops"}))
    assert (role_of(p, W), role_of(p, O), role_of(p, S)) == ("writer", "operator", None)
    with pytest.raises(errors.Unauthorized, match="stranger.*tls_writer_identities"):
        check(p, S, "read")
    with pytest.raises(errors.Unauthorized, match="no client certificate"):
        check(p, access.ANONYMOUS, "add", KEY)
    # an identity may be any SAN, e.g. an IP address
    assert role_of(Policy(tls=True, writers=frozenset({"10.0.0.1"})), W) == "writer"


def test_empty_writer_list_admits_any_client_tls_let_in():
    p = Policy(tls=True, operators=frozenset({"ops"}))
    assert role_of(p, S) == role_of(p, access.ANONYMOUS) == "writer"


def test_key_less_path_is_the_operators_for_recovery_adds_and_fences():
    p = Policy(tls=True, operators=frozenset({"ops"}))
    assert check(p, O, "recovery_add", OPERATOR_KEY) is True
    assert check(p, O, "fence", OPERATOR_KEY) is True
    assert check(p, O, "fence", KEY) is False              # with a key: the normal check
    assert check(p, O, "read", OPERATOR_KEY) is False      # reads carry no key check
    with pytest.raises(errors.Unauthorized):
        check(p, O, "add", OPERATOR_KEY)                   # plain adds need the key
    for op in ("add", "recovery_add", "fence", "write_lac"):
        with pytest.raises(errors.Unauthorized, match="tls_operator_identities"):
            check(p, W, op, OPERATOR_KEY)
        assert check(p, W, op, KEY) is False


def test_only_operators_learn_keys():
    p = Policy(tls=True, operators=frozenset({"ops"}))
    assert may_learn_key(p, O, b"", fence=False)
    assert not may_learn_key(p, O, b"", fence=True)
    assert not may_learn_key(p, O, KEY, fence=False)
    assert not may_learn_key(p, W, b"", fence=False)


def test_admin_routes_reads_need_a_role_changes_need_the_operator():
    p = Policy(tls=True, writers=frozenset({"writer"}), operators=frozenset({"ops"}))
    for mutating in (False, True):
        r = access.admin_refusal(p, access.ANONYMOUS, mutating)
        assert (r.reason, r.missing) == ("unauthenticated", "client certificate")
        r = access.admin_refusal(p, S, mutating)
        assert r.reason == "forbidden" and "stranger" in r.message
        assert access.admin_refusal(p, O, mutating) is None
    assert access.admin_refusal(p, W, mutating=False) is None
    r = access.admin_refusal(p, W, mutating=True)
    assert (r.reason, r.missing) == ("forbidden", "operator")
    assert "tls_operator_identities" in r.message
    # an empty writer list admits any verified identity to read, never to change
    open_ = Policy(tls=True, operators=frozenset({"ops"}))
    assert access.admin_refusal(open_, S, mutating=False) is None
    assert access.admin_refusal(open_, S, mutating=True).missing == "operator"
    assert access.admin_refusal(open_, access.ANONYMOUS, False).reason == "unauthenticated"
