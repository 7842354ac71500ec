"""The peer readers this bookie's pulls share (bookie_server/serving/pull.py).

Theory of operation
-------------------
A pull reads its peer through a reader: serving/peer_lane.py's
``LanePeerReader`` (one lane connection, its reads pipelined on it) or
serving/peer_client.py's ``PeerReader`` (a gRPC channel).  Re-replication
pulls one fragment after another from the same few peers, so a reader is
not opened per pull: :class:`PeerReaders` hands a pull a reader of its peer,
and takes it back when the pull ends to hand to the next pull of that peer.
Pulls at the same time each get a reader of their own (a lane connection
answers its reads one at a time, in order).

A reader is the same one only for the same peer reached the same way: the
key is the path (lane or gRPC), the address, the peer's id and, on a TLS
bookie, the bytes of the certificate files it presents and trusts (read
per pull, so a pull after a SIGHUP reload presents the reloaded
certificate, on a reader of its own).

An idle reader is closed after ``idle_close_s`` without a pull (the peer's
lane keeps no timer on an idle connection: closing it is the client's job),
by a reaper thread that runs only while readers are idle; at most
``max_idle`` are kept.  A connection the peer closed while idle is
reopened by the reader on its next read (reads are idempotent).  When the
bookie stops, its service closes the pool (``BookieService.close``, after
the gRPC server stopped): every idle reader is closed, and one still in a
pull is closed when the pull gives it back.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Callable, Hashable, Optional, Union

from bookie_server.serving.peer_client import PeerReader
from bookie_server.serving.peer_lane import LanePeerReader

Reader = Union[PeerReader, LanePeerReader]

IDLE_CLOSE_S = 30.0
MAX_IDLE = 16


class PeerReaders:
    """Idle peer readers by key (module docstring); ``clock`` is the
    monotonic clock idle times are measured on."""

    def __init__(self, idle_close_s: float = IDLE_CLOSE_S, max_idle: int = MAX_IDLE,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.idle_close_s = idle_close_s
        self.max_idle = max_idle
        self._clock = clock
        self._cond = threading.Condition()
        self._idle: dict[Hashable, list[tuple[float, Reader]]] = {}
        self._reaper: Optional[threading.Thread] = None
        self._closed = False
        self.opened = 0          # readers made, for tests and logs: reuse keeps it low

    @contextmanager
    def reader(self, key: Hashable, make: Callable[[], Reader]) -> Iterator[Reader]:
        """An idle reader of ``key``, else ``make()``; kept for the next
        pull when the block ends, closed when it raises."""
        with self._cond:
            idle = self._idle.get(key)
            got = idle.pop()[1] if idle else None
            if idle is not None and not idle:
                del self._idle[key]
        if got is None:
            got = make()
            with self._cond:
                self.opened += 1
        try:
            yield got
        except BaseException:
            got.close()
            raise
        self._put_back(key, got)

    def idle_count(self) -> int:
        with self._cond:
            return sum(len(v) for v in self._idle.values())

    def expire(self) -> None:
        """Close the readers idle for ``idle_close_s`` or longer."""
        with self._cond:
            stale = self._take_stale(self._clock() - self.idle_close_s)
        _close_all(stale)

    def close(self) -> None:
        """Close every idle reader; readers in use are closed when given back."""
        with self._cond:
            self._closed = True
            stale = [r for v in self._idle.values() for _, r in v]
            self._idle.clear()
            self._cond.notify_all()
        _close_all(stale)

    def _put_back(self, key: Hashable, reader: Reader) -> None:
        with self._cond:
            if self._closed or sum(len(v) for v in self._idle.values()) >= self.max_idle:
                evicted: list[Reader] = [reader]
            else:
                evicted = []
                self._idle.setdefault(key, []).append((self._clock(), reader))
                if self._reaper is None:
                    self._reaper = threading.Thread(target=self._reap, name="pull-peer-reaper",
                                                    daemon=True)
                    self._reaper.start()
                self._cond.notify_all()
        _close_all(evicted)

    def _take_stale(self, before: float) -> list[Reader]:
        stale: list[Reader] = []
        for key in list(self._idle):
            keep = [(t, r) for t, r in self._idle[key] if t > before]
            stale += [r for t, r in self._idle[key] if t <= before]
            if keep:
                self._idle[key] = keep
            else:
                del self._idle[key]
        return stale

    def _reap(self) -> None:
        """Close readers as they pass ``idle_close_s``; ends when none is idle."""
        while True:
            with self._cond:
                if self._closed or not self._idle:
                    self._reaper = None
                    return
                oldest = min(t for v in self._idle.values() for t, _ in v)
                wait = oldest + self.idle_close_s - self._clock()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                stale = self._take_stale(self._clock() - self.idle_close_s)
            _close_all(stale)


def _close_all(readers: list[Reader]) -> None:
    for r in readers:
        r.close()
