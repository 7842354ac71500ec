"""Metadata store adapters.  ``open_store(uri)`` picks one from the URI:

    etcd://HOST:PORT[,HOST:PORT...]/SCOPE   the real store (pyetcd)
    memory://NAME                           the in-process twin (tests, simulation)
"""
from pybk_spark.metadata.store import Lease, MetadataStore, Versioned  # noqa: F401
