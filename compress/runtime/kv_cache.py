"""The KV cache of the running sequences, in fp32 or KIVI-quantized form, paged: each
sequence's tokens live in fixed-size blocks of a shared pool (compress/runtime/kv_blocks.py),
taken as it grows and shared between sequences whose prompts start alike.

KIVI (Liu et al., 2024): keys are quantized per channel, values per token, and the most
recent tokens stay in full precision until a group of them is complete. Here a slot keeps
its last `group` tokens (at most) in an fp32 residual; when the residual fills, those
tokens are quantized as one group: keys get one scale/zero per (head, channel) over the
group's tokens, values one scale/zero per (token, head) over the channels. int4 codes are
packed two per byte. Scales are computed on the fly from the tokens themselves.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compress.errors import LlmpressError
from compress.kernels import hugepages
from compress.runtime.kv_blocks import BlockPool, block_size


@dataclass(frozen=True)
class KVScheme:
    bits: int | None = None  # None: fp32; 8 or 4: KIVI
    group: int = 32  # tokens per key-quantization group, and the fp32 residual length

    def __post_init__(self):
        if self.bits not in (None, 4, 8):
            raise ValueError(f"KV-cache bits must be 4 or 8, got {self.bits}")

    def config(self) -> dict | None:
        """config.json's `llmpress_kv_cache_scheme`, written in compressed-tensors'
        quantization-args vocabulary. Not its `kv_cache_scheme` field: transformers reads
        that as static per-tensor k/v scales stored in the checkpoint, which dynamic KIVI
        scales are not, and then refuses to load the model."""
        if self.bits is None:
            return None
        return {
            "num_bits": self.bits,
            "type": "int",
            "symmetric": False,
            "strategy": "group",
            "group_size": self.group,
            "dynamic": True,
            "observer": "minmax",
            "layout": "kivi",  # keys per channel over token groups, values per token
        }

    @classmethod
    def from_config(cls, cfg: dict | None) -> KVScheme:
        if not cfg:
            return cls()
        return cls(bits=cfg["num_bits"], group=cfg.get("group_size") or 32)

    @classmethod
    def of_artifact(cls, config: dict) -> KVScheme:
        return cls.from_config(config.get(CONFIG_KEY))


FP32 = KVScheme()  # no KV quantization
CONFIG_KEY = "llmpress_kv_cache_scheme"


def kv_scheme(spec: str | None, config: dict) -> KVScheme:
    """The scheme a user asked for (`--kv`), else the one the artifact records."""
    return parse_kv(spec) if spec else KVScheme.of_artifact(config)


def parse_kv(spec: str) -> KVScheme:
    """`int8`, `int4`, `int4:g64` or `none`."""
    name, _, group = spec.partition(":g")
    bits = {"none": None, "fp32": None, "int8": 8, "int4": 4}.get(name)
    if name not in ("none", "fp32", "int8", "int4") or (group and not group.isdigit()):
        raise LlmpressError(f"unknown KV-cache scheme {spec!r}: use int8, int4, int4:g32 or none")
    return KVScheme(bits=bits, group=int(group) if group else 32)


def cache_for(weights, slots: int, max_len: int, kv: KVScheme = FP32, blocks=None) -> KVCache:
    """The KV cache of `slots` sequences of a model's (runtime ModelWeights): its attention
    layers' alone (BlockSpec.kv_layers), on the weights' device."""
    s = weights.shape
    return KVCache(
        weights.spec.cached_layers, slots, s.kv_heads, max_len, s.head_dim, kv,
        weights.embed.device, blocks=blocks,
    )  # fmt: skip


def _quantize(x: torch.Tensor, dim: int, bits: int):
    """Asymmetric min-max codes along `dim`: (codes uint8, scale, minimum)."""
    lo, hi = x.amin(dim, keepdim=True), x.amax(dim, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp_min(1e-8)
    codes = torch.round((x - lo) / scale).clamp(0, 2**bits - 1).to(torch.uint8)
    return codes, scale, lo


def _pack4(codes: torch.Tensor) -> torch.Tensor:
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def _unpack4(packed: torch.Tensor) -> torch.Tensor:
    return torch.stack((packed & 0xF, packed >> 4), dim=-1).flatten(-2)


class KVCache:
    """k/v for `layers` × `slots` sequences of up to `max_len` tokens, stored in a pool of
    `blocks` blocks of `block` tokens (default: enough for every slot's whole context). Each
    slot's block table (`table`, row per slot) names the pool blocks holding its positions
    0.., block by block; `prepare` gives a slot blocks before anything is written there.
    Constructing a KVCache gives the class its scheme needs: FP32Cache or KiviCache."""

    exact = False  # whether reads give back exactly what was written (not quantized)

    def __new__(cls, *args, **kwargs):  # (copy and pickle call it with no arguments)
        if cls is KVCache:
            scheme = kwargs.get("scheme", args[5] if len(args) > 5 else FP32)
            cls = FP32Cache if scheme.bits is None else KiviCache
        return super().__new__(cls)

    def __init__(
        self, layers, slots, kv_heads, max_len, head_dim, scheme=FP32, device="cpu", blocks=None
    ):
        self.scheme, self.max_len = scheme, max_len
        self.block = block_size(scheme.group)
        self.max_blocks = max_len // self.block + 1
        self.pool = BlockPool(slots * self.max_blocks if blocks is None else blocks)
        self.shape = (layers, slots, kv_heads, head_dim)
        self.native = None  # the C kernels' view of these arrays (compress/kernels/cpu.py)
        self.held: list[list[int]] = [[] for _ in range(slots)]  # the table, as lists
        with torch.device(device):  # every buffer on `device`
            self.lengths = torch.zeros(slots, dtype=torch.long)
            self.table = torch.zeros(slots, self.max_blocks, dtype=torch.int32)
            self._allocate(layers, (layers, kv_heads, self.pool.n_blocks), head_dim)

    def _allocate(self, layers, dims, head_dim) -> None:
        raise NotImplementedError

    def _zeros(self, *shape, dtype=torch.float32) -> torch.Tensor:
        """A zeroed array of the cache; on the CPU in 2 MB pages (kernels/hugepages.py):
        decode's attention reads every block of every sequence each step, and in 4 KB
        pages each block began with a TLB miss and a stop for the hardware prefetchers."""
        if self.lengths.is_cpu:  # (made first, on the cache's device)
            return hugepages.empty(shape, dtype).zero_()
        return torch.zeros(*shape, dtype=dtype)

    def _arrays(self) -> tuple[torch.Tensor, ...]:
        """The pool's arrays, each [layers, kv_heads, blocks, ...]: a head's blocks side by
        side, so a sequence whose blocks were taken in a row reads one run of memory."""
        raise NotImplementedError

    def blocks_for(self, tokens: int) -> int:
        """Blocks that hold `tokens` tokens."""
        return -(-tokens // self.block)

    def prepare(self, slot: int, start: int, end: int) -> None:
        """Make positions start..end-1 of `slot` writable: blocks are taken from the pool
        as the sequence grows, and a block another sequence also holds is copied first.
        Raises OutOfBlocks when the pool has none left. `write` prepares its own span; a
        decode step's rows (written in C, or by `write_tokens`) are prepared once, where
        the step starts (runtime/model.py)."""
        held, bs = self.held[slot], self.block
        for i in range(start // bs, (end - 1) // bs + 1):
            if i < len(held):
                if not self.pool.writable(held[i]):  # shared: copy on write
                    b = self.pool.allocate()
                    for t in self._arrays():
                        t[:, :, b] = t[:, :, held[i]]
                    self.pool.release(held[i])
                    held[i] = b
                    self.table[slot, i] = b
                continue
            while len(held) <= i:
                held.append(self.pool.allocate())
                self.table[slot, len(held) - 1] = held[-1]

    def prepare_rows(self, slots: list[int], positions: list[int]) -> None:
        """`prepare` one position for each of several slots (a decode step's rows)."""
        bs, refs, indexed = self.block, self.pool.refs, self.pool.key_of
        for slot, pos in zip(slots, positions, strict=True):
            held, i = self.held[slot], pos // bs
            if i >= len(held) or refs[held[i]] > 1 or held[i] in indexed:
                self.prepare(slot, pos, pos + 1)

    def share(self, slot: int, blocks: list[int]) -> None:
        """An empty slot starts with `blocks` (a cached prefix's full blocks, or a forked
        sequence's) as its own."""
        if self.held[slot]:
            raise ValueError(f"slot {slot} already holds blocks")
        for i, b in enumerate(blocks):
            self.pool.hold(b)
            self.held[slot].append(b)
            self.table[slot, i] = b
        self.lengths[slot] = len(blocks) * self.block

    def fork(self, src: int, dst: int) -> None:
        """An empty slot `dst` starts as a copy of `src`'s sequence: it holds every block
        of it (a partly written one is copied when either writes there next)."""
        self.share(dst, list(self.held[src]))
        self.lengths[dst] = self.lengths[src]

    def register(self, slot: int, keys: list[bytes]) -> None:
        """Index the slot's first len(keys) blocks (full, written) under `keys`."""
        for key, b in zip(keys, self.held[slot], strict=False):
            self.pool.register(key, b)

    def release(self, slot: int) -> None:
        """The slot's sequence is done: its blocks go back to the pool, the last first (a
        prefix's head is evicted last: a lost head would strand the blocks behind it)."""
        for b in reversed(self.held[slot]):
            self.pool.release(b)
        self.held[slot].clear()
        self.lengths[slot] = 0

    def bytes_per_token(self) -> float:
        """KV bytes stored per token, all layers (codes and scales; a KIVI residual is
        fp32 for at most `group` tokens and is left out)."""
        raise NotImplementedError

    def write(self, layer: int, slot: int, start: int, k: torch.Tensor, v: torch.Tensor):
        """Store k/v [kv_heads, T, hd] of one slot at positions start..start+T-1."""
        raise NotImplementedError

    def read(self, layer: int, slots: torch.Tensor, length: int, valid=None):
        """k, v [len(slots), kv_heads, length, hd] for positions 0..length-1. `valid[j]`:
        how many tokens slot j has written (default: its recorded length); positions past
        that are garbage or zeros, and the caller masks them."""
        raise NotImplementedError

    def rollback_room(self, slot: int) -> int:
        """Tokens `slot` may take beyond its length and still be rolled back to it
        (speculative decoding refuses drafts after writing them)."""
        return self.max_len - int(self.lengths[slot])

    def write_tokens(self, layer: int, slots: torch.Tensor, positions: torch.Tensor, k, v):
        """Store one token per slot: k/v [B, kv_heads, hd] at each slot's position (its
        block prepared)."""
        for j, slot in enumerate(slots.tolist()):
            self.write(layer, slot, int(positions[j]), k[j][:, None], v[j][:, None])

    def fill_random(self, batch: int, context: int, gen: torch.Generator) -> None:
        """Slots 0..batch-1 hold `context` random tokens (for timing: a step's cost does
        not depend on the values)."""
        for slot in range(batch):
            self.prepare(slot, 0, context)
        self._fill_random(gen)
        self.lengths[:batch] = context

    def _fill_random(self, gen: torch.Generator) -> None:
        raise NotImplementedError

    def _spans(self, slot: int, start: int, t: int):
        """(block, offset in it, offset in the input, count) covering start..start+t-1."""
        pos, held = start, self.held[slot]
        while pos < start + t:
            i, off = divmod(pos, self.block)
            n = min(self.block - off, start + t - pos)
            yield held[i], off, pos - start, n
            pos += n

    def _gather(self, t: torch.Tensor, slot_blocks: torch.Tensor) -> torch.Tensor:
        """Pool array t [kv_heads, blocks, rows, ...] of the given blocks [B, nb], as
        [B, kv_heads, nb * rows, ...] in position order."""
        g = t[:, slot_blocks]  # [kvh, B, nb, rows, ...]
        kvh, b, nb, rows = g.shape[:4]
        return g.transpose(0, 1).reshape(b, kvh, nb * rows, *g.shape[4:])


class FP32Cache(KVCache):
    exact = True  # reads give back what was written

    def _allocate(self, layers, dims, head_dim):
        self.k = self._zeros(*dims, self.block, head_dim)
        self.v = self._zeros(*dims, self.block, head_dim)

    def _arrays(self):
        return self.k, self.v

    def bytes_per_token(self) -> float:
        layers, _, heads, hd = self.shape
        return 2 * layers * heads * hd * 4

    def write(self, layer, slot, start, k, v):
        t = k.shape[1]
        self.prepare(slot, start, start + t)
        for b, off, a, n in self._spans(slot, start, t):
            self.k[layer, :, b, off : off + n] = k[:, a : a + n]
            self.v[layer, :, b, off : off + n] = v[:, a : a + n]

    def read(self, layer, slots, length, valid=None):
        blocks = self.table[slots, : self.blocks_for(length)].long()
        k, v = self._gather(self.k[layer], blocks), self._gather(self.v[layer], blocks)
        return k[:, :, :length], v[:, :, :length]

    def write_tokens(self, layer, slots, positions, k, v):
        blocks = self.table[slots, positions // self.block].long()
        offsets = positions % self.block
        self.k[layer, :, blocks, offsets] = k.transpose(0, 1)
        self.v[layer, :, blocks, offsets] = v.transpose(0, 1)

    def _fill_random(self, gen):
        for t in (self.k, self.v):
            t.normal_(generator=gen)


class KiviCache(KVCache):
    def _allocate(self, layers, dims, head_dim):
        g, per_byte, bs = self.scheme.group, 8 // self.scheme.bits, self.block
        slots = self.shape[1]
        self.kq = self._zeros(*dims, bs, head_dim // per_byte, dtype=torch.uint8)
        self.vq = self._zeros(*dims, bs, head_dim // per_byte, dtype=torch.uint8)
        self.k_scale = self._zeros(*dims, bs // g, 1, head_dim)  # per channel, per token group
        self.k_min = self._zeros(*dims, bs // g, 1, head_dim)
        self.v_scale = self._zeros(*dims, bs, 1)  # per token
        self.v_min = self._zeros(*dims, bs, 1)
        self.k_res = self._zeros(layers, slots, dims[1], g, head_dim)  # per slot, not pooled
        self.v_res = self._zeros(layers, slots, dims[1], g, head_dim)

    def _arrays(self):
        return self.kq, self.vq, self.k_scale, self.k_min, self.v_scale, self.v_min

    def fork(self, src: int, dst: int) -> None:
        super().fork(src, dst)
        self.k_res[:, dst] = self.k_res[:, src]  # the newest tokens, kept per slot
        self.v_res[:, dst] = self.v_res[:, src]

    def bytes_per_token(self) -> float:
        layers, _, heads, hd = self.shape
        codes = 2 * layers * heads * hd * self.scheme.bits / 8
        k_params = layers * heads * hd * 2 * 4 / self.scheme.group
        v_params = layers * heads * 2 * 4
        return codes + k_params + v_params

    def write(self, layer, slot, start, k, v):
        t, g = k.shape[1], self.scheme.group
        self.prepare(slot, start, start + t)
        pos = start
        while pos < start + t:  # fill the residual, quantizing each group as it completes
            off = pos % g
            n = min(g - off, start + t - pos)
            self.k_res[layer, slot, :, off : off + n] = k[:, pos - start : pos - start + n]
            self.v_res[layer, slot, :, off : off + n] = v[:, pos - start : pos - start + n]
            pos += n
            if pos % g == 0:
                self._flush(layer, slot, pos // g - 1)

    def rollback_room(self, slot: int) -> int:
        """Up to the end of the current group: past it, the next group's tokens would
        overwrite this group's fp32 residual, which a rollback still needs (the group is
        quantized again from it when its last token is written anew)."""
        length, g = int(self.lengths[slot]), self.scheme.group
        return min(super().rollback_room(slot), g - length % g)

    def _flush(self, layer: int, slot: int, group_index: int):
        bits, g = self.scheme.bits, self.scheme.group
        i, off = divmod(group_index * g, self.block)
        b, j = self.held[slot][i], off // g
        kc, ks, kmin = _quantize(self.k_res[layer, slot], dim=1, bits=bits)  # per channel
        vc, vs, vmin = _quantize(self.v_res[layer, slot], dim=2, bits=bits)  # per token
        if bits == 4:
            kc, vc = _pack4(kc), _pack4(vc)
        self.kq[layer, :, b, off : off + g], self.vq[layer, :, b, off : off + g] = kc, vc
        self.k_scale[layer, :, b, j] = ks
        self.k_min[layer, :, b, j] = kmin
        self.v_scale[layer, :, b, off : off + g] = vs
        self.v_min[layer, :, b, off : off + g] = vmin

    def read(self, layer, slots, length, valid=None):
        g = self.scheme.group
        valid = self.lengths[slots] if valid is None else valid
        ks, vs = [], []
        for s, count in zip(slots.tolist(), valid.tolist(), strict=True):
            n = min(length, count)
            done = n // g * g  # quantized prefix; the rest sits in the fp32 residual
            k, v = self._dequant(layer, s, done)
            k = torch.cat((k, self.k_res[layer, s, :, : n - done]), dim=1)
            v = torch.cat((v, self.v_res[layer, s, :, : n - done]), dim=1)
            pad = (0, 0, 0, length - n)
            ks.append(torch.nn.functional.pad(k, pad))
            vs.append(torch.nn.functional.pad(v, pad))
        return torch.stack(ks), torch.stack(vs)

    def _dequant(self, layer: int, slot: int, n: int):
        bits, g = self.scheme.bits, self.scheme.group
        blocks = torch.tensor([self.held[slot][: self.blocks_for(n)]], dtype=torch.long)
        blocks = blocks.to(self.kq.device)
        kc = self._gather(self.kq[layer], blocks)[0, :, :n]
        vc = self._gather(self.vq[layer], blocks)[0, :, :n]
        if bits == 4:
            kc, vc = _unpack4(kc), _unpack4(vc)
        heads, _, hd = kc.shape
        k_scale = self._gather(self.k_scale[layer], blocks)[0, :, : n // g]
        k_min = self._gather(self.k_min[layer], blocks)[0, :, : n // g]
        v_scale = self._gather(self.v_scale[layer], blocks)[0, :, :n]
        v_min = self._gather(self.v_min[layer], blocks)[0, :, :n]
        kg = kc.float().reshape(heads, n // g, g, hd)
        k = kg * k_scale + k_min
        v = vc.float() * v_scale + v_min
        return k.reshape(heads, n, hd), v

    def _fill_random(self, gen):
        for t in (self.kq, self.vq):
            t.random_(0, 256, generator=gen)
        for t in (self.k_scale, self.v_scale):
            t.fill_(0.02)
        for t in (self.k_min, self.v_min):
            t.fill_(-1.0)
        for t in (self.k_res, self.v_res):
            t.normal_(generator=gen)
