"""``bookie-server``: run a bookie (or ``bookie-server format``).

    bookie-server --conf conf/bookie.conf [--port N] [--data-dir DIR]
                  [--metadata-uri etcd://HOST:PORT/SCOPE] [--bookie-id ID]
                  [--metrics-port N]
    bookie-server format --conf ... [--metadata-uri ...] [--yes]  # delete cookie + data
                                       # (--yes: confirmed, for a data dir that holds any)
    bookie-server updatecookie --conf ... [same flags] [--yes]  # the bookie moved:
                                       # record its new advertised address in the cookie
    bookie-server lastmark --data-dir DIR          # offline, JSON (bookie_server/offline.py;
    bookie-server readjournal --data-dir DIR [...] # pybk lastmark / readjournal run these)

Without a metadata URI the bookie runs standalone (no registration, no GC).
SIGTERM/SIGINT: unregister, stop accepting, flush, exit 0.  SIGHUP: reload
the disk thresholds from the conf file, and the TLS certificate, key and CA
files (bookie_server/serving/tls.py: new connections use them; a reload that fails
keeps the old ones and logs event=tls_reload_failed naming the setting).

Start-up order: lock the data dir (bookie.lock), bind every port (gRPC,
add lane, metrics), check that no other live bookie holds the bookie id,
check the cookie, replay, serve, register.  A refused start writes nothing.

Identity: the bookie listens on ``bind_address`` and registers
``advertised_address`` (derived when unset: bookie_server/serving/identity.py); the
cookie records that address, and a start advertising another one is refused
until ``updatecookie`` records the move.  Health: bookie_server/serving/health.py.

Exit codes: 0 stopped cleanly; 2 refused to start, with a one-line reason:
bad config (TLS files that cannot be read or do not match, naming the
setting; a wildcard advertised address, or a loopback one with the
metadata store on another host), data dir locked by another process (its pid is named), a port
in use (the port and its setting are named), the bookie id registered by
another live bookie, an invalid cookie (also: the advertised address
changed), updatecookie or format not confirmed; 3 metadata store unavailable.

Format: the bookie id stays named in the ensembles of every ledger it held,
so ``format`` marks the id's data lost (bookie_server/cookie.py,
``mark_data_lost``) and the auditor copies those ledgers' entries back onto
the bookie once it runs again (docs/operations.md, "Replacing a bookie's
disk").
"""
from __future__ import annotations

import argparse
import gc as pygc
import logging
import os
import shlex
import signal
import socket
import time
import sys
import uuid
from typing import TYPE_CHECKING, Callable, Optional, Sequence

from bookie_server import cookie, direct_buffers, offline
from bookie_server.serving import admin_http, health, identity, tls as bookie_tls
from bookie_server.background import DamagePublisher, DiskChecker, GarbageCollector
from bookie_server.bookie import Bookie
from bookie_server.config import load_config, replace
from bookie_server.journal.journal_crc import CRC_IMPLEMENTATION
from bookie_server.serving.listeners import bind_all
from bookie_server.serving.metrics import BookieMetrics
from bookie_server.serving.registration import Registrar
from bookie_server.storage.scrubber import Scrubber
from bookie_server.serving.service import add_service, make_add_lane
from pybk_spark import errors
from pybk_spark.dirlock import DirLock
from pybk_spark.metadata import EtcdSecurity, open_store
from pybk_spark.protocol import damage_marker
from pybk_spark.wire import arrow_memory

if TYPE_CHECKING:
    from bookie_server.config import BookieConfig
    from bookie_server.serving.listeners import Listeners
    from pybk_spark.metadata.store import MetadataStore

MakeBookie = Callable[..., Bookie]     # (cfg, *, metrics=...) -> Bookie

LOCK_NAME = cookie.LOCK_NAME

log = logging.getLogger("bookie.main")


def _parse(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="bookie-server", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("command", nargs="?", choices=["run", "format", "updatecookie"],
                   default="run")
    p.add_argument("--conf")
    p.add_argument("--port", type=int)
    p.add_argument("--bind-address")
    p.add_argument("--advertised-address")
    p.add_argument("--data-dir")
    p.add_argument("--metadata-uri")
    p.add_argument("--bookie-id")
    p.add_argument("--metrics-port", type=int)
    p.add_argument("--add-lane-port", type=int, help="0 = any free port, -1 = no add lane")
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--yes", action="store_true",
                   help="updatecookie: the move is confirmed; format: deleting the data "
                        "dir's data is confirmed (no question asked)")
    return p.parse_args(argv)


def _open_store(uri: str, cfg: Optional[BookieConfig] = None) -> Optional[MetadataStore]:
    if not uri:
        return None
    return open_store(uri, EtcdSecurity.from_config(cfg) if cfg is not None else None)


def main(argv: Optional[Sequence[str]] = None, *, make_bookie: MakeBookie = Bookie) -> int:
    """``make_bookie(cfg)`` builds the Bookie: a test seam (tests/chaos/
    faulty_bookie.py passes one with failing or lying syscalls)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in offline.COMMANDS:        # reads a data dir, starts nothing
        return offline.main(argv)
    args = _parse(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s level=%(levelname)s logger=%(name)s %(message)s")
    overrides = {"port": args.port, "bind_address": args.bind_address,
                 "advertised_address": args.advertised_address,
                 "data_dir": args.data_dir, "metadata_uri": args.metadata_uri,
                 "bookie_id": args.bookie_id, "metrics_port": args.metrics_port,
                 "add_lane_port": args.add_lane_port}
    try:
        cfg = load_config(args.conf, overrides)
        cfg = replace(cfg, advertised_address=identity.effective_host(cfg))
    except (OSError, ValueError, TypeError) as exc:
        print(f"bookie-server: bad configuration: {exc}", file=sys.stderr)
        return 2
    # One data dir, one bookie: the lock comes before anything reads or
    # writes the data dir or the metadata store (docs/bookie.md, "Start-up").
    lock = DirLock(cfg.data_dir, LOCK_NAME)
    try:
        lock.acquire()
    except errors.DataDirInUse as exc:
        print(f"bookie-server: refusing to start: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"bookie-server: cannot lock data dir {cfg.data_dir} (data_dir / --data-dir): "
              f"{exc}", file=sys.stderr)
        return 2
    args.update_hint = shlex.join(["bookie-server", "updatecookie",
                                   *[a for a in argv if a not in ("run", "format")]])
    rc = _locked_main(args, cfg, make_bookie)
    # Everything durable is fsynced and the lease is revoked; do not let a
    # library's lingering non-daemon thread keep a stopped bookie alive.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


def _locked_main(args: argparse.Namespace, cfg: BookieConfig,
                 make_bookie: MakeBookie = Bookie) -> int:
    bookie_id = cfg.effective_bookie_id()
    listeners = metrics = readiness = admin = server_tls = None
    if args.command == "run":
        if cfg.tls_cert_file:
            try:
                server_tls = bookie_tls.ServerTls(cfg)
            except bookie_tls.TlsConfigError as exc:
                print(f"bookie-server: bad configuration: {exc}", file=sys.stderr)
                return 2
        metrics = BookieMetrics()
        readiness = health.Readiness(needs_registration=bool(cfg.metadata_uri))
        admin = admin_http.AdminApi(allow_remote=cfg.admin_http_allow_remote,
                                    auth=bookie_tls.admin_policy(cfg))
        try:
            listeners = bind_all(cfg, metrics, readiness, admin, server_tls)
        except errors.PortInUse as exc:
            print(f"bookie-server: refusing to start: {exc}", file=sys.stderr)
            return 2
    try:
        store = _open_store(cfg.metadata_uri, cfg)
    except errors.BKError as exc:
        print(f"bookie-server: cannot open metadata store {cfg.metadata_uri}: {exc}",
              file=sys.stderr)
        return 3
    try:
        registrar = None
        if store is not None:
            registrar = _registrar(cfg, bookie_id, store, listeners)
            registrar.check_claimable()          # a live bookie with our id: refuse
        if args.command == "format":
            return _format(cfg, bookie_id, store, args.yes)
        address = f"{cfg.advertised_address}:{cfg.port}"
        if args.command == "updatecookie":
            return _update_cookie(cfg, bookie_id, store, address, args.yes)
        cookie_value = cookie.check_or_create(cfg.data_dir, bookie_id, store,
                                              address=address, update_hint=args.update_hint)
        if registrar is not None:
            registrar.owner["cookie_instance"] = cookie_value.get("instance_id", "")
        return _serve(cfg, bookie_id, store, args.conf, listeners, metrics, registrar,
                      make_bookie, readiness, admin, server_tls)
    except (errors.InvalidCookie, errors.BookieIdInUse) as exc:
        print(f"bookie-server: refusing to start: {exc}", file=sys.stderr)
        return 2
    except errors.MetadataUnauthorized as exc:
        print(f"bookie-server: metadata store refused access: {exc}", file=sys.stderr)
        return 2
    except errors.MetadataError as exc:
        print(f"bookie-server: metadata store unavailable: {exc}", file=sys.stderr)
        return 3
    finally:
        if store is not None:
            store.close()


def _registrar(cfg: BookieConfig, bookie_id: str, store: MetadataStore,
               listeners: Optional[Listeners]) -> Registrar:
    """The registrar, knowing who we are: ``owner`` lets the next start tell
    a crashed predecessor on this data dir from another live bookie."""
    local = cookie.read_local(cfg.data_dir) or {}
    owner = {"token": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid(),
             "data_dir": os.path.realpath(cfg.data_dir),
             "cookie_instance": local.get("instance_id", "")}
    port = listeners.port if listeners is not None else cfg.port
    lane = listeners.lane_listener if listeners is not None else None
    host = cfg.advertised_address          # resolved by main(): bookie_server/serving/identity.py
    lane_address = f"{host}:{lane.getsockname()[1]}" if lane is not None else ""
    return Registrar(store, bookie_id, f"{host}:{port}", cfg.rack,
                     cfg.metrics_port, cfg.registration_ttl_s, lane_address, owner=owner,
                     limits={"max_entry_bytes": cfg.max_entry_bytes,
                             "max_batch_bytes": cfg.max_batch_bytes},
                     tls=bool(cfg.tls_cert_file))


def _format(cfg: BookieConfig, bookie_id: str, store: Optional[MetadataStore],
            confirmed: bool) -> int:
    """``format``: delete the cookie and the data dir's data, after the
    operator confirms (``--yes``, or ``yes`` typed) when there is any."""
    if cookie.holds_anything(cfg.data_dir) and not confirmed:
        what = (f"bookie {bookie_id}: delete everything in data dir {cfg.data_dir} "
                "(cookie, journal, entries)")
        if not sys.stdin.isatty():
            print(f"bookie-server: refusing to format without confirmation: {what}? Pass --yes",
                  file=sys.stderr)
            return 2
        if input(f"{what}? Type yes: ").strip().lower() != "yes":
            print("bookie-server: nothing formatted", file=sys.stderr)
            return 2
    marked = cookie.format_bookie(cfg.data_dir, bookie_id, store)
    print(f"bookie-server: formatted {bookie_id} (cookie deleted, data dir emptied)" +
          (f"; its ledgers are copied back onto it once it runs again "
           f"({damage_marker.marker_key(bookie_id)})" if marked else ""))
    return 0


def _update_cookie(cfg: BookieConfig, bookie_id: str, store: Optional[MetadataStore],
                   address: str, confirmed: bool) -> int:
    """``updatecookie``: record the bookie's new advertised address in both
    cookies, after the operator confirms (``--yes``, or ``yes`` typed)."""
    local = cookie.read_local(cfg.data_dir) or {}
    old = local.get("address") or "(not recorded)"
    if old == address:
        print(f"bookie-server: cookie of {bookie_id} already records {address}")
        return 0
    if not confirmed:
        question = (f"bookie {bookie_id}: change the address recorded in its cookie from {old} "
                    f"to {address}? Clients will look for it there. Type yes: ")
        if not sys.stdin.isatty():
            print(f"bookie-server: refusing to update the cookie without confirmation: "
                  f"{question.split('?')[0]}? Pass --yes", file=sys.stderr)
            return 2
        if input(question).strip().lower() != "yes":
            print("bookie-server: cookie not changed", file=sys.stderr)
            return 2
    previous = cookie.update_address(cfg.data_dir, bookie_id, store, address)
    print(f"bookie-server: cookie of {bookie_id} updated: address {previous or '(none)'} "
          f"-> {address}")
    return 0


def _reload_tls(server_tls: bookie_tls.ServerTls, conf_path: Optional[str]) -> None:
    """SIGHUP: the certificate files again (new paths from the conf file
    only for the three file settings; the rest needs a restart)."""
    try:
        cfg = server_tls.cfg
        if conf_path:
            new = load_config(conf_path, {})
            cfg = replace(cfg, tls_cert_file=new.tls_cert_file or cfg.tls_cert_file,
                          tls_key_file=new.tls_key_file or cfg.tls_key_file,
                          tls_ca_file=new.tls_ca_file or cfg.tls_ca_file)
        server_tls.reload(cfg)
    except Exception as exc:  # noqa: BLE001 - keep serving with the old certificates
        log.error("event=tls_reload_failed error=%s", exc)


def _freeze_startup_heap() -> None:
    """Move what start-up built (modules, protobuf descriptors, the replayed
    index) out of the cyclic collector's reach.  It lives as long as the
    process, yet every full collection would walk it again with the GIL held:
    30-85 ms per collection in a started bookie (docs/performance.md, (4)),
    which stalls every add and read on that bookie meanwhile."""
    pygc.collect()
    pygc.freeze()


def _serve(cfg: BookieConfig, bookie_id: str, store: Optional[MetadataStore],
           conf_path: Optional[str], listeners: Optional[Listeners],
           metrics: Optional[BookieMetrics], registrar: Optional[Registrar],
           make_bookie: MakeBookie = Bookie, readiness: Optional[health.Readiness] = None,
           admin: Optional[admin_http.AdminApi] = None,
           server_tls: Optional[bookie_tls.ServerTls] = None) -> int:
    # Signal handlers only flip plain flags: taking a lock (Event.set) inside a
    # handler can deadlock when the signal lands while the main thread holds
    # that same lock.  The main loop polls the flags.
    signals = {"stop": False, "reload": False}
    signal.signal(signal.SIGTERM, lambda *_: signals.__setitem__("stop", True))
    signal.signal(signal.SIGINT, lambda *_: signals.__setitem__("stop", True))
    signal.signal(signal.SIGHUP, lambda *_: signals.__setitem__("reload", True))

    memory_pool = arrow_memory.use_for_process()   # before replay allocates
    direct_buffers.reserve_read_buffers(cfg.read_buffers_at_start_mb,
                                        cfg.pull_buffers_at_start_mb)
    bookie = make_bookie(cfg, metrics=metrics).open()
    publisher = (DamagePublisher(bookie, store, bookie_id, cfg.registration_ttl_s)
                 if store is not None else None)
    if publisher is not None:
        # Adopt the damage marker before serving: a formatted bookie's marker
        # (cookie.mark_data_lost) makes it answer BookieIOError, never
        # NoSuchEntry, for the entries it held before it was formatted.
        publisher.sync_once()
    if listeners is None:       # run: bound by _locked_main before anything else
        raise ValueError("bookie-server run needs its listeners bound first")
    server, port = listeners.server, listeners.port
    service = add_service(server, bookie, cfg, bookie_id)
    readiness = readiness or health.Readiness(needs_registration=registrar is not None)
    health.add_grpc_health(server, readiness)
    bookie.add_mode_listener(lambda ro: readiness.set(read_only=ro))
    lane = make_add_lane(service, listeners.lane_listener,   # listening before Health answers
                         server_tls)
    server.start()
    readiness.set(serving=True, read_only=bookie.read_only)
    if registrar is not None:          # disk full, journal failure: the registry follows
        bookie.add_mode_listener(registrar.set_read_only)
    checker = DiskChecker(bookie, cfg, on_change=lambda ro: None)
    checker.start()
    if registrar is not None:
        try:
            registrar.start(read_only=bookie.read_only)
        except BaseException:          # lost a race for the id: stop serving, refuse
            if lane is not None:
                lane.stop()
            server.stop(None)
            service.close()
            checker.stop()
            bookie.close()
            raise
        readiness.set(registered=True)
    ledger_gc = GarbageCollector(bookie, store, cfg.gc_interval_s) if store is not None else None
    if ledger_gc is not None:
        ledger_gc.start()
    if publisher is not None:
        publisher.start()
    if admin is not None:
        admin.attach(bookie, bookie_id, store=store, gc=ledger_gc, readiness=readiness,
                     disk_full=lambda: checker.usage_fn() >= checker.threshold)
    scrubber = Scrubber(bookie, cfg.scrub_interval_s, cfg.scrub_rate_bytes_per_s)
    scrubber.start()
    _freeze_startup_heap()
    lane_port = lane.port if lane is not None else -1
    log.info("event=bookie_ready bookie_id=%s port=%d add_lane_port=%d data_dir=%s "
             "read_only=%s journal_crc=%s bind_address=%s advertised_address=%s tls=%s "
             "client_auth=%s arrow_memory_pool=%s", bookie_id,
             port, lane_port, cfg.data_dir, bookie.read_only, CRC_IMPLEMENTATION,
             cfg.bind_address, cfg.advertised_address, server_tls is not None,
             cfg.tls_client_auth if server_tls is not None else "-", memory_pool)
    print(f"bookie-server ready bookie_id={bookie_id} port={port} add_lane_port={lane_port}",
          flush=True)

    while not signals["stop"]:
        time.sleep(0.1)
        if signals["reload"]:
            signals["reload"] = False
            try:
                if not conf_path:
                    raise ValueError("no --conf file to reload")
                new = load_config(conf_path, {})
                checker.set_thresholds(new.disk_usage_threshold, new.disk_usage_lwm)
                log.info("event=config_reloaded threshold=%s lwm=%s",
                         new.disk_usage_threshold, new.disk_usage_lwm)
                checker.check_once()
            except Exception as exc:  # noqa: BLE001 - a bad reload keeps the old settings serving
                log.error("event=config_reload_failed error=%r", exc)
            if server_tls is not None:
                _reload_tls(server_tls, conf_path)

    log.info("event=bookie_stopping bookie_id=%s", bookie_id)
    readiness.set(stopping=True)       # probes see it before the registration goes
    # The metadata side gets the lease ttl, at most 5 s, in all: past it the
    # lease expires by itself, and an etcd that answers nothing (a partition)
    # must not keep the bookie from closing its storage cleanly before a
    # supervisor's SIGKILL (LocalCluster's comes after 15 s).
    metadata_deadline = time.monotonic() + min(cfg.registration_ttl_s, 5.0)

    def metadata_time_left() -> float:
        return max(0.5, metadata_deadline - time.monotonic())
    if registrar is not None:
        registrar.stop(timeout=metadata_time_left())
    if lane is not None:
        lane.stop()
    server.stop(grace=2).wait()
    service.close()                    # the readers kept for the next pull of a peer
    checker.stop(timeout=metadata_time_left())
    if ledger_gc is not None:
        ledger_gc.stop(timeout=metadata_time_left())
    scrubber.stop()
    if publisher is not None:
        publisher.stop(timeout=metadata_time_left())
    bookie.close()
    log.info("event=bookie_stopped bookie_id=%s", bookie_id)
    return 0


if __name__ == "__main__":
    sys.exit(main())
