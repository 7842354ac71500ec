"""pybk-spark: Apache BookKeeper's replicated-ledger protocol in Python, native to Spark."""
import os as _os

# grpcio >= 1.81 runs a post-fork handler in the child of every fork() that can
# close its epoll fd and make fork+exec children (spark-submit's Java gateway,
# bookie-server, etcd) fail with "epoll_wait error: Bad file descriptor"
# (grpc/grpc#43055).  We only fork to exec, so gRPC's fork support is not
# needed.  It is read when grpc is first imported: this runs before any of our
# modules import it.  An explicit setting in the environment wins.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

__version__ = "0.1.0"
__all__ = ["BookKeeper", "errors"]


def __getattr__(name):
    # Lazy so that bookie_server (which imports pybk_spark.wire/errors) does not
    # pull in the client, grpc channels or Spark.
    if name == "BookKeeper":
        from pybk_spark.logs.client import BookKeeper
        return BookKeeper
    raise AttributeError(name)
