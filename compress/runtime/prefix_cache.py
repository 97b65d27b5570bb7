"""Prompt prefixes computed once. After each chunk of a prompt is prefilled, its full blocks
are indexed in the cache's block pool (compress/runtime/kv_blocks.py); a later request whose
prompt starts with the same blocks takes them into its block table, shared and counted,
and prefills only the rest (a shared system prompt, a few-shot preamble, a conversation's
earlier turns). A block is keyed by a hash chained over every token up to its end, so it
matches only behind the same whole prefix.

A quantized cache holds the prefix rounded, while the rest of a prompt attends to its
prefix in full precision (as one whole prefill would). So for int8/int4 caches the fp32 k/v
of indexed blocks are kept here too, within a byte budget, least recently used first; a hit
reaches as far as both the blocks and their fp32 copies go. An fp32 cache's blocks are
their own full-precision copy."""

from __future__ import annotations

from collections import OrderedDict

import torch

from compress.runtime.kv_blocks import block_keys
from compress.runtime.kv_cache import KVCache


class PrefixCache:
    def __init__(self, cache: KVCache, capacity_bytes: int):
        if capacity_bytes <= 0:
            raise ValueError("a prefix cache needs a positive byte budget")
        self.cache, self.block, self.capacity = cache, cache.block, capacity_bytes
        self.full: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # [layers, 2, kvh, B, hd]
        self.bytes = 0  # of the fp32 copies
        self.prompt_tokens = 0  # prompt tokens of the requests that looked
        self.hit_tokens = 0  # of which found here (not computed)

    @property
    def needs_copies(self) -> bool:
        return not self.cache.exact

    def lookup(self, tokens: list[int], limit: int) -> tuple[list[int], list | None]:
        """The pool blocks of the longest cached run of full blocks `tokens` starts with, at
        most `limit` tokens, and for a quantized cache their fp32 k/v per layer
        ([kv_heads, found, hd] each; None for an fp32 cache)."""
        keys = block_keys(tokens, self.block)[: max(limit, 0) // self.block]
        blocks = self.cache.pool.lookup(keys)
        if self.needs_copies:
            n = 0
            while n < len(blocks) and keys[n] in self.full:
                n += 1
            blocks = blocks[:n]
        if not blocks:
            return [], None
        if not self.needs_copies:
            return blocks, None
        for key in reversed(keys[: len(blocks)]):  # the head last: most recently used
            self.full.move_to_end(key)
        kv = torch.cat([self.full[k] for k in keys[: len(blocks)]], dim=3)
        return blocks, [(layer[0], layer[1]) for layer in kv]

    def insert(self, slot: int, tokens: list[int], kv: list | None) -> None:
        """Index the full blocks of `tokens`, the prompt prefilled so far in `slot`; for a
        quantized cache keep their fp32 k/v `kv` too (per layer [kv_heads, >= tokens, hd])."""
        keys = block_keys(tokens, self.block)
        self.cache.register(slot, keys)
        if not self.needs_copies or kv is None:
            return
        for i, key in reversed(list(enumerate(keys))):  # the head last: most recently used
            if key in self.full:
                self.full.move_to_end(key)
                continue
            a, b = i * self.block, (i + 1) * self.block
            block = torch.stack([torch.stack((k[:, a:b], v[:, a:b])) for k, v in kv])
            size = block.numel() * block.element_size()
            if size > self.capacity:
                return
            self.full[key] = block.float().contiguous()
            self.bytes += size
            while self.bytes > self.capacity:
                _, old = self.full.popitem(last=False)
                self.bytes -= old.numel() * old.element_size()

    def count(self, prompt_tokens: int, hit_tokens: int) -> None:
        """An admitted request's prompt, and how much of it came from here (every prompt
        counts, one that must be computed whole included)."""
        self.prompt_tokens += prompt_tokens
        self.hit_tokens += hit_tokens

    @property
    def hit_rate(self) -> float:
        """Share of the prompt tokens looked up that were found here."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
