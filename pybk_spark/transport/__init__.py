"""Bookie transports: the client's only way to talk to bookies.

``BookieTransport`` is the port (futures in, typed errors out); the gRPC
adapter lives in ``grpc_bookie``, simulations provide in-memory ones.
"""
from pybk_spark.transport.base import BookieTransport, TransportPool  # noqa: F401
