"""Ensemble placement policies.

``writable_bookies(store)`` reads the registry (``bookies/writable/<id>``
JSON with a ``rack`` label).  A policy picks ``n`` distinct bookies, or a
replacement outside the current ensemble, with an injected ``random.Random``.

* ``RandomPlacement``: uniform choice (default).
* ``RackAwarePlacement``: spreads an ensemble over as many racks as possible
  (round-robin over racks in random order); a replacement prefers a rack not
  already used by the rest of the ensemble.

Too few candidates => NotEnoughBookies, naming the ensemble and every
writable bookie that was not a candidate, with why (``exclude`` may be a
mapping bookie -> reason; a plain iterable's bookies read "excluded by the
caller").
"""
from __future__ import annotations

import json
import random
from typing import Any, Iterable, Mapping

from pybk_spark import errors
from pybk_spark.metadata.store import MetadataStore
from pybk_spark.metadata import keys


DECOMMISSIONED_PREFIX = "audit/decommissioned/"

# a bookie's registration as it registered it (JSON: addresses, rack, ...)
Registration = dict[str, Any]


def writable_bookies(store: MetadataStore) -> dict[str, Registration]:
    """Registered writable bookies, minus those an operator is decommissioning
    (``pybk decommission``): no new ensemble or replacement lands on them."""
    leaving = {key.rsplit("/", 1)[1] for key, _v in store.list_prefix(DECOMMISSIONED_PREFIX)}
    out: dict[str, Registration] = {}
    for key, v in store.list_prefix(keys.bookies_prefix("writable")):
        bookie_id = key.rsplit("/", 1)[1]
        if bookie_id in leaving:
            continue
        try:
            reg = json.loads(v.value)
        except ValueError:
            reg = {}
        out[bookie_id] = reg if isinstance(reg, dict) else {}
    return out


class PlacementPolicy:
    def __init__(self, rng: random.Random | None = None) -> None:
        self.rng = rng or random.Random()

    def new_ensemble(self, n: int, bookies: Mapping[str, Registration],
                     exclude: Iterable[str] = ()) -> tuple[str, ...]:
        raise NotImplementedError

    def replace(self, ensemble: tuple[str, ...], slot: int, bookies: Mapping[str, Registration],
                exclude: Iterable[str] = ()) -> str:
        raise NotImplementedError


def _candidates(bookies: Mapping[str, Registration], exclude: Iterable[str]) -> list[str]:
    ex = set(exclude)
    return sorted(b for b in bookies if b not in ex)


def _reasons(exclude: Iterable[str]) -> dict[str, str]:
    if isinstance(exclude, Mapping):
        return {str(b): str(why) for b, why in exclude.items()}
    return {str(b): "excluded by the caller" for b in exclude}


def refusal(bookies: Mapping[str, Registration], exclude: Iterable[str], *,
            ensemble: tuple[str, ...] = (), needed: int | None = None) -> errors.NotEnoughBookies:
    """The NotEnoughBookies of a placement: the writable bookies it could
    not use, each with its reason (members of ``ensemble`` are named as the
    ensemble, not listed again)."""
    reasons = _reasons(exclude)
    excluded = {b: reasons[b] for b in bookies if b in reasons and b not in ensemble}
    available = len(_candidates(bookies, reasons)) if needed is not None else None
    return errors.NotEnoughBookies(ensemble=ensemble, excluded=excluded, needed=needed,
                                   available=available)


class RandomPlacement(PlacementPolicy):
    def new_ensemble(self, n: int, bookies: Mapping[str, Registration],
                     exclude: Iterable[str] = ()) -> tuple[str, ...]:
        cands = _candidates(bookies, exclude)
        if len(cands) < n:
            raise refusal(bookies, exclude, needed=n)
        return tuple(self.rng.sample(cands, n))

    def replace(self, ensemble: tuple[str, ...], slot: int, bookies: Mapping[str, Registration],
                exclude: Iterable[str] = ()) -> str:
        cands = _candidates(bookies, set(exclude) | set(ensemble))
        if not cands:
            raise refusal(bookies, exclude, ensemble=tuple(ensemble))
        return self.rng.choice(cands)


class RackAwarePlacement(PlacementPolicy):
    @staticmethod
    def _rack(bookies: Mapping[str, Registration], b: str) -> str:
        return str(bookies.get(b, {}).get("rack") or "/default-rack")

    def new_ensemble(self, n: int, bookies: Mapping[str, Registration],
                     exclude: Iterable[str] = ()) -> tuple[str, ...]:
        cands = _candidates(bookies, exclude)
        if len(cands) < n:
            raise refusal(bookies, exclude, needed=n)
        racks: dict[str, list[str]] = {}
        for b in cands:
            racks.setdefault(self._rack(bookies, b), []).append(b)
        order = sorted(racks)
        self.rng.shuffle(order)
        for r in order:
            self.rng.shuffle(racks[r])
        chosen: list[str] = []
        while len(chosen) < n:
            for r in order:
                if racks[r] and len(chosen) < n:
                    chosen.append(racks[r].pop())
        return tuple(chosen)

    def replace(self, ensemble: tuple[str, ...], slot: int, bookies: Mapping[str, Registration],
                exclude: Iterable[str] = ()) -> str:
        cands = _candidates(bookies, set(exclude) | set(ensemble))
        if not cands:
            raise refusal(bookies, exclude, ensemble=tuple(ensemble))
        used = {self._rack(bookies, b) for i, b in enumerate(ensemble) if i != slot}
        fresh = [b for b in cands if self._rack(bookies, b) not in used]
        return self.rng.choice(fresh or cands)


POLICIES: dict[str, type[PlacementPolicy]] = {"random": RandomPlacement, "rack-aware": RackAwarePlacement}


def make_policy(name: str, rng: random.Random | None = None) -> PlacementPolicy:
    try:
        return POLICIES[name](rng)
    except KeyError:
        raise errors.IncorrectParameter(f"unknown placement policy {name!r}; one of {sorted(POLICIES)}") from None
