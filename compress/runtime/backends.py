"""One backend per device, chosen at load: what a decode step runs on.

- CPU ("c"): the C kernels. Layer inputs are quantized to int8 once and shared by the
  packed linears; when every block linear is packed, a whole decode step is one C call
  (attention included, for every KV-cache class; a packed head too), and so are a prefill
  step's blocks; otherwise each op runs on its own with the C
  attention.
- CUDA ("triton"): the stored weights dequantized inside Triton matmuls, and a Triton
  attention that reads the fp32 or KIVI cache as stored. Under TRITON_INTERPRET=1 the same
  kernels run on CPU tensors, which is how the tests run this backend without a GPU.
"""

from __future__ import annotations

import torch

from compress.kernels.cpu import (
    FusedConv,
    FusedDecoder,
    FusedDelta,
    FusedExperts,
    FusedLatent,
    FusedLayer,
    FusedMamba,
    FusedMamba1,
    decode_attention,
)
from compress.runtime.deltanet import DeltaNet
from compress.runtime.kv_cache import KVCache
from compress.runtime.linears import DenseLinear, QuantLinear
from compress.runtime.mamba import Mamba1, Mamba2
from compress.runtime.short_conv import ShortConv
from compress.runtime.weights import ModelWeights


class CpuBackend:
    name = "c"
    int8_activations = True  # the packed linears read QuantizedInput

    def __init__(self, weights: ModelWeights, ropes):
        self.fused = _fused_decoder(weights, ropes)

    def decode(self, h, cache: KVCache, slots, positions):
        """Every block on h [B, hidden] in one C call, when it can: the logits when the
        call ran the packed head too, else h (changed in place); None when it cannot."""
        return None if self.fused is None else self.fused(h, cache, slots, positions)

    def prefill(self, h, cache: KVCache, chunks, positions, decode=()) -> bool:
        """Every block of a prefill step on h [N, hidden] in one C call, in place, when it
        can: the one-call decoder's code with the causal prefill attention, over any cache.
        A chunk with its prompt's k/v in full precision (Chunk.prefix) attends to them and
        leaves them extended by its rows; other chunks read their prefix from the cache.
        `decode`: the slots of the decode rows after the chunks' rows (prepared). False: it
        cannot."""
        if self.fused is None:
            return False
        spans = [(c.slot, c.start, c.tokens.shape[0]) for c in chunks]
        s = self.fused.dims
        full = []
        for c, (slot, start, t) in zip(chunks, spans, strict=True):
            if c.prefix is None:
                if start and cache.scheme.bits and int(cache.lengths[slot]) < start:
                    return False  # (the per-op path reads zeros past what was written)
                full.append(None)
                continue
            if start and len(c.prefix) != self.fused.cached:
                return False
            f = torch.empty(2, self.fused.cached, s[2], start + t, s[3])
            for i, (k, v) in enumerate(c.prefix):
                f[0, i, :, :start], f[1, i, :, :start] = k, v
            full.append(f)
        for slot, start, t in spans:
            cache.prepare(slot, start, start + t)
        self.fused.prefill(h, cache, spans, positions, full, decode)
        for c, f in zip(chunks, full, strict=True):
            if f is not None:  # what its next chunk attends to
                c.prefix[:] = list(zip(f[0], f[1], strict=True))
        return True

    def decode_ids(self, tokens: list[int], slots: list[int], cache: KVCache):
        """A whole decode step from token ids in one C call (embedding to logits), when
        the one-call decoder holds the embedding and a packed head; else None."""
        if self.fused is None or self.fused.ctx is None:
            return None
        return self.fused.from_ids(tokens, slots, cache)

    def attend(
        self, q, k, v, cache: KVCache, layer, slots, positions, scale, window, softcap, sinks
    ):
        """Store this step's k/v, then attend over 0..position (one C call)."""
        return decode_attention(
            q, k, v, cache, layer, slots, positions, scale, window, softcap, sinks
        )


class TritonBackend:
    name = "triton"
    int8_activations = False

    def __init__(self, weights: ModelWeights, ropes):
        pass

    def decode(self, h, cache, slots, positions):
        return None

    def prefill(self, h, cache, chunks, positions, decode=()) -> bool:
        return False

    def decode_ids(self, tokens, slots, cache):
        return None

    def attend(
        self, q, k, v, cache: KVCache, layer, slots, positions, scale, window, softcap, sinks
    ):
        from compress.kernels.triton_attention import decode_attention as triton_attention

        cache.write_tokens(layer, slots, positions, k, v)
        lengths = positions + 1
        return triton_attention(q, cache, layer, slots, lengths, scale, window, softcap, sinks)


BACKENDS = {b.name: b for b in (CpuBackend, TritonBackend)}


def backend_for(weights: ModelWeights, ropes):
    """`ropes`: the runtime's Rope of each layer (its cos/sin tables)."""
    return BACKENDS[weights.kernels](weights, ropes)


def _experts(moe) -> FusedExperts | None:
    router = moe.router
    if not isinstance(router, DenseLinear) or router.weight.dtype != torch.float32:
        return None
    if not all(isinstance(x, QuantLinear) for pair in moe.experts for x in pair):
        return None
    pairs = [(g.fused_form(), d.fused_form()) for g, d in moe.experts]
    fused = FusedExperts(router.weight, pairs, moe.top_k, moe.renormalize, moe.reads)
    fused.sigmoid, fused.choice_bias, fused.scale = moe.sigmoid, moe.choice_bias, moe.scale
    fused.groups, fused.group_score = moe.groups, moe.group_score
    fused.sparsemixer, fused.router_bias = moe.sparsemixer, router.bias
    fused.logit_choice = moe.logit_choice
    if moe.shared is not None:
        if not all(isinstance(x, QuantLinear) for x in moe.shared):
            return None
        fused.shared = tuple(x.fused_form() for x in moe.shared)
        fused.shared_scale = moe.shared_scale
        fused.shared_gate = None if moe.shared_gate is None else moe.shared_gate.weight
    return fused


def _latent(lat) -> FusedLatent:
    """The one-call decoder's form of a layer's latent attention (runtime/weights.Latent)."""
    return FusedLatent(
        lat.q_width, lat.kv_rank, lat.nope, lat.rope, lat.v, lat.kv_norm,
        [x.fused_form() for x in lat.uk], [x.fused_form() for x in lat.uv], lat.q_norm,
        None if lat.q_b is None else lat.q_b.fused_form(), lat.eps,
    )  # fmt: skip


def _fused_decoder(w: ModelWeights, ropes):
    """The one-call CPU decoder, when every block linear is a packed weight (outlier
    columns and biases allowed), experts included (with an fp32 router)."""
    rows = []
    if any(isinstance(x.mixer, DeltaNet) and x.mixer.ba_weight is None for x in w.layers):
        return None
    kv_layers = w.spec.kv_layers  # each layer's place in the KV cache
    mla_rows = 0  # floats a row of the latent's scratch: a norm's input, every head's product
    for i, layer in enumerate(w.layers):
        lins = (layer.qkv, layer.o, *(() if layer.moe else (layer.gate_up, layer.down)))
        latent = layer.latent.linears() if layer.latent else ()
        if not all(isinstance(x, QuantLinear) for x in (*lins, *latent)):
            return None
        mla = None if layer.latent is None else _latent(layer.latent)
        if mla is not None:
            if mla.normed > max(w.shape.hidden, w.shape.heads * w.shape.head_dim):
                return None  # (the norms' rows are quantized in the step's own buffers)
            widest = max(-(-mla.nope // 32), -(-mla.kv_rank // 32)) * 32
            if mla.nope > mla.kv_rank or max(mla.v, widest) > w.shape.head_dim:
                return None  # (q_b's output, the heads' inputs and o's fill attention's buffers)
            mla_rows = max(mla_rows, mla.rows(w.shape.heads))
        experts = None if layer.moe is None else _experts(layer.moe)
        if layer.moe is not None and experts is None:
            return None
        lins = [x.fused_form() for x in lins] + [None, None] * (layer.moe is not None)
        r = ropes[i]
        norms = {
            "q_norm": layer.q_norm,
            "k_norm": layer.k_norm,
            "post_attn_norm": layer.post_attn_norm,
            "post_mlp_norm": layer.post_mlp_norm,
        }
        window, cap = w.spec.windows[i] or 0, w.spec.attn_softcap
        rows.append(
            FusedLayer(
                layer.attn_norm,
                layer.mlp_norm,
                *lins,
                r.cos,
                r.sin,
                window,
                cap,
                w.spec.residual_scale,
                w.spec.qk_norm == "full",
                **norms,
                moe=experts,
                q_scale=r.q_scale,
                qk_after_rope=w.spec.qk_norm_after_rope,
                center=w.spec.centered,
                parallel=w.spec.parallel,
                qk_each=w.spec.qk_norm == "each_head",
                ungated=not w.spec.gated_mlp,
                act_params=layer.act_params,
                mla=mla,
                gated=layer.gated,
                sinks=layer.sinks,
                delta=FusedDelta(layer.mixer, i) if isinstance(layer.mixer, DeltaNet) else None,
                mamba=FusedMamba(layer.mixer, i) if isinstance(layer.mixer, Mamba2) else None,
                conv=FusedConv(layer.mixer, i) if isinstance(layer.mixer, ShortConv) else None,
                mamba1=FusedMamba1(layer.mixer, i) if isinstance(layer.mixer, Mamba1) else None,
                kv_layer=max(kv_layers[i], 0),
            )
        )
    s, spec = w.shape, w.spec
    halves = 2 if spec.gated_mlp else 1  # gate_up holds gate and up, or up alone
    dense = [layer.gate_up.out_features // halves for layer in w.layers if layer.moe is None]
    inter = max(dense, default=0)
    head = (w.norm, w.lm_head.fused_form()) if isinstance(w.lm_head, QuantLinear) else None
    return FusedDecoder(
        rows, s.hidden, s.heads, s.kv_heads, s.head_dim, inter, spec.eps, spec.attn_scale,
        spec.activation, head, (w.embed, spec.embed_scale), mla_rows,
    )  # fmt: skip
