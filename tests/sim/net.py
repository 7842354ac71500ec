"""The simulated network between clients and in-memory bookies.

Theory of operation
-------------------
``SimNet`` implements the transport port (``pybk_spark.transport.base``)
over ``MemoryBookie``s.  Every request is two events: it reaches the
bookie after a seeded delay (the bookie then acts on it, atomically), and
its answer reaches the client after another.  The simulator decides each
message's fate: lost (the caller sees ``Timeout`` after its timeout: an
unknown outcome, the bookie may or may not have acted), slow (an answer
later than the timeout: ``Timeout``, although the bookie acted), a crashed
bookie (``BookieUnavailable`` at once, or a timeout), a partition between
one client and one bookie (both directions lost), and extra loss of one
kind of request (``loss``, by the request's tag: ``lacF`` a fencing LAC
read, ``addR`` a recovery add).  A crashed bookie keeps its state (it is
durable) and answers again after its restart.  ``failed_adds`` names every
(client, bookie) pair where the client saw an add fail.
"""
from __future__ import annotations

from concurrent.futures import Future, InvalidStateError

from pybk_spark import errors
from pybk_spark.transport.base import BookieTransport, TransportPool
from pybk_spark.transport.memory import MemoryBookie

DEFAULT_TIMEOUT = 5.0


class SimNet:
    def __init__(self, loop, bookies: dict[str, MemoryBookie], *, drop_p: float = 0.0,
                 slow_p: float = 0.0):
        self.loop = loop
        self.bookies = bookies
        self.drop_p = drop_p
        self.slow_p = slow_p
        self.down: set[str] = set()
        self.cut: set[tuple[str, str]] = set()     # (client owner, bookie) partitions
        self.loss: dict[str, float] = {}           # request tag -> extra loss probability
        self.plants: dict[str, object] = {}        # request rewriters of planted bugs
        self.failed_adds: set[tuple[str, str]] = set()  # (owner, bookie): an add it saw fail

    def heal(self) -> None:
        self.down.clear()
        self.cut.clear()
        self.drop_p = self.slow_p = 0.0
        self.loss.clear()

    def _delay(self) -> float:
        rng = self.loop.rng
        d = rng.uniform(0.05, 1.0)
        if rng.random() < self.slow_p:
            d += rng.uniform(2.0, 8.0)
        return d

    def call(self, owner: str, bookie: str, what: str, fn, timeout: float | None) -> Future:
        loop, rng = self.loop, self.loop.rng
        timeout = timeout or DEFAULT_TIMEOUT
        fut: Future = Future()
        if owner in loop.dead:
            return fut                              # a dead process sends nothing
        d1, d2 = self._delay(), self._delay()
        if bookie in self.down and rng.random() < 0.5:
            loop.at(d1, _fail, fut, errors.BookieUnavailable(bookie=bookie))
            return fut
        if (bookie in self.down or (owner, bookie) in self.cut
                or rng.random() < self.drop_p
                or (what in self.loss and rng.random() < self.loss[what])):
            loop.at(timeout, _fail, fut, errors.Timeout(f"{what} to {bookie} lost", bookie=bookie))
            return fut
        late = d1 + d2 > timeout
        if late:
            loop.at(timeout, _fail, fut, errors.Timeout(f"{what} to {bookie} late", bookie=bookie))

        def deliver():
            if bookie in self.down or (owner, bookie) in self.cut:
                if not late:
                    loop.at(timeout - d1, _fail, fut, errors.Timeout(bookie=bookie))
                return
            try:
                result, exc = fn(self.bookies[bookie]), None
            except errors.BKError as e:
                result, exc = None, e
            loop.note(f"{owner}>{bookie} {what} {'ok' if exc is None else type(exc).__name__}")
            if late:
                return
            if (owner, bookie) in self.cut:
                loop.at(timeout - d1, _fail, fut, errors.Timeout(bookie=bookie))
            elif exc is None:
                loop.at(d2, _ok, fut, result)
            else:
                loop.at(d2, _fail, fut, exc)
        loop.at(d1, deliver)
        return fut


def _ok(fut: Future, result) -> None:
    try:
        fut.set_result(result)
    except InvalidStateError:
        pass


def _fail(fut: Future, exc: BaseException) -> None:
    try:
        fut.set_exception(exc)
    except InvalidStateError:
        pass


class SimTransport(BookieTransport):
    def __init__(self, net: SimNet, owner: str, bookie_id: str):
        self.net, self.owner, self.bookie_id = net, owner, bookie_id

    def _call(self, what, fn, timeout):
        return self.net.call(self.owner, self.bookie_id, what, fn, timeout)

    def add(self, ledger_id, master_key, entries, recovery=False, timeout=None):
        fut = self._call("addR" if recovery else "add",
                         lambda b: b.add(ledger_id, master_key, entries, recovery), timeout)
        fut.add_done_callback(self._note_failed_add)    # before the caller's callbacks
        return fut

    def _note_failed_add(self, fut: Future) -> None:
        if fut.exception() is not None:                 # lost, late or refused alike
            self.net.failed_adds.add((self.owner, self.bookie_id))

    def read(self, ledger_id, first, last, *, max_entries=0, max_bytes=0, fence=False,
             master_key=b"", timeout=None, sparse=False, stripe=None):
        fence = self.net.plants.get("read_fence", lambda owner, f: f)(self.owner, fence)
        if sparse:
            return self._call("read", lambda b: b.read_sparse(ledger_id, first, last, max_entries,
                                                              fence, master_key, stripe), timeout)
        return self._call(f"read{'F' if fence else ''} {first}",
                          lambda b: b.read(ledger_id, first, last, max_entries, fence, master_key),
                          timeout)

    def read_lac(self, ledger_id, *, fence=False, master_key=b"", wait_for_lac_above=-2,
                 wait_ms=0, timeout=None):
        fence = self.net.plants.get("lac_fence", lambda owner, f: f)(self.owner, fence)
        return self._call(f"lac{'F' if fence else ''}",
                          lambda b: b.read_lac(ledger_id, fence, master_key), timeout)

    def write_lac(self, ledger_id, master_key, lac, timeout=None):
        return self._call("wlac", lambda b: b.write_lac(ledger_id, master_key, lac), timeout)


class SimTransportPool(TransportPool):
    """One client's (``owner``'s) view of the network."""

    def __init__(self, net: SimNet, owner: str):
        self.net, self.owner = net, owner

    def get(self, bookie_id: str) -> BookieTransport:
        if bookie_id not in self.net.bookies:
            raise errors.BookieUnavailable(f"unknown bookie {bookie_id}", bookie=bookie_id)
        return SimTransport(self.net, self.owner, bookie_id)
