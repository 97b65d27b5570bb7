"""The paged KV cache's block pool: reference counts, copy-on-write, eviction of indexed
blocks nobody holds, and no sequence ever reading a block that went back to the pool."""

import random

import pytest
import torch

from compress.runtime.kv_blocks import BlockPool, OutOfBlocks, block_keys
from compress.runtime.kv_cache import KVCache, parse_kv
from compress.runtime.prefix_cache import PrefixCache

BLOCK = 32


def _values(tokens: list[int]) -> torch.Tensor:
    """k for each position: a function of the whole prefix up to it (as real k/v are), so a
    shared block holds the same values for every sequence that shares it."""
    out, h = [], 0
    for t in tokens:
        h = (h * 31 + t + 1) % 100003
        out.append(float(h))
    return torch.tensor(out)


def _check(cache: KVCache, seqs: dict[int, list[int]]) -> None:
    pool = cache.pool
    holders = [0] * pool.n_blocks
    for slot, held in enumerate(cache.held):
        for i, b in enumerate(held):
            holders[b] += 1
            assert int(cache.table[slot, i]) == b
    assert holders == pool.refs
    held_blocks = {b for b, n in enumerate(holders) if n}
    assert not held_blocks & set(pool.free) and not held_blocks & set(pool.cached)
    assert not set(pool.free) & set(pool.cached)
    assert len(pool.free) + len(pool.cached) + len(held_blocks) == pool.n_blocks
    assert all(pool.index[key] == b for b, key in pool.key_of.items())
    assert len(pool.index) == len(pool.key_of)
    for slot, tokens in seqs.items():  # every sequence reads back exactly its own values
        k, v = cache.read(0, torch.tensor([slot]), len(tokens))
        want = _values(tokens)
        torch.testing.assert_close(k[0, 0, :, 0], want, rtol=0, atol=0)
        torch.testing.assert_close(v[0, 0, :, 0], -want, rtol=0, atol=0)


def _write(cache: KVCache, slot: int, tokens: list[int], start: int) -> None:
    vals = _values(tokens)[start:]
    k = vals.reshape(1, -1, 1).expand(1, -1, 2).contiguous()
    cache.write(0, slot, start, k, -k)
    cache.lengths[slot] = len(tokens)


def test_random_sequences_share_grow_copy_and_release_without_reading_a_freed_block():
    """A seeded walk of 600 operations on a pool too small for every sequence at once:
    sequences start from the longest indexed prefix of their tokens (drawn from a small
    alphabet, so prefixes collide), grow, index their full blocks, are released, and now
    and then rewrite a position inside a block they share (copy-on-write: the others keep
    theirs). After every step the counts equal the block tables, every block is in exactly
    one state, and every sequence reads back its own values."""
    rnd = random.Random(0)
    cache = KVCache(1, 6, 1, 160, 2, blocks=14)
    seqs: dict[int, list[int]] = {}
    shared_hits = cows = refusals = 0
    for _ in range(600):
        op = rnd.random()
        free_slots = [s for s in range(6) if s not in seqs]
        if op < 0.35 and free_slots:
            slot = rnd.choice(free_slots)
            tokens = [rnd.randrange(2) for _ in range(rnd.randrange(1, 100))]
            tokens[:40] = [0] * min(40, len(tokens))  # a common head
            blocks = cache.pool.lookup(block_keys(tokens[:-1], BLOCK))
            cache.share(slot, blocks)
            shared_hits += bool(blocks)
            try:
                _write(cache, slot, tokens, len(blocks) * BLOCK)
            except OutOfBlocks:
                refusals += 1
                cache.release(slot)
                continue
            seqs[slot] = tokens
            cache.register(slot, block_keys(tokens, BLOCK))
        elif op < 0.7 and seqs:
            slot = rnd.choice(list(seqs))
            tokens = seqs[slot] + [rnd.randrange(2) for _ in range(rnd.randrange(1, 40))]
            if len(tokens) >= 160:
                continue
            try:
                _write(cache, slot, tokens, len(seqs[slot]))
            except OutOfBlocks:
                refusals += 1
                continue
            seqs[slot] = tokens
        elif op < 0.8 and seqs:  # rewrite one position: the block is copied if shared
            slot = rnd.choice(list(seqs))
            tokens, pos = seqs[slot], rnd.randrange(len(seqs[slot]))
            b = cache.held[slot][pos // BLOCK]
            shared = cache.pool.refs[b] > 1
            tokens[pos] = 5 + rnd.randrange(3)  # every later value changes too
            try:
                _write(cache, slot, tokens, pos)
            except OutOfBlocks:
                refusals += 1
                cache.release(slot)
                del seqs[slot]
                continue
            cows += shared and cache.held[slot][pos // BLOCK] != b
            assert cache.pool.refs[cache.held[slot][pos // BLOCK]] == 1
        elif seqs:
            slot = rnd.choice(list(seqs))
            cache.release(slot)
            del seqs[slot]
        _check(cache, seqs)
    assert shared_hits > 20 and cows > 0 and refusals > 0  # every path was taken


def test_an_indexed_block_nobody_holds_is_kept_until_needed_then_evicted_oldest_first():
    pool = BlockPool(3)
    a, b = pool.allocate(), pool.allocate()
    pool.register(b"a", a), pool.register(b"b", b)
    pool.release(b), pool.release(a)  # b released first: the older
    assert pool.lookup([b"a"]) == [a] and pool.available == 3
    c = pool.allocate()  # the never-used block first
    assert c not in (a, b)
    d = pool.allocate()  # then the least recently released indexed one
    assert d == b and pool.lookup([b"b"]) == [] and pool.lookup([b"a"]) == [a]
    pool.hold(a)  # a hit: no longer evictable
    with pytest.raises(OutOfBlocks):
        pool.allocate()
    with pytest.raises(ValueError, match="released more often"):
        pool.release(c), pool.release(c)


def test_a_block_matches_only_behind_the_same_whole_prefix():
    a = list(range(70))
    keys = block_keys(a, BLOCK)
    assert len(keys) == 2  # full blocks only
    changed = [5] + a[1:]  # same second block, different first: no key in common
    assert not set(keys) & set(block_keys(changed, BLOCK))
    assert block_keys(a[:64] + [1, 2], BLOCK) == keys


@pytest.mark.parametrize("kv", ["none", "int8"])
def test_a_hit_shares_the_blocks_and_a_quantized_cache_keeps_fp32_copies(kv):
    """A prefix written once is found by a second prompt: the same pool blocks, counted
    twice; for an int8 cache the fp32 k/v come back too, within their byte budget."""
    cache = KVCache(2, 2, 2, 128, 4, parse_kv(kv))
    prefix = PrefixCache(cache, 1 << 20)
    tokens = list(range(80))
    kv_full = [(torch.randn(2, 80, 4), torch.randn(2, 80, 4)) for _ in range(2)]
    for layer, (k, v) in enumerate(kv_full):
        cache.write(layer, 0, 0, k, v)
    prefix.insert(0, tokens[:64], kv_full if kv != "none" else None)
    blocks, copies = prefix.lookup(tokens + [1], limit=80)
    assert blocks == cache.held[0][:2]
    cache.share(1, blocks)
    assert [cache.pool.refs[b] for b in blocks] == [2, 2]
    k0, _ = cache.read(1, torch.tensor([1]), 64)
    if kv == "none":
        assert copies is None
        torch.testing.assert_close(k0[0], kv_full[1][0][:, :64], rtol=0, atol=0)
    else:
        torch.testing.assert_close(copies[1][0], kv_full[1][0][:, :64], rtol=0, atol=0)
        torch.testing.assert_close(k0[0], kv_full[1][0][:, :64], rtol=0.05, atol=0.05)
    cache.release(0), cache.release(1)
    assert cache.pool.used == 0 and len(cache.pool.cached) == 2  # kept for the next hit
