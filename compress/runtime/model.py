"""The llama-family forward pass over ModelWeights: prefill one sequence, or decode one
token for each of a batch of sequences at their own positions (gpt-fast's shape: plain
torch around the packed linears, no framework model)."""

from __future__ import annotations

import torch

from compress.kernels.cpu import (
    EXACT_ABOVE,
    quantize_input,
    rms_norm_quantized,
    rope_,
    silu_mul_quantized,
)
from compress.runtime.backends import backend_for
from compress.runtime.kv_cache import KVCache
from compress.runtime.weights import Layer, ModelWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


class Rope:
    """cos/sin tables for every position, rotate-half convention (as transformers' llama)."""

    def __init__(self, head_dim: int, theta: float, max_len: int, device="cpu"):
        inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
        angles = torch.outer(torch.arange(max_len, dtype=torch.float64), inv)
        self.cos, self.sin = angles.cos().float().to(device), angles.sin().float().to(device)

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, hd] at positions [T]."""
        if x.device.type == "cpu":
            return rope_(x.contiguous(), positions.contiguous(), self.cos, self.sin)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float, packed: bool):
    """rms_norm; quantized in the same pass when the packed CPU linears read it."""
    return rms_norm_quantized(x, weight, eps) if packed else rms_norm(x, weight, eps)


def _mlp(layer: Layer, h: torch.Tensor, eps: float, packed: bool) -> torch.Tensor:
    gate_up = layer.gate_up(_norm(h, layer.mlp_norm, eps, packed))
    if packed:
        return layer.down(silu_mul_quantized(gate_up))
    gate, up = gate_up.chunk(2, dim=-1)
    return layer.down(torch.nn.functional.silu(gate) * up)


def _qkv(layer: Layer, h, w: ModelWeights, rope: Rope, positions, packed: bool):
    s = w.shape
    t = h.shape[0]
    qkv = layer.qkv(_norm(h, layer.attn_norm, s.eps, packed))
    kv = s.kv_heads * s.head_dim
    q, k, v = qkv.split([s.heads * s.head_dim, kv, kv], -1)
    q = rope(q.reshape(t, s.heads, s.head_dim), positions)
    k = rope(k.reshape(t, s.kv_heads, s.head_dim), positions)
    return q, k, v.reshape(t, s.kv_heads, s.head_dim)


def _decode_attention(q, keys, values, mask):
    """One query per sequence against its cached keys; query heads grouped by KV head
    (two small matmuls beat the fused SDPA kernel's setup cost for a single query)."""
    b, heads, hd = q.shape
    kv_heads = keys.shape[1]
    qg = q.view(b, kv_heads, heads // kv_heads, hd)
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * hd**-0.5  # [B, kv, rep, L]
    scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores, -1), values)  # [B, kv, rep, hd]


PREFILL_BLOCK = 128  # query rows per block of the causal prefill attention


def _prefill_attention(q, keys, values, start: int) -> torch.Tensor:
    """Causal attention of q [heads, T, hd] at positions start.. over keys/values
    [kv_heads, start + T, hd]: blocks of query rows, each against only the keys it may
    see, query heads grouped by KV head (the masked fused SDPA kernel took 1.8× as long)."""
    heads, t, hd = q.shape
    kv_heads = keys.shape[0]
    qg = q.view(kv_heads, heads // kv_heads, t, hd)
    out = torch.empty_like(qg)
    for r0 in range(0, t, PREFILL_BLOCK):
        r1 = min(r0 + PREFILL_BLOCK, t)
        n = start + r1  # keys these rows may see: 0..start + r1 - 1
        scores = torch.matmul(qg[:, :, r0:r1], keys[:, None, :n].transpose(-1, -2)) * hd**-0.5
        rows = torch.arange(start + r0, start + r1, device=q.device)
        hidden = torch.arange(n, device=q.device)[None] > rows[:, None]
        scores.masked_fill_(hidden, float("-inf"))
        out[:, :, r0:r1] = torch.matmul(torch.softmax(scores, -1), values[:, None, :n])
    return out.view(heads, t, hd)


class Model:
    """`exact=True` (evaluation) runs chunks of more than EXACT_ABOVE rows through weights
    dequantized to fp32, so logits measure the weights alone; otherwise (serving) every
    CPU chunk goes through the packed int8-activation kernels, as decode does."""

    def __init__(self, weights: ModelWeights, max_len: int, exact: bool = False):
        self.w, self.exact = weights, exact
        self.device = weights.embed.device
        self.rope = Rope(weights.shape.head_dim, weights.shape.rope_theta, max_len, self.device)
        self.backend = backend_for(weights, self.rope.cos, self.rope.sin)

    def _packed(self, rows: int) -> bool:
        """Whether `rows` rows take the packed CPU kernels with int8 activations."""
        return self.backend.int8_activations and not (self.exact and rows > EXACT_ABOVE)

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.w.lm_head(_norm(h, self.w.norm, self.w.shape.eps, self._packed(len(h))))

    @torch.inference_mode()
    def prefill(
        self, tokens: torch.Tensor, cache: KVCache, slot: int, start: int = 0, last_only=False
    ):
        """Logits [T, vocab] (`last_only`: [1, vocab], the one a reply samples from) for
        tokens [T] of one sequence that already has `start` tokens cached; their k/v join
        the cache. The chunk attends to the cached prefix (as stored, quantized or not) and
        to its own keys in full precision."""
        s, t = self.w.shape, tokens.shape[0]
        packed = self._packed(t)
        dev = self.device
        tokens = tokens.to(dev)
        positions = torch.arange(start, start + t, device=dev)
        h = self.w.embed[tokens].float()
        slots = torch.tensor([slot], device=dev)
        for i, layer in enumerate(self.w.layers):
            q, k, v = _qkv(layer, h, self.w, self.rope, positions, packed)
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [kv_heads, T, hd]
            if start:
                pk, pv = cache.read(i, slots, start)
                keys, values = torch.cat((pk[0], k), 1), torch.cat((pv[0], v), 1)
            else:
                keys, values = k, v
            cache.write(i, slot, start, k, v)
            att = _prefill_attention(q.transpose(0, 1), keys, values, start)
            att = att.transpose(0, 1).reshape(t, s.heads * s.head_dim)
            h = h + layer.o(quantize_input(att) if packed else att)
            h = h + _mlp(layer, h, s.eps, packed)
        cache.lengths[slot] = start + t
        return self._logits(h[-1:] if last_only else h)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, cache: KVCache, slots: torch.Tensor) -> torch.Tensor:
        """One step: logits [B, vocab] for the next token of each sequence in `slots`, whose
        last tokens are `tokens` [B]."""
        s, b = self.w.shape, tokens.shape[0]
        tokens, slots = tokens.to(self.device), slots.to(self.device)
        positions = cache.lengths[slots]
        packed = self._packed(b)
        h = self.w.embed[tokens].float().contiguous()
        if not (packed and self.backend.decode_layers(h, cache, slots, positions)):
            for i, layer in enumerate(self.w.layers):
                q, k, v = _qkv(layer, h, self.w, self.rope, positions, packed)
                att = self.backend.attend(q, k, v, cache, i, slots, positions)
                att = att.reshape(b, s.heads * s.head_dim)
                h = h + layer.o(quantize_input(att) if packed else att)
                h = h + _mlp(layer, h, s.eps, packed)
        cache.lengths[slots] += 1
        return self._logits(h)
