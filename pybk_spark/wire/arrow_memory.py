"""The Arrow memory pool for the large, short-lived buffers of the data path:
read answers received from a bookie, batches a bookie pulls or journals.

Why not pyarrow's default pool: the Linux wheels default to mimalloc, which
gives the pages of a freed multi-MiB block back to the kernel soon after.
The next block of that size is faulted in again, and with transparent huge
pages every fault zero-fills 2 MiB.  A bookie pulling a fragment (5 MB read
answers, one after another) spent 40-47% of its CPU in the kernel's
``clear_page_erms`` (perf, docs/performance.md "Memory touched for the first time").
jemalloc, and glibc's malloc, keep a freed block mapped and hand it out
again: that CPU went to zero.

``wire_pool()`` is jemalloc where this pyarrow build has it, else the
system allocator.  ``ARROW_DEFAULT_MEMORY_POOL``, when the operator sets it,
wins: the process default is then used as it is.  ``use_for_process()``
makes the pool the process default (bookie-server does, at start: every
Arrow allocation in a bookie is on the data path); the client library
only uses it for the big buffers Arrow allocates for it: read answers
(wire/frame_socket.py) and the payload column ``make_batch`` converts
(wire/entries.py), never changing its host process's default (a Spark
Python worker runs user code too).  A writer's batches (``run_batch``)
take their payload column as one joined ``bytes``, a block glibc's malloc
keeps and reuses in the same way.
"""
from __future__ import annotations

import functools
import os

import pyarrow as pa

ENV = "ARROW_DEFAULT_MEMORY_POOL"


@functools.lru_cache(maxsize=1)
def wire_pool() -> pa.MemoryPool:
    if os.environ.get(ENV):
        return pa.default_memory_pool()
    try:
        return pa.jemalloc_memory_pool()
    except (NotImplementedError, pa.ArrowNotImplementedError):   # built without jemalloc
        return pa.system_memory_pool()


def use_for_process() -> str:
    """Make ``wire_pool()`` the default pool; returns its backend name."""
    pool = wire_pool()
    pa.set_memory_pool(pool)
    return str(pool.backend_name)
