"""The ledger client: BookKeeper, ledger handles, the writer, reads, recovery, placement and digests."""
