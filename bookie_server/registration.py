"""Registration in the metadata store, under a lease that dies with the bookie.

``bookies/writable/<id>`` or ``bookies/readonly/<id>`` holds
``{"bookie_id","address","rack","metrics_port","state","add_lane_address","limits"}``
(``add_lane_address`` is empty when the bookie serves no add lane; ``limits``
is ``{"max_entry_bytes", "max_batch_bytes"}``, the add sizes this bookie
accepts, which clients check before assigning entry ids) under a lease of
``ttl`` seconds, refreshed every ttl/3.  If a refresh fails (lease expired,
etcd restarted) a new lease is granted and the key re-put.  Switching mode
puts the new key first, then deletes the old one.
"""
from __future__ import annotations

import json
import logging
import threading
from typing import Optional

from pybk_spark import errors

log = logging.getLogger("bookie.registration")


def registration_key(bookie_id: str, read_only: bool) -> str:
    return f"bookies/{'readonly' if read_only else 'writable'}/{bookie_id}"


class Registrar:
    def __init__(self, store, bookie_id: str, address: str, rack: str, metrics_port: int,
                 ttl: int = 5, add_lane_address: str = "", limits: dict | None = None):
        self.store = store
        self.bookie_id = bookie_id
        self.address = address
        self.rack = rack
        self.metrics_port = metrics_port
        self.add_lane_address = add_lane_address
        self.limits = dict(limits or {})
        self.ttl = max(2, int(ttl))
        self.read_only = False
        self._lease = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _value(self) -> bytes:
        return json.dumps({"bookie_id": self.bookie_id, "address": self.address,
                           "rack": self.rack, "metrics_port": self.metrics_port,
                           "state": "readonly" if self.read_only else "writable",
                           "add_lane_address": self.add_lane_address,
                           "limits": self.limits}).encode()

    def start(self, read_only: bool = False) -> None:
        with self._lock:
            self.read_only = read_only
            self._register()
        self._thread = threading.Thread(target=self._refresh_loop, name="registration",
                                        daemon=True)
        self._thread.start()

    def _register(self) -> None:
        self._lease = self.store.grant_lease(self.ttl)
        self.store.put(registration_key(self.bookie_id, self.read_only), self._value(),
                       lease=self._lease)
        log.info("event=registered key=%s lease_ttl=%d",
                 registration_key(self.bookie_id, self.read_only), self.ttl)

    def set_read_only(self, read_only: bool) -> None:
        with self._lock:
            if read_only == self.read_only:
                return
            if self._lease is None:          # not registered yet: start() uses the mode
                self.read_only = read_only
                return
            old = registration_key(self.bookie_id, self.read_only)
            self.read_only = read_only
            try:
                self.store.put(registration_key(self.bookie_id, read_only), self._value(),
                               lease=self._lease)
                self.store.delete(old)
            except errors.BKError as exc:
                log.warning("event=reregister_failed error=%r (retried by refresh loop)", exc)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.ttl / 3.0):
            with self._lock:
                try:
                    self._lease.refresh()
                    if self.store.get(registration_key(self.bookie_id, self.read_only)) is None:
                        raise errors.MetadataError("registration key vanished")
                except Exception as exc:  # noqa: BLE001 - lease lost or store down
                    log.warning("event=lease_refresh_failed error=%r", exc)
                    try:
                        self._register()
                    except Exception as exc2:  # noqa: BLE001
                        log.warning("event=reregister_failed error=%r", exc2)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            try:
                self.store.delete(registration_key(self.bookie_id, self.read_only))
                if self._lease is not None:
                    self._lease.revoke()
            except Exception as exc:  # noqa: BLE001
                log.warning("event=unregister_failed error=%r", exc)
