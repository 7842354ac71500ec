"""Registration in the metadata store, under a lease that dies with the bookie.

``bookies/writable/<id>`` or ``bookies/readonly/<id>`` holds a JSON dict
``{"bookie_id","address","rack","metrics_port","state","add_lane_address",
"limits","owner","tls"}`` (``add_lane_address`` is empty when the bookie serves no
add lane; ``limits`` is ``{"max_entry_bytes", "max_batch_bytes"}``, the add
sizes this bookie accepts, which clients check before assigning entry ids)
under a lease of ``ttl`` seconds, refreshed every ttl/3 (at most every 2 s:
``keepalive_period``, which says why).  ``owner`` says which
process holds the id: ``{"token","host","pid","data_dir","cookie_instance"}``
(``token`` is fresh per process).  ``tls`` is true when the bookie's ports
speak TLS: clients only use it to explain a refused connection (a client
configured for TLS never falls back to plaintext).  Readers must ignore
keys they do not know.

Theory of operation
-------------------
One id, one live bookie.  The key is created with put-if-absent under the
bookie's own lease, never overwritten blindly, so two bookies racing for one
id cannot both register.  Before the bookie writes anything to the metadata
store, and again when it registers, ``decide_claim(existing, me)`` (pure)
judges a registration already present under either mode's key (present means
its lease is alive):
  * absent, or ``owner.token`` is ours               -> FREE: create / keep it
  * same host and same (real) data dir               -> REPLACE: it was left by
    a crashed predecessor on this very data dir.  We hold the data dir's lock
    (pybk_spark/dirlock.py), which a live predecessor would still hold, so
    that process is dead; its key is replaced by compare-and-swap (the old
    lease then expires holding nothing).  A restart right after a crash
    registers at once instead of waiting out the old lease.
  * no owner (a bookie from before owners were recorded), or the same cookie
    instance seen from another host or path (a volume moved to another
    machine after a crash, or a copied data dir: not tellable apart) -> WAIT:
    the claim polls until the key vanishes, for at most ``wait_s`` (a little
    more than one lease ttl), logging that it waits; a key still there then
    belongs to a live bookie -> refuse.
  * anything else (another data dir, another cookie) -> REFUSE at once with
    ``errors.BookieIdInUse`` naming the holder.
The claim creates the key of its mode and then re-reads the other mode's key;
if a foreign one appeared meanwhile it deletes its own and refuses (of two
bookies racing on the two keys at least one sees the other: never both).

A refresh round re-registers only on a definite answer: etcd says the lease
is gone (expired while the bookie was cut off, a wiped cluster), or our key
is missing or was changed.  A round that learns nothing (a member hung or
cut off, an election: ``MetadataUnavailable``) changes nothing: the lease's
own keep-alive moves to another member within a third of the ttl
(pybk_spark/metadata/etcd_leases.py), and moving the key to a new lease
through an etcd that is failing over would only add writes of unknown
outcome.  Otherwise a new lease is granted and
the key created again, or moved under it; a key meanwhile taken by another
owner is left alone (logged: ``event=registration_taken``).  The earlier
lease is revoked only after the key is under the new one: if the move fails
too, the earlier lease (perhaps still alive, still holding the key) is kept
until a later round succeeds.  A round's RPCs (the keep-alive, the read of
the key) run without the registrar's lock, so a slow member delays no mode
switch; a round re-registers only if the lease, mode and version it checked
are still the ones held.  Switching mode creates the new key
first, then deletes the old one.  Stopping deletes the key (CAS on the
version we wrote) and revokes the lease, for at most the lease ttl: an etcd
that answers nothing would otherwise hold a bookie's shutdown for one RPC
timeout per step, and past the ttl the lease expires by itself.  Once
stopping, a mode switch only records the mode (a new key would outlive the
bookie).
"""
from __future__ import annotations

import json
import logging
import threading
import time
from typing import Any, Callable, Optional

from bookie_server.background import join_bounded
from pybk_spark import errors
from pybk_spark.metadata import keys
from pybk_spark.metadata.store import Lease, MetadataStore, Versioned, keepalive_period

log = logging.getLogger("bookie.registration")

FREE, REPLACE, WAIT, REFUSE = "free", "replace", "wait", "refuse"
_MAX_RETIRED = 3        # earlier leases kept while re-registrations keep failing
MODES = ("writable", "readonly")


def registration_key(bookie_id: str, read_only: bool) -> str:
    return keys.bookie_key("readonly" if read_only else "writable", bookie_id)


def decide_claim(existing: Optional[dict[str, Any]], me: dict[str, Any]) -> str:
    """What to do about ``existing`` (a live registration value, or None)
    when the process described by ``me`` (its ``owner`` dict) wants the id."""
    if existing is None:
        return FREE
    owner = existing.get("owner")
    if not isinstance(owner, dict) or not owner.get("token"):
        return WAIT
    if owner.get("token") == me.get("token"):
        return FREE
    if owner.get("host") == me.get("host") and owner.get("data_dir") == me.get("data_dir"):
        return REPLACE
    if owner.get("cookie_instance") and owner.get("cookie_instance") == me.get("cookie_instance"):
        return WAIT
    return REFUSE


def _loads(raw: bytes) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def describe_owner(existing: dict[str, Any]) -> str:
    owner = existing.get("owner") if isinstance(existing.get("owner"), dict) else {}
    if not owner:
        return f"a bookie at {existing.get('address', '?')} (owner not recorded)"
    return (f"pid {owner.get('pid', '?')} on host {owner.get('host', '?')} "
            f"(data dir {owner.get('data_dir', '?')}, address {existing.get('address', '?')})")


class Registrar:
    def __init__(self, store: MetadataStore, bookie_id: str, address: str, rack: str, metrics_port: int,
                 ttl: int = 5, add_lane_address: str = "", *, owner: Optional[dict[str, Any]] = None,
                 limits: Optional[dict[str, Any]] = None, tls: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.store = store
        self.bookie_id = bookie_id
        self.address = address
        self.rack = rack
        self.metrics_port = metrics_port
        self.add_lane_address = add_lane_address
        self.owner = dict(owner or {})
        self.limits = dict(limits or {})
        self.tls = bool(tls)
        self.ttl = max(2, int(ttl))
        self.read_only = False
        self.clock = clock
        self.sleep = sleep
        self._lease: Any = None
        self._retired: list[Any] = []       # earlier leases, revoked once the key has moved
        self._version: Optional[int] = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def value_dict(self) -> dict[str, Any]:
        """The registration value; a dict so fields can be added freely."""
        return {"bookie_id": self.bookie_id, "address": self.address,
                "rack": self.rack, "metrics_port": self.metrics_port,
                "state": "readonly" if self.read_only else "writable",
                "add_lane_address": self.add_lane_address, "limits": self.limits,
                "owner": self.owner, "tls": self.tls}

    def _value(self) -> bytes:
        return json.dumps(self.value_dict()).encode()

    @property
    def wait_s(self) -> float:
        """How long a claim waits for an unprovable registration to expire."""
        return self.ttl + 2.0

    # -- the claim --------------------------------------------------------------------
    def _existing(self) -> list[tuple[str, Versioned, dict[str, Any]]]:
        out = []
        for mode in MODES:
            key = keys.bookie_key(mode, self.bookie_id)
            got = self.store.get(key)
            if got is not None:
                out.append((key, got, _loads(got.value)))
        return out

    def check_claimable(self) -> None:
        """Return once no live registration of another process holds the id
        (waiting at most ``wait_s`` for one that may be a dead process's);
        raise ``errors.BookieIdInUse`` otherwise.  Writes nothing."""
        deadline = None
        while True:
            blocking = [(k, v) for k, _, v in self._existing()
                        if decide_claim(v, self.owner) in (WAIT, REFUSE)]
            if not blocking:
                return
            key, value = blocking[0]
            if decide_claim(value, self.owner) == REFUSE:
                raise self._in_use(key, value)
            now = self.clock()
            if deadline is None:
                deadline = now + self.wait_s
                log.warning("event=registration_wait key=%s holder=%r wait_s=%.1f (waiting for "
                            "the holder's lease to expire)", key, describe_owner(value),
                            self.wait_s)
            if now >= deadline:
                raise self._in_use(key, value, waited=self.wait_s)
            self.sleep(0.2)

    def _in_use(self, key: str, value: dict[str, Any], waited: float = 0.0) -> errors.BookieIdInUse:
        after = f" (still there after waiting {waited:.0f}s)" if waited else ""
        return errors.BookieIdInUse(
            f"bookie id {self.bookie_id!r} is registered by a live bookie: "
            f"{describe_owner(value)}, key {key}{after}; stop it or choose another --bookie-id")

    def start(self, read_only: bool = False) -> None:
        """Claim the id and register; ``errors.BookieIdInUse`` if another live
        bookie holds it."""
        self.check_claimable()
        with self._lock:
            self.read_only = read_only
            self._lease = self.store.grant_lease(self.ttl)
            try:
                self._claim()
            except BaseException:
                self._lease.revoke()
                self._lease = None
                raise
        log.info("event=registered key=%s lease_ttl=%d",
                 registration_key(self.bookie_id, self.read_only), self.ttl)
        self._thread = threading.Thread(target=self._refresh_loop, name="registration",
                                        daemon=True)
        self._thread.start()

    def _claim(self) -> None:
        """Create our key (or replace a dead predecessor's), then make sure
        the other mode's key is not a live foreign one."""
        key = registration_key(self.bookie_id, self.read_only)
        self._put_owned(key, takeover=True)
        other = registration_key(self.bookie_id, not self.read_only)
        got = self.store.get(other)
        if got is None:
            return
        value = _loads(got.value)
        action = decide_claim(value, self.owner)
        if action == REPLACE:
            self.store.delete(other, expected_version=got.version)
        elif action != FREE:
            self.store.delete(key, expected_version=self._version)
            raise self._in_use(other, value)

    def _put_owned(self, key: str, takeover: bool = False) -> None:
        """Create ``key`` under our lease; overwrite only our own value (or,
        with ``takeover``, a dead predecessor's).  Raises BookieIdInUse."""
        while True:
            got = self.store.get(key)
            if got is None:
                try:
                    self._version = self.store.put_if_absent(key, self._value(), lease=self._lease)
                    return
                except errors.MetadataVersion:
                    continue
            value = _loads(got.value)
            action = decide_claim(value, self.owner)
            if action == FREE or (takeover and action == REPLACE):
                if action == REPLACE:
                    log.warning("event=registration_replaced key=%s old_holder=%r (a crashed "
                                "predecessor on this data dir)", key, describe_owner(value))
                try:
                    self._version = self.store.compare_and_swap(key, self._value(), got.version,
                                                                lease=self._lease)
                    return
                except errors.MetadataVersion:
                    continue
            raise self._in_use(key, value)

    # -- while running ----------------------------------------------------------------
    def set_read_only(self, read_only: bool) -> None:
        with self._lock:
            if read_only == self.read_only:
                return
            if self._lease is None or self._stop.is_set():
                self.read_only = read_only   # not registered yet: start() uses the mode;
                return                       # stopping: a new key would outlive the bookie
            old, old_version = registration_key(self.bookie_id, self.read_only), self._version
            self.read_only = read_only
            try:
                self._put_owned(registration_key(self.bookie_id, read_only))
                self.store.delete(old, expected_version=old_version)
            except errors.BKError as exc:
                log.warning("event=reregister_failed error=%r (retried by refresh loop)", exc)

    def _refresh_loop(self) -> None:
        while not self._stop.wait(keepalive_period(self.ttl)):
            self.refresh_once()

    def _registered(self) -> tuple[Any, bool, Optional[int]]:
        return self._lease, self.read_only, self._version

    def refresh_once(self) -> None:
        """One round: refresh the lease and check our key, without the lock
        (each RPC may take the store's timeout, and ``set_read_only``, which
        the disk checker and the admin API call, must not wait that long);
        re-register under the lock only if what was checked is still what
        we hold (a mode switch meanwhile is checked next round)."""
        with self._lock:
            seen = self._registered()
        lease, read_only, version = seen
        try:
            lease.refresh()
            got = self.store.get(registration_key(self.bookie_id, read_only))
            if got is None or got.version != version:
                raise errors.MetadataError("registration key vanished or changed")
        except errors.MetadataUnavailable as exc:
            # nothing learnt: the lease keeps itself alive through another member
            log.info("event=lease_refresh_failed error=%r action=none (outcome unknown)", exc)
        except Exception as exc:  # noqa: BLE001 - lease lost, key gone, or a bug
            with self._lock:
                if self._stop.is_set() or self._registered() != seen:
                    return
                log.warning("event=lease_refresh_failed error=%r", exc)
                self._reregister()

    def _reregister(self) -> None:
        """A new lease and our key under it.  The leases it replaces are
        revoked only once the key is under the new one: after a failed
        refresh the old lease may well be alive and still hold our key (a
        member restarting, one lost connection), and revoking it while the
        move failed would unregister a healthy bookie until the next round."""
        try:
            new = self.store.grant_lease(self.ttl)
        except Exception as exc:  # noqa: BLE001 - the registrar thread logs and retries
            log.warning("event=reregister_failed error=%r", exc)
            return
        if self._lease is not None:
            self._retired.append(self._lease)
        while len(self._retired) > _MAX_RETIRED:   # each keeps a keep-alive thread: bounded;
            self._revoke(self._retired.pop(1))     # keep the oldest, the holder at the last success
        self._lease = new
        try:
            self._put_owned(registration_key(self.bookie_id, self.read_only))
            other = registration_key(self.bookie_id, not self.read_only)
            got = self.store.get(other)       # a mode switch that failed half-way
            if got is not None and decide_claim(_loads(got.value), self.owner) == FREE:
                self.store.delete(other, expected_version=got.version)
        except errors.BookieIdInUse as exc:
            log.error("event=registration_taken error=%s", exc)
        except Exception as exc:  # noqa: BLE001 - the registrar thread logs and retries
            log.warning("event=reregister_failed error=%r (earlier leases kept: one may "
                        "still hold the key)", exc)
            return
        else:
            log.info("event=reregistered key=%s",
                     registration_key(self.bookie_id, self.read_only))
        retired, self._retired = self._retired, []
        for old in retired:
            self._revoke(old)

    @staticmethod
    def _revoke(lease: Lease) -> None:
        try:
            lease.revoke()
        except Exception:  # noqa: BLE001 - expired already, or store down
            pass

    def stop(self, timeout: Optional[float] = None) -> bool:
        """Unregister: delete our key (CAS on the version we wrote) and revoke
        the leases, after the refresh round in flight.  Best effort, and
        bounded by ``timeout`` (default: the lease ttl): an etcd that answers
        nothing (a partition) holds each RPC until its timeout, and past the
        ttl the lease expires by itself, so waiting longer only delays the
        bookie's own shutdown.  Returns False when it gave up (logged)."""
        self._stop.set()
        worker = threading.Thread(target=self._unregister, name="unregister", daemon=True)
        worker.start()
        return join_bounded(worker, float(self.ttl if timeout is None else timeout),
                            "unregister")

    def _unregister(self) -> None:
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            try:
                if self._version is not None:
                    self.store.delete(registration_key(self.bookie_id, self.read_only),
                                      expected_version=self._version)
            except Exception as exc:  # noqa: BLE001 - not ours any more, or store down
                log.warning("event=unregister_failed error=%r", exc)
            for lease in [*self._retired, self._lease]:
                try:
                    if lease is not None:
                        lease.revoke()
                except Exception as exc:  # noqa: BLE001 - shutdown goes on; leases expire anyway
                    log.warning("event=unregister_failed error=%r", exc)
            self._retired = []
