"""pybk-spark: Apache BookKeeper's replicated-ledger protocol in Python, native to Spark."""
__version__ = "0.1.0"
__all__ = ["BookKeeper", "errors"]


def __getattr__(name):
    # Lazy so that bookie_server (which imports pybk_spark.wire/errors) does not
    # pull in the client, grpc channels or Spark.
    if name == "BookKeeper":
        from pybk_spark.client import BookKeeper
        return BookKeeper
    raise AttributeError(name)
