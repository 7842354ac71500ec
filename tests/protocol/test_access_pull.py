"""``pull`` (bookie-to-bookie re-replication, wire PullEntries) is an
operator's request: protocol/access.py."""
import pytest

from pybk_spark import errors
from pybk_spark.protocol import access

TLS = access.Policy(tls=True, writers=frozenset({"app"}), operators=frozenset({"ops"}))


def test_only_an_operator_may_ask_a_tls_bookie_to_pull():
    assert access.check(TLS, access.Peer(frozenset({"ops"})), "pull") is False
    for who in ({"app"}, set()):
        with pytest.raises(errors.Unauthorized, match="tls_operator_identities"):
            access.check(TLS, access.Peer(frozenset(who)), "pull")


def test_any_writer_when_writers_are_not_listed_is_still_not_an_operator():
    open_tls = access.Policy(tls=True, operators=frozenset({"ops"}))
    with pytest.raises(errors.Unauthorized):
        access.check(open_tls, access.Peer(frozenset({"anyone"})), "pull")


def test_plaintext_bookie_lets_admin_tools_pull():
    assert access.check(access.Policy(), access.ANONYMOUS, "pull") is False
