"""One reader thread for every plain-TCP add lane connection of a process.

Theory of operation
-------------------
A sync add's Qw answers arrive close together, one per bookie.  With a
reader thread per connection each answer wakes its own thread, which takes
the GIL, settles one add and sleeps again.  Here one thread waits in one
``epoll`` on all the connections' sockets and reads whichever is ready:
answers that arrived together are read in one wake-up.

* A connection registers its socket (``register``) once it sent its hello;
  from then on this thread alone receives from it, and closes it at the end.
* When a socket is readable the thread ``recv``s what is there without
  blocking and hands the bytes to the connection (``Source.received``),
  which settles every whole frame and keeps a cut-off one for the next
  receive.
* The end of the stream, a receive error or an exception from
  ``received`` (a malformed frame, a refused connection) ends that
  connection alone: it is unregistered, then ``Source.finished`` closes its
  socket and fails its unanswered requests.
* The thread starts on the first registration and lives as long as the
  process; a forked child (a Spark worker) starts its own.

A TLS connection keeps a reader thread of its own (its records need the
TLS socket's own reads).
"""
from __future__ import annotations

import logging
import os
import select
import socket
import threading
from typing import Optional, Protocol

# what one receive asks for: every answer queued on the socket, in one call
_RECV_BYTES = 64 << 10
_log = logging.getLogger(__name__)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


class Source(Protocol):
    sock: socket.socket

    def received(self, data: bytes) -> None:
        """Settle the whole frames of ``data``; raise to end the connection."""

    def finished(self, exc: BaseException) -> None:
        """The connection is over because of ``exc``: close its socket (no
        longer registered) and fail what it left unanswered."""


class LaneReaders:
    """The epoll loop reading every registered connection."""

    def __init__(self) -> None:
        self._epoll = select.epoll()
        self._sources: dict[int, Source] = {}
        self.thread = threading.Thread(target=self._run, name="pybk-add-lane-readers",
                                       daemon=True)
        self.thread.start()

    def register(self, source: Source) -> None:
        fd = source.sock.fileno()
        self._sources[fd] = source
        self._epoll.register(fd, select.EPOLLIN)

    def _run(self) -> None:
        poll, sources = self._epoll.poll, self._sources
        while True:
            for fd, _events in poll():
                source = sources.get(fd)
                if source is None:
                    continue
                try:
                    data = source.sock.recv(_RECV_BYTES, _DONTWAIT)
                    if not data:
                        raise EOFError("add lane closed by the bookie")
                    source.received(data)
                except BlockingIOError:
                    continue
                except Exception as exc:  # noqa: BLE001 - end of stream, socket error, bad frame
                    self._end(fd, source, exc)

    def _end(self, fd: int, source: Source, exc: BaseException) -> None:
        del self._sources[fd]
        try:
            self._epoll.unregister(fd)
        except OSError:
            pass
        try:
            source.finished(exc)
        except Exception:  # noqa: BLE001 - one connection's callback must not end the others'
            _log.exception("ending the add lane connection to %s",
                           getattr(source, "bookie_id", "?"))


_lock = threading.Lock()
_readers: Optional[LaneReaders] = None
_pid = 0


def lane_readers() -> LaneReaders:
    """This process's loop (started on first use; anew in a forked child)."""
    global _readers, _pid
    readers = _readers
    if readers is not None and _pid == os.getpid():
        return readers
    with _lock:
        if _readers is None or _pid != os.getpid():
            _readers, _pid = LaneReaders(), os.getpid()
        return _readers
