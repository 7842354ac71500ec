"""Pure decisions of operator work (no I/O): the auditor's, and which entry
ids a bookie slot holds."""
