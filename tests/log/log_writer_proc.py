"""A log writer in its own process, for crash tests.

    python tests/log/log_writer_proc.py URI LOG COUNT ROLL_EVERY [--hang-after-roll]

Prints "ACK <segment> <ledger> <entry> <payload>" for every acknowledged
append (flushed), "ROLLED" when it stops between a roll's CAS and the close
of the previous ledger (with --hang-after-roll it then waits to be killed).
"""
import sys
import threading

from pybk_spark import BookKeeper
from pybk_spark.logs.log_writer import LogWriter, RollPolicy


class HangingWriter(LogWriter):
    hang = False

    def _after_roll_cas(self, previous_ledger_id, new_ledger_id):
        print("ROLLED", previous_ledger_id, new_ledger_id, flush=True)
        if self.hang:
            threading.Event().wait()


def main():
    uri, name, count, roll_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    bk = BookKeeper(uri)
    writer = HangingWriter(bk, name, roll_policy=RollPolicy(max_entries=roll_every))
    writer.hang = "--hang-after-roll" in sys.argv
    writer.open()
    for i in range(count):
        payload = f"{name}-{i}"
        pos = writer.append(payload.encode())
        print("ACK", pos.ledger_index, pos.ledger_id, pos.entry_id, payload, flush=True)
    writer.close()
    bk.close()


if __name__ == "__main__":
    main()
