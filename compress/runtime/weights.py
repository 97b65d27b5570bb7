"""Load an artifact (quantized, pruned or plain) into the runtime's layout.

Straight from safetensors: no transformers model is built. Quantized linears keep their
integer codes, repacked once into the CPU kernels' layout; dense tensors are computed in
fp32 whatever their storage dtype (16-bit matmuls on CPU are slow where the processor
lacks bf16 instructions, and fp32 keeps evaluation equal to transformers' fp32 one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace

import torch

from compress.artifact.reader import quantized_layers
from compress.errors import LlmpressError
from compress.kernels import hugepages
from compress.kernels.cpu import ACTIVATIONS, PackedLinear, quantize_input
from compress.model import adapters
from compress.model.adapters import ModelShape, adapter_for
from compress.model.loading import Checkpoint, read_tensors
from compress.model.rope import KINDS as ROPE_KINDS
from compress.model.spec import BlockSpec
from compress.runtime.deltanet import DeltaNet
from compress.runtime.linears import (
    DenseLinear,
    QuantLinear,
    TritonQuantLinear,
    fold_input_shift,
    fuse,
)
from compress.runtime.mamba import Mamba1, Mamba2
from compress.runtime.short_conv import ShortConv


def _subset(allowed):
    return lambda value: None if value in allowed else f"{value!r} (runs {', '.join(allowed)})"


def _any(_value):
    return None


def _rope(ropes) -> str | None:
    kinds = {r.kind for r in ropes}
    if len({r.rotary_dim for r in ropes}) > 1:
        return "layers rotating different widths"
    return None if kinds <= set(ROPE_KINDS) else f"{sorted(kinds - set(ROPE_KINDS))}"


# What the runtime (torch ops, the C kernels) implements, for every field of BlockSpec:
# a check returning None, or what it cannot run. tests/test_families.py checks that every
# field has one, so a new field cannot go unread.
RUNS = {
    "norm": _subset(("rms", "rms1p", "layer", "layer1p")),
    "eps": _any,
    "sandwich": _any,
    "pre_norm": _any,  # without: the branch reads the residual stream as it is
    "qk_norm": _subset(("none", "head", "full", "each_head")),
    "activation": _subset(tuple(ACTIVATIONS)),
    "biases": _any,  # any role may carry one
    "fused_checkpoint": _any,
    "rope": _rope,
    "attn_scale": _any,
    "attn_softcap": _any,  # torch, C and Triton attention cap their scores
    "embed_scale": _any,
    "residual_scale": _any,  # torch adds scaled branches; C's QLayer.residual
    "logit_scale": _any,
    "logit_softcap": _any,
    "windows": _any,
    "tied": _any,
    # a layer's MLP, dense or MoE (Layer.moe), with any scores, choice bias, scale and shared
    # expert (MoeWeights), chosen within expert groups where there are groups
    "mlp": _any,
    "qkv_clip": lambda c: None if c is None else f"{c} (q, k and v clamped)",
    "qk_norm_after_rope": _any,  # the torch path and the one-call decoder both order them
    "parallel": _any,  # Layer.mlp_norm is then the attention's norm, read before attention
    "gated_mlp": _any,  # without a gate, Layer.gate_up holds up alone
    # folded at load into the biases of the linears each norm feeds (fold_input_shift)
    "norm_bias": _any,
    # one cached head of the latent, shared by every query head (Latent)
    "latent_attention": _any,
    "attn_gate": _any,  # a fourth part of Layer.qkv (Layer.gated), applied before o
    "attn_sinks": _any,  # Layer.sinks, read by torch's, C's and Triton's attention
    "linear_layers": _any,  # Layer.mixer: runtime/deltanet.py, runtime/mamba.py
}


def check_runnable(spec: BlockSpec, family: str) -> None:
    """Refuse, in one line, a model whose blocks compute what the runtime does not."""
    for f in fields(spec):
        problem = RUNS[f.name](getattr(spec, f.name))
        if problem is not None:
            raise LlmpressError(
                f"{family}: {f.name} {problem} is not supported by the runtime yet, so bench "
                "and serve cannot run it: evaluate it with eval --engine transformers"
            )


@dataclass
class MoeWeights:
    """A Mixture-of-Experts MLP: the router in fp32 and each expert's fused gate/up and
    down, run only for the tokens routed to it."""

    router: DenseLinear
    experts: list[tuple[object, object]]  # (gate_up, down) per expert
    top_k: int
    renormalize: bool
    reads: torch.Tensor = None  # int64 [E]: steps that read each expert (both paths add)
    shared: tuple[object, object] | None = None  # a shared expert's (gate_up, down)
    shared_gate: DenseLinear | None = None  # [1, hidden] fp32: sigmoid of it gates `shared`
    sigmoid: bool = False  # the router's scores: sigmoids, not the softmax (glm4_moe)
    logit_choice: bool = False  # sigmoids, chosen by logit plus choice_bias (Kolibri's)
    choice_bias: torch.Tensor | None = None  # fp32 [E]: added to the scores to choose
    scale: float = 1.0  # the chosen weights times this
    groups: tuple[int, int] = (1, 1)  # chosen within the best groups[1] of groups[0]
    group_score: str = "top2"  # a group's score: its best two summed, or its "max" (V2's)
    sparsemixer: float | None = None  # PhiMoE's routing, at this threshold (route_scores)
    shared_scale: float = 1.0  # the shared expert's output times this (cohere2_moe's 0.5)

    def __post_init__(self):
        if self.reads is None:
            self.reads = torch.zeros(len(self.experts), dtype=torch.int64)

    @property
    def bytes_read(self) -> int:
        """Expert weight bytes the runtime has read so far (for MBU)."""
        sizes = [g.nbytes + d.nbytes for g, d in self.experts]
        return sum(n * size for n, size in zip(self.reads.tolist(), sizes, strict=True))

    def linears(self):
        yield self.router
        for gate_up, down in self.experts:
            yield from (gate_up, down)
        yield from self.linears_shared()

    @property
    def routed_bytes(self) -> int:
        """Bytes of top_k experts (each as large as the average expert): one token's."""
        experts = sum(g.nbytes + d.nbytes for g, d in self.experts)
        return experts * self.top_k // len(self.experts)

    @property
    def active_bytes(self) -> int:
        """Bytes one token reads: the router, top_k experts and a shared expert."""
        shared = sum(x.nbytes for x in self.linears_shared())
        return self.router.nbytes + self.routed_bytes + shared

    def linears_shared(self):
        """The shared expert's gate and linears (none without one)."""
        if self.shared is None:
            return ()
        return self.shared if self.shared_gate is None else (self.shared_gate, *self.shared)

    @property
    def active_params(self) -> int:
        """Weights one token multiplies by: the router, top_k experts, a shared expert."""
        experts = sum(x.out_features * x.in_features for g, d in self.experts for x in (g, d))
        always = (self.router, *self.linears_shared())
        n = sum(x.out_features * x.in_features for x in always)
        return n + experts * self.top_k // len(self.experts)


@dataclass
class Latent:
    """Multi-head latent attention (DeepSeek's MLA) as the runtime computes it, in the
    absorbed form: the cache holds one head per token, [rotated key part (rope), normed
    latent (kv_rank)], which is the key and the value alike (vLLM and llama.cpp cache the
    same), so every cache kind, the C and Triton attention, paged blocks and prefix sharing
    serve it as one KV head shared by all query heads. kv_b's rows split by head: each
    head's query takes its key part (q_nope · W_UK, into the latent's width) and its
    attention output over the latent goes out through its value part (W_UV). Layer.qkv
    fuses what reads the attention norm (q_a_proj or q_proj, and kv_a_proj_with_mqa);
    each head's q is [rotated part, unrotated part] (rows reordered at load: rope at the
    start, as the runtime rotates it, in halves).

    The served path (int8 activations) runs per-head linears: `uv`, kv_b's value rows of
    a head as stored, and `uk`, a head's key rows transposed ([kv_rank, nope]), which no
    stored layout gives: quantized weights are re-coded in int8 per 32 inputs, a small
    rounding of the stored weights on the path whose activations are int8 already;
    16-bit ones are transposed as they are. The exact path (fp32 activations, and the GPU)
    multiplies by kv_b's own weights in fp32."""

    q_width: int  # q's part of qkv: q_a's rank, or every head's q
    kv_rank: int
    nope: int
    rope: int
    v: int
    heads: int
    kv_norm: torch.Tensor
    kv_b: object  # each head's unrotated key and its v from the normed latent: [H·(nope+v), rank]
    uk: list | None = None  # per head [kv_rank, nope]: its key rows of kv_b, transposed
    uv: list | None = None  # per head [v, kv_rank]: its value rows of kv_b
    q_norm: torch.Tensor | None = None  # with q_b: q through the low-rank pair
    q_b: object = None
    eps: float = 1e-6  # the latent's and q_a's norms'
    _weight: torch.Tensor | None = None  # kv_b in fp32 [H, nope+v, rank], kept off the CPU

    @property
    def head_dim(self) -> int:
        """The cache's width: the rotated key part, then the latent."""
        return self.rope + self.kv_rank

    def linears(self):
        """What a served step reads (kv_b itself only where there are no per-head ones)."""
        heads = (*self.uk, *self.uv) if self.uk is not None else (self.kv_b,)
        return heads if self.q_b is None else (self.q_b, *heads)

    def norms(self):
        return (self.kv_norm,) if self.q_norm is None else (self.q_norm, self.kv_norm)

    def weight(self) -> torch.Tensor:
        """kv_b's weights in fp32 [heads, nope + v, kv_rank], the exact path's: made at
        each call on the CPU (a copy kept would be 4 bytes a weight of every layer), once
        elsewhere."""
        if self._weight is not None:
            return self._weight
        w = dense_weight(self.kv_b).view(self.heads, self.nope + self.v, self.kv_rank)
        if w.device.type != "cpu":
            self._weight = w
        return w

    def absorb_q(self, q_nope: torch.Tensor, packed: bool) -> torch.Tensor:
        """Each head's unrotated query [T, heads, nope] through its key rows: [T, heads,
        kv_rank], the query of the latent."""
        if packed and self.uk is not None:
            parts = [self.uk[h](quantize_input(q_nope[:, h])) for h in range(self.heads)]
            return torch.stack(parts, 1)
        w = self.weight()[:, : self.nope]
        return torch.einsum("thd,hdr->thr", q_nope.float(), w)

    def values(self, att: torch.Tensor, packed: bool) -> torch.Tensor:
        """Attention's output [T, heads * head_dim] as o_proj reads it [T, heads * v]: each
        head's weighted latent through its value rows."""
        t = att.shape[0]
        lat = att.view(t, self.heads, self.head_dim)[..., self.rope :]
        if packed and self.uv is not None:
            parts = [self.uv[h](quantize_input(lat[:, h])) for h in range(self.heads)]
            return torch.cat(parts, -1)
        w = self.weight()[:, self.nope :]
        return torch.einsum("thr,hvr->thv", lat, w).reshape(t, -1)


def grouped_rows(dn) -> tuple[torch.Tensor, torch.Tensor]:
    """Qwen3-Next's in_proj_qkvz and in_proj_ba rows (a GatedDeltaNet `grouped`: each key
    head's group holds its q, k, then its value heads' v and z; its value heads' b, then a)
    in the order Qwen3.5 stores them apart and the runtime reads: every q, every k, every
    v, every z; every b, every a."""
    r, kd, vd, heads = dn.v_heads // dn.k_heads, dn.k_dim, dn.v_dim, torch.arange(dn.k_heads)

    def part(width: int, lo: int, n: int) -> torch.Tensor:
        return (heads[:, None] * width + lo + torch.arange(n)).reshape(-1)

    group = 2 * kd + 2 * r * vd
    qkvz = [part(group, 0, kd), part(group, kd, kd), part(group, 2 * kd, r * vd)]
    qkvz.append(part(group, 2 * kd + r * vd, r * vd))
    return torch.cat(qkvz), torch.cat([part(2 * r, 0, r), part(2 * r, r, r)])


def dense_weight(lin) -> torch.Tensor:
    """A linear's weight [out, in] in fp32, as its exact product computes with it."""
    if isinstance(lin, DenseLinear):
        return lin.weight.float()
    if isinstance(lin, QuantLinear):
        w = lin.packed.dense().clone()
        if lin.outlier_index is not None:  # those columns run in 16-bit beside the codes
            w[:, lin.outlier_index] = lin.outlier_weight
        return w
    eye = torch.eye(lin.in_features, device=lin.weight.device)
    w = lin(eye, True)
    return (w if lin.bias is None else w - lin.bias).t().contiguous()


def head_linears(kv_b, heads: int, nope: int, v: int, rank: int, lin) -> tuple[list, list]:
    """The served per-head linears of kv_b (Latent.uk, Latent.uv): `lin(rows)` loads
    kv_b's rows as stored (the value rows); the key rows transposed, re-coded in int8 per
    32 inputs where kv_b is quantized, transposed in their dtype where it is dense."""
    width = nope + v
    uv = [lin(torch.arange(h * width + nope, (h + 1) * width)) for h in range(heads)]
    if isinstance(kv_b, DenseLinear):
        w = kv_b.weight.view(heads, width, rank)[:, :nope]
        return [DenseLinear(w[h].t().contiguous()) for h in range(heads)], uv
    w = dense_weight(kv_b).view(heads, width, rank)[:, :nope]
    return [QuantLinear(int8_packed(w[h].t())) for h in range(heads)], uv


def int8_packed(w: torch.Tensor) -> PackedLinear:
    """fp32 w [out, in] as symmetric int8 codes per 32 inputs."""
    n, k = w.shape
    kp = -(-k // 32) * 32
    groups = torch.nn.functional.pad(w.float(), (0, kp - k)).reshape(n, kp // 32, 32)
    scale = groups.abs().amax(-1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(groups / scale[..., None]).clamp(-127, 127).to(torch.int8).reshape(n, kp)
    packed = PackedLinear(q[:, :k], scale, None, 32, 8)
    # activations in one int8 term, as the 4-bit linears take them: the heads then run in
    # one grouped C pass (with two terms, one call each: 2-6% of a decode step at
    # GLM-4.7-Flash's widths and 128 tokens)
    packed.one_term = True
    return packed


def latent_rows(heads: int, nope: int, rope: int, interleaved: bool) -> torch.Tensor:
    """The row order of MLA's q projection that puts each head's rotated part first, in
    the halves layout the runtime rotates (from pairs where `interleaved`)."""
    one = torch.cat([nope + rope_halves(rope, interleaved), torch.arange(nope)])
    return (torch.arange(heads)[:, None] * (nope + rope) + one).reshape(-1)


def rope_halves(rope: int, interleaved: bool) -> torch.Tensor:
    """The order of `rope` rotated dimensions in halves: (0, 2, 4, …, 1, 3, …) from pairs."""
    r = torch.arange(rope)
    return torch.cat([r[0::2], r[1::2]]) if interleaved else r


@dataclass
class Layer:
    """One block; q/k/v and gate/up are fused into one linear each (one kernel call).
    Norm weights are the effective multipliers (gemma's 1 + w added at load)."""

    attn_norm: torch.Tensor | None  # None: the branch reads the residual unnormed (olmo2)
    mlp_norm: torch.Tensor | None
    qkv: object
    o: object
    gate_up: object
    down: object
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None
    moe: MoeWeights | None = None  # in place of gate_up/down
    act_params: torch.Tensor | None = None  # fp32 [4]: xIELU's alpha_p, alpha_n, beta, eps
    latent: Latent | None = None  # MLA: qkv holds what reads the attention norm
    gated: bool = False  # qkv's last heads * head_dim columns gate attention's output
    sinks: torch.Tensor | None = None  # fp32 [heads]: each head's attention sink
    # a recurrent mixer in place of attention: a Gated DeltaNet (qkv its fused in_proj_qkv
    # and in_proj_z) or a Mamba-2 (qkv its in_proj); o its out_proj
    mixer: DeltaNet | Mamba2 | None = None

    def attn_linears(self):
        extra = self.mixer.extra_linears() if self.mixer else ()
        return (self.qkv, *(self.latent.linears() if self.latent else ()), *extra, self.o)

    def linears(self):
        if self.moe is not None:
            return (*self.attn_linears(), *self.moe.linears())
        return (*self.attn_linears(), self.gate_up, self.down)

    @property
    def step_bytes(self) -> int:
        """Weight bytes a decode step of one token reads in this block: its linears, or for
        a Mixture-of-Experts block only the router and the active experts."""
        if self.moe is None:
            dense = sum(lin.nbytes for lin in self.linears())
        else:
            dense = sum(lin.nbytes for lin in self.attn_linears()) + self.moe.active_bytes
        return dense + sum(t.numel() * t.element_size() for t in self.norms())

    @property
    def active_params(self) -> int:
        """Weights one token multiplies by (of experts: the router and top_k of them)."""
        lins = [*self.attn_linears()] + ([self.gate_up, self.down] if self.moe is None else [])
        n = sum(lin.out_features * lin.in_features for lin in lins)
        return n + (0 if self.moe is None else self.moe.active_params)

    def norms(self):
        every = (self.attn_norm, self.mlp_norm, self.q_norm, self.k_norm)
        every += (self.post_attn_norm, self.post_mlp_norm)
        every += self.latent.norms() if self.latent else ()
        every += self.mixer.held() if self.mixer else ()
        return tuple(n for n in every if n is not None)


@dataclass
class ModelWeights:
    shape: ModelShape
    spec: BlockSpec
    embed: torch.Tensor
    layers: list[Layer]
    norm: torch.Tensor
    lm_head: object
    dense_fallbacks: list[str] = field(default_factory=list)
    kernels: str = "c"  # the backend these linears are laid out for: "c" or "triton"

    def linears(self):
        for layer in self.layers:
            yield from layer.linears()
        yield self.lm_head

    @property
    def step_bytes(self) -> int:
        """Weight bytes one decode step of one sequence reads: every linear as stored (of a
        Mixture-of-Experts block, the router and the top_k experts only), norms, and the one
        embedding row per token (negligible) — the tied lm_head counts once, as a linear."""
        final = self.norm.numel() * self.norm.element_size()
        return sum(layer.step_bytes for layer in self.layers) + self.lm_head.nbytes + final

    @property
    def state_bytes(self) -> int:
        """A sequence's recurrent states, every layer's (0 without recurrent layers)."""
        return sum(x.mixer.state_bytes for x in self.layers if x.mixer is not None)

    @property
    def active_params(self) -> int:
        head = self.lm_head.out_features * self.lm_head.in_features
        return sum(layer.active_params for layer in self.layers) + head

    def expert_bytes_read(self) -> int:
        """Expert weight bytes read so far; with `step_bytes` less its expert estimate, the
        bytes decode steps actually read (MBU counts what routing chose, not a guess)."""
        return sum(layer.moe.bytes_read for layer in self.layers if layer.moe is not None)

    @property
    def expert_step_bytes(self) -> int:
        """The part of step_bytes that is experts (the batch-1 estimate)."""
        moe = [layer.moe for layer in self.layers if layer.moe is not None]
        return sum(m.routed_bytes for m in moe)


class _BlockTensors(Mapping):
    """The checkpoint's tensors, read when asked: one block's at a time while that block is
    built (`hold`), any other afresh on each access. Loading then holds one block's stored
    tensors beside the packed weights built so far, not a second copy of the model (a
    7B-shaped w4 artifact: 4.5 GB more)."""

    def __init__(self, ckpt: Checkpoint):
        self.ckpt, self.names, self.held = ckpt, list(ckpt.tensors), {}
        self._known = set(self.names)

    def hold(self, prefix: str) -> None:
        names = [n for n in self.names if n.startswith(prefix + ".")]
        self.held = read_tensors(self.ckpt, names)

    def __getitem__(self, name: str) -> torch.Tensor:
        if name in self.held:
            return self.held[name]
        if name not in self._known:
            raise KeyError(name)
        return read_tensors(self.ckpt, [name])[name]

    def __contains__(self, name) -> bool:
        return name in self._known

    def __iter__(self):
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _dense(t: torch.Tensor, device) -> torch.Tensor:
    """A dense weight as the runtime keeps it: in its stored width on CPU, where the
    kernels read 16-bit weights directly (a 128k x 2048 bf16 head upcast would be 1 GB
    more read every step); in fp32 on other devices."""
    if torch.device(device).type == "cpu" and t.dtype in (torch.bfloat16, torch.float16):
        return t.to(device).contiguous()
    return t.to(device, torch.float32)


def _to_hugepages(weights: ModelWeights) -> None:
    """Every linear's streamed weights into huge pages (compress/kernels/hugepages.py),
    once they are final (a fused q/k/v's parts would leave copies behind); a tied
    embedding moves with the head it is."""
    tied = isinstance(weights.lm_head, DenseLinear) and weights.lm_head.weight is weights.embed
    for linear in weights.linears():
        packed = getattr(linear, "packed", None)
        if isinstance(packed, PackedLinear):
            packed.to_hugepages()
        elif isinstance(linear, DenseLinear):
            linear.weight = hugepages.place(linear.weight)
    if tied:
        weights.embed = weights.lm_head.weight


def interleaved_rows(heads: int, head_dim: int, rotary: int) -> torch.Tensor:
    """The row order that turns a projection whose rope rotates pairs (2i, 2i+1) (glm4)
    into the halves layout (i, i + rotary/2) the runtime rotates, head by head (the
    unrotated rest keeps its place). q and k reordered alike leave q·k as it was."""
    one = torch.cat(
        [torch.arange(0, rotary, 2), torch.arange(1, rotary, 2), torch.arange(rotary, head_dim)]
    )
    return (torch.arange(heads)[:, None] * head_dim + one).reshape(-1)


def gate_in_q_rows(heads: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows of a q projection holding each head's query then its output gate
    ([q_h; g_h], MiniCPM5-MoE's): every head's query rows, and every head's gate rows."""
    at = torch.arange(heads)[:, None] * 2 * head_dim + torch.arange(head_dim)
    return at.reshape(-1), (at + head_dim).reshape(-1)


def rows_by_part(heads: int, head_dim: int) -> torch.Tensor:
    """The row order that turns a q/k/v fused head by head (gpt_neox's: head h's q, k, v
    rows in turn) into all of q, then k, then v, as the runtime splits it."""
    one = torch.arange(head_dim)
    at = torch.arange(heads)[:, None] * 3 * head_dim + one
    return torch.cat([at + part * head_dim for part in range(3)]).reshape(-1)


def _rows(t: torch.Tensor | None, rows: torch.Tensor | None) -> torch.Tensor | None:
    return t if t is None or rows is None else t.index_select(0, rows.to(t.device))


def _linear(prefix, tensors, codec, layers, fallbacks, device="cpu", kernels="c", rows=None):
    """The runtime's linear for `prefix`; `rows`: its output rows in this order."""
    bias = tensors.get(f"{prefix}.bias")
    bias = None if bias is None else _rows(bias.float(), rows)
    if prefix not in layers:
        return DenseLinear(_dense(_rows(tensors[f"{prefix}.weight"], rows), device), bias)
    if kernels == "triton":  # the stored layout itself, where the GPU kernels read it
        stored = codec.device_tensors(prefix, tensors, layers[prefix])
        if stored is not None:  # packed along the input: a row is an output's
            weight, scale, zp, group, bits, in_features = stored
            on = (_rows(weight, rows), _rows(scale, rows), _rows(zp, rows), bias)
            weight, scale, zp, bias_d = (None if t is None else t.to(device) for t in on)
            return TritonQuantLinear(weight, scale, zp, group, bits, in_features, bias_d)
    s = codec.decode(prefix, tensors, layers[prefix])
    if rows is not None:
        s = replace(
            s, q=_rows(s.q, rows), scale=_rows(s.scale, rows),
            zero_point=_rows(s.zero_point, rows), outlier_weight=_rows(s.outlier_weight, rows),
        )  # fmt: skip
    q, index, group, bits = s.q, s.outlier_index, s.group_size, s.scheme.bits
    if index is not None:  # those columns run in 16-bit: their int8 codes must add nothing
        q = q.clone()
        zp = s.zero_point
        q[:, index.long()] = 0 if zp is None else zp.repeat_interleave(group, 1)[:, index.long()]
    try:
        if bits not in (4, 8):
            raise ValueError(f"{bits}-bit")
        if kernels != "c":
            raise ValueError(f"no {kernels} kernel for this layout")
        packed = PackedLinear(q, s.scale, s.zero_point, group, bits)
    except ValueError as e:
        fallbacks.append(f"{prefix} ({e})")
        return DenseLinear(s.dequantize().to(device), None if bias is None else bias.to(device))
    return QuantLinear(packed, bias, index, s.outlier_weight)


def _fold_norm_biases(layer: Layer, tensors, prefix: str, adapter, spec: BlockSpec, device):
    """A LayerNorm's bias added to what it feeds (spec.norm_bias): the linears reading the
    norm compute W·(n + b) as W·n plus W·b in their biases, so every path (torch, C,
    Triton) runs the norm without one. Experts' (PhiMoE's): the router's logits and each
    expert's gate/up take theirs the same way."""
    moe = layer.moe
    gated = moe is not None and moe.shared_gate is not None
    if gated or layer.post_attn_norm is not None or layer.post_mlp_norm is not None:
        raise LlmpressError(
            "norms with a bias beside a gated shared expert or output norms are not supported "
            "by the runtime yet: evaluate this model with --engine transformers"
        )
    attn = tensors[f"{prefix}.{adapter.attn_norm}.bias"].float().to(device)
    fold_input_shift(layer.qkv, attn)
    mlp = attn if adapter.one_norm else tensors[f"{prefix}.{adapter.mlp_norm}.bias"].float()
    mlp = mlp.to(device)
    if moe is None:
        fold_input_shift(layer.gate_up, mlp)
        return
    for lin in (moe.router, *(gate_up for gate_up, _ in moe.experts)):
        fold_input_shift(lin, mlp)
    if moe.shared is not None:
        fold_input_shift(moe.shared[0], mlp)


XIELU_DEFAULTS = {"beta": 0.5, "eps": -1e-6}  # transformers' XIELUActivation's buffers


def _sinks(tensors, name: str, device) -> torch.Tensor:
    """A layer's attention sinks as every kernel reads them: fp32 [heads]."""
    return tensors[name].to(device, torch.float32).reshape(-1).contiguous()


def _act_params(tensors, module: str, spec: BlockSpec, device) -> torch.Tensor | None:
    """xIELU's effective parameters (alpha_p, alpha_n, beta, eps) from a layer's stored
    ones (apertus: softplus of the alphas, alpha_n offset by beta); None for the other
    activations, which have none."""
    if spec.activation != "xielu":
        return None

    def value(name):
        key = f"{module}.{name}"
        if key in tensors:
            return float(tensors[key].float().reshape(-1)[0])
        if name in XIELU_DEFAULTS:
            return XIELU_DEFAULTS[name]
        raise LlmpressError(f"{key} is missing: the checkpoint is incomplete; re-download it")

    soft = torch.nn.functional.softplus
    beta = value("beta")
    alpha_p = float(soft(torch.tensor(value("alpha_p"))))
    alpha_n = beta + float(soft(torch.tensor(value("alpha_n"))))
    return torch.tensor([alpha_p, alpha_n, beta, value("eps")], device=device)


def load_weights(
    ckpt: Checkpoint, device: str | None = None, kernels: str | None = None
) -> ModelWeights:
    """`device`: "cpu" or "cuda" (default: cuda when available). `kernels`: the backend,
    "c" (packed CPU kernels) or "triton"; default: triton on cuda, c on cpu (triton on cpu
    runs under TRITON_INTERPRET=1, for tests). The runtime's model, cache and engine follow
    the embedding's device."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kernels = kernels or ("triton" if torch.device(device).type == "cuda" else "c")
    if kernels not in ("c", "triton") or (kernels == "c" and torch.device(device).type != "cpu"):
        raise LlmpressError(f"kernels {kernels!r} on {device}: use c on cpu, triton on cuda")
    adapter = adapter_for(ckpt.config)
    shape = adapter.shape(ckpt.config)
    spec = adapter.spec(ckpt.config)
    check_runnable(spec, adapter.families[0])
    mla = adapter.latent
    if mla is not None:  # one cached head a token, every query head's (Latent)
        shape = replace(shape, kv_heads=1, head_dim=mla.rope + mla.kv_rank)
    tensors = _BlockTensors(ckpt)
    codec, layers = quantized_layers(ckpt.config, tensors)
    fallbacks: list[str] = []
    offset = spec.norm_offset

    def norm(name, rows=None):
        """A norm's effective weight, flat (cohere's [heads, head_dim] q/k norms too);
        `rows`: its values in this order (a q/k norm beside reordered q/k rows)."""
        if name is None:
            return None
        w = (tensors[f"{name}.weight"].float() + offset).reshape(-1)
        return _rows(w, rows).to(device).contiguous()

    blocks = []
    for i in range(shape.layers):
        p = adapter.block_prefix(i)
        tensors.hold(p)

        def lin(name, p=p, rows=None):
            return _linear(f"{p}.{name}", tensors, codec, layers, fallbacks, device, kernels, rows)

        def opt(name, p=p, rows=None):
            return norm(f"{p}.{name}", rows) if name else None

        def qk_norm(name, i=i, p=p):
            """Reordered as q and k rows are where rope rotates pairs (cohere's); one module
            per head (StableLM 2 12B's) stacked as one weight row per head."""
            if name and adapter.qk_norm_modules:
                heads = shape.heads if name == adapter.q_norm else shape.kv_heads
                return torch.cat([opt(f"{name}.{h}") for h in range(heads)])
            if not name or not adapter.rope_interleaved:
                return opt(name)
            width = tensors[f"{p}.{name}.weight"].numel()
            d = shape.head_dim
            return opt(name, rows=interleaved_rows(width // d, d, spec.rope[i].rotary_dim))

        moe = gate_up = down = None
        if spec.mlp is not None and i not in spec.mlp.dense_layers:
            experts = [
                (
                    fuse(
                        [lin(adapter.expert_linear(e, "gate")), lin(adapter.expert_linear(e, "up"))]
                    ),
                    lin(adapter.expert_linear(e, "down")),
                )
                for e in range(spec.mlp.experts)
            ]
            router = DenseLinear(tensors[f"{p}.{adapter.router}.weight"].to(device, torch.float32))
            moe = MoeWeights(router, experts, spec.mlp.top_k, spec.mlp.renormalize)
            moe.sigmoid, moe.scale = spec.mlp.scoring == "sigmoid", spec.mlp.scale
            moe.logit_choice = spec.mlp.scoring == "sigmoid_logits"
            moe.groups, moe.group_score = spec.mlp.groups, spec.mlp.group_score
            if spec.mlp.scoring == "sparsemixer":
                moe.sparsemixer = spec.mlp.jitter
            if adapter.choice_bias:
                bias = tensors[f"{p}.{adapter.choice_bias}"].reshape(-1)
                moe.choice_bias = bias.to(device, torch.float32).contiguous()
            if spec.mlp.shared:
                gate, up, down = (lin(n) for n in adapter.shared_linears)
                moe.shared = (fuse([gate, up]), down)
                moe.shared_scale = spec.mlp.shared_scale
                if adapter.shared_gate:
                    weight = tensors[f"{p}.{adapter.shared_gate}.weight"]
                    moe.shared_gate = DenseLinear(weight.to(device, torch.float32))
        elif adapter.gate_up:
            gate_up, down = lin(adapter.gate_up), lin(adapter.down)
        elif adapter.gate is None:  # an MLP without a gate: "gate_up" is up alone
            gate_up, down = lin(adapter.up), lin(adapter.down)
        else:
            gate_up, down = fuse([lin(adapter.gate), lin(adapter.up)]), lin(adapter.down)
        latent = mixer = None
        block = adapter.layer(i)  # (a DeltaNet layer's names its own o and no q/k norms)
        dn = block.mixer
        if isinstance(dn, adapters.Mamba1):  # qkv is its in_proj
            qkv = [lin(dn.in_proj)]
            conv = tensors[f"{p}.{dn.conv1d}.weight"].float().flatten(1).to(device)

            def f32(name: str, p=p) -> torch.Tensor:
                return tensors[f"{p}.{name}"].float().to(device).contiguous()

            mixer = Mamba1(
                dn.width, dn.state, dn.rank, in_proj=qkv[0], x_proj=f32(f"{dn.x_proj}.weight"),
                dt_proj=f32(f"{dn.dt_proj}.weight"), dt_bias=f32(f"{dn.dt_proj}.bias"),
                conv=conv, conv_bias=(
                    f32(f"{dn.conv1d}.bias") if dn.conv_bias else conv.new_zeros(len(conv))
                ),
                decay=-f32(dn.a_log).exp(), d=f32(dn.d),
                norms=tuple(f32(f"{n}.weight") for n in dn.norms), eps=spec.eps,
            )  # fmt: skip
        elif isinstance(dn, adapters.ShortConv):  # qkv is its in_proj
            qkv = [lin(dn.in_proj)]
            conv = tensors[f"{p}.{dn.conv1d}.weight"].float().flatten(1).to(device)
            mixer = ShortConv(dn.width, in_proj=qkv[0], conv=conv)
        elif isinstance(dn, adapters.Mamba2):  # qkv is its in_proj
            qkv = [lin(dn.in_proj)]
            conv = tensors[f"{p}.{dn.conv1d}.weight"].float().flatten(1).to(device)
            bias = f"{p}.{dn.conv1d}.bias"
            mixer = Mamba2(
                dn.heads, dn.head_dim, dn.state, dn.groups, in_proj=qkv[0], conv=conv,
                conv_bias=(
                    tensors[bias].float().to(device) if dn.conv_bias else conv.new_zeros(len(conv))
                ),
                decay=-tensors[f"{p}.{dn.a_log}"].float().exp().to(device),
                dt_bias=tensors[f"{p}.{dn.dt_bias}"].float().to(device),
                d=tensors[f"{p}.{dn.d}"].float().to(device),
                norm=tensors[f"{p}.{dn.norm}.weight"].float().to(device),
                eps=spec.eps,
            )  # fmt: skip
        elif dn is not None:  # a Gated DeltaNet: qkv is its in_proj_qkv and in_proj_z
            if dn.grouped:  # Qwen3-Next's rows, key head by key head: q, k, v, z, then b, a
                qkvz_rows, ba_rows = grouped_rows(dn)
                qkv, ba = [lin(dn.qkv, rows=qkvz_rows)], lin(dn.kept[0], rows=ba_rows)
            else:
                qkv, ba = [fuse([lin(dn.qkv), lin(dn.z)])], fuse([lin(n) for n in dn.kept])
            mixer = DeltaNet(
                dn.k_heads, dn.v_heads, dn.k_dim, dn.v_dim, qkvz=qkv[0], ba=ba,
                conv=tensors[f"{p}.{dn.conv1d}.weight"].float().flatten(1).to(device),
                decay=-tensors[f"{p}.{dn.a_log}"].float().exp().to(device),
                dt_bias=tensors[f"{p}.{dn.dt_bias}"].float().to(device),
                norm=tensors[f"{p}.{dn.norm}.weight"].float().to(device),  # w·x: no offset
                eps=spec.eps,
            )  # fmt: skip
            if kernels == "c":
                mixer.ba_weight = dense_weight(mixer.ba).contiguous()
        elif mla is not None:
            q_rows = latent_rows(shape.heads, mla.nope, mla.rope, mla.interleaved)
            rot = mla.kv_rank + rope_halves(mla.rope, mla.interleaved)
            kv_rows = torch.cat([torch.arange(mla.kv_rank), rot])  # the latent, then k's rope
            q = lin(mla.q_a) if mla.q_rank else lin(mla.q, rows=q_rows)
            qkv = [q, lin(mla.kv_a, rows=kv_rows)]
            latent = Latent(
                q_width=q.out_features, kv_rank=mla.kv_rank, nope=mla.nope, rope=mla.rope,
                v=mla.v, heads=shape.heads, kv_norm=opt(mla.kv_a_norm), kv_b=lin(mla.kv_b),
                eps=mla.eps,
            )  # fmt: skip
            if kernels == "c":
                latent.uk, latent.uv = head_linears(
                    latent.kv_b, shape.heads, mla.nope, mla.v, mla.kv_rank,
                    lambda rows, name=mla.kv_b: lin(name, rows=rows),
                )  # fmt: skip
            if mla.q_rank:
                latent.q_norm, latent.q_b = opt(mla.q_a_norm), lin(mla.q_b, rows=q_rows)
        elif adapter.qkv:
            by_part = rows_by_part(shape.heads, shape.head_dim) if adapter.qkv_by_head else None
            qkv = [lin(adapter.qkv, rows=by_part)]
        elif adapter.rope_interleaved:  # q and k into the halves layout the runtime rotates
            rotary = spec.rope[i].rotary_dim
            qkv = [
                lin(adapter.q, rows=interleaved_rows(shape.heads, shape.head_dim, rotary)),
                lin(adapter.k, rows=interleaved_rows(shape.kv_heads, shape.head_dim, rotary)),
                lin(adapter.v),
            ]
        elif adapter.attn_gate_in_q:  # each head's [q_h; g_h] rows: q's, then the gate's
            q_rows, gate_rows = gate_in_q_rows(shape.heads, shape.head_dim)
            qkv = [lin(adapter.q, rows=q_rows), lin(adapter.k), lin(adapter.v)]
            qkv.append(lin(adapter.q, rows=gate_rows))
        else:
            qkv = [lin(r) for r in (adapter.q, adapter.k, adapter.v)]
        if adapter.attn_gate:  # after q, k and v, as every kernel reads it
            qkv.append(lin(adapter.attn_gate))
        blocks.append(
            Layer(
                act_params=_act_params(tensors, f"{p}.{adapter.act_module}", spec, device),
                attn_norm=opt(adapter.attn_norm),
                # parallel (cohere): the MLP norms the block's input with attention's norm,
                # or with a norm of its own (gpt_neox)
                mlp_norm=opt(adapter.attn_norm if adapter.one_norm else adapter.mlp_norm),
                qkv=fuse(qkv) if len(qkv) > 1 else qkv[0],
                o=lin(block.o),
                gate_up=gate_up,
                down=down,
                moe=moe,
                q_norm=qk_norm(block.q_norm),
                k_norm=qk_norm(block.k_norm),
                post_attn_norm=opt(adapter.post_attn_norm),
                # or the experts' output norm (A.X-K1's), in their layers only
                post_mlp_norm=opt(adapter.post_mlp_norm or (moe and adapter.moe_out_norm)),
                latent=latent,
                gated=spec.attn_gate and mixer is None,
                sinks=_sinks(tensors, f"{p}.{adapter.sinks}", device) if adapter.sinks else None,
                mixer=mixer,
            )
        )
        if spec.norm_bias:
            _fold_norm_biases(blocks[-1], tensors, p, adapter, spec, device)
    embed = _dense(tensors[f"{adapter.embed}.weight"], device)  # rows widened when looked up
    head = adapter.lm_head
    if f"{head}.weight" in tensors or head in layers:
        lm_head = _linear(head, tensors, codec, layers, fallbacks, device, kernels)
    else:  # tied: the embedding matrix is the output projection
        lm_head = DenseLinear(embed)
    if spec.norm_bias:  # the final norm's bias, as the blocks' (_fold_norm_biases)
        fold_input_shift(lm_head, tensors[f"{adapter.final_norm}.bias"].float().to(device))
    weights = ModelWeights(
        shape=shape,
        spec=spec,
        embed=embed,
        layers=blocks,
        norm=norm(adapter.final_norm),
        lm_head=lm_head,
        dense_fallbacks=list(dict.fromkeys(fallbacks)),  # (kv_b's heads name it once)
        kernels=kernels,
    )
    if kernels == "c":
        _to_hugepages(weights)
    return weights
