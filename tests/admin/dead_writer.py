"""Writer process for the dead-writer test: creates a ledger (E=3 Qw=2 Qa=2),
prints ``LEDGER <id>``, then adds chunks of entries ``e<i>`` forever, printing
``ACK <last id>`` after each chunk is acknowledged.  The test SIGKILLs it."""
import sys

from pybk_spark.ledger.client import BookKeeper

uri, chunk = sys.argv[1], int(sys.argv[2])
bk = BookKeeper(uri, conf={"writer_lease_ttl_s": 2})
lh = bk.create_ledger(3, 2, 2, password=b"secret", custom_metadata={"password": "secret"})
print(f"LEDGER {lh.ledger_id}", flush=True)
i = 0
while True:
    ids = lh.add_entries([f"e{j}".encode() for j in range(i, i + chunk)])
    i += chunk
    print(f"ACK {ids[-1]}", flush=True)
