"""Give freed memory back to the system during long block-by-block work.

glibc serves large allocations with mmap and returns them on free, but raises that
threshold to the size of each such block freed (up to 32 MB), so a block walk's tensors
soon come from the heap, whose freed pages it keeps: measured on a Llama-3.2-1B shape,
`compress --quant rtn:w4g64` grew 110 MB per block to 3.2 GB. A fixed threshold keeps
it at one block (1.3 GB). Not for serving: there each large allocation would page-fault
afresh every step.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter numbers (malloc.h)
THRESHOLD = 4 << 20


def return_freed_memory() -> bool:
    """Fix glibc's mmap threshold at 4 MB (no-op elsewhere); True when it took effect."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD))
    except (OSError, AttributeError):  # musl and others: no mallopt
        return False
