"""Which option names the ``bookkeeper`` source accepts, and where.

Theory of operation
-------------------
Spark hands a Python data source every ``.option(...)`` the user set, with
names lowercased (a ``CaseInsensitiveDict``), plus a few of its own:
``path`` (``load(PATH)`` / ``save(PATH)`` / ``start(PATH)``), and for
``writeStream`` ``checkpointLocation`` and ``queryName`` (checked against
PySpark 4.3: nothing else reaches the source).  An option Spark does not
know is silently passed through, so a misspelt name would be ignored.

:func:`check_names` refuses, with ``IncorrectParameter``, every name that is
not valid for the operation at hand: a name valid for another operation is
named as such ("applies to batch reads only"); any other name gets the
closest valid names (``errors.did_you_mean``).  Names are compared case-insensitively
and reported in their documented spelling.

``load()`` cannot tell a batch read from a stream read (Spark calls the same
``schema()`` for both), so it checks against :data:`ANY_READ`; the batch
reader (at planning) and the stream reader (at ``start()``) check their own
sets again.

Pure: no I/O.
"""
from __future__ import annotations

from typing import Iterable, Mapping

from pybk_spark import errors
from pybk_spark.spark.client_options import CLIENT_PREFIX, KNOWN_TLS_OPTIONS

# -- the catalogue: documented spelling -------------------------------------------------------
COMMON_READ = (
    "metadataServiceUri", "log", "startingOffsets", "includeMetadata", "password",
    "maxEntriesPerPartition", "readBatchEntries", "readBatchBytes", "readAheadBatches",
    "readWindowsInFlight", "failOnDataLoss", "minPartitions", "startingTimestamp", "logs",
    "logPattern", "extraPasswords",
) + KNOWN_TLS_OPTIONS
BATCH_READ = COMMON_READ + ("ledgers", "endingOffsets", "recovery", "path", "endingTimestamp",
                            "startingOffsetsByTimestamp", "endingOffsetsByTimestamp")
STREAM_READ = COMMON_READ + ("maxEntriesPerTrigger", "maxBytesPerTrigger",
                             "minEntriesPerTrigger", "maxTriggerDelay")
BATCH_WRITE = (
    "metadataServiceUri", "log", "path", "ensembleSize", "writeQuorum", "ackQuorum",
    "maxRowsPerEntry", "maxBytesPerEntry", "password", "mergeSchema",
) + KNOWN_TLS_OPTIONS
STREAM_WRITE = BATCH_WRITE + ("checkpointLocation", "sinkId", "queryName")
ANY_READ = tuple(dict.fromkeys(BATCH_READ + STREAM_READ))

BATCH_ONLY_READ = tuple(n for n in BATCH_READ if n not in STREAM_READ)
STREAM_ONLY_READ = tuple(n for n in STREAM_READ if n not in BATCH_READ)

_OPERATIONS = (
    ("batch reads", BATCH_READ),
    ("stream reads", STREAM_READ),
    ("batch writes", BATCH_WRITE),
    ("stream writes", STREAM_WRITE),
)
_SPELLING = {n.lower(): n for _, names in _OPERATIONS for n in names}


def spelling(name: str) -> str:
    """The documented spelling of an option name (the name itself if unknown)."""
    return _SPELLING.get(str(name).lower(), str(name))


def present(options: Mapping[str, str], names: Iterable[str]) -> list[str]:
    """The names (documented spelling) of ``names`` set in ``options``."""
    given = {str(k).lower() for k in options}
    return [n for n in names if n.lower() in given]


TABLE_PREFIX = "option."     # CREATE TABLE ... OPTIONS (k v): Spark also passes option.k


# table properties Spark adds for a catalog table (TableCatalog's reserved ones)
TABLE_PROPERTIES = ("provider", "location", "comment", "owner", "external",
                    "is_managed_location", "collation")


def fold_table_options(options: Mapping[str, str]) -> dict[str, str]:
    """Options of a SQL table (``CREATE TABLE t USING bookkeeper OPTIONS
    (...)``): Spark hands each one over twice, as ``k`` and as ``option.k``
    (its table-property spelling), with its own table properties
    (``provider``, ...).  Fold ``option.k`` into ``k``; drop the properties
    (only then: a read that is not a table keeps its options as given)."""
    table = any(str(k).lower().startswith(TABLE_PREFIX) for k in options)
    out: dict[str, str] = {}
    for key, value in options.items():
        if table and str(key).lower() in TABLE_PROPERTIES:
            continue
        if str(key).lower().startswith(TABLE_PREFIX):
            out.setdefault(str(key)[len(TABLE_PREFIX):], value)
        else:
            out[key] = value
    return out


def applies(name: str, allowed: set[str]) -> bool:
    """Whether option ``name`` applies to an operation whose (lower-case)
    option names are ``allowed``: ``bk.*`` client settings apply to every one."""
    lowered = str(name).lower()
    return lowered in allowed or lowered.startswith(CLIENT_PREFIX)


def check_names(options: Mapping[str, str], valid: tuple[str, ...], operation: str) -> None:
    """Refuse any option name not in ``valid``; ``operation`` ('batch reads',
    'stream reads', 'batch writes', 'stream writes', 'reads') is named in the
    message.  ``bk.*`` names are client settings, valid everywhere (their keys
    are checked by ``client_options.client_settings``)."""
    allowed = {n.lower() for n in valid}
    for key in options:
        if applies(key, allowed):
            continue
        lowered = str(key).lower()
        name = spelling(key)
        where = [op for op, names in _OPERATIONS if lowered in {n.lower() for n in names}]
        if where:
            raise errors.IncorrectParameter(
                f"option {name!r} applies to {' and '.join(where)} only, not to {operation}")
        close = errors.did_you_mean(key, valid)
        hint = (f"; {close}" if close
                else "; valid options: " + ", ".join(
                    sorted((n for n in valid if not n.startswith("_")), key=str.lower)))
        raise errors.IncorrectParameter(
            f"unknown option {str(key)!r} for bookkeeper {operation}{hint} "
            "(option names are case-insensitive; docs/spark.md lists them)")
