"""The bookie's entry storage: segments, index, page cache, compaction, damage and the scrubber."""
