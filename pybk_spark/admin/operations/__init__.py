"""Operator work that reads and writes ledgers, bookies and metadata:
recovery, re-replication, repair, retirement, the autorecovery daemon."""
