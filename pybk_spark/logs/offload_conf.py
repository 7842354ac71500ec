"""The offload settings: conf/offload.conf (``key = value``, the client's
conf-file syntax) -> the location and an ``OffloadPolicy``.  Flags of
``pybk offload`` and ``jobs/offload.py`` override the file's values."""
from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any, Mapping, Optional

from pybk_spark import errors
from pybk_spark.config import conf_pairs
from pybk_spark.logs.offload_files import ROW_GROUP_BYTES
from pybk_spark.protocol.offload import OffloadPolicy


@dataclass(frozen=True)
class OffloadSettings:
    location: str = "offload"          # a local path, or a pyarrow.fs URI
    keep_segments: int = 2
    min_age_s: float = 0.0
    keep_bytes: int = -1
    grace_s: float = 3600.0
    orphan_age_s: float = 600.0
    row_group_bytes: int = ROW_GROUP_BYTES

    def policy(self) -> OffloadPolicy:
        return OffloadPolicy(keep_segments=self.keep_segments, min_age_s=self.min_age_s,
                             keep_bytes=self.keep_bytes, grace_s=self.grace_s,
                             orphan_age_s=self.orphan_age_s)

    def with_overrides(self, values: Mapping[str, Any]) -> "OffloadSettings":
        known = {f.name for f in fields(self)}
        conv: dict[str, Any] = {}
        for key, raw in values.items():
            if raw is None:
                continue
            if key not in known:
                hint = errors.did_you_mean(key, known)
                raise errors.IncorrectParameter(f"unknown offload setting {key!r}"
                                                + (f"; {hint}" if hint else ""))
            try:
                conv[key] = type(getattr(self, key))(raw)
            except (TypeError, ValueError):
                raise errors.IncorrectParameter(
                    f"offload setting {key} = {raw!r}: expected a "
                    f"{type(getattr(self, key)).__name__}") from None
        new = replace(self, **conv)
        new.policy()                   # IncorrectParameter naming a bad limit
        if new.row_group_bytes < 1:
            raise errors.IncorrectParameter("offload setting row_group_bytes: at least 1")
        return new


def load_offload_conf(path: Optional[str] = None, **overrides: Any) -> OffloadSettings:
    """The settings of ``path`` (None: the defaults), then ``overrides``."""
    settings = OffloadSettings()
    if path:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise errors.IncorrectParameter(f"cannot read offload conf {path}: "
                                            f"{exc.strerror or exc}") from None
        settings = settings.with_overrides(
            {k: v for _n, k, v in conf_pairs(text, lambda n, line: errors.IncorrectParameter(
                f"{path}:{n}: not 'key = value': {line!r}"))})
    return settings.with_overrides(overrides)
