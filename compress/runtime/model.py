"""The llama-family forward pass over ModelWeights: prefill one sequence, or decode one
token for each of a batch of sequences at their own positions (gpt-fast's shape: plain
torch around the packed linears, no framework model)."""

from __future__ import annotations

import torch

from compress.kernels.cpu import (
    EXACT_ABOVE,
    FusedDecoder,
    decode_attention,
    rms_norm_quantized,
    rope_,
    silu_mul_quantized,
)
from compress.runtime.kv_cache import KVCache
from compress.runtime.linears import QuantLinear
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


def _decode_sized(x: torch.Tensor) -> bool:
    """Rows the packed CPU kernels take with int8 activations (more go the exact path)."""
    return x.shape[0] <= EXACT_ABOVE and x.device.type == "cpu"


def _norm(x: torch.Tensor, weight: torch.Tensor, eps: float):
    """rms_norm, quantized in the same pass for the packed CPU linears at decode sizes."""
    if _decode_sized(x):
        return rms_norm_quantized(x, weight, eps)
    return rms_norm(x, weight, eps)


def _mlp(layer: Layer, h: torch.Tensor, eps: float) -> torch.Tensor:
    gate_up = layer.gate_up(_norm(h, layer.mlp_norm, eps))
    if _decode_sized(gate_up):
        return layer.down(silu_mul_quantized(gate_up))
    gate, up = gate_up.chunk(2, dim=-1)
    return layer.down(torch.nn.functional.silu(gate) * up)


def _qkv(layer: Layer, h: torch.Tensor, w: ModelWeights, rope: Rope, positions: torch.Tensor):
    s = w.shape
    t = h.shape[0]
    qkv = layer.qkv(_norm(h, layer.attn_norm, s.eps))
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


class Model:
    def __init__(self, weights: ModelWeights, max_len: int):
        self.w = weights
        self.device = weights.embed.device
        self.rope = Rope(weights.shape.head_dim, weights.shape.rope_theta, max_len, self.device)
        self.fused = _fused_decoder(weights, self.rope) if self.device.type == "cpu" else None

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.w.lm_head(_norm(h, self.w.norm, self.w.shape.eps))

    @torch.inference_mode()
    def prefill(self, tokens: torch.Tensor, cache: KVCache, slot: int, start: int = 0):
        """Logits [T, vocab] for tokens [T] of one sequence that already has `start` tokens
        cached; their k/v join the cache. The chunk attends to the cached prefix (as stored,
        quantized or not) and to its own keys in full precision."""
        s, t = self.w.shape, tokens.shape[0]
        dev = self.device
        tokens = tokens.to(dev)
        positions = torch.arange(start, start + t, device=dev)
        h = self.w.embed[tokens].float()
        causal = torch.ones(t, start + t, dtype=torch.bool, device=dev).tril(start)
        slots = torch.tensor([slot], device=dev)
        for i, layer in enumerate(self.w.layers):
            q, k, v = _qkv(layer, h, self.w, self.rope, positions)
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [kv_heads, T, hd]
            if start:
                pk, pv = cache.read(i, slots, start)
                keys, values = torch.cat((pk[0], k), 1), torch.cat((pv[0], v), 1)
            else:
                keys, values = k, v
            cache.write(i, slot, start, k, v)
            att = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), keys, values, attn_mask=causal, enable_gqa=True
            )
            h = h + layer.o(att.transpose(0, 1).reshape(t, s.heads * s.head_dim))
            h = h + _mlp(layer, h, s.eps)
        cache.lengths[slot] = start + t
        return self._logits(h)

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, cache: KVCache, slots: torch.Tensor) -> torch.Tensor:
        """One step: logits [B, vocab] for the next token of each sequence in `slots`, whose
        last tokens are `tokens` [B]."""
        s, b = self.w.shape, tokens.shape[0]
        tokens, slots = tokens.to(self.device), slots.to(self.device)
        positions = cache.lengths[slots]
        if self.fused is not None and b <= EXACT_ABOVE:
            h = self.w.embed[tokens].float().contiguous()
            self.fused(h, cache, slots, positions)
            cache.lengths[slots] += 1
            return self._logits(h)
        cpu = self.device.type == "cpu"
        h = self.w.embed[tokens].float()
        for i, layer in enumerate(self.w.layers):
            q, k, v = _qkv(layer, h, self.w, self.rope, positions)
            if cpu:  # one C call: store k/v, attend (compress/kernels/cpu/qgemm.c)
                att = decode_attention(q, k, v, cache, i, slots, positions)
            else:
                cache.write_tokens(i, slots, positions, k, v)  # then attend to 0..position
                att = _triton_attention(q, cache, i, slots, positions + 1)
            h = h + layer.o(att.reshape(b, s.heads * s.head_dim))
            h = h + _mlp(layer, h, s.eps)
        cache.lengths[slots] += 1
        return self._logits(h)


def _fused_decoder(w: ModelWeights, rope: Rope):
    """The one-call CPU decoder, when every block linear is a packed weight (outlier
    columns allowed)."""
    rows = []
    for layer in w.layers:
        lins = layer.linears()
        if not all(isinstance(x, QuantLinear) and x.bias is None for x in lins):
            return None
        rows.append((layer.attn_norm, layer.mlp_norm, *(x.fused_form() for x in lins)))
    s = w.shape
    inter = w.layers[0].gate_up.out_features // 2
    return FusedDecoder(
        rows, s.hidden, s.heads, s.kv_heads, s.head_dim, inter, s.eps, rope.cos, rope.sin
    )


def _triton_attention(q, cache: KVCache, layer: int, slots, lengths):
    from compress.kernels.triton_attention import decode_attention

    return decode_attention(q, cache, layer, slots, lengths)
