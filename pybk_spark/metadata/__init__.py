"""Metadata store adapters.  ``open_store(uri)`` picks one from the URI:

    etcd://HOST:PORT[,HOST:PORT...]/SCOPE   the real store (pyetcd)
    memory://NAME                           the in-process twin (tests, simulation)
"""
from pybk_spark.metadata.store import Lease, MetadataStore, Versioned  # noqa: F401

from pybk_spark import errors as _errors


def parse_uri(uri: str) -> tuple[str, str, str]:
    """``(kind, where, scope)``: ("etcd", "h:p,h:p", scope) or ("memory", name, "")."""
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
        where, _, scope = rest.partition("/")
        scope = scope.strip("/")
        if not where or not scope:
            raise _errors.IncorrectParameter(
                f"bad metadata URI {uri!r}: want etcd://HOST:PORT[,HOST:PORT]/SCOPE")
        return "etcd", where, scope
    raise _errors.IncorrectParameter(f"bad metadata URI {uri!r}: unknown scheme {kind!r}")


def open_store(uri: str) -> MetadataStore:
    """Open the store a metadata service URI names (raises IncorrectParameter)."""
    kind, where, scope = parse_uri(uri)
    if kind == "memory":
        from pybk_spark.metadata.memory_store import MemoryMetadataStore
        return MemoryMetadataStore.named(where)
    from pybk_spark.metadata.etcd_store import EtcdMetadataStore, parse_endpoints
    parse_endpoints(where)             # validate before connecting
    return EtcdMetadataStore(where, scope)
