"""Throwaway certificates for a local cluster and tests (``pybk standalone --tls``).

One CA (``trustme``, the ``tls`` extra: ``pip install 'pybk-spark[tls]'``)
signs a bookie certificate for the loopback addresses (IP SANs 127.0.0.1
and ::1, DNS SAN localhost: clients check the registered address against
them) and one client certificate per identity (its common name and a DNS
SAN).  Never use them outside a test or a laptop: the CA key is on disk next
to them.
"""
from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

BOOKIE_HOSTS = ("127.0.0.1", "::1", "localhost")
WRITER, OPERATOR = "pybk-writer", "pybk-operator"


@dataclass
class CertFiles:
    dir: Path
    ca_file: Path
    bookie_cert: Path
    bookie_key: Path
    clients: dict = field(default_factory=dict)     # identity -> (cert, key)
    ca: object = None                               # the trustme CA, to issue more

    def bookie_conf(self, client_auth: str = "required", writers: str = "",
                    operators: str = OPERATOR) -> dict:
        return {"tls_cert_file": str(self.bookie_cert), "tls_key_file": str(self.bookie_key),
                "tls_ca_file": str(self.ca_file), "tls_client_auth": client_auth,
                "tls_writer_identities": writers, "tls_operator_identities": operators}

    def client_conf(self, identity: str | None = WRITER) -> dict:
        conf = {"tls_ca_file": str(self.ca_file)}
        if identity is not None:
            cert, key = self.clients[identity]
            conf.update(tls_cert_file=str(cert), tls_key_file=str(key))
        return conf


def _trustme():
    try:
        import trustme  # why: an optional dependency (the tls extra), needed only here
    except ImportError:
        raise RuntimeError("TLS certificates for a local cluster need the trustme package: "
                           "pip install 'pybk-spark[tls]'") from None
    return trustme


def make_ca(key_type=None):
    trustme = _trustme()
    return trustme.CA(key_type=key_type) if key_type is not None else trustme.CA()


def issue(ca, directory: Path, name: str, *identities: str,
          not_after: datetime.datetime | None = None) -> tuple[Path, Path]:
    """A certificate for ``identities`` (the first is the common name) signed
    by ``ca``: (cert chain file, key file) in ``directory``."""
    cert = ca.issue_cert(*identities, common_name=identities[0], not_after=not_after)
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}-key.pem"
    cert.cert_chain_pems[0].write_to_path(str(cert_path))
    for extra in cert.cert_chain_pems[1:]:
        with open(cert_path, "ab") as fh:
            fh.write(extra.bytes())
    cert.private_key_pem.write_to_path(str(key_path))
    os.chmod(key_path, 0o600)
    return cert_path, key_path


def make_cert_files(directory: str | os.PathLike, clients=(WRITER, OPERATOR),
                    bookie_hosts=BOOKIE_HOSTS) -> CertFiles:
    """A CA, a bookie certificate and client certificates in ``directory``."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    ca = make_ca()
    ca_file = d / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    bookie_cert, bookie_key = issue(ca, d, "bookie", *bookie_hosts)
    files = CertFiles(d, ca_file, bookie_cert, bookie_key)
    for ident in clients:
        files.clients[ident] = issue(ca, d, f"client-{ident}", ident)
    files.ca = ca          # kept for tests that issue more
    return files


def ensure_cert_files(directory: str | os.PathLike, clients=(WRITER, OPERATOR)) -> CertFiles:
    """The certificates in ``directory``, made on first use (a restarted
    standalone keeps its CA, so clients configured earlier still work)."""
    d = Path(directory)
    paths = [d / "ca.pem", d / "bookie.pem", d / "bookie-key.pem"] + [
        d / f"client-{c}{suffix}.pem" for c in clients for suffix in ("", "-key")]
    if not all(p.exists() for p in paths):
        return make_cert_files(d, clients)
    files = CertFiles(d, d / "ca.pem", d / "bookie.pem", d / "bookie-key.pem")
    for c in clients:
        files.clients[c] = (d / f"client-{c}.pem", d / f"client-{c}-key.pem")
    return files


def write_client_confs(files: CertFiles) -> dict:
    """client.conf files for the writer and the operator identity; {name: path}."""
    out = {}
    for name, ident, extra in (("client.conf", WRITER, {}),
                               ("operator.conf", OPERATOR, {"operator": "true"})):
        path = files.dir / name
        conf = {**files.client_conf(ident), **extra}
        path.write_text("# written by pybk standalone --tls (throwaway certificates)\n" +
                        "".join(f"{k} = {v}\n" for k, v in conf.items()))
        out[name] = path
    return out
