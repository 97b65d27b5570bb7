"""The decoder forward pass over ModelWeights: prefill one sequence, or decode one token
for each of a batch of sequences at their own positions (gpt-fast's shape: plain torch
around the packed linears, no framework model). What differs between families comes from
the weights' BlockSpec: optional q/k and sandwich norms, activation, rope tables and
sliding window per layer, attention, embedding, residual and logit scales, attention and
logit softcapping."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from compress.kernels.cpu import (
    QuantizedInput,
    act_mul_quantized,
    act_quantized,
    exact_products,
    gate_rows,
    prefill_attention,
    quantize_input,
    rms_norm_quantized,
    rope_,
    route,
    sigmoid_gate,
)
from compress.kernels.cpu import rms_norm as cpu_rms_norm
from compress.model.moe import route_scores
from compress.model.rope import RopeSpec, query_scales, tables
from compress.runtime.backends import backend_for
from compress.runtime.kv_cache import KVCache
from compress.runtime.states import states_of
from compress.runtime.weights import Layer, ModelWeights, MoeWeights


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, center=False) -> torch.Tensor:
    """On CPU the C kernels' own norm, so the per-op and one-call paths round alike.
    `center`: x less its mean first (a LayerNorm without a bias, spec.norm "layer"). A
    weight of several rows of x's width (q [T, heads, D] and one per head: cohere's q/k
    norms) gives each head its own."""
    if x.device.type == "cpu" and x.numel():
        return cpu_rms_norm(x, weight, eps, center)
    if center:
        x = x - x.mean(-1, keepdim=True)
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight.view(-1, x.shape[-1])


class Rope:
    """cos/sin tables of one layer type for every position, rotate-half convention (as
    transformers), over the first rotary_dim values of each head."""

    def __init__(self, spec: RopeSpec, max_len: int, device="cpu"):
        self.cos, self.sin = tables(spec, max_len, device)
        self.rotary = spec.rotary_dim
        self.q_scale = query_scales(spec, max_len, device)  # None: every query's is 1

    def __call__(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [T, heads, hd] at positions [T]."""
        if x.device.type == "cpu":
            return rope_(x.contiguous(), positions.contiguous(), self.cos, self.sin)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]
        rot, rest = x[..., : self.rotary], x[..., self.rotary :]
        x1, x2 = rot.chunk(2, dim=-1)
        return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin, rest), dim=-1)


def _norm(x: torch.Tensor, weight: torch.Tensor | None, spec, packed: bool):
    """The branch-input norm spec.norm names (none without a weight: olmo2's branches read
    the residual as it is); quantized in the same pass when the packed CPU linears read it."""
    if weight is None:
        return quantize_input(x) if packed else x
    center = spec.centered
    if packed:
        return rms_norm_quantized(x, weight, spec.eps, center)
    return rms_norm(x, weight, spec.eps, center)


ACT = {
    "silu": torch.nn.functional.silu,
    "gelu_pytorch_tanh": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),
    "gelu_new": lambda g: torch.nn.functional.gelu(g, approximate="tanh"),  # phi's name
    "gelu": torch.nn.functional.gelu,  # the exact one (gpt_neox)
    "relu2": lambda g: torch.relu(g).square(),
}


def _gated(gate_up, down, x, act: str, packed: bool, exact=None) -> torch.Tensor:
    """down(act(gate(x)) * up(x)), gate and up fused in one linear. `exact`: passed to
    the linears (an expert's rows of an exact batch stay exact however few they are)."""
    gu = gate_up(x, exact)
    if packed:
        return down(act_mul_quantized(gu, act))
    gate, up = gu.chunk(2, dim=-1)
    return down(ACT[act](gate) * up, exact)


def xielu(u: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """xIELU (apertus) with effective parameters p = (alpha_p, alpha_n, beta, eps)."""
    alpha_p, alpha_n, beta, eps = p.tolist()
    neg = (torch.expm1(torch.clamp(u, max=eps)) - u) * alpha_n + beta * u
    return torch.where(u > 0, alpha_p * u * u + beta * u, neg)


def _ungated(up, down, x, act: str, packed: bool, params=None) -> torch.Tensor:
    """down(act(up(x))): an MLP without a gate (arcee; apertus's xIELU with `params`)."""
    u = up(x)
    if packed:
        return down(act_quantized(u, act, params))
    return down(xielu(u, params) if act == "xielu" else ACT[act](u))


def _experts(moe: MoeWeights, x, act: str, packed: bool) -> torch.Tensor:
    """The Mixture-of-Experts MLP: the router's scores (fp32) and top-k, as the family
    routes (compress/model/moe.py's route_scores); tokens grouped by expert, so each chosen
    expert's packed weights are read once per step and an unchosen one not at all."""
    xf = x.x if isinstance(x, QuantizedInput) else x
    routing = (moe.top_k, moe.renormalize, moe.sigmoid, moe.choice_bias, moe.scale)
    routing += (moe.groups, moe.group_score, moe.sparsemixer, moe.logit_choice)
    if xf.device.type == "cpu":  # the one-call decoder's routing, ties and rounding alike
        weights, chosen = route(xf, moe.router.weight, *routing, router_bias=moe.router.bias)
    else:
        weights, chosen = route_scores(moe.router(xf).float(), *routing)
    out = torch.zeros(xf.shape[0], moe.experts[0][1].out_features, device=xf.device)
    for e in chosen.unique().tolist():
        rows, slot = torch.where(chosen == e)
        xe = x.rows(rows) if isinstance(x, QuantizedInput) else xf[rows]
        gate_up, down = moe.experts[e]
        moe.reads[e] += 1
        y = _gated(gate_up, down, xe, act, packed, exact=None if packed else True)
        out.index_add_(0, rows, y * weights[rows, slot, None])
    if moe.shared is not None and moe.shared_gate is None:  # every token, as it is
        shared = _gated(*moe.shared, x, act, packed)
        if moe.shared_scale != 1.0:  # cohere2_moe's average: halved (exactly)
            shared = shared * moe.shared_scale
        out = out + shared
    elif moe.shared is not None:  # every token, gated by sigmoid(shared_gate · x)
        if xf.device.type == "cpu":  # the one-call decoder's dot product
            gate = sigmoid_gate(xf, moe.shared_gate.weight)
        else:
            gate = torch.sigmoid(xf @ moe.shared_gate.weight.T)
        out = out + gate * _gated(*moe.shared, x, act, packed)
    return out


def _mlp(layer: Layer, h: torch.Tensor, w: ModelWeights, packed: bool) -> torch.Tensor:
    spec = w.spec
    x = _norm(h, layer.mlp_norm, spec, packed)
    if layer.moe is not None:
        out = _experts(layer.moe, x, spec.activation, packed)
    elif not spec.gated_mlp:
        out = _ungated(layer.gate_up, layer.down, x, spec.activation, packed, layer.act_params)
    else:
        out = _gated(layer.gate_up, layer.down, x, spec.activation, packed)
    if layer.post_mlp_norm is None:
        return out
    return rms_norm(out, layer.post_mlp_norm, spec.eps, spec.centered)


def _attn_out(layer: Layer, att: torch.Tensor, spec, packed: bool, gate=None) -> torch.Tensor:
    if layer.latent is not None:  # each head's weighted latent through its value rows
        att = layer.latent.values(att, packed)
    if gate is not None:  # times sigmoid(gate), channel by channel (spec.attn_gate)
        if att.device.type == "cpu":  # the one-call decoder's arithmetic
            att = gate_rows(att.contiguous(), gate.contiguous())
        else:
            att = att * torch.sigmoid(gate)
    out = layer.o(quantize_input(att) if packed else att)
    if layer.post_attn_norm is None:
        return out
    return rms_norm(out, layer.post_attn_norm, spec.eps, spec.centered)


def _latent_qkv(layer: Layer, x, w: ModelWeights, rope: Rope, positions, packed: bool):
    """MLA's q [T, heads, rope + kv_rank] and its one cached head k, v [T, 1, rope +
    kv_rank] from the attention norm's output x (Latent): the key is the rotated part
    beside the normed latent, the value zeros beside the latent; each head's query, its
    rotated part beside its unrotated part through its key rows of kv_b."""
    lat, heads = layer.latent, w.shape.heads
    a = layer.qkv(x)
    t = a.shape[0]
    q, latent, k_rot = a.split([lat.q_width, lat.kv_rank, lat.rope], -1)
    if lat.q_b is not None:
        q = q.contiguous()
        q = lat.q_b((rms_norm_quantized if packed else rms_norm)(q, lat.q_norm, lat.eps))
    q = rope(q.reshape(t, heads, lat.rope + lat.nope), positions)
    k_rot = rope(k_rot.reshape(t, 1, lat.rope), positions)
    k = torch.cat([k_rot, rms_norm(latent.contiguous(), lat.kv_norm, lat.eps)[:, None]], -1)
    q = torch.cat([q[..., : lat.rope], lat.absorb_q(q[..., lat.rope :], packed)], -1)
    v = k.clone()
    v[..., : lat.rope] = 0  # o never reads it; rotated keys would only widen quantized rows
    return q, k, v


def _qkv(layer: Layer, h, w: ModelWeights, rope: Rope, positions, packed: bool):
    s, spec = w.shape, w.spec
    t = h.shape[0]
    if layer.latent is not None:
        x = _norm(h, layer.attn_norm, spec, packed)
        return (*_latent_qkv(layer, x, w, rope, positions, packed), None)
    qkv = layer.qkv(_norm(h, layer.attn_norm, spec, packed))
    kv = s.kv_heads * s.head_dim
    parts = [s.heads * s.head_dim, kv, kv] + ([s.heads * s.head_dim] if layer.gated else [])
    q, k, v, *gate = qkv.split(parts, -1)
    layer_gate = gate[0] if gate else None

    def normed(q, k):  # the q/k norms, of the family's kind
        c = spec.centered
        return rms_norm(q, layer.q_norm, spec.eps, c), rms_norm(k, layer.k_norm, spec.eps, c)

    full = spec.qk_norm == "full"  # over all of q's heads at once (olmo2), else per head
    if layer.q_norm is not None and full:
        q, k = normed(q, k)
    q, k = q.reshape(t, s.heads, s.head_dim), k.reshape(t, s.kv_heads, s.head_dim)
    after = spec.qk_norm_after_rope  # hunyuan's: rope first, then the per-head norms
    if layer.q_norm is not None and not full and not after:
        q, k = normed(q, k)
    q, k = rope(q, positions), rope(k, positions)
    if after:
        q, k = normed(q, k)
    if rope.q_scale is not None:  # Llama 4's temperature past the original context
        q = q * rope.q_scale[positions][:, None, None]
    return q, k, v.reshape(t, s.kv_heads, s.head_dim), layer_gate


def _add(h: torch.Tensor, branch: torch.Tensor, scale: float) -> torch.Tensor:
    """The residual add, the branch's output times `scale` (granite's residual multiplier)."""
    return h + branch if scale == 1.0 else h + branch * scale


def _block_end(layer: Layer, h, att, w: ModelWeights, packed: bool, gate=None) -> torch.Tensor:
    """The block's output from its input h and attention's `att` (and its output gate's
    logits, spec.attn_gate): attention's branch added, then the MLP's on that sum, or
    (spec.parallel) on h itself."""
    spec = w.spec
    after = _add(h, _attn_out(layer, att, spec, packed, gate), spec.residual_scale)
    return _add(after, _mlp(layer, h if spec.parallel else after, w, packed), spec.residual_scale)


def final_logits(logits: torch.Tensor, spec) -> torch.Tensor:
    """The head's products as the family's logits: times spec.logit_scale, then capped at
    spec.logit_softcap (both in place where they apply)."""
    if spec.logit_scale != 1.0:
        logits = logits.mul_(spec.logit_scale)
    cap = spec.logit_softcap
    return logits if cap is None else softcapped(logits, cap)


def softcapped(scores: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """cap * tanh(scores / cap), in place (gemma2's attention scores); None: as they are."""
    if softcap:
        scores.div_(softcap).tanh_().mul_(softcap)
    return scores


def _decode_attention(q, keys, values, mask, scale: float | None = None, softcap=None, sinks=None):
    """One query per sequence against its cached keys; query heads grouped by KV head
    (two small matmuls beat the fused SDPA kernel's setup cost for a single query)."""
    b, heads, hd = q.shape
    kv_heads = keys.shape[1]
    qg = q.view(b, kv_heads, heads // kv_heads, hd)
    scale = hd**-0.5 if scale is None else scale
    scores = torch.matmul(qg, keys.transpose(-1, -2)) * scale  # [B, kv, rep, L]
    scores = softcapped(scores, softcap).masked_fill(~mask, float("-inf"))
    sink = None if sinks is None else sinks.view(kv_heads, -1, 1)
    return torch.matmul(_softmax(scores, sink), values)  # [B, kv, rep, hd]


def _softmax(scores: torch.Tensor, sink: torch.Tensor | None) -> torch.Tensor:
    """The softmax over the last dimension of scores; with `sink` (each row's sink score,
    broadcast to scores' rows), each row's denominator has exp(sink) besides: a score with
    no value, its column dropped after the softmax."""
    if sink is None:
        return torch.softmax(scores, -1)
    column = sink.expand(*scores.shape[:-1], 1)
    return torch.softmax(torch.cat((scores, column), -1), -1)[..., :-1]


PREFILL_BLOCK = 128  # query rows per block of the causal prefill attention


@dataclass
class Chunk:
    """Tokens [T] of one sequence to prefill at positions start..start+T-1 of its slot;
    `all_logits`: every row's logits back (prompt scoring), else the last row's."""

    tokens: torch.Tensor
    slot: int
    start: int = 0
    all_logits: bool = False
    # the prompt's earlier chunks' k/v in full precision, per cached layer ([kv_heads, start, hd]
    # each), extended by this chunk; None: read the prefix from the cache. A quantized
    # cache holds the prefix rounded, and a prompt prefilled in chunks must attend as one
    # prefilled whole would
    prefix: list | None = None


def _prefill_attention(
    q, keys, values, start: int, scale: float, window=None, softcap=None, sinks=None
):
    """Causal attention of q [heads, T, hd] at positions start.. over keys/values
    [kv_heads, start + T, hd], scores capped at `softcap` when given: blocks of query rows,
    each against only the keys it may see (the last `window` positions, when a sliding
    window is given), query heads grouped
    by KV head (the masked fused SDPA kernel took 1.8× as long). Off the CPU, and the
    tests' reference for the C call every CPU prefill makes."""
    heads, t, hd = q.shape
    kv_heads = keys.shape[0]
    qg = q.view(kv_heads, heads // kv_heads, t, hd)
    out = torch.empty_like(qg)
    for r0 in range(0, t, PREFILL_BLOCK):
        r1 = min(r0 + PREFILL_BLOCK, t)
        n = start + r1  # keys these rows may see: lo..start + r1 - 1
        lo = max(0, start + r0 - window + 1) if window else 0
        k, v = keys[:, None, lo:n], values[:, None, lo:n]
        rows_q = qg[:, :, r0:r1]
        if r1 - r0 == 1:  # as two rows: a one-row product takes another BLAS path whose
            rows_q = rows_q.expand(-1, -1, 2, -1)  # sums differ in the last bits (int8
            # activations then round apart): a prompt's last token must come out the same
            # whether its prefix was computed with it, cached, or in an earlier chunk
        scores = softcapped(torch.matmul(rows_q, k.transpose(-1, -2)) * scale, softcap)
        rows = torch.arange(start + r0, start + r1, device=q.device)[:, None]
        cols = torch.arange(lo, n, device=q.device)[None]
        hidden = (cols > rows) | (cols <= rows - window) if window else cols > rows
        scores.masked_fill_(hidden, float("-inf"))
        weights = _softmax(scores, None if sinks is None else sinks.view(kv_heads, -1, 1, 1))
        out[:, :, r0:r1] = torch.matmul(weights, v)[:, :, : r1 - r0]
    return out.view(heads, t, hd)


class Model:
    """`exact=True` (evaluation) runs every chunk through weights dequantized to fp32, so
    logits measure the weights alone; otherwise (serving) every CPU chunk goes through the
    packed int8-activation kernels, as decode does."""

    def __init__(self, weights: ModelWeights, max_len: int, exact: bool = False):
        self.w, self.exact = weights, exact
        self.device = weights.embed.device
        kinds: dict[RopeSpec, Rope] = {}
        self.ropes = [
            kinds.setdefault(r, Rope(r, max_len, self.device)) for r in weights.spec.rope
        ]  # per layer, one table per layer type
        self.backend = backend_for(weights, self.ropes)
        # the Gated DeltaNet layers (their state beside the cache: runtime/deltanet.py)
        self.nets = {i: x.mixer for i, x in enumerate(weights.layers) if x.mixer is not None}
        self.kv = weights.spec.kv_layers  # each layer's place in the KV cache

    def _packed(self, rows: int) -> bool:
        """Whether `rows` rows take the packed CPU kernels with int8 activations: never in
        an exact model, whatever the rows (a window or chunk of EXACT_ABOVE rows or fewer
        would otherwise have measured the served kernels as the weights alone)."""
        return self.backend.int8_activations and not self.exact

    def _products(self):
        """The linears' mode for a pass: exact (dequantized) at any size in an exact model."""
        return exact_products() if self.exact else contextlib.nullcontext()

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self._capped(
            self.w.lm_head(_norm(h, self.w.norm, self.w.spec, self._packed(len(h))))
        )

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        return final_logits(logits, self.w.spec)

    def _embed(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.w.embed[tokens].float()
        scale = self.w.spec.embed_scale
        return (h if scale == 1.0 else h * scale).contiguous()

    @torch.inference_mode()
    def prefill(
        self, tokens: torch.Tensor, cache: KVCache, slot: int, start: int = 0, last_only=False
    ):
        """Logits [T, vocab] (`last_only`: [1, vocab], the one a reply samples from) for
        tokens [T] of one sequence that already has `start` tokens cached; their k/v join
        the cache. The chunk attends to the cached prefix (as stored, quantized or not) and
        to its own keys in full precision."""
        (logits,) = self.prefill_batch([Chunk(tokens, slot, start, not last_only)], cache)
        return logits

    @torch.inference_mode()
    def prefill_batch(self, chunks: list[Chunk], cache: KVCache) -> list[torch.Tensor]:
        """`prefill` of several sequences' chunks in one pass: the linears take every
        chunk's rows together, so the weights are read once for all of them (prompts that
        arrive together), while each chunk writes and attends over its own slot. Returns
        each chunk's logits: all its rows where `all_logits`, else its last."""
        return self._prefill(chunks, cache)[0]

    @torch.inference_mode()
    def step(self, chunks: list[Chunk], cache: KVCache, tokens: list[int], slots: list[int]):
        """A serving step: `prefill_batch` of the chunks, and `decode_ids` of the sequences
        in `slots` (their last tokens `tokens`): the chunks' logits and the decode rows'
        [B, vocab] (None without rows). Where the one-call CPU prefill runs, both in that
        one pass, so the step reads the weights once, not once for its prefill and again
        for its decoding; each row comes out the same bits as in a pass of its own."""
        if chunks and tokens:
            both = self._prefill(chunks, cache, tokens, slots)
            if both is not None:
                return both
        logits = self._prefill(chunks, cache)[0] if chunks else []
        return logits, self.decode_ids(tokens, cache, slots) if tokens else None

    def _prefill(self, chunks: list[Chunk], cache: KVCache, tokens=(), slots=()):
        """prefill_batch, with decode rows after the chunks' rows when given (then None
        where the one-call CPU prefill cannot run, nothing done)."""
        with self._products():
            return self._prefill_rows(chunks, cache, tokens, slots)

    def _prefill_rows(self, chunks: list[Chunk], cache: KVCache, tokens=(), slots=()):
        dev, nd = self.device, len(tokens)
        sizes = [c.tokens.shape[0] for c in chunks]
        ends = torch.tensor(sizes).cumsum(0).tolist()
        bounds = list(zip([0, *ends[:-1]], ends, strict=True))
        packed = self._packed(ends[-1] + nd)
        if nd and not packed:
            return None
        ids = torch.cat([*(c.tokens for c in chunks), torch.tensor(tokens, dtype=torch.int64)])
        positions = [torch.arange(c.start, c.start + t) for c, t in zip(chunks, sizes, strict=True)]
        if nd:  # each decode row at its sequence's length
            lengths = cache.lengths.tolist()
            at = [lengths[s] for s in slots]
            positions.append(torch.tensor(at, dtype=torch.int64))
        positions = torch.cat(positions).to(dev)
        h = self._embed(ids.to(dev))
        if self.nets:  # (before the one-call step, which runs in them)
            states_of(cache, self.nets)
        if nd:
            cache.prepare_rows(list(slots), at)
            if not self.backend.prefill(h, cache, chunks, positions, slots):
                return None
        elif not (packed and self.backend.prefill(h, cache, chunks, positions)):  # one C call
            h = self._prefill_per_op(h, chunks, bounds, cache, positions, packed)
        rows = []
        for c, (a, b) in zip(chunks, bounds, strict=True):
            cache.lengths[c.slot] = c.start + b - a
            rows.append(range(a, b) if c.all_logits else range(b - 1, b))
        if nd:
            cache.lengths[torch.tensor(slots)] += 1
        picked = [r for span in rows for r in span] + list(range(ends[-1], ends[-1] + nd))
        logits = self._logits(h[picked]).split([len(span) for span in rows] + [nd])
        return list(logits[: len(chunks)]), logits[-1] if nd else None

    def _prefill_per_op(self, h, chunks, bounds, cache: KVCache, positions, packed: bool):
        """prefill_batch's blocks op by op: off the CPU, or with dense or partly packed
        weights. A chunk with Chunk.prefix attends to its prompt's k/v in full precision
        (a chunked prompt over a quantized cache) and extends it."""
        s, dev, spec = self.w.shape, self.device, self.w.spec
        in_c = dev.type == "cpu"  # attention in one C call (served and exact alike)
        for i, layer in enumerate(self.w.layers):
            if layer.mixer is not None:  # each chunk from its slot's state, or from zeros
                pairs = zip(chunks, bounds, strict=True)
                spans = [(c.slot, a, b, c.start == 0) for c, (a, b) in pairs]
                h = self._recurrent(i, layer, h, spans, cache, packed)
                continue
            j = self.kv[i]  # its place in the cache, and in Chunk.prefix
            q, k, v, gate = _qkv(layer, h, self.w, self.ropes[i], positions, packed)
            att = torch.empty(h.shape[0], s.heads * s.head_dim, device=dev)
            parts = []
            for c, (a, b) in zip(chunks, bounds, strict=True):
                kc, vc = k[a:b].transpose(0, 1), v[a:b].transpose(0, 1)  # [kv_heads, T, hd]
                if c.start and c.prefix is not None:
                    (pk, pv) = c.prefix[j]
                    keys, values = torch.cat((pk, kc), 1), torch.cat((pv, vc), 1)
                elif c.start:
                    pk, pv = cache.read(j, torch.tensor([c.slot], device=dev), c.start)
                    keys, values = torch.cat((pk[0], kc), 1), torch.cat((pv[0], vc), 1)
                else:
                    keys, values = kc, vc
                if c.prefix is not None:  # what the next chunk attends to
                    c.prefix[j : j + 1] = [(keys, values)]
                cache.write(j, c.slot, c.start, kc, vc)
                if in_c:
                    parts.append((a, b, keys, values, c.start))
                    continue
                out = _prefill_attention(
                    q[a:b].transpose(0, 1), keys, values, c.start, spec.attn_scale,
                    spec.windows[i], spec.attn_softcap, layer.sinks,
                )  # fmt: skip
                att[a:b] = out.transpose(0, 1).reshape(b - a, s.heads * s.head_dim)
            if parts:
                prefill_attention(
                    q, att, parts, spec.attn_scale, spec.windows[i] or 0, spec.attn_softcap,
                    layer.sinks,
                )  # fmt: skip
            h = _block_end(layer, h, att, self.w, packed, gate)
        return h

    def _recurrent(self, i: int, layer: Layer, h, spans, cache: KVCache, packed: bool):
        """Block i, a recurrent layer's, on h: `spans` as its mixer's `mix` takes them."""
        x = _norm(h, layer.attn_norm, self.w.spec, packed)
        att = layer.mixer.mix(x, spans, states_of(cache, self.nets), i)
        return _block_end(layer, h, att, self.w, packed)

    @torch.inference_mode()
    def verify(self, tokens: torch.Tensor, cache: KVCache, slot: int) -> torch.Tensor:
        """Logits [T, vocab] for tokens [T] appended to one cached sequence, each row as a
        decode step at its position computes it, the weights read once for all T rows:
        speculative decoding's check. The rows go through decode's own path as a batch of
        one slot at successive positions: every backend writes a step's k/v before any row
        attends, and each row reads only up to its position. T must fit
        `cache.rollback_room(slot)`; the caller rolls `cache.lengths` back past the tokens
        it refuses."""
        start, t = int(cache.lengths[slot]), tokens.shape[0]
        if t > cache.rollback_room(slot):
            raise ValueError(f"{t} rows past position {start} could not be rolled back")
        positions = torch.arange(start, start + t, device=self.device)
        cache.prepare(slot, start, start + t)
        logits = self._decode_rows(tokens, cache, torch.full((t,), slot), positions)
        cache.lengths[slot] = start + t
        return logits

    @torch.inference_mode()
    def decode(self, tokens: torch.Tensor, cache: KVCache, slots: torch.Tensor) -> torch.Tensor:
        """One step: logits [B, vocab] for the next token of each sequence in `slots`, whose
        last tokens are `tokens` [B]."""
        slots = slots.to(self.device)
        positions = cache.lengths[slots]
        cache.prepare_rows(slots.tolist(), positions.tolist())
        logits = self._decode_rows(tokens, cache, slots, positions)
        cache.lengths[slots] += 1
        return logits

    def decode_ids(self, tokens: list[int], cache: KVCache, slots: list[int]) -> torch.Tensor:
        """`decode` from lists of token ids and slots: on the CPU with every linear packed,
        the step is one C call from embedding to logits."""
        if self._packed(len(tokens)):
            if self.nets:
                states_of(cache, self.nets)
            lengths = cache.lengths.tolist()
            cache.prepare_rows(slots, [lengths[s] for s in slots])
            logits = self.backend.decode_ids(tokens, slots, cache)
            if logits is not None:
                return self._capped(logits)
        return self.decode(torch.tensor(tokens), cache, torch.tensor(slots))

    def _decode_rows(self, tokens, cache: KVCache, slots, positions) -> torch.Tensor:
        """Row b: token b of the sequence in slot b at position b (its k/v stored there)."""
        with self._products():
            return self._rows(tokens, cache, slots, positions)

    def _rows(self, tokens, cache: KVCache, slots, positions) -> torch.Tensor:
        s, b = self.w.shape, tokens.shape[0]
        tokens, slots = tokens.to(self.device), slots.to(self.device)
        packed = self._packed(b)
        h = self._embed(tokens)
        spec = self.w.spec
        if self.nets:
            states_of(cache, self.nets)
        done = self.backend.decode(h, cache, slots, positions) if packed else None
        if done is not None and done is not h:  # the one call ran the head too
            return self._capped(done)
        if done is None:
            for i, layer in enumerate(self.w.layers):
                if layer.mixer is not None:  # row r continues its slot's state
                    spans = [(slot, r, r + 1, False) for r, slot in enumerate(slots.tolist())]
                    h = self._recurrent(i, layer, h, spans, cache, packed)
                    continue
                q, k, v, gate = _qkv(layer, h, self.w, self.ropes[i], positions, packed)
                att = self.backend.attend(
                    q, k, v, cache, self.kv[i], slots, positions, spec.attn_scale, spec.windows[i],
                    spec.attn_softcap, layer.sinks,
                )  # fmt: skip
                att = att.reshape(b, s.heads * s.head_dim)
                h = _block_end(layer, h, att, self.w, packed, gate)
        return self._logits(h)
