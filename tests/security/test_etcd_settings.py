"""The etcd security settings: parsing and merging (pure), conf keys of the
client and the bookie, and the role layout."""
from __future__ import annotations

import pytest

from pybk_spark import errors
from pybk_spark.admin.commands import etcd_roles
from pybk_spark.config import ClientConfig
from pybk_spark.metadata import EtcdSecurity, parse_uri, uri_security, with_security
from pybk_spark.metadata.security import SETTINGS


def test_uri_query_round_trip_and_parse_uri_ignores_it():
    sec = EtcdSecurity(etcd_ca_file="/etc/pybk/ca.pem", etcd_user="client",
                       etcd_password_file="/etc/pybk/client pw")
    uri = with_security("etcd://h1:2379,h2:2379/pybk", sec)
    assert uri.startswith("etcd://h1:2379,h2:2379/pybk?etcd_ca_file=/etc/pybk/ca.pem&")
    assert uri_security(uri) == sec and sec.tls
    assert parse_uri(uri) == ("etcd", "h1:2379,h2:2379", "pybk")
    assert with_security(uri, EtcdSecurity()) == "etcd://h1:2379,h2:2379/pybk"
    assert uri_security("etcd://h:1/s") == EtcdSecurity()


@pytest.mark.parametrize("query, setting", [
    ("etcd_password=secret", "etcd_password_file"),
    ("ca=/x", "etcd_ca_file"),                                   # unknown: lists the known
    ("etcd_cert_file=/c.pem", "etcd_key_file"),
    ("etcd_user=u", "etcd_password_file"),
])
def test_bad_queries_name_the_setting(query, setting):
    with pytest.raises(errors.IncorrectParameter, match=setting):
        uri_security(f"etcd://h:1/s?{query}")


def test_merge_conf_and_uri_conflict_is_named():
    a = EtcdSecurity(etcd_ca_file="/a.pem")
    assert a.merged(EtcdSecurity(etcd_user="u", etcd_password_file="/p")).etcd_user == "u"
    assert a.merged(EtcdSecurity(etcd_ca_file="/a.pem")) == a
    with pytest.raises(errors.IncorrectParameter, match="etcd_ca_file given twice"):
        a.merged(EtcdSecurity(etcd_ca_file="/b.pem"))


def test_password_file(tmp_path):
    p = tmp_path / "pw"
    p.write_text("s3cret\nignored\n")
    assert EtcdSecurity(etcd_user="u", etcd_password_file=str(p)).password() == "s3cret"
    p.write_text("")
    with pytest.raises(errors.IncorrectParameter, match="etcd_password_file.*empty"):
        EtcdSecurity(etcd_user="u", etcd_password_file=str(p)).password()
    with pytest.raises(errors.IncorrectParameter, match="etcd_password_file"):
        EtcdSecurity(etcd_user="u", etcd_password_file=str(tmp_path / "no")).password()


def test_client_and_bookie_conf_keys():
    from bookie_server.config import BookieConfig
    conf = ClientConfig().with_overrides({"etcd_ca_file": "/ca.pem"})
    assert EtcdSecurity.from_config(conf) == EtcdSecurity(etcd_ca_file="/ca.pem")
    assert EtcdSecurity.from_config(BookieConfig(etcd_user="b", etcd_password_file="/p")) == \
        EtcdSecurity(etcd_user="b", etcd_password_file="/p")
    assert EtcdSecurity.from_config(BookieConfig()).empty
    for key in SETTINGS:
        assert hasattr(ClientConfig(), key) and hasattr(BookieConfig(), key)


def test_role_layout_keeps_bookies_off_ledger_metadata():
    writes = {role: [(k, pre) for perm, k, pre in grants if "WRITE" in perm]
              for role, grants in etcd_roles.layout(["b1"]).items()}
    assert writes[etcd_roles.OPERATOR] == [("", True)]
    assert all(k.startswith(("bookies/", "cookies/")) for k, _ in writes[etcd_roles.BOOKIE])
    assert not any(k.startswith(("bookies/", "cookies/")) for k, _ in writes[etcd_roles.CLIENT])
    assert writes["pybk-bookie-b1"] == [("bookies/writable/b1", False),
                                        ("bookies/readonly/b1", False),
                                        ("bookies/damaged/b1", False),
                                        ("bookies/instances/b1", False), ("cookies/b1", False)]
    with pytest.raises(errors.IncorrectParameter):
        etcd_roles.bookie_role("a/b")
