"""Options of a write to the ``bookkeeper`` Spark data source (batch
``df.write`` and the streaming sink), parsed and validated into a frozen
:class:`WriteOptions` value; a bad option raises ``errors.IncorrectParameter``
naming it, before any I/O (the read options are in options.py).

Pure: no I/O, no clock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from pybk_spark import errors
from pybk_spark.spark import option_names as names
from pybk_spark.spark.client_options import ClientSettings, client_overrides
from pybk_spark.spark.option_values import option, parse_bool, parse_positive_int
from pybk_spark.spark.options import metadata_service_uri

DEFAULT_MAX_ROWS_PER_ENTRY = 10_000
DEFAULT_MAX_BYTES_PER_ENTRY = 1 << 20
MAX_BYTES_PER_ENTRY_LIMIT = 3 << 20           # stays under gRPC's default 4 MiB message


@dataclass(frozen=True)
class WriteOptions:
    metadata_uri: str
    log: str
    ensemble: int = 3
    write_quorum: int = 2
    ack_quorum: int = 2
    max_rows_per_entry: int = DEFAULT_MAX_ROWS_PER_ENTRY
    max_bytes_per_entry: int = DEFAULT_MAX_BYTES_PER_ENTRY
    password: bytes = b""
    sink_id: Optional[str] = None            # streaming sink identity (exactly-once key)
    client_conf: ClientSettings = ()        # ClientConfig overrides: bk.* + tls.*
    merge_schema: bool = False               # allow adding nullable columns at the end


def parse_write_options(options: Mapping[str, str], *, streaming: bool = False) -> WriteOptions:
    options = names.fold_table_options(options)
    if streaming:
        names.check_names(options, names.STREAM_WRITE, "stream writes")
    else:
        names.check_names(options, names.BATCH_WRITE, "batch writes")
    uri = metadata_service_uri(options, writing=True)
    log = option(options, "log") or option(options, "path")
    if log is None or not str(log).strip():
        raise errors.IncorrectParameter("option 'log' is required to write (the log to append to)")
    log = str(log).strip()
    if "/" in log:
        raise errors.IncorrectParameter(f"option 'log' must not contain '/', got {log!r}")
    ensemble = parse_positive_int("ensembleSize", option(options, "ensembleSize"), 3)
    write_quorum = parse_positive_int("writeQuorum", option(options, "writeQuorum"),
                                      min(2, ensemble))
    ack_quorum = parse_positive_int("ackQuorum", option(options, "ackQuorum"), min(2, write_quorum))
    if not ack_quorum <= write_quorum <= ensemble:
        raise errors.IncorrectParameter(
            "options must satisfy ackQuorum <= writeQuorum <= ensembleSize, got "
            f"{ack_quorum} <= {write_quorum} <= {ensemble}")
    max_bytes = parse_positive_int("maxBytesPerEntry", option(options, "maxBytesPerEntry"),
                                   DEFAULT_MAX_BYTES_PER_ENTRY)
    if max_bytes > MAX_BYTES_PER_ENTRY_LIMIT:
        raise errors.IncorrectParameter(
            f"option 'maxBytesPerEntry' must be <= {MAX_BYTES_PER_ENTRY_LIMIT}, got {max_bytes}")
    sink_id = None
    if streaming:
        sink_id = option(options, "sinkId") or option(options, "checkpointLocation")
        if sink_id is None or not str(sink_id).strip():
            raise errors.IncorrectParameter(
                "the bookkeeper sink needs option 'checkpointLocation' (or 'sinkId'): it is the "
                "identity under which committed batch ids are recorded for exactly-once")
        sink_id = str(sink_id).strip()
    password = option(options, "password")
    return WriteOptions(
        metadata_uri=uri, log=log, ensemble=ensemble, write_quorum=write_quorum,
        ack_quorum=ack_quorum,
        max_rows_per_entry=parse_positive_int("maxRowsPerEntry", option(options, "maxRowsPerEntry"),
                                              DEFAULT_MAX_ROWS_PER_ENTRY),
        max_bytes_per_entry=max_bytes,
        password=password.encode() if password else b"",
        sink_id=sink_id,
        client_conf=client_overrides(options),
        merge_schema=parse_bool("mergeSchema", option(options, "mergeSchema"), False),
    )
