"""The value parsers every option of the ``bookkeeper`` source is read with.

Spark hands a data source a case-insensitive ``str -> str`` map; these
functions find one option in it (:func:`option`) and turn its text into a
boolean, a positive integer or size, a duration, or the ``{"<ledgerId>":
int}`` JSON of per-ledger offsets and times.  A value they cannot take
raises ``errors.IncorrectParameter`` naming the option and what was expected
(a name nobody knows gets ``errors.did_you_mean``'s hint, option_names.py).
The option sets built from them are options.py (reads, streams),
write_options.py (writes, the sink) and client_options.py (client settings).

Pure: no I/O, no clock.
"""
from __future__ import annotations

from typing import Iterator, Mapping, Optional

from pybk_spark import errors


def option(options: Mapping[str, str], name: str) -> Optional[str]:
    """Case-insensitive lookup (Spark passes a CaseInsensitiveDict; plain dicts
    from tests and jobs are accepted too)."""
    if name in options:
        return options[name]
    lowered = name.lower()
    for key, value in options.items():
        if key.lower() == lowered:
            return value
    return None


BOOLEAN_SPELLINGS = ("true", "false")     # case-insensitive, as Spark's own options


def parse_bool(name: str, text: Optional[str], default: bool) -> bool:
    """A boolean option: ``true`` or ``false``, case-insensitively (docs/spark.md)."""
    if text is None:
        return default
    value = str(text).strip().lower()
    if value in BOOLEAN_SPELLINGS:
        return value == "true"
    raise errors.IncorrectParameter(f"option {name!r} must be true or false "
                                    f"(case-insensitive), not {text!r}")


def parse_positive_int(name: str, text: Optional[str], default: int, minimum: int = 1) -> int:
    """A count or a size in bytes: an integer >= ``minimum`` (1: positive)."""
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if text is None:
        return default
    try:
        value = int(str(text).strip())
    except ValueError:
        raise errors.IncorrectParameter(f"option {name!r} must be {kind}, got {text!r}") from None
    if value < minimum:
        raise errors.IncorrectParameter(f"option {name!r} must be {kind}, got {text!r}")
    return value


_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(name: str, text: Optional[str], default: float) -> float:
    """``15m``, ``10s``, ``500ms``, ``1h``, ``1d``; a bare number is milliseconds
    (as Spark's Kafka source reads ``maxTriggerDelay``).  -> seconds."""
    if text is None:
        return default
    raw = str(text).strip().lower()
    number = raw.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = raw[len(number):].strip() or "ms"
    try:
        value = float(number.strip())
    except ValueError:
        value = -1.0
    if unit not in _DURATION_UNITS or value < 0:
        raise errors.IncorrectParameter(
            f"option {name!r} must be a duration such as '15m', '30s' or '500ms', got {text!r}")
    return value * _DURATION_UNITS[unit]


def ledger_integers(name: str, parsed: Mapping[str, object], what: str
                    ) -> Iterator[tuple[int, int]]:
    """The ``(ledger id, integer)`` items of option ``name``'s JSON object
    ``{"<ledgerId>": int, ...}`` (by-ledger offsets and times), one at a time;
    a key that is not a ledger id, or a value that is not an integer, is refused
    naming ``what`` the value is."""
    for key, value in parsed.items():
        try:
            ledger_id = int(key)
        except ValueError:
            raise errors.IncorrectParameter(
                f"option {name!r}: key {key!r} is not a ledger id") from None
        if isinstance(value, bool) or not isinstance(value, int):
            raise errors.IncorrectParameter(
                f"option {name!r}: {what} for ledger {ledger_id} must be an integer, got {value!r}")
        yield ledger_id, value
