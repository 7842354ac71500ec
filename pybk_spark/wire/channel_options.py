"""gRPC channel options of every channel to a bookie (etcd's channels have
their own, in ``metadata/etcd_connection.py``).

gRPC's default reconnect backoff starts at 1 s and grows to 120 s.  While a
channel waits out its backoff every call on it fails at once with
UNAVAILABLE, so a client whose bookie restarted could go two minutes
without reaching it again, though the bookie answered after seconds.
BookKeeper's client reconnects on the next request; these options keep
gRPC close to that: a retry 100 ms after a failed connect, and never more
than 1 s apart.  Plain data, so that both sides (the client's transport,
the bookie's peer reader) take the one definition.
"""
from __future__ import annotations

RECONNECT_BACKOFF: tuple[tuple[str, int], ...] = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)


def bookie_channel_options(max_message_bytes: int) -> list[tuple[str, int]]:
    """Options of a channel to a bookie: message limits and the backoff above."""
    return [("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
            *RECONNECT_BACKOFF]
