"""The KV cache's memory as a pool of fixed-size token blocks (vLLM's paged attention idea).

A sequence holds a list of blocks (its block table) that grows a block at a time as it
does, so a short request takes a few blocks instead of a `max_len` slot. Blocks are
reference-counted: a full block of prompt tokens is indexed by a hash of every token up to
its end, and a later prompt that starts with the same tokens takes the same block (its
count goes up) instead of computing it again. A block nobody holds stays indexed, with its
contents, until an allocation needs it: the least recently released goes first. Writing
into a block someone else also holds copies it first (copy-on-write); writing into an
indexed block takes it out of the index, since its tokens no longer match its key.

Pure bookkeeping: which block holds what lives in the cache (compress/runtime/kv_cache.py).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict

BLOCK = 32  # tokens per block (a multiple of the KIVI cache's group: groups quantize whole)


def block_size(kv_group: int) -> int:
    """Tokens per block for a cache that quantizes `kv_group` tokens at a time."""
    return math.lcm(BLOCK, kv_group)


class OutOfBlocks(RuntimeError):
    """Every block is held by a running sequence."""


def block_keys(tokens: list[int], block: int) -> list[bytes]:
    """One key per full block of `tokens`, each over the whole prefix up to its end: a
    block matches only behind the same whole prefix."""
    out, h = [], b""
    for end in range(block, len(tokens) + 1, block):
        chunk = array("q", tokens[end - block : end]).tobytes()
        h = hashlib.blake2b(h + chunk, digest_size=16).digest()
        out.append(h)
    return out


class BlockPool:
    def __init__(self, n_blocks: int):
        if n_blocks <= 0:
            raise ValueError("a KV block pool needs at least one block")
        self.n_blocks = n_blocks
        self.refs = [0] * n_blocks
        self.free = list(range(n_blocks))[::-1]  # held by nobody and not indexed
        self.cached: OrderedDict[int, bytes] = OrderedDict()  # held by nobody, indexed; LRU first
        self.index: dict[bytes, int] = {}
        self.key_of: dict[int, bytes] = {}

    @property
    def available(self) -> int:
        """Blocks an allocation may take: free ones and indexed ones nobody holds."""
        return len(self.free) + len(self.cached)

    @property
    def used(self) -> int:
        """Blocks some sequence holds."""
        return self.n_blocks - self.available

    def allocate(self) -> int:
        """A block held once; an indexed block nobody holds is evicted when none is free."""
        if self.free:
            b = self.free.pop()
        elif self.cached:
            b, key = self.cached.popitem(last=False)
            del self.index[key], self.key_of[b]
        else:
            raise OutOfBlocks(f"all {self.n_blocks} KV-cache blocks are held")
        self.refs[b] = 1
        return b

    def hold(self, b: int) -> None:
        """One more holder of block b (a prefix hit)."""
        if self.refs[b] == 0:
            self.cached.pop(b)
        self.refs[b] += 1

    def release(self, b: int) -> None:
        """One holder fewer; a block nobody holds stays indexed (most recently used) or
        becomes free."""
        if self.refs[b] <= 0:
            raise ValueError(f"block {b} released more often than held")
        self.refs[b] -= 1
        if self.refs[b] == 0:
            key = self.key_of.get(b)
            if key is None:
                self.free.append(b)
            else:
                self.cached[b] = key

    def register(self, key: bytes, b: int) -> None:
        """Index block b (held, full) under `key`; a key or block already indexed stays."""
        if key not in self.index and b not in self.key_of:
            self.index[key], self.key_of[b] = b, key

    def unregister(self, b: int) -> None:
        key = self.key_of.pop(b, None)
        if key is not None:
            del self.index[key]

    def lookup(self, keys: list[bytes]) -> list[int]:
        """The blocks of the longest run of `keys` indexed, from the first (not held)."""
        found = []
        for key in keys:
            b = self.index.get(key)
            if b is None:
                break
            found.append(b)
        return found

    def writable(self, b: int) -> bool:
        """Whether a holder may write into block b as it is: held by it alone. An indexed
        block leaves the index (its tokens will no longer match its key)."""
        if self.refs[b] > 1:
            return False
        self.unregister(b)
        return True
