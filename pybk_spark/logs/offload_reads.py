"""A ``LogReader``'s reads of offloaded segments: the segment's files, read
and checked once (logs/offload_files.py), served as the entries the ledger
held, with the same positions (ledger id, entry id)."""
from __future__ import annotations

from typing import Optional

import pyarrow as pa

from pybk_spark.logs import offload_files
from pybk_spark.protocol.log_metadata import Segment


class OffloadedSegments:
    """The entries of the last offloaded segment read (one at a time: a reader
    moves forward through the log)."""

    def __init__(self) -> None:
        self._ledger_id: Optional[int] = None
        self._entries: Optional[pa.Table] = None

    def entries(self, segment: Segment) -> pa.Table:
        assert segment.offload is not None
        if self._ledger_id != segment.ledger_id or self._entries is None:
            table = offload_files.read_segment(segment.offload)
            self._entries = offload_files.as_entries(table, segment.ledger_id)
            self._ledger_id = segment.ledger_id
        return self._entries

    def read(self, segment: Segment, next_entry: int, max_entries: int
             ) -> Optional[pa.RecordBatch]:
        """Entries ``next_entry`` .. (at most ``max_entries``) of the segment;
        None past its last entry."""
        assert segment.offload is not None
        first = segment.offload.first_entry
        if next_entry > segment.offload.last_entry:
            return None
        part = self.entries(segment).slice(next_entry - first, max_entries).combine_chunks()
        batches = part.to_batches()
        return batches[0] if batches else None

    def forget(self) -> None:
        self._ledger_id, self._entries = None, None
