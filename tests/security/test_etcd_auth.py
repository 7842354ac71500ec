"""etcd authentication and the least-privilege roles, on a whole real cluster:
LocalCluster with etcd TLS + client certificates + auth, bookies running as
the ``bookie`` user, clients as ``client``, admin commands as ``operator``."""
from __future__ import annotations

import contextlib
import io
import json

import pytest

from pybk_spark import errors
from pybk_spark.commands import cli
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.metadata import EtcdSecurity, open_store, with_security
from pybk_spark.metadata.store import ledger_key


@contextlib.contextmanager
def _opened(uri):
    store = open_store(uri)
    try:
        yield store
    finally:
        store.close()


def _pybk(*argv) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_client_writes_and_reads_a_ledger_on_the_secured_cluster(secure_cluster):
    with BookKeeper(secure_cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2)
        assert [lh.add_entry(b"e%d" % i) for i in range(5)] == list(range(5))
        lh.close()
        rh = bk.open_ledger(lh.ledger_id)
        assert [e.payload for e in rh.read(0, 4)] == [b"e%d" % i for i in range(5)]
    with _opened(secure_cluster.uri_for("operator")) as store:
        assert len(store.list_prefix("bookies/writable/")) == 3   # bookies registered


def test_client_settings_from_conf_keys(secure_cluster):
    """The same settings as client.conf keys, with a bare URI."""
    sec = secure_cluster.etcd_security("client")
    conf = {k: getattr(sec, k) for k in ("etcd_ca_file", "etcd_cert_file", "etcd_key_file",
                                         "etcd_user", "etcd_password_file")}
    with BookKeeper(secure_cluster.etcd.uri(secure_cluster.scope), conf=conf) as bk:
        lh = bk.create_ledger(3, 2, 2)
        lh.add_entry(b"x")
        lh.close()


def test_bookie_credentials_cannot_rewrite_ledger_metadata(secure_cluster):
    with BookKeeper(secure_cluster.metadata_uri) as bk:
        lh = bk.create_ledger(3, 2, 2)
        lh.close()
    key = ledger_key(lh.ledger_id)
    with _opened(secure_cluster.uri_for("bookie")) as store:
        current = store.get(key)                    # bookies may read (GC)
        with pytest.raises(errors.MetadataUnauthorized, match="permission denied"):
            store.compare_and_swap(key, b"{}", current.version)
        with pytest.raises(errors.MetadataUnauthorized):
            store.delete(key)
        with pytest.raises(errors.MetadataUnauthorized):
            store.put_if_absent("idgen-x", b"1")
        # its own kind of keys it may write
        v = store.put_if_absent("bookies/damaged/test-bookie", b"{}")
        store.delete("bookies/damaged/test-bookie", expected_version=v)
    with _opened(secure_cluster.uri_for("client")) as store:
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_user"):
            store.put("bookies/writable/forged", b"{}")
        assert store.get(key).value != b"{}"


def test_no_credentials_against_auth_etcd(secure_cluster):
    with _opened(secure_cluster.uri_for(None)) as store:     # TLS, no etcd_user
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_user"):
            store.put_if_absent("ledgers/x", b"1")


def test_wrong_password_names_the_setting(secure_cluster, tmp_path):
    pw = tmp_path / "wrong.pw"
    pw.write_text("not-the-password\n")
    sec = EtcdSecurity(**{**secure_cluster.etcd_security("client").__dict__,
                          "etcd_password_file": str(pw)})
    with _opened(with_security(secure_cluster.metadata_uri, sec)) as store:
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_password_file"):
            store.get("idgen")


def test_operator_applies_roles_and_a_revoked_user_is_refused(secure_cluster, tmp_path):
    op_uri = secure_cluster.uri_for("operator")
    # operator: admin commands work
    rc, out, _ = _pybk("--json", "listbookies", "--metadata-uri", op_uri)
    assert rc == 0 and len(json.loads(out)) == 3
    rc, out, _ = _pybk("etcd-roles", "--metadata-uri", op_uri)
    assert rc == 0 and "pybk-bookie" in out
    # an operator cannot manage etcd users (that needs etcd's root role) ...
    pw = tmp_path / "temp.pw"
    pw.write_text("temp-secret\n")
    rc, _, err = _pybk("etcd-roles", "--apply", "--user", "temp", "pybk-client", str(pw),
                       "--metadata-uri", op_uri)
    assert rc == 1 and "MetadataUnauthorized" in err
    # ... root can: a new client user, which works until it is deleted
    root = EtcdSecurity(**{**secure_cluster.etcd_security("operator").__dict__,
                           "etcd_user": "root",
                           "etcd_password_file": str(secure_cluster.data_dir / "etcd-auth" /
                                                     "root.pw")})
    root_uri = with_security(op_uri, root)
    rc, out, err = _pybk("etcd-roles", "--apply", "--user", "temp", "pybk-client", str(pw),
                         "--per-bookie", "bookie-0", "--metadata-uri", root_uri)
    assert rc == 0, err
    temp = EtcdSecurity(**{**root.__dict__, "etcd_user": "temp", "etcd_password_file": str(pw)})
    with _opened(with_security(op_uri, temp)) as store:
        v = store.put_if_absent("logs/temp-check", b"1")
        with _opened(root_uri) as admin:
            admin.auth_request("UserDelete", name="temp")
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_user"):
            store.delete("logs/temp-check", expected_version=v)
    with _opened(op_uri) as store:
        assert store.get("logs/temp-check") is not None
        store.delete("logs/temp-check")


def test_stale_token_is_renewed(secure_cluster):
    """etcd drops a user's tokens when its password is set (here: to the same
    one), as when a simple token expires: the store logs in again and repeats
    the call, invisibly to its caller."""
    root = EtcdSecurity(**{**secure_cluster.etcd_security("operator").__dict__,
                           "etcd_user": "root",
                           "etcd_password_file": str(secure_cluster.data_dir / "etcd-auth" /
                                                     "root.pw")})
    with _opened(secure_cluster.metadata_uri) as store, \
            _opened(with_security(secure_cluster.metadata_uri, root)) as admin:
        v = store.put_if_absent("logs/renew-check", b"1")
        epoch = store.connection.auth_epoch
        password = secure_cluster.etcd_security("client").password()
        admin.auth_request("UserChangePassword", name="client", password=password)
        v = store.compare_and_swap("logs/renew-check", b"2", v)
        assert store.get("logs/renew-check").value == b"2"
        store.delete("logs/renew-check", expected_version=v)
        assert store.connection.auth_epoch > epoch          # it did log in again


def test_bookie_conf_keys_and_refused_bookie_exits_2(secure_cluster, tmp_path):
    """bookie.conf etcd_* keys with a bare metadata_uri; a bookie whose login is
    refused exits 2 naming the setting, before it serves anything."""
    import subprocess
    import sys

    from bookie_server.__main__ import _open_store
    from bookie_server.config import BookieConfig
    from pybk_spark.metadata.security import SETTINGS
    from pybk_spark.cluster.ports import free_port
    sec = secure_cluster.etcd_security("bookie")
    bare = secure_cluster.etcd.uri(secure_cluster.scope)
    store = _open_store(bare, BookieConfig(**{k: getattr(sec, k) for k in SETTINGS}))
    try:
        assert len(store.list_prefix("bookies/writable/")) == 3
        with pytest.raises(errors.MetadataUnauthorized):
            store.put_if_absent("ledgers/x", b"{}")
    finally:
        store.close()
    wrong = tmp_path / "wrong.pw"
    wrong.write_text("nope\n")
    conf = tmp_path / "bookie.conf"
    conf.write_text("".join(f"{k} = {getattr(sec, k)}\n" for k in SETTINGS
                            if k != "etcd_password_file") + f"etcd_password_file = {wrong}\n")
    proc = subprocess.run(
        [sys.executable, "-m", "bookie_server", "--conf", str(conf), "--port", str(free_port()),
         "--add-lane-port", "-1", "--data-dir", str(tmp_path / "data"),
         "--metadata-uri", bare, "--bookie-id", "refused-bookie"],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stderr
    assert "refused access" in proc.stderr and "etcd_password_file" in proc.stderr
