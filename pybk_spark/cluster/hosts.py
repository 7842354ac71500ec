"""Test hosts on one machine: Linux network namespaces joined by a bridge.

A ``HostNetwork`` is one private /24, ``10.213.<slot>.0/24``, that exists only
inside namespaces this module made:

    root namespace                      namespace pbk-<slot>-<name>
      bridge pbk<slot>br 10.213.<slot>.1/24
        +-- veth pbk<slot>v<i>  <---->  eth0 10.213.<slot>.<i+2>/24, lo up

Every "host" is a namespace with its own address and its own loopback; the
bridge lets every host reach every other host and lets the test process (in
the root namespace, at ``root_address``) reach them all.  There is no default
route inside a host: traffic can only go to the /24 or to the host's own
loopback.  ``Host.spawn``/``Host.run`` start processes with
``ip netns exec`` (an exec, never a fork-then-setns in a threaded parent).

Names and ownership.  Everything carries the prefix ``pbk``: namespaces
``pbk-<slot>-<name>``, links ``pbk<slot>br`` / ``pbk<slot>v<i>``.  The slot
(1-254) is owned by whoever holds ``flock`` on ``/run/pbk-hosts/<slot>.lock``;
the kernel drops the lock when the owner dies, however it died.  So several
runs can coexist (each picks a free slot), and "a leftover" is exactly a
``pbk`` namespace or link whose slot lock nobody holds: ``clear_leftovers()``
(called by every ``start()``) kills the processes still inside such
namespaces and deletes them and their links.  Nothing without the prefix is
ever touched.

Clean-up.  ``close()`` kills every process inside the network's namespaces
(``ip netns pids``, so a grandchild cannot escape), deletes the namespaces
(their veth ends go with them) and the bridge, then drops the slot lock.  It
runs on ``with``-exit (also on an exception and on Ctrl-C, which Python raises
as KeyboardInterrupt), at interpreter exit (atexit), and on SIGTERM/SIGHUP
(turned into SystemExit when nobody else handles them).  A SIGKILLed run is
cleaned by the next ``start()``.

Capability.  ``unavailable_reason()`` says why namespaces cannot be made here
(not Linux, no ``ip``, no CAP_NET_ADMIN, or the kernel refusing a probe
namespace) or returns None; tests skip with that reason, ``make test-hosts``
fails with it.

Faults.  ``HostNetwork.faults`` (``pybk_spark.cluster.link_faults``) cuts,
drops, loses and delays traffic between hosts: packet-filter rules inside the
hosts' namespaces and netem on a host's root-side veth (``Host.link``).
``heal()`` undoes them all; they vanish with the namespaces on close.
"""
from __future__ import annotations

import atexit
import errno
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Mapping, Optional, Sequence

from pybk_spark.cluster import procs
from pybk_spark.cluster.link_faults import LinkFaults

PREFIX = "pbk"
SUBNET_PREFIX = "10.213"          # 10.213.<slot>.0/24, only inside our namespaces
LOCK_DIR = Path("/run/pbk-hosts")
_NS_RE = re.compile(rf"^{PREFIX}-(\d+)-")
_LINK_RE = re.compile(rf"^{PREFIX}(\d+)(br|v\d+)$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,19}$")
_CAP_NET_ADMIN = 12


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made on this machine (the reason says why)."""


# -- capability -----------------------------------------------------------------------
def ip_binary() -> Optional[str]:
    return shutil.which("ip") or next((p for p in ("/usr/sbin/ip", "/sbin/ip")
                                       if os.access(p, os.X_OK)), None)


def _has_cap_net_admin() -> bool:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> _CAP_NET_ADMIN & 1)
    except OSError:
        pass
    return os.geteuid() == 0


_REASON: Optional[list] = None


def unavailable_reason() -> Optional[str]:
    """None if test hosts can be made here, else what is missing (cached)."""
    global _REASON
    if _REASON is None:
        _REASON = [_probe()]
    return _REASON[0]


def _probe() -> Optional[str]:
    if not sys.platform.startswith("linux"):
        return f"network namespaces need Linux (this is {sys.platform})"
    ip = ip_binary()
    if ip is None:
        return "no 'ip' command (install iproute2)"
    if not _has_cap_net_admin():
        return "no CAP_NET_ADMIN: run as root to make network namespaces"
    name = f"{PREFIX}-0-probe{os.getpid()}"
    made = subprocess.run([ip, "netns", "add", name], capture_output=True, text=True)
    if made.returncode != 0:
        return f"'ip netns add' failed: {made.stderr.strip() or made.returncode}"
    subprocess.run([ip, "netns", "del", name], capture_output=True)
    return None


def require() -> None:
    """Raise HostsUnavailable naming the missing capability."""
    reason = unavailable_reason()
    if reason:
        raise HostsUnavailable(reason)


# -- ip(8) helpers ----------------------------------------------------------------------
def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    res = subprocess.run([ip_binary() or "ip", *args], capture_output=True, text=True,
                         timeout=30)
    if check and res.returncode != 0:
        raise HostsUnavailable(f"ip {' '.join(args)}: {res.stderr.strip()}")
    return res


def _netns_names() -> list[str]:
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def _link_names() -> list[str]:
    out = _ip("-o", "link", "show", check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) >= 2:
            names.append(parts[1].strip().split("@", 1)[0])
    return names


def _kill_netns_processes(ns: str) -> None:
    out = _ip("netns", "pids", ns, check=False).stdout
    for pid in (int(p) for p in out.split() if p.isdigit()):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _delete_netns(ns: str) -> None:
    _kill_netns_processes(ns)
    _ip("netns", "del", ns, check=False)


# -- slot ownership -------------------------------------------------------------------
def _try_lock(slot: int) -> Optional[int]:
    """An fd holding the slot's lock, or None if a live process holds it."""
    LOCK_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(LOCK_DIR / f"{slot}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


def _remove_slot(slot: int) -> list[str]:
    removed = []
    for ns in _netns_names():
        m = _NS_RE.match(ns)
        if m and int(m.group(1)) == slot:
            _delete_netns(ns)
            removed.append(ns)
    for link in _link_names():
        m = _LINK_RE.match(link)
        if m and int(m.group(1)) == slot:
            _ip("link", "del", link, check=False)
            removed.append(link)
    return removed


def clear_leftovers() -> list[str]:
    """Delete ``pbk`` namespaces/links of runs that are gone; returns their names."""
    slots = set()
    for ns in _netns_names():
        m = _NS_RE.match(ns)
        if m:
            slots.add(int(m.group(1)))
    for link in _link_names():
        m = _LINK_RE.match(link)
        if m:
            slots.add(int(m.group(1)))
    removed = []
    for slot in sorted(slots):
        if slot == 0:                       # probe namespaces: pid-named, never held
            for ns in _netns_names():
                if ns.startswith(f"{PREFIX}-0-probe") and ns != f"{PREFIX}-0-probe{os.getpid()}":
                    _delete_netns(ns)
                    removed.append(ns)
            continue
        fd = _try_lock(slot)
        if fd is None:
            continue                        # a live run owns it
        try:
            removed += _remove_slot(slot)
        finally:
            os.close(fd)
    return removed


def _subnets_in_use() -> set[ipaddress.IPv4Network | ipaddress.IPv6Network]:
    out = _ip("-o", "-4", "addr", "show", check=False).stdout
    nets = set()
    for line in out.splitlines():
        m = re.search(r"\sinet\s(\S+)", line)
        if m:
            nets.add(ipaddress.ip_interface(m.group(1)).network)
    return nets


# -- hosts -----------------------------------------------------------------------------
class Host:
    """One namespace with one address.  Processes started here are killed by
    the network's close(); ``spawn`` also registers them with ``procs``."""

    def __init__(self, network: "HostNetwork", name: str, index: int, address: str):
        self.network = network
        self.name = name
        self.index = index
        self.address = address
        self.netns = f"{PREFIX}-{network.slot}-{name}"
        self.link = f"{PREFIX}{network.slot}v{index}"     # root-side veth (fault seam)

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address})"

    def command(self, argv: Sequence[str]) -> list[str]:
        """``argv`` wrapped to run inside this host."""
        return [ip_binary() or "ip", "netns", "exec", self.netns, *map(str, argv)]

    def spawn(self, argv: Sequence[str], env: Mapping[str, str] | None = None, *,
              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, cwd=None) -> subprocess.Popen:
        """Start ``argv`` inside this host (own session, so a terminal's Ctrl-C
        reaches only the test process).  ``env`` replaces the environment
        when given.  ``ip netns exec`` execs ``argv``, so the pid is argv's."""
        return procs.spawn(self.command(argv), env=None if env is None else dict(env),
                           stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, cwd=cwd)

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60.0,
            env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` inside this host to completion; output captured as text."""
        return subprocess.run(self.command(argv), env=None if env is None else dict(env),
                              capture_output=True, text=True, timeout=timeout, check=check)

    def pids(self) -> list[int]:
        out = _ip("netns", "pids", self.netns, check=False).stdout
        return [int(p) for p in out.split() if p.isdigit()]


class HostNetwork:
    """A bridge and up to 250 hosts on ``10.213.<slot>.0/24``.  Use as a
    context manager (or ``start()`` / ``close()``)."""

    def __init__(self, slot: int | None = None):
        self._want_slot = slot
        self.slot: int = 0
        self.hosts: dict[str, Host] = {}
        self._lock_fd: Optional[int] = None
        self._mutex = threading.Lock()
        self.faults = LinkFaults(self)      # partitions, drops, loss, netem

    # -- addresses --------------------------------------------------------------------
    @property
    def subnet(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{SUBNET_PREFIX}.{self.slot}.0/24")

    @property
    def bridge(self) -> str:
        return f"{PREFIX}{self.slot}br"

    @property
    def root_address(self) -> str:
        """The test process's own address on the bridge."""
        return f"{SUBNET_PREFIX}.{self.slot}.1"

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # -- lifecycle -------------------------------------------------------------------
    def start(self) -> "HostNetwork":
        require()
        clear_leftovers()
        self._claim_slot()
        _LIVE.add(self)
        _install_signal_handlers()
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("addr", "add", f"{self.root_address}/24", "dev", self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def _claim_slot(self) -> None:
        used = _subnets_in_use()
        candidates = [self._want_slot] if self._want_slot else range(1, 255)
        for slot in candidates:
            if ipaddress.ip_network(f"{SUBNET_PREFIX}.{slot}.0/24") in used:
                continue
            fd = _try_lock(slot)
            if fd is None:
                continue
            self.slot, self._lock_fd = slot, fd
            _remove_slot(slot)              # a dead owner's remains, if any
            return
        raise HostsUnavailable(f"no free {SUBNET_PREFIX}.N.0/24 slot (all locked or in use)")

    def add_host(self, name: str) -> Host:
        """A new namespace with loopback up and an address on the bridge."""
        if not _NAME_RE.match(name):
            raise ValueError(f"host name {name!r}: want [a-z0-9-], at most 20 chars")
        with self._mutex:
            if name in self.hosts:
                raise ValueError(f"host {name!r} exists")
            index = len(self.hosts)
            if index > 250:
                raise HostsUnavailable("at most 251 hosts per network")
            host = Host(self, name, index, f"{SUBNET_PREFIX}.{self.slot}.{index + 2}")
            self.hosts[name] = host
        peer = f"{PREFIX}{self.slot}p{index}"
        _ip("netns", "add", host.netns)
        _ip("link", "add", host.link, "type", "veth", "peer", "name", peer)
        _ip("link", "set", peer, "netns", host.netns)
        _ip("link", "set", host.link, "master", self.bridge)
        _ip("link", "set", host.link, "up")
        inside = ("-n", host.netns)
        _ip(*inside, "link", "set", "lo", "up")
        _ip(*inside, "link", "set", peer, "name", "eth0")
        _ip(*inside, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip(*inside, "link", "set", "eth0", "up")
        return host

    def add_hosts(self, *names: str) -> list[Host]:
        return [self.add_host(n) for n in names]

    # -- faults ----------------------------------------------------------------------
    def heal(self) -> int:
        """Undo every link fault; returns how many there were."""
        return self.faults.heal_all()

    def close(self) -> None:
        """Kill everything inside, delete namespaces, links and bridge; drop the slot."""
        with self._mutex:
            hosts, self.hosts = list(self.hosts.values()), {}
            fd, self._lock_fd = self._lock_fd, None
        _LIVE.discard(self)
        self.faults.forget()                # the rules go with the namespaces
        if fd is None:
            return
        try:
            for host in hosts:
                _delete_netns(host.netns)
            _remove_slot(self.slot)         # bridge and any veth left behind
        finally:
            os.close(fd)

    def __enter__(self) -> "HostNetwork":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


# -- process-wide clean-up ----------------------------------------------------------------
_LIVE: set[HostNetwork] = set()
_HANDLERS_INSTALLED = False


def _close_all() -> None:
    for net in list(_LIVE):
        try:
            net.close()
        except Exception:  # noqa: BLE001 - at exit every network gets its close
            pass


def _on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)       # unwinds with-blocks and fixtures, then atexit


def _install_signal_handlers() -> None:
    """SIGTERM/SIGHUP -> SystemExit, only where nobody installed a handler
    and only from the main thread (signal.signal's own rule)."""
    global _HANDLERS_INSTALLED
    if _HANDLERS_INSTALLED or threading.current_thread() is not threading.main_thread():
        return
    _HANDLERS_INSTALLED = True
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            signal.signal(sig, _on_signal)


atexit.register(_close_all)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m pybk_spark.cluster.hosts [--check|--clean]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    reason = unavailable_reason()
    if reason:
        print(f"test hosts unavailable: {reason}", file=sys.stderr)
        return 1
    if "--clean" in args:
        for name in clear_leftovers():
            print(f"removed {name}")
    else:
        print("test hosts available (network namespaces can be made)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
