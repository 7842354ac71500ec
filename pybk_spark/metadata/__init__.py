"""Metadata store adapters.  ``open_store(uri)`` picks one from the URI:

    etcd://HOST:PORT[,HOST:PORT...]/SCOPE[?etcd_ca_file=...&etcd_user=...]
                                            the real store (pyetcd); the query
                                            carries etcd TLS / auth settings
                                            (pybk_spark/metadata/security.py)
    memory://NAME                           the in-process twin (tests, simulation)
"""
from pybk_spark.metadata.store import Lease, MetadataStore, Versioned  # noqa: F401
from pybk_spark.metadata.security import EtcdSecurity  # noqa: F401
from pybk_spark.metadata.memory_store import MemoryMetadataStore

from pybk_spark import errors as _errors


def parse_uri(uri: str) -> tuple[str, str, str]:
    """``(kind, where, scope)``: ("etcd", "h:p,h:p", scope) or ("memory", name, "").
    The query of an etcd URI is ignored here (``uri_security`` reads it)."""
    if not isinstance(uri, str) or "://" not in uri:
        raise _errors.IncorrectParameter(f"bad metadata URI {uri!r} "
                                         "(want etcd://HOST:PORT/SCOPE or memory://NAME)")
    kind, rest = uri.split("://", 1)
    if kind == "memory":
        name = rest.strip("/")
        if not name:
            raise _errors.IncorrectParameter(f"bad metadata URI {uri!r}: memory://NAME needs a name")
        return "memory", name, ""
    if kind == "etcd":
        rest = rest.partition("?")[0]
        where, _, scope = rest.partition("/")
        scope = scope.strip("/")
        if not where or not scope:
            raise _errors.IncorrectParameter(
                f"bad metadata URI {uri!r}: want etcd://HOST:PORT[,HOST:PORT]/SCOPE")
        return "etcd", where, scope
    raise _errors.IncorrectParameter(f"bad metadata URI {uri!r}: unknown scheme {kind!r}")


def uri_security(uri: str) -> EtcdSecurity:
    """The etcd security settings in the URI's query (empty when none)."""
    return EtcdSecurity.from_query(uri.partition("?")[2]) if "?" in uri else EtcdSecurity()


def with_security(uri: str, security: EtcdSecurity) -> str:
    """``uri`` with ``security`` as its query (replacing any query it had)."""
    base = uri.partition("?")[0]
    query = security.query()
    return f"{base}?{query}" if query else base


def open_store(uri: str, security: EtcdSecurity | None = None) -> MetadataStore:
    """Open the store a metadata service URI names (raises IncorrectParameter).
    ``security`` (from conf keys) merges with the URI's own query."""
    kind, where, scope = parse_uri(uri)
    if kind == "memory":
        return MemoryMetadataStore.named(where)
    from pybk_spark.metadata.etcd_connection import parse_endpoints  # why: pyetcd (~0.2 s), for etcd only
    from pybk_spark.metadata.etcd_store import EtcdMetadataStore  # why: pyetcd (~0.2 s), for etcd only
    parse_endpoints(where)             # validate before connecting
    return EtcdMetadataStore(where, scope, security=uri_security(uri).merged(security))
