"""The bookie's journal: group-committed, fsynced records, their checksums and replay at startup."""
