"""Options of the ``bookkeeper`` Spark data source, parsed and validated.

Theory of operation
-------------------
Spark hands a data source a case-insensitive ``str -> str`` map.  This module
turns it into a frozen :class:`ReadOptions` / :class:`StreamOptions` value
(writes: write_options.py), or raises ``errors.IncorrectParameter`` naming
the option and what was expected, before any I/O happens.  Which names each
operation takes is option_names.py; the values are read with
option_values.py's parsers; ``bk.*`` and the TLS options become client
settings in client_options.py; append-time bounds are time_options.py.

Offsets follow Spark's Kafka connector:
  * ``startingOffsets`` is inclusive, ``endingOffsets`` is exclusive;
  * ``earliest`` / ``latest`` apply to every ledger;
  * JSON ``{"<ledgerId>": entryId, ...}`` sets single ledgers; ledgers not
    named keep the default (earliest for start, latest for end);
    in JSON, ``-2`` means earliest and ``-1`` means latest;
  * with option ``log``, the JSON may name the log the ledgers belong to,
    ``"uid": "<the log's uid>"`` (``pybk logmetadata``; protocol/log_identity.py):
    a read of another log of that name (deleted and created again) is
    then refused with ``LogRecreated`` (reader.py).
"Latest" is the end of what may be read: last entry + 1 for a CLOSED ledger,
LAC + 1 for a ledger that is still OPEN (recovery=false).

Pure: no I/O, no clock.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Mapping, Optional

from pybk_spark import errors
from pybk_spark.spark import option_names as names
from pybk_spark.spark.client_options import ClientSettings, client_overrides
from pybk_spark.spark.multi_offsets import parse_starting
from pybk_spark.spark.option_values import (ledger_integers, option, parse_bool, parse_duration,
                                            parse_positive_int)
from pybk_spark.spark.stream_offsets import UID_KEY
from pybk_spark.spark.time_options import TimeBounds, parse_time_bounds

EARLIEST = -2
LATEST = -1

DEFAULT_MAX_ENTRIES_PER_PARTITION = 100_000
DEFAULT_READ_BATCH_ENTRIES = 1000
DEFAULT_READ_BATCH_BYTES = 16 << 20     # one read window (all bookies together)
DEFAULT_READ_AHEAD_BATCHES = 1          # windows read while Spark takes the previous one
DEFAULT_READ_WINDOWS_IN_FLIGHT = 3      # read requests out at once per task (read_handle.py)


@dataclass(frozen=True)
class ReadOptions:
    metadata_uri: str
    ledgers: tuple[int, ...] = ()
    log: Optional[str] = None
    starting: Mapping[int, int] = field(default_factory=dict)   # ledger -> first entry / EARLIEST / LATEST
    starting_default: int = EARLIEST
    ending: Mapping[int, int] = field(default_factory=dict)     # ledger -> end (exclusive) / LATEST
    ending_default: int = LATEST
    recovery: bool = False
    max_entries_per_partition: int = DEFAULT_MAX_ENTRIES_PER_PARTITION
    read_batch_entries: int = DEFAULT_READ_BATCH_ENTRIES
    read_batch_bytes: int = DEFAULT_READ_BATCH_BYTES
    read_ahead_batches: int = DEFAULT_READ_AHEAD_BATCHES
    read_windows_in_flight: int = DEFAULT_READ_WINDOWS_IN_FLIGHT
    password: bytes = b""
    extra_passwords: tuple[bytes, ...] = ()  # tried per ledger after password (extraPasswords)
    include_metadata: bool = False          # DataFrame logs: add _ledger_id, _entry_id
    fail_on_data_loss: bool = True          # truncated position / deleted ledger: LogTruncated
    min_partitions: Optional[int] = None    # split slices until there are at least this many
    client_conf: ClientSettings = ()        # ClientConfig overrides: bk.* + tls.*
    logs: tuple[str, ...] = ()              # several logs (multi_log.py)
    log_pattern: Optional[str] = None       # regex over log names (multi_log.py)
    times: TimeBounds = TimeBounds()        # start / end by append time (time_options.py)
    offsets_uid: Optional[str] = None       # uid of the log the JSON offsets were taken in

    @property
    def passwords(self) -> tuple[bytes, ...]:
        """Every password a ledger of this read may be opened with, in order."""
        return (self.password,) + self.extra_passwords

    def start_for(self, ledger_id: int) -> int:
        return self.starting.get(ledger_id, self.starting_default)

    def end_for(self, ledger_id: int) -> int:
        return self.ending.get(ledger_id, self.ending_default)


def parse_extra_passwords(value: Optional[str]) -> tuple[bytes, ...]:
    """Option ``extraPasswords``: a JSON array of strings (a password may
    hold any character, a comma too)."""
    if value is None or not str(value).strip():
        return ()
    try:
        got = json.loads(value)
    except ValueError:
        got = None
    if not isinstance(got, list) or not all(isinstance(p, str) for p in got):
        raise errors.IncorrectParameter(
            "option 'extraPasswords' must be a JSON array of strings, e.g. '[\"old-password\"]'")
    return tuple(p.encode() for p in got)


def parse_ledgers(text: str) -> tuple[int, ...]:
    ids = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            ledger_id = int(part)
        except ValueError:
            raise errors.IncorrectParameter(
                f"option 'ledgers' must be 'ID[,ID...]' of integers, got {text!r}") from None
        if ledger_id < 0:
            raise errors.IncorrectParameter(f"option 'ledgers' has a negative ledger id: {ledger_id}")
        if ledger_id not in ids:
            ids.append(ledger_id)
    if not ids:
        raise errors.IncorrectParameter("option 'ledgers' names no ledger")
    return tuple(ids)


def _parse_logs(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(p.strip() for p in str(text).split(",") if p.strip()))
    if not names:
        raise errors.IncorrectParameter("option 'logs' names no log, e.g. 'events,clicks'")
    return names


def _parse_pattern(text: str) -> str:
    try:
        re.compile(str(text))
    except re.error as exc:
        raise errors.IncorrectParameter(
            f"option 'logPattern' is not a regular expression ({exc}): {text!r}") from None
    return str(text)


def parse_offsets(name: str, text: Optional[str], *, default: int,
                  allow_earliest: bool, allow_latest: bool) -> tuple[int, dict[int, int]]:
    """-> (default for unnamed ledgers, {ledger_id: offset})."""
    if text is None:
        return default, {}
    stripped = str(text).strip()
    word = stripped.lower()
    if word in ("earliest", "latest"):
        value = EARLIEST if word == "earliest" else LATEST
        _check_special(name, value, allow_earliest, allow_latest)
        return value, {}
    try:
        parsed = json.loads(stripped)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict):
        raise errors.IncorrectParameter(
            f"option {name!r} must be 'earliest', 'latest' or JSON "
            f"{{\"<ledgerId>\": entryId, ...}}, got {text!r}")
    out: dict[int, int] = {}
    parsed = {k: v for k, v in parsed.items() if k != UID_KEY}
    for ledger_id, value in ledger_integers(name, parsed, "offset"):
        if value < 0:
            if value not in (EARLIEST, LATEST):
                raise errors.IncorrectParameter(
                    f"option {name!r}: offset {value} for ledger {ledger_id} is invalid "
                    "(use an entry id >= 0, -2 for earliest or -1 for latest)")
            _check_special(name, value, allow_earliest, allow_latest)
        out[ledger_id] = value
    return default, out


def offsets_uid(options: Mapping[str, str]) -> Optional[str]:
    """The ``"uid"`` named by the JSON of ``startingOffsets`` / ``endingOffsets``
    (None: neither names one); the two must agree."""
    found: dict[str, str] = {}
    for name in ("startingOffsets", "endingOffsets"):
        text = option(options, name)
        try:
            parsed = json.loads(str(text)) if text is not None else None
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and parsed.get(UID_KEY) is not None:
            uid = parsed[UID_KEY]
            if not isinstance(uid, str) or not uid:
                raise errors.IncorrectParameter(
                    f"option {name!r}: \"uid\" must be a log's uid (pybk logmetadata LOG), "
                    f"got {uid!r}")
            found[name] = uid
    if len(set(found.values())) > 1:
        raise errors.IncorrectParameter(
            "options 'startingOffsets' and 'endingOffsets' name different logs: "
            + ", ".join(f"{n} has uid {u}" for n, u in sorted(found.items())))
    return next(iter(found.values()), None)


def _check_special(name: str, value: int, allow_earliest: bool, allow_latest: bool) -> None:
    if value == EARLIEST and not allow_earliest:
        raise errors.IncorrectParameter(f"option {name!r} cannot be 'earliest'")
    if value == LATEST and not allow_latest:
        raise errors.IncorrectParameter(f"option {name!r} cannot be 'latest'")


def metadata_service_uri(options: Mapping[str, str], *, writing: bool = False) -> str:
    """The required ``metadataServiceUri`` (reads and writes), stripped."""
    uri = option(options, "metadataServiceUri")
    if not options and writing:
        raise errors.IncorrectParameter(
            "no options reached the bookkeeper writer: PySpark hands a Python source "
            "no table options, so an INSERT into a bookkeeper table names its target: "
            "INSERT INTO t WITH ('metadataServiceUri' = 'etcd://HOST:PORT/SCOPE', "
            "'log' = 'NAME') ... (docs/spark.md, 'SQL')")
    if not options:
        raise errors.IncorrectParameter(
            "no options reached the bookkeeper source: PySpark hands a Python source no "
            "table options, and this catalog table did not record its own (it was created "
            "with a column list, which keeps Spark from asking the source for its schema, "
            "or by an earlier version); re-create it without a column list: CREATE TABLE t "
            "USING bookkeeper OPTIONS (...), or give them per query: SELECT ... FROM t "
            "WITH (...) (docs/spark.md, 'SQL')")
    if uri is None or not str(uri).strip():
        raise errors.IncorrectParameter(
            "option 'metadataServiceUri' is required, e.g. "
            ".option('metadataServiceUri', 'etcd://127.0.0.1:2379/pybk') (options given: "
            f"{sorted(str(k) for k in options) or 'none'})")
    uri = str(uri).strip()
    if not uri.startswith("etcd://"):
        raise errors.IncorrectParameter(
            f"option 'metadataServiceUri' must look like etcd://HOST:PORT/SCOPE, got {uri!r}")
    return uri


def parse_read_options(options: Mapping[str, str], *, check_names: bool = True) -> ReadOptions:
    """Options of a batch read (``check_names=False``: the caller checked the
    names already, for another operation)."""
    options = names.fold_table_options(options)
    if check_names:
        names.check_names(options, names.BATCH_READ, "batch reads")
    uri = metadata_service_uri(options)

    ledgers_text = option(options, "ledgers")
    log = option(options, "log")
    logs_text, pattern = option(options, "logs"), option(options, "logPattern")
    if (ledgers_text is None and log is None and logs_text is None and pattern is None
            and option(options, "path")):
        ledgers_text = option(options, "path")      # .load("12,13") is a shorthand for ledgers
    given = [n for n, v in (("ledgers", ledgers_text), ("log", log), ("logs", logs_text),
                            ("logPattern", pattern)) if v is not None]
    if len(given) > 1:
        raise errors.IncorrectParameter(
            f"options {given} are mutually exclusive: name the data with one of them")
    if not given:
        raise errors.IncorrectParameter(
            "one of the options 'ledgers', 'log', 'logs' or 'logPattern' is required")
    logs = _parse_logs(logs_text) if logs_text is not None else ()
    if pattern is not None:
        pattern = _parse_pattern(pattern)
    ledgers = parse_ledgers(ledgers_text) if ledgers_text is not None else ()
    if log is not None and not str(log).strip():
        raise errors.IncorrectParameter("option 'log' must name a log")

    start_default, starting = parse_offsets(
        "startingOffsets", option(options, "startingOffsets"), default=EARLIEST,
        allow_earliest=True, allow_latest=True)
    end_default, ending = parse_offsets(
        "endingOffsets", option(options, "endingOffsets"), default=LATEST,
        allow_earliest=False, allow_latest=True)
    if (logs or pattern is not None) and (starting or ending):
        raise errors.IncorrectParameter(
            "with 'logs'/'logPattern', 'startingOffsets'/'endingOffsets' may only be "
            "'earliest'/'latest' (ledger ids are per log)")
    uid = offsets_uid(options)
    if uid is not None and log is None:
        raise errors.IncorrectParameter(
            "\"uid\" in 'startingOffsets'/'endingOffsets' names a log: it goes with "
            "option 'log' only")
    times = parse_time_bounds(lambda n: option(options, n), multi=bool(logs or pattern))
    if ledgers:
        for name, named in (("startingOffsets", starting), ("endingOffsets", ending),
                            ("startingOffsetsByTimestamp/endingOffsetsByTimestamp",
                             times.named_ledgers)):
            unknown = sorted(set(named) - set(ledgers))
            if unknown:
                raise errors.IncorrectParameter(
                    f"option {name!r} names ledgers not listed in 'ledgers': {unknown}")

    password = option(options, "password")
    return ReadOptions(
        metadata_uri=uri,
        ledgers=ledgers,
        log=str(log).strip() if log is not None else None,
        starting=starting, starting_default=start_default,
        ending=ending, ending_default=end_default,
        recovery=parse_bool("recovery", option(options, "recovery"), False),
        max_entries_per_partition=parse_positive_int(
            "maxEntriesPerPartition", option(options, "maxEntriesPerPartition"),
            DEFAULT_MAX_ENTRIES_PER_PARTITION),
        read_batch_entries=parse_positive_int(
            "readBatchEntries", option(options, "readBatchEntries"), DEFAULT_READ_BATCH_ENTRIES),
        read_batch_bytes=parse_positive_int(
            "readBatchBytes", option(options, "readBatchBytes"), DEFAULT_READ_BATCH_BYTES),
        read_ahead_batches=parse_positive_int(
            "readAheadBatches", option(options, "readAheadBatches"), DEFAULT_READ_AHEAD_BATCHES,
            minimum=0),
        read_windows_in_flight=parse_positive_int(
            "readWindowsInFlight", option(options, "readWindowsInFlight"),
            DEFAULT_READ_WINDOWS_IN_FLIGHT),
        password=password.encode() if password else b"",
        extra_passwords=parse_extra_passwords(option(options, "extraPasswords")),
        include_metadata=parse_bool("includeMetadata", option(options, "includeMetadata"), False),
        fail_on_data_loss=parse_bool("failOnDataLoss", option(options, "failOnDataLoss"), True),
        min_partitions=parse_positive_int("minPartitions", option(options, "minPartitions"), 0)
        or None,
        offsets_uid=uid,
        client_conf=client_overrides(options),
        logs=logs, log_pattern=pattern, times=times,
    )


# -- streaming read options ------------------------------------------------------------------
DEFAULT_MAX_TRIGGER_DELAY_S = 15 * 60.0          # Kafka's maxTriggerDelay default, 15m


@dataclass(frozen=True)
class StreamOptions:
    read: ReadOptions
    starting: str = "earliest"                 # earliest | latest | JSON {"index": i, "entry": e}
    max_entries_per_trigger: Optional[int] = None
    max_bytes_per_trigger: Optional[int] = None
    min_entries_per_trigger: Optional[int] = None
    max_trigger_delay_s: float = DEFAULT_MAX_TRIGGER_DELAY_S


def parse_stream_options(options: Mapping[str, str]) -> StreamOptions:
    options = names.fold_table_options(options)
    names.check_names(options, names.STREAM_READ, "stream reads")
    multi = option(options, "logs") is not None or option(options, "logPattern") is not None
    if option(options, "log") is None and not multi:
        raise errors.IncorrectParameter(
            "the streaming bookkeeper source needs option 'log' (or 'logs' / 'logPattern'; "
            "streams read logs, option 'ledgers' is for batch reads)")
    if option(options, "startingOffsets") is not None and option(options, "startingTimestamp"):
        raise errors.IncorrectParameter(
            "options 'startingOffsets' and 'startingTimestamp' both set: give one of them")
    starting = option(options, "startingOffsets") or "earliest"
    stripped = str(starting).strip()
    if stripped.lower() in ("earliest", "latest"):
        starting = stripped.lower()
    elif multi:
        parse_starting(stripped)          # {"<log>": {"index": I, "entry": E}}
        starting = stripped
    else:
        try:
            parsed = json.loads(stripped)
            ok = isinstance(parsed, dict) and all(
                isinstance(parsed.get(k), int) and parsed[k] >= 0 for k in ("index", "entry"))
        except ValueError:
            ok = False
        if not ok:
            raise errors.IncorrectParameter(
                "option 'startingOffsets' of a stream must be 'earliest', 'latest' or JSON "
                f"{{\"index\": SEGMENT_INDEX, \"entry\": ENTRY_ID}}, got {starting!r}")
        starting = stripped
    stream_only = {n.lower() for n in names.STREAM_ONLY_READ} | {"startingoffsets"}
    base = {k: v for k, v in dict(options).items() if k.lower() not in stream_only}

    def optional_int(name: str) -> Optional[int]:
        text = option(options, name)
        return parse_positive_int(name, text, 1) if text is not None else None
    return StreamOptions(
        read=parse_read_options(base, check_names=False), starting=starting,
        max_entries_per_trigger=optional_int("maxEntriesPerTrigger"),
        max_bytes_per_trigger=optional_int("maxBytesPerTrigger"),
        min_entries_per_trigger=optional_int("minEntriesPerTrigger"),
        max_trigger_delay_s=parse_duration("maxTriggerDelay", option(options, "maxTriggerDelay"),
                                           DEFAULT_MAX_TRIGGER_DELAY_S))


# -- load(): batch or stream ------------------------------------------------------------------
def parse_load_options(options: Mapping[str, str]) -> ReadOptions:
    """What ``load()`` can check: Spark calls the same ``schema()`` for
    ``read`` and ``readStream``.  Names must be valid for some read; a
    stream-only option makes it a stream read, a batch-only one a batch read
    (both: refused); otherwise ``startingOffsets`` may have either form.  The
    batch reader and the stream reader check their own set again."""
    options = names.fold_table_options(options)
    names.check_names(options, names.ANY_READ, "reads")
    stream_only = names.present(options, names.STREAM_ONLY_READ)
    batch_only = names.present(options, names.BATCH_ONLY_READ)
    if stream_only and batch_only:
        raise errors.IncorrectParameter(
            f"options {batch_only} are for batch reads (spark.read) and {stream_only} for "
            "stream reads (spark.readStream); a read cannot have both")
    if stream_only:
        return parse_stream_options(options).read
    if batch_only:
        return parse_read_options(options)
    try:
        return parse_read_options(options)
    except errors.IncorrectParameter as batch_error:
        if option(options, "startingOffsets") is None:
            raise
        try:
            return parse_stream_options(options).read
        except errors.IncorrectParameter:
            raise batch_error from None
