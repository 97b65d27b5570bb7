"""Freed tensors go back to the system in the block-by-block commands (compress/allocator.py)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Each round frees two large tensors beneath a small one that stays: glibc's heap keeps
# such pages once its mmap threshold has risen past their size, as in a block walk.
PATTERN = """
import sys, torch
from compress.allocator import return_freed_memory
fixed = sys.argv[1] == "fixed" and return_freed_memory()
def rss():
    status = open("/proc/self/status").read().split("VmRSS:")[1]
    return int(status.split()[0]) // 1024
base, keep = rss(), []
for _ in range(40):
    a, b = torch.ones(4 << 20), torch.ones(3 << 20)
    keep.append(torch.ones(1024))
    del a, b
print(fixed, rss() - base)
"""


def _growth(mode: str) -> tuple[str, int]:
    run = subprocess.run(
        [sys.executable, "-c", PATTERN, mode], cwd=ROOT, capture_output=True, text=True, check=True
    )
    fixed, grew = run.stdout.split()
    return fixed, int(grew)


def test_the_fixed_threshold_returns_freed_blocks():
    assert _growth("default")[1] > 200  # what a block walk grew by, 110 MB per 1B block
    fixed, grew = _growth("fixed")
    assert fixed == "True" and grew < 50
