"""etcd over TLS with client certificates: a real etcd (tls_etcd), real certificates."""
from __future__ import annotations

import pytest

from pybk_spark import errors
from pybk_spark.metadata import EtcdSecurity, open_store, with_security
from pybk_spark.metadata.etcd_store import EtcdMetadataStore
from pybk_spark.testing.fixtures import unique_scope


def _store(etcd, **settings):
    return EtcdMetadataStore(etcd.endpoint, unique_scope("tls"), timeout=3.0, read_retry=1.0,
                             security=EtcdSecurity(**settings))


def test_tls_with_client_certificate_works(tls_etcd, certs):
    uri = with_security(tls_etcd.uri(unique_scope("tls")),
                        EtcdSecurity(etcd_ca_file=certs.ca, etcd_cert_file=certs.client_cert,
                                     etcd_key_file=certs.client_key))
    store = open_store(uri)
    try:
        v = store.put_if_absent("k", b"v")
        assert store.get("k").value == b"v" and store.get("k").version == v
        assert store.uri == uri                      # the settings survive a round trip
    finally:
        store.close()


def test_plaintext_client_against_tls_etcd_names_etcd_ca_file(tls_etcd):
    store = _store(tls_etcd)
    try:
        with pytest.raises(errors.MetadataUnavailable, match="etcd_ca_file"):
            store.get("k")
    finally:
        store.close()


def test_server_certificate_from_unknown_ca_is_refused(tls_etcd, certs):
    store = _store(tls_etcd, etcd_ca_file=certs.foreign_ca, etcd_cert_file=certs.client_cert,
                   etcd_key_file=certs.client_key)
    try:
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_ca_file"):
            store.get("k")
    finally:
        store.close()


def test_client_certificate_from_unknown_ca_is_refused(tls_etcd, certs):
    store = _store(tls_etcd, etcd_ca_file=certs.ca, etcd_cert_file=certs.stranger_cert,
                   etcd_key_file=certs.stranger_key)
    try:
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_cert_file"):
            store.put("k", b"v")
    finally:
        store.close()


def test_missing_client_certificate_is_refused(tls_etcd, certs):
    store = _store(tls_etcd, etcd_ca_file=certs.ca)
    try:
        with pytest.raises(errors.MetadataUnauthorized, match="etcd_cert_file"):
            store.get("k")
    finally:
        store.close()


def test_unreadable_ca_file_is_named(tls_etcd, tmp_path):
    with pytest.raises(errors.IncorrectParameter, match="etcd_ca_file"):
        _store(tls_etcd, etcd_ca_file=str(tmp_path / "nope.pem"))
