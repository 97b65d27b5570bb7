"""Give freed memory back to the system during long block-by-block work.

glibc serves large allocations with mmap and returns them on free, but raises that
threshold to the size of each such block freed (up to 32 MB), so a block walk's tensors
soon come from the heap, whose freed pages it keeps: measured on a Llama-3.2-1B shape,
`compress --quant rtn:w4g64` grew 110 MB per block to 3.2 GB. A fixed threshold keeps
it at one block (1.3 GB). Not for serving: there each large allocation would page-fault
afresh every step.

Fixing the threshold also fixes glibc's trim threshold at its 128 kB default, so the
heap's top was handed back and faulted in again by the next tensor below the threshold:
with the scale search's shared buffers in place the README's compress took 9-13 million
page faults and 25-33 s of system time in a 73-83 s run. Keeping up to 64 MB free at the
top cut that to 5-8 million and 16-21 s, the run to 66-71 s, for up to 200 MB more peak
memory in some runs (benchmarks/allocator_churn.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from contextlib import contextmanager

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameter numbers (malloc.h)
THRESHOLD = 4 << 20
TRIM = 64 << 20  # free bytes the heap's top keeps before it is returned
HEAP_MAX = 32 << 20  # the largest mmap threshold glibc takes (64-bit)
# the heap's free top kept inside heap_blocks: with TRIM, a freed 24 MB block on top of
# the free memory already there went back to the system about every other round
LOOP_TRIM = 4 * HEAP_MAX
_fixed: list = []  # the libc whose thresholds return_freed_memory fixed


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 4 MB and its trim threshold at 64 MB (no-op
    elsewhere); True when they took effect."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mapped = libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)
        done = bool(mapped and libc.mallopt(M_TRIM_THRESHOLD, TRIM))
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
    if done and not _fixed:
        _fixed.append(libc)
    return done


@contextmanager
def heap_blocks():
    """While the block runs, allocations up to HEAP_MAX come from the heap, as glibc's own
    moving threshold would let them, instead of return_freed_memory's 4 MB: for a loop
    that allocates the same tensors every round once the block walk is over (eval's
    windows: each chunk's logits, the int8 head's scratch), which were otherwise mapped
    and page-faulted afresh every window. The heap's top keeps up to LOOP_TRIM free
    meanwhile. Then return_freed_memory's thresholds again; nothing changes where it did
    not set them."""
    libc = _fixed[0] if _fixed else None
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, HEAP_MAX)
        libc.mallopt(M_TRIM_THRESHOLD, LOOP_TRIM)
    try:
        yield
    finally:
        if libc is not None:
            libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD)
            libc.mallopt(M_TRIM_THRESHOLD, TRIM)
