"""Helpers shared by tests, bench/ and the demo: embedded etcd, local cluster,
free ports, child-process bookkeeping.  Real processes, never mocks."""
