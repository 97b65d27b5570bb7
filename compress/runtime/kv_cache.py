"""Preallocated KV cache, one slot per running sequence, in fp32 or KIVI-quantized form.

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
    """k/v for `layers` × `slots` sequences of up to `max_len` tokens. Constructing a
    KVCache gives the class its scheme needs: FP32Cache or KiviCache."""

    exact = False  # whether reads give back exactly what was written (not quantized)

    def __new__(cls, *args, **kwargs):  # (copy and pickle call it with no arguments)
        if cls is KVCache:
            scheme = kwargs.get("scheme", args[5] if len(args) > 5 else FP32)
            cls = FP32Cache if scheme.bits is None else KiviCache
        return super().__new__(cls)

    def __init__(self, layers, slots, kv_heads, max_len, head_dim, scheme=FP32, device="cpu"):
        self.scheme, self.max_len = scheme, max_len
        self.shape = (layers, slots, kv_heads, head_dim)
        self.native = None  # the C kernels' view of these arrays (compress/kernels/cpu.py)
        with torch.device(device):  # every buffer on `device`
            self.lengths = torch.zeros(slots, dtype=torch.long)
            self._allocate(layers, (layers, slots, kv_heads), max_len, head_dim)

    def _allocate(self, layers, dims, max_len, head_dim) -> None:
        raise NotImplementedError

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
        """Store one token per slot: k/v [B, kv_heads, hd] at each slot's position."""
        for j, slot in enumerate(slots.tolist()):
            self.write(layer, slot, int(positions[j]), k[j][:, None], v[j][:, None])

    def fill_random(self, batch: int, context: int, gen: torch.Generator) -> None:
        """Slots 0..batch-1 hold `context` random tokens (for timing: a step's cost does
        not depend on the values)."""
        raise NotImplementedError


class FP32Cache(KVCache):
    exact = True  # reads give back what was written

    def _allocate(self, layers, dims, max_len, head_dim):
        self.k = torch.zeros(*dims, max_len, head_dim)
        self.v = torch.zeros(*dims, max_len, head_dim)

    def bytes_per_token(self) -> float:
        layers, _, heads, hd = self.shape
        return 2 * layers * heads * hd * 4

    def write(self, layer, slot, start, k, v):
        t = k.shape[1]
        self.k[layer, slot, :, start : start + t] = k
        self.v[layer, slot, :, start : start + t] = v

    def read(self, layer, slots, length, valid=None):
        return self.k[layer, slots, :, :length], self.v[layer, slots, :, :length]

    def write_tokens(self, layer, slots, positions, k, v):
        self.k[layer, slots, :, positions] = k
        self.v[layer, slots, :, positions] = v

    def fill_random(self, batch, context, gen):
        for t in (self.k, self.v):
            t[:, :batch, :, :context].normal_(generator=gen)
        self.lengths[:batch] = context


class KiviCache(KVCache):
    def _allocate(self, layers, dims, max_len, head_dim):
        g, per_byte = self.scheme.group, 8 // self.scheme.bits
        ng = max_len // g + 1
        self.kq = torch.zeros(*dims, ng * g, head_dim // per_byte, dtype=torch.uint8)
        self.vq = torch.zeros(*dims, ng * g, head_dim // per_byte, dtype=torch.uint8)
        self.k_scale = torch.zeros(*dims, ng, 1, head_dim)  # per channel, per token group
        self.k_min = torch.zeros(*dims, ng, 1, head_dim)
        self.v_scale = torch.zeros(*dims, ng * g, 1)  # per token
        self.v_min = torch.zeros(*dims, ng * g, 1)
        self.k_res = torch.zeros(*dims, g, head_dim)
        self.v_res = torch.zeros(*dims, g, head_dim)

    def bytes_per_token(self) -> float:
        layers, _, heads, hd = self.shape
        codes = 2 * layers * heads * hd * self.scheme.bits / 8
        k_params = layers * heads * hd * 2 * 4 / self.scheme.group
        v_params = layers * heads * 2 * 4
        return codes + k_params + v_params

    def write(self, layer, slot, start, k, v):
        t, g = k.shape[1], self.scheme.group
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
        a, b = group_index * g, (group_index + 1) * g
        kc, ks, kmin = _quantize(self.k_res[layer, slot], dim=1, bits=bits)  # per channel
        vc, vs, vmin = _quantize(self.v_res[layer, slot], dim=2, bits=bits)  # per token
        if bits == 4:
            kc, vc = _pack4(kc), _pack4(vc)
        self.kq[layer, slot, :, a:b], self.vq[layer, slot, :, a:b] = kc, vc
        self.k_scale[layer, slot, :, group_index] = ks
        self.k_min[layer, slot, :, group_index] = kmin
        self.v_scale[layer, slot, :, a:b], self.v_min[layer, slot, :, a:b] = vs, vmin

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
        kc, vc = self.kq[layer, slot, :, :n], self.vq[layer, slot, :, :n]
        if bits == 4:
            kc, vc = _unpack4(kc), _unpack4(vc)
        heads, _, hd = kc.shape
        kg = kc.float().reshape(heads, n // g, g, hd)
        k = kg * self.k_scale[layer, slot, :, : n // g] + self.k_min[layer, slot, :, : n // g]
        v = vc.float() * self.v_scale[layer, slot, :, :n] + self.v_min[layer, slot, :, :n]
        return k.reshape(heads, n, hd), v

    def fill_random(self, batch, context, gen):
        for t in (self.kq, self.vq):
            t[:, :batch].random_(0, 256, generator=gen)
        for t in (self.k_scale, self.v_scale):
            t[:, :batch].fill_(0.02)
        for t in (self.k_min, self.v_min):
            t[:, :batch].fill_(-1.0)
        for t in (self.k_res, self.v_res):
            t[:, :batch].normal_(generator=gen)
        self.lengths[:batch] = context
