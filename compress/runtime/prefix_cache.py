"""Prompt prefixes computed once: the k/v of full blocks of prompt tokens are kept after a
request's prompt is prefilled, and a later request whose prompt starts with the same
blocks gets them copied into its slot and prefills only the rest (a shared system prompt,
a few-shot preamble, a conversation's earlier turns).

A block is keyed by a hash chained over every token up to its end, so it matches only
behind the same whole prefix. k/v are kept in fp32 as the prefill computed them, not as a
quantized cache rounded them: a hit writes into any cache kind exactly what prefilling
the prefix would have written, and the rest of the prompt attends to the prefix in full
precision, as a chunked prefill does. The least recently used blocks go first once the
store passes its byte budget; a prefix's first block counts as used last, so a chain loses
its tail before its head (a lost head would strand the blocks behind it)."""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict

import torch

BLOCK = 32  # tokens per block (a multiple of the KIVI cache's group: groups quantize whole)


def block_size(kv_group: int) -> int:
    """Tokens per block for a cache that quantizes `kv_group` tokens at a time."""
    return math.lcm(BLOCK, kv_group)


class PrefixCache:
    def __init__(self, capacity_bytes: int, block: int = BLOCK):
        if capacity_bytes <= 0:
            raise ValueError("a prefix cache needs a positive byte budget")
        self.capacity, self.block = capacity_bytes, block
        self.blocks: OrderedDict[bytes, torch.Tensor] = OrderedDict()  # [layers, 2, kvh, B, hd]
        self.bytes = 0
        self.prompt_tokens = 0  # prompt tokens of the requests that looked
        self.hit_tokens = 0  # of which found here (not computed)

    def keys(self, tokens: list[int]) -> list[bytes]:
        """One key per full block of `tokens`, each over the whole prefix up to its end."""
        out, h = [], b""
        for end in range(self.block, len(tokens) + 1, self.block):
            chunk = array("q", tokens[end - self.block : end]).tobytes()
            h = hashlib.blake2b(h + chunk, digest_size=16).digest()
            out.append(h)
        return out

    def lookup(self, tokens: list[int], limit: int) -> tuple[int, list | None]:
        """The longest run of cached blocks that `tokens` starts with, at most `limit`
        tokens: (tokens found, per layer (k, v) [kv_heads, found, hd]), or (0, None).
        Every prompt is counted, a `limit` of 0 included (a prompt that must be computed
        whole)."""
        self.prompt_tokens += len(tokens)
        found = []
        for key in self.keys(tokens)[: max(limit, 0) // self.block]:
            block = self.blocks.get(key)
            if block is None:
                break
            found.append((key, block))
        if not found:
            return 0, None
        for key, _ in reversed(found):  # the head last: most recently used
            self.blocks.move_to_end(key)
        kv = torch.cat([b for _, b in found], dim=3)  # [layers, 2, kvh, n, hd]
        n = len(found) * self.block
        self.hit_tokens += n
        return n, [(layer[0], layer[1]) for layer in kv]

    def insert(self, tokens: list[int], kv: list) -> None:
        """Keep the full blocks of `tokens`, whose per-layer k/v [kv_heads, >= blocks'
        tokens, hd] are `kv`; blocks already kept are only marked used."""
        keys = self.keys(tokens)
        for i, key in reversed(list(enumerate(keys))):  # the head last: most recently used
            if key in self.blocks:
                self.blocks.move_to_end(key)
                continue
            a, b = i * self.block, (i + 1) * self.block
            block = torch.stack([torch.stack((k[:, a:b], v[:, a:b])) for k, v in kv])
            size = block.numel() * block.element_size()
            if size > self.capacity:
                return
            self.blocks[key] = block.float().contiguous()
            self.bytes += size
            while self.bytes > self.capacity:
                _, old = self.blocks.popitem(last=False)
                self.bytes -= old.numel() * old.element_size()

    @property
    def hit_rate(self) -> float:
        """Share of the prompt tokens looked up that were found here."""
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
