"""A TLS connection shared by a reading thread and sending threads (the lane).

Theory of operation
-------------------
Both ends of the lane read a connection on one thread while other threads
send on it (wire/frame_socket.py).  An OpenSSL connection must not be used
by two threads at once, and a blocking ``SSLSocket`` would hold it for as
long as a ``recv`` waits.  So the TLS socket underneath is non-blocking and
every OpenSSL call is made under one lock, never held while waiting:

* ``recv_into``: under the lock, try to read; ``SSLWantReadError`` (nothing
  decrypted yet) or ``SSLWantWriteError`` -> release the lock, wait with
  ``select`` for the raw socket to be readable (writable), try again.
  Bytes OpenSSL already decrypted are taken first (the read is tried
  before any wait), so nothing buffered inside OpenSSL is missed.
* ``send``: likewise; ``flags`` = ``MSG_DONTWAIT`` means one attempt
  (``BlockingIOError`` when nothing could be sent), as on a plain socket.
  A write OpenSSL could not finish counts as nothing sent; OpenSSL requires
  the next write to carry the same bytes, which every caller does (a
  ``sendall`` loop, or ``FrameWriter`` queueing the frame whole and its
  helper thread sending it before anything else).
* ``settimeout`` sets how long one call may wait in total: past it the call
  raises ``TimeoutError`` (``None`` = forever).
* ``shutdown`` acts on the raw socket (no TLS close_notify): it wakes a
  thread waiting in ``select``, which then reads the end of the stream.

:func:`handshake` wraps an accepted (``server_side``) or connected socket
and runs the TLS handshake in the same non-blocking way, bounded by a
deadline: a peer that never completes its handshake costs at most that
long, then ``TimeoutError``; garbage instead of a ClientHello is an
``ssl.SSLError`` at once.  The caller closes the socket on either.

It quacks like the socket methods frame_socket.py and the lane servers use
(``recv_into``, ``send``, ``sendall``, ``sendmsg``, ``makefile("rb")``,
``shutdown``, ``close``, ``fileno``, ``setsockopt``, ``settimeout``,
``getpeercert``).
"""
from __future__ import annotations

import io
import select
import socket
import ssl
import threading
import time
from typing import Any, Iterable, Optional, cast

_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)


def _wait(sock: socket.socket, for_write: bool, deadline: Optional[float]) -> None:
    """Block until ``sock`` is readable (writable) or raise TimeoutError."""
    while True:
        remaining = None if deadline is None else deadline - time.monotonic()
        if remaining is not None and remaining <= 0:
            raise TimeoutError("timed out")
        r, w, x = select.select([] if for_write else [sock], [sock] if for_write else [],
                                [sock], remaining)
        if r or w or x:
            return


def handshake(raw: socket.socket, context: ssl.SSLContext, *, server_side: bool,
              server_hostname: Optional[str] = None, timeout: Optional[float]) -> "TlsSocket":
    """Wrap ``raw`` and complete the TLS handshake within ``timeout`` seconds
    (TimeoutError past it; ssl.SSLError for a failed handshake)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    raw.setblocking(False)
    tls = context.wrap_socket(raw, server_side=server_side, server_hostname=server_hostname,
                              do_handshake_on_connect=False)
    while True:
        try:
            tls.do_handshake()
            return TlsSocket(tls)
        except ssl.SSLWantReadError:
            _wait(tls, False, deadline)
        except ssl.SSLWantWriteError:
            _wait(tls, True, deadline)


class TlsSocket:
    def __init__(self, tls: ssl.SSLSocket):
        self._tls = tls
        self._lock = threading.Lock()
        self._timeout: Optional[float] = None

    # -- what the lane uses of a socket ---------------------------------------------------
    def fileno(self) -> int:
        return self._tls.fileno()

    def settimeout(self, timeout: Optional[float]) -> None:
        self._timeout = timeout

    def setsockopt(self, *args: Any) -> None:
        self._tls.setsockopt(*args)

    def getpeercert(self) -> Optional[dict[str, Any]]:
        return self._tls.getpeercert()

    def version(self) -> Optional[str]:
        return self._tls.version()

    def _deadline(self) -> Optional[float]:
        return None if self._timeout is None else time.monotonic() + self._timeout

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        deadline = self._deadline()
        while True:
            with self._lock:
                try:
                    return self._tls.recv_into(buffer, nbytes or len(buffer))
                except ssl.SSLWantReadError:
                    for_write = False
                except ssl.SSLWantWriteError:
                    for_write = True
                except (ssl.SSLEOFError, ssl.SSLZeroReturnError):
                    return 0              # the peer (or our shutdown) ended the stream
            _wait(self._tls, for_write, deadline)

    def recv(self, n: int) -> bytes:
        buf = bytearray(n)
        got = self.recv_into(buf, n)
        return bytes(buf[:got])

    def send(self, data: Any, flags: int = 0) -> int:
        once = bool(_DONTWAIT and flags & _DONTWAIT)
        deadline = self._deadline()
        view = memoryview(data).cast("B")
        while True:
            with self._lock:
                try:
                    return self._tls.send(view)
                except ssl.SSLWantWriteError:
                    for_write = True
                except ssl.SSLWantReadError:
                    for_write = False
            if once:
                raise BlockingIOError("TLS send would block")
            _wait(self._tls, for_write, deadline)

    def sendall(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        while view:
            sent = self.send(view)
            view = view[sent:]

    def sendmsg(self, buffers: Iterable[Any]) -> int:
        """One buffer at a time (no gathering over TLS)."""
        for b in buffers:
            if len(b):
                return self.send(b)
        return 0

    def makefile(self, mode: str = "rb") -> io.BufferedReader:
        if mode != "rb":
            raise ValueError("only 'rb'")
        return io.BufferedReader(socket.SocketIO(cast(socket.socket, self), "rb"))   # duck-typed

    def shutdown(self, how: int) -> None:
        socket.socket.shutdown(self._tls, how)

    def close(self) -> None:
        with self._lock:
            self._tls.close()

    def _decref_socketios(self) -> None:     # socket.SocketIO.close() calls it
        pass
