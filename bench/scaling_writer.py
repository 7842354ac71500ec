"""One writer process of the scaling figure (bench.scaling), run on its own
test host: ``python -m bench.scaling_writer --uri URI``.

It keeps one ``BookKeeper`` client for the whole run and obeys one JSON
command per stdin line, answering each with one JSON line on stdout (logs go
to stderr), so the coordinator can read every process's CPU counters while
the writers sit idle between commands:

* ``{"cmd": "setup", "ensemble": [...], "entries": n, "warmup": m}``: warm a
  throw-away ledger on that ensemble with ``m`` entries, create the measured
  E=3 Qw=3 Qa=2 ledger on it and prepare ``n`` 1 KiB payloads.
* ``{"cmd": "append"}``: ``add_entries`` of the ``n`` payloads, timed by
  ``bench.client_append`` (the code of figure 3), then ``close()`` (which
  waits for the Qw - Qa straggler copies, so their bookie CPU falls inside
  the coordinator's window).  Answers the add's figures plus its wall-clock
  start/end (``time.time()``: one clock for every namespace on the machine).
* ``{"cmd": "read"}``: opens the closed ledger without fencing and reads it
  back with ``bench.catchup.timed_read`` (the code of figure 5).
* ``{"cmd": "exit"}`` (or end of input): close the client and exit 0.

The ensemble is chosen by the coordinator (round-robin over the bookies, so
every bookie carries load); the client's placement policy is replaced by a
fixed one for that (``BookKeeper.placement`` is the client's seam for it).
Adds time out after 30 s, not 5: see ``WRITER_CONF``.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from typing import Any

from bench import catchup, client_append
from pybk_spark.ledger.client import BookKeeper
from pybk_spark.ledger.placement import RandomPlacement


# On 2 shared cores with a dozen busy processes an add can wait seconds for a
# CPU; a timeout would trigger an ensemble change that is the machine's doing.
WRITER_CONF = {"add_timeout_s": 30.0}


class FixedPlacement(RandomPlacement):
    """Every new ensemble is the one given (a benchmark's placement); a
    replacement (after an add timed out) is random, and counted."""

    def __init__(self, ensemble):
        super().__init__()
        self.ensemble = tuple(ensemble)

    def new_ensemble(self, n, bookies, exclude=()):
        if n != len(self.ensemble) or not set(self.ensemble) <= set(bookies):
            raise RuntimeError(f"fixed ensemble {self.ensemble} not writable: {sorted(bookies)}")
        return self.ensemble


class Writer:
    def __init__(self, uri: str):
        self.bk = BookKeeper(uri, conf=WRITER_CONF)
        self.lh: Any = None
        self.data: list[bytes] = []

    def setup(self, ensemble, entries: int, warmup: int) -> dict:
        self.bk.placement = FixedPlacement(ensemble)
        warm = self.bk.create_ledger(3, 3, 2)
        warm.add_entries(client_append.payloads(warmup))
        warm.close()
        self.lh = self.bk.create_ledger(3, 3, 2)
        self.data = client_append.payloads(entries)
        return {"ledger": self.lh.ledger_id, "ensemble": list(ensemble)}

    def append(self) -> dict:
        start = time.time()
        out = client_append.timed_batched(self.lh, self.data)
        end = time.time()
        self.lh.close()
        changes = len(self.lh.metadata.ensembles) - 1
        return {**out, "start": start, "end": end, "closed_at": time.time(),
                "ensemble_changes": changes}

    def read(self) -> dict:
        rh = self.bk.open_ledger(self.lh.ledger_id, recovery=False)
        start = time.time()
        out = catchup.timed_read(rh, len(self.data))
        return {**out, "start": start, "end": time.time()}

    def close(self) -> None:
        self.bk.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scaling_writer")
    p.add_argument("--uri", required=True, help="metadata URI (etcd://...)")
    a = p.parse_args(argv)
    w = Writer(a.uri)
    print(json.dumps({"ready": True}), flush=True)
    try:
        for line in sys.stdin:
            msg = json.loads(line)
            cmd = msg.get("cmd")
            if cmd == "exit":
                break
            try:
                if cmd == "setup":
                    reply = w.setup(msg["ensemble"], int(msg["entries"]), int(msg["warmup"]))
                elif cmd == "append":
                    reply = w.append()
                elif cmd == "read":
                    reply = w.read()
                else:
                    reply = {"error": f"unknown command {cmd!r}"}
            except Exception as exc:  # noqa: BLE001 - reported to the coordinator
                traceback.print_exc()
                reply = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(reply, default=str), flush=True)
    finally:
        w.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
