"""Architecture adapters, written as data.

An adapter says where the parts of a decoder block are and how they depend on one
another, so that every method (AWQ scale folding, outlier search, pruning surgery)
works from these tables instead of from per-model classes. Adding a family means
adding one entry to ADAPTERS. The adapter also turns config.json into sizes (`shape`, the
one place that reads them) and declares the norm, activation and rope its blocks use, so
a consumer that cannot run some kind (the runtime) refuses it by reading the declaration.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from compress.errors import LlmpressError
from compress.model.spec import MoeSpec


@dataclass(frozen=True)
class InputGroup:
    """Linears that read the same input, and the op that produces it.

    `producer` is the module (relative to the block) whose output is that input: a norm
    for q/k/v and gate/up, a linear for o (after v) and down (after up). Scaling the
    input channels of the linears by s and the producer's output channels by 1/s leaves
    the model unchanged, which is what AWQ and SmoothQuant-style methods rely on.
    With grouped-query attention v's outputs are shared by several query heads, so v → o
    holds only when the widths match; methods check `producer` width before folding.
    """

    producer: str
    linears: tuple[str, ...]


@dataclass(frozen=True)
class CutGroup:
    """Slices that must be removed together for the model to stay consistent.

    Removing unit i of this axis removes output rows `i` of every module in `rows`
    (weight and bias) and input columns `i` of every module in `cols`.
    """

    axis: str
    rows: tuple[str, ...]
    cols: tuple[str, ...]


def _suffixes_renamed(state: dict, pairs: tuple[tuple[str, str], ...]) -> dict:
    """`state` with each key ending in a block-relative name `old` ending in `new` instead,
    for each (old, new) of `pairs`."""
    if not pairs:
        return state
    out = {}
    for key, value in state.items():
        for old, new in pairs:
            if key == old or key.endswith("." + old):
                key = key[: len(key) - len(old)] + new
                break
        out[key] = value
    return out


@dataclass(frozen=True)
class Widths:
    """The sizes pruning changes, and the parameter count they imply. In a
    Mixture-of-Experts model `intermediate` is each expert's width, `experts` how many a
    layer holds and `top_k` how many a token uses (0 and 0 for a dense MLP); `shared` is
    its shared expert's width, `shared_experts` how many experts wide that is where the
    config says so (GLM-4.5's, ERNIE's: cut with theirs), and where it keeps a dense MLP
    in some layers (GLM-4.5's first), `dense_layers` counts them and `dense_intermediate`
    is their width. `attention`: a layer's attention parameters where pruning leaves the
    attention whole (multi-head latent attention: its heads share the latents); 0 where
    they follow from the heads and head_dim. `gated_mlp`: an MLP is gate, up and down
    (else up and down: arcee's, starcoder2's); `attn_gate`: attention has a gate as wide as
    q (afmoe's). `norms`: the hidden-wide norms of every block (2; 4 with sandwich norms, 1
    in a parallel block), `moe_norms` those of the Mixture-of-Experts layers only (A.X-K1's
    output norm)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    layers: int
    experts: int = field(default=0, kw_only=True)
    top_k: int = field(default=0, kw_only=True)
    shared: int = field(default=0, kw_only=True)
    shared_experts: int = field(default=0, kw_only=True)
    dense_layers: int = field(default=0, kw_only=True)
    dense_intermediate: int = field(default=0, kw_only=True)
    attention: int = field(default=0, kw_only=True)
    # routing within groups (DeepSeek-V3's, V2's): the experts split into `groups` equal
    # groups, the best `groups_chosen` of them scored by their best `group_best` scores
    groups: int = field(default=1, kw_only=True)
    groups_chosen: int = field(default=1, kw_only=True)
    group_best: int = field(default=1, kw_only=True)
    gated_mlp: bool = field(default=True, kw_only=True)
    attn_gate: bool = field(default=False, kw_only=True)
    norms: int = field(default=2, kw_only=True)
    moe_norms: int = field(default=0, kw_only=True)

    @classmethod
    def of(cls, config: dict) -> Widths:
        adapter = adapter_for(config)
        m = adapter.shape(config)
        attention = 0
        if adapter.latent:
            shapes = adapter.latent.shapes(m.heads, m.hidden).values()
            attention = sum(math.prod(dims) for dims in shapes)
        if adapter.attn_gate_in_q:  # each head's q and gate rows interleave: kept whole
            shapes = adapter.layer(0).linear_shapes(m)
            attention = sum(math.prod(shapes[n]) for n in (adapter.q, adapter.k, adapter.v))
            attention += math.prod(shapes[adapter.o])
        every = (adapter.attn_norm, adapter.mlp_norm, adapter.post_attn_norm, adapter.post_mlp_norm)
        kinds = {
            "gated_mlp": adapter.gate is not None or adapter.gate_up is not None,
            "attn_gate": adapter.attn_gate is not None,
            "norms": sum(n is not None for n in every),
            "moe_norms": int(adapter.moe_out_norm is not None and adapter.experts > 0),
        }
        if adapter.experts:
            moe = adapter.moe(_hf(config))
            dense = len(moe.dense_layers)
            wide = moe.shared // moe.intermediate if adapter.moe.shared_count else 0
            return Widths(
                m.hidden, m.heads, m.kv_heads, m.head_dim, moe.intermediate, m.layers,
                experts=moe.experts, top_k=moe.top_k, shared=moe.shared, shared_experts=wide,
                dense_layers=dense, dense_intermediate=m.intermediate if dense else 0,
                attention=attention, groups=moe.groups[0], groups_chosen=moe.groups[1],
                group_best=2 if moe.group_score == "top2" else 1, **kinds,
            )  # fmt: skip
        return Widths(
            m.hidden, m.heads, m.kv_heads, m.head_dim, m.intermediate, m.layers,
            attention=attention, **kinds,
        )  # fmt: skip

    def non_embedding_params(self) -> int:
        """Block weights plus the final norm: what pruning targets are measured against
        (every expert, the shared one and the router counted; a dense layer's MLP as it is;
        the hidden-wide norms; biases and q/k norms not)."""
        attn = self.attention or 2 * self.hidden * self.head_dim * (self.heads + self.kv_heads)
        if self.attn_gate and not self.attention:  # a gate as wide as q
            attn += self.hidden * self.head_dim * self.heads
        per = 3 if self.gated_mlp else 2  # the matrices of an MLP
        mlp = per * self.hidden * self.intermediate * max(self.experts, 1)
        mlp += self.experts * self.hidden + per * self.hidden * self.shared  # router, shared
        dense = per * self.hidden * self.dense_intermediate
        blocks = self.layers * (attn + self.norms * self.hidden)
        mlp += self.moe_norms * self.hidden
        return (
            blocks
            + (self.layers - self.dense_layers) * mlp
            + self.dense_layers * dense
            + self.hidden
        )

    def apply(self, config: dict) -> dict:
        """`config` with these widths (head_dim written out: it no longer follows from hidden);
        an MoE model's expert count and width under its family's own keys. An attention
        left whole (`attention`) keeps its keys as the config has them."""
        whole = {"num_hidden_layers": self.layers}
        if not self.attention:
            whole.update(hidden_size=self.hidden, num_attention_heads=self.heads)
            whole.update(num_key_value_heads=self.kv_heads, head_dim=self.head_dim)
        out = {**config, **whole}
        adapter = adapter_for(config)
        keys = adapter.moe
        if keys is None or self.dense_layers:  # the dense MLP's width
            dense = adapter.dense_width if adapter.dense_width and keys else "intermediate_size"
            out[dense] = self.dense_intermediate or self.intermediate
        if keys is None:
            return out
        aliases = type(_hf(config)).attribute_map  # e.g. num_experts is num_local_experts
        for key, value in ((keys.width, self.intermediate), (keys.count, self.experts)):
            out[key] = value
            if key in aliases:
                out[aliases[key]] = value
        return out


@dataclass(frozen=True)
class ModelShape(Widths):
    """The sizes config.json describes, read once (`Adapter.shape`)."""

    vocab: int
    max_positions: int  # what the block computes (eps, rope) is in the BlockSpec
    # the head's rows: the vocabulary, or its first output_vocab_size ids where the head
    # is kept to them (Apertus 1.5's: the text ids of a vocabulary with image and audio codes)
    head_rows: int

    @classmethod
    def of(cls, config: dict, head_dim: int | None = None) -> ModelShape:
        """`head_dim`: the family's class default when config.json has none (qwen3's 128,
        gemma3's 256); otherwise hidden / heads."""
        heads = config["num_attention_heads"]
        return cls(
            hidden=config["hidden_size"],
            heads=heads,
            kv_heads=config.get("num_key_value_heads") or heads,
            head_dim=config.get("head_dim") or head_dim or config["hidden_size"] // heads,
            intermediate=config["intermediate_size"],
            layers=config["num_hidden_layers"],
            vocab=config["vocab_size"],
            max_positions=config.get("max_position_embeddings", 2048),
            head_rows=config.get("output_vocab_size") or config["vocab_size"],
        )


@dataclass(frozen=True)
class Latent:
    """DeepSeek's multi-head latent attention (MLA), sized by its config: q through a
    low-rank pair (q_a_proj, its norm, q_b_proj), or one q_proj where q_lora_rank is null
    (DeepSeek-V2-Lite); k and v through one latent shared by every head (kv_a_proj_with_mqa
    gives the latent and the one rotated key part; the latent's norm; kv_b_proj gives each
    head's unrotated key and its value)."""

    q_rank: int  # 0: one q_proj
    kv_rank: int
    nope: int  # each head's unrotated q/k width
    rope: int  # the rotated q/k width (one key part for every head)
    v: int  # each head's value width
    # the rotated part's rope pairs dimensions (2i, 2i+1) (V2's complex numbers, V3's
    # rope_interleave), not halves
    interleaved: bool = True

    eps = 1e-6  # its two norms' (the attention builds them without the config's eps)
    q = "self_attn.q_proj"
    q_a = "self_attn.q_a_proj"
    q_a_norm = "self_attn.q_a_layernorm"
    q_b = "self_attn.q_b_proj"
    kv_a = "self_attn.kv_a_proj_with_mqa"
    kv_a_norm = "self_attn.kv_a_layernorm"
    kv_b = "self_attn.kv_b_proj"

    @classmethod
    def of(cls, hf, pairs: bool) -> Latent:
        """`pairs`: whether the family's rope rotates pairs where the config has no
        rope_interleave key (V2's complex numbers do; MiniCPM3's halves do not)."""
        return cls(
            hf.q_lora_rank or 0, hf.kv_lora_rank, hf.qk_nope_head_dim, hf.qk_rope_head_dim,
            hf.v_head_dim, bool(getattr(hf, "rope_interleave", pairs)),
        )  # fmt: skip

    @property
    def linears(self) -> tuple[str, ...]:
        """The attention's linears but o, in execution order."""
        q = (self.q_a, self.q_b) if self.q_rank else (self.q,)
        return (*q, self.kv_a, self.kv_b)

    @property
    def reads_hidden(self) -> tuple[str, str]:
        """The linears that read the attention norm's output (one GPTQ Hessian; vLLM fuses
        q_a_proj and kv_a_proj_with_mqa as fused_qkv_a_proj)."""
        return (self.q_a if self.q_rank else self.q, self.kv_a)

    def input_groups(self, attn_norm: str) -> tuple[InputGroup, ...]:
        """Each of its linears by the norm whose output it reads."""
        q_b = (InputGroup(self.q_a_norm, (self.q_b,)),) if self.q_rank else ()
        return (
            InputGroup(attn_norm, self.reads_hidden),
            *q_b,
            InputGroup(self.kv_a_norm, (self.kv_b,)),
        )

    def shapes(self, heads: int, hidden: int) -> dict[str, tuple[int, ...]]:
        """Its linears' [out, in] (o's too) and its norms' widths."""
        q_out = heads * (self.nope + self.rope)
        out = {
            self.kv_a: (self.kv_rank + self.rope, hidden),
            self.kv_a_norm: (self.kv_rank,),
            self.kv_b: (heads * (self.nope + self.v), self.kv_rank),
            "o": (hidden, heads * self.v),
        }
        if self.q_rank:
            out.update({self.q_a: (self.q_rank, hidden), self.q_a_norm: (self.q_rank,)})
            out[self.q_b] = (q_out, self.q_rank)
        else:
            out[self.q] = (q_out, hidden)
        return out


@dataclass(frozen=True)
class GatedDeltaNet:
    """Gated DeltaNet linear attention (Qwen3.5's `linear_attention` layers), sized by its
    config: q, k and v through one projection and a causal depthwise convolution (kernel
    `conv`, then SiLU), q and k L2-normed per head, a state [k_dim, v_dim] per value head
    decayed by exp(-exp(A_log)·softplus(a + dt_bias)) and written by the delta rule at
    rate sigmoid(b); each value head's output RMS-normed and gated by SiLU(z), then
    out_proj. No keys are cached: a sequence carries its state."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    conv: int  # the convolution's kernel width
    # Qwen3-Next's: q, k, v and z in one in_proj_qkvz and b and a in one in_proj_ba, their
    # rows key head by key head ([q, k, v, z] of each head's group, then [b, a] of each)
    grouped: bool = False

    module = "linear_attn"
    out = "linear_attn.out_proj"
    conv1d = "linear_attn.conv1d"
    norm = "linear_attn.norm"
    a_log = "linear_attn.A_log"
    dt_bias = "linear_attn.dt_bias"

    @classmethod
    def of(cls, hf, grouped: bool = False) -> GatedDeltaNet:
        return cls(
            hf.linear_num_key_heads, hf.linear_num_value_heads, hf.linear_key_head_dim,
            hf.linear_value_head_dim, hf.linear_conv_kernel_dim, grouped,
        )  # fmt: skip

    @property
    def qkv(self) -> str:
        return "linear_attn.in_proj_qkvz" if self.grouped else "linear_attn.in_proj_qkv"

    @property
    def z(self) -> str | None:
        return None if self.grouped else "linear_attn.in_proj_z"

    @property
    def linears(self) -> tuple[str, ...]:
        """The input projections compressed (out_proj is the adapter's o)."""
        return (self.qkv,) if self.grouped else (self.qkv, self.z)

    @property
    def kept(self) -> tuple[str, ...]:
        """The input projections kept as stored, as routers are: b and a, a head's write
        rate and decay, [value heads, hidden] each, a few thousandths of the layer, that
        vLLM loads as one in_proj_ba too narrow for its 4-bit GPU kernels' 64-row tiles at
        16 value heads."""
        if self.grouped:
            return ("linear_attn.in_proj_ba",)
        return ("linear_attn.in_proj_b", "linear_attn.in_proj_a")

    @property
    def reads_hidden(self) -> tuple[str, ...]:
        """Every linear that reads the attention norm's output."""
        return (*self.linears, *self.kept)

    def input_groups(self, attn_norm: str) -> tuple[InputGroup, ...]:
        """Every input projection reads the attention norm's output (b's and a's columns
        take a fold's scale too, 16-bit); out_proj reads the gated norm's, one weight
        shared by every value head, which no per-channel scale folds into."""
        return (InputGroup(attn_norm, self.reads_hidden),)

    @property
    def fused(self) -> tuple[tuple[str, ...], ...]:
        """What vLLM loads as one tensor and compresses: in_proj_qkvz (stored so already
        where `grouped`)."""
        return () if self.grouped else ((self.qkv, self.z),)

    def shapes(self, hidden: int) -> dict[str, tuple[int, ...]]:
        """Its linears' [out, in] (out_proj's too) and its other tensors' shapes."""
        keys, values = self.k_heads * self.k_dim, self.v_heads * self.v_dim
        width = 2 * keys + values  # what the convolution runs over
        if self.grouped:
            inputs = {self.qkv: (width + values, hidden), self.kept[0]: (2 * self.v_heads, hidden)}
        else:
            b, a = self.kept
            inputs = {self.qkv: (width, hidden), self.z: (values, hidden)}
            inputs.update({b: (self.v_heads, hidden), a: (self.v_heads, hidden)})
        return {
            **inputs,
            self.out: (hidden, values),
            self.conv1d: (width, 1, self.conv),
            self.norm: (self.v_dim,),
            self.a_log: (self.v_heads,),
            self.dt_bias: (self.v_heads,),
        }

    def tensors(self, hidden: int) -> dict[str, tuple[int, ...]]:
        """Its tensors besides the linears compressed, by name in the block (a module's
        as `.weight`), with their shapes."""
        dims = self.shapes(hidden)
        out = {f"{n}.weight": dims[n] for n in (*self.kept, self.conv1d, self.norm)}
        return {**out, self.a_log: dims[self.a_log], self.dt_bias: dims[self.dt_bias]}


class _ByInProj:
    """A recurrent mixer with one input projection, `in_proj`, which reads the block's norm
    (what the mixer's own rows feed, out_proj and Jamba's x_proj and dt_proj, no scale of
    the norm's channels folds into)."""

    grouped = False  # (GatedDeltaNet's)
    z = None
    fused = ()

    def input_groups(self, attn_norm: str) -> tuple[InputGroup, ...]:
        return (InputGroup(attn_norm, self.reads_hidden),)


@dataclass(frozen=True)
class Mamba2(_ByInProj):
    """A Mamba-2 mixer (Bamba's and Granite 4.0's `linear_attention` layers), sized by its
    config: one in_proj gives the gate z [heads · head_dim], x, B and C (B and C `groups`
    rows of `state` each) and dt [heads]; x, B and C go through a causal depthwise
    convolution (kernel `conv`, a bias where `conv_bias`) and SiLU; per head a state
    [head_dim, state] decayed by exp(−exp(A_log)·dt), dt = softplus(dt + dt_bias), and
    written dt·x ⊗ B; the output state·C + D·x, times SiLU(z), RMS-normed in `groups`
    groups, then out_proj. No keys are cached: a sequence carries its state."""

    heads: int
    head_dim: int
    state: int  # d_state: B's and C's width per group
    groups: int
    conv: int  # the convolution's kernel width
    conv_bias: bool = True

    module = "mamba"
    out = "mamba.out_proj"
    conv1d = "mamba.conv1d"
    norm = "mamba.norm"
    a_log = "mamba.A_log"
    dt_bias = "mamba.dt_bias"
    d = "mamba.D"
    in_proj = "mamba.in_proj"
    kept = ()
    qkv = in_proj  # (the name the runtime's layer keeps it under)
    linears = reads_hidden = (in_proj,)

    @classmethod
    def of(cls, hf) -> Mamba2:
        width = int(hf.mamba_expand * hf.hidden_size)
        if width != hf.mamba_n_heads * hf.mamba_d_head:
            raise LlmpressError(
                f"mamba_expand × hidden_size ({width}) is not mamba_n_heads × mamba_d_head "
                f"({hf.mamba_n_heads * hf.mamba_d_head}): the config is inconsistent; fix it"
            )
        limit = tuple(getattr(hf, "time_step_limit", None) or (0.0, float("inf")))
        if limit != (0.0, float("inf")) or getattr(hf, "mamba_proj_bias", False):
            raise LlmpressError(
                f"{hf.model_type}: a Mamba-2 time_step_limit other than (0, inf), or biased "
                "projections (mamba_proj_bias), are not supported yet; open an issue with the "
                "model's config.json"
            )
        if hf.hidden_act != "silu":
            raise LlmpressError(
                f"{hf.model_type}: a Mamba-2 convolution activated by {hf.hidden_act} (not "
                "silu) is not supported yet; open an issue with the model's config.json"
            )
        return cls(
            hf.mamba_n_heads, hf.mamba_d_head, hf.mamba_d_state, hf.mamba_n_groups,
            hf.mamba_d_conv, bool(getattr(hf, "mamba_conv_bias", True)),
        )  # fmt: skip

    @property
    def width(self) -> int:
        """z's width, x's, and what out_proj reads."""
        return self.heads * self.head_dim

    @property
    def channels(self) -> int:
        """What the convolution runs over: x, B and C."""
        return self.width + 2 * self.groups * self.state

    def shapes(self, hidden: int) -> dict[str, tuple[int, ...]]:
        """Its linears' [out, in] and its other tensors' shapes."""
        return {
            self.in_proj: (self.width + self.channels + self.heads, hidden),
            self.out: (hidden, self.width),
            self.conv1d: (self.channels, 1, self.conv),
            self.norm: (self.width,),
            self.a_log: (self.heads,),
            self.dt_bias: (self.heads,),
            self.d: (self.heads,),
        }

    def tensors(self, hidden: int) -> dict[str, tuple[int, ...]]:
        """Its tensors besides the linears compressed, by name in the block."""
        dims = self.shapes(hidden)
        out = {f"{self.conv1d}.weight": dims[self.conv1d], f"{self.norm}.weight": (self.width,)}
        if self.conv_bias:
            out[f"{self.conv1d}.bias"] = (self.channels,)
        return {**out, **{n: (self.heads,) for n in (self.a_log, self.dt_bias, self.d)}}


@dataclass(frozen=True)
class Mamba1(_ByInProj):
    """A Mamba (selective scan) mixer as Jamba's, sized by its config: in_proj gives x and the
    gate z [width each]; x through a causal depthwise convolution (its bias) and SiLU; x_proj
    of that gives dt [rank], B and C [state each], each RMS-normed (dt_layernorm,
    b_layernorm, c_layernorm); dt_proj widens dt to one per channel, softplus(· + bias); per
    channel a state [state] decayed by exp(dt·A), A = −exp(A_log) [width, state], and written
    dt·x·B; the output state·C + D·x, times SiLU(z), then out_proj. x_proj and dt_proj read
    the convolution's output, not the hidden states: kept as stored, as routers are."""

    width: int
    state: int
    rank: int
    conv: int
    conv_bias: bool = True

    module = "mamba"
    in_proj = "mamba.in_proj"
    out = "mamba.out_proj"
    conv1d = "mamba.conv1d"
    x_proj = "mamba.x_proj"
    dt_proj = "mamba.dt_proj"
    a_log = "mamba.A_log"
    d = "mamba.D"
    norms = ("mamba.dt_layernorm", "mamba.b_layernorm", "mamba.c_layernorm")
    kept = (x_proj, dt_proj)
    qkv = in_proj
    linears = reads_hidden = (in_proj,)

    @classmethod
    def of(cls, hf) -> Mamba1:
        if (getattr(hf, "num_experts", 1) or 1) > 1:
            raise LlmpressError(
                f"{hf.model_type}: experts beside the Mamba layers (num_experts "
                f"{hf.num_experts}: Jamba Mini, Large) are not supported yet; open an issue "
                "with the model's config.json"
            )
        if getattr(hf, "mamba_proj_bias", False) or hf.hidden_act != "silu":
            raise LlmpressError(
                f"{hf.model_type}: biased Mamba projections (mamba_proj_bias) or a convolution "
                f"activated by {hf.hidden_act} are not supported yet; open an issue with the "
                "model's config.json"
            )
        width = hf.mamba_expand * hf.hidden_size
        return cls(width, hf.mamba_d_state, hf.mamba_dt_rank, hf.mamba_d_conv,
                   bool(hf.mamba_conv_bias))  # fmt: skip

    @property
    def channels(self) -> int:
        return self.width

    def shapes(self, hidden: int) -> dict[str, tuple[int, ...]]:
        return {
            self.in_proj: (2 * self.width, hidden),
            self.out: (hidden, self.width),
            self.conv1d: (self.width, 1, self.conv),
            self.x_proj: (self.rank + 2 * self.state, self.width),
            self.dt_proj: (self.width, self.rank),
        }

    def tensors(self, hidden: int) -> dict[str, tuple[int, ...]]:
        dims = self.shapes(hidden)
        out = {f"{n}.weight": dims[n] for n in (self.conv1d, *self.kept)}
        out[f"{self.dt_proj}.bias"] = (self.width,)
        if self.conv_bias:
            out[f"{self.conv1d}.bias"] = (self.width,)
        widths = (self.rank, self.state, self.state)
        out.update({f"{n}.weight": (w,) for n, w in zip(self.norms, widths, strict=True)})
        return {**out, self.a_log: (self.width, self.state), self.d: (self.width,)}


@dataclass(frozen=True)
class ShortConv(_ByInProj):
    """LFM2's gated short convolution (its `conv` layers), sized by its config: in_proj gives
    B, C and x [width each]; B·x through a causal depthwise convolution (kernel `conv`),
    times C, then out_proj. A sequence carries the last kernel − 1 values of B·x."""

    width: int
    conv: int

    module = "conv"
    in_proj = "conv.in_proj"
    out = "conv.out_proj"
    conv1d = "conv.conv"
    kept = ()
    qkv = in_proj
    linears = reads_hidden = (in_proj,)

    @classmethod
    def of(cls, hf) -> ShortConv:
        if getattr(hf, "conv_bias", False):
            raise LlmpressError(
                f"{hf.model_type}: conv_bias (biased short-convolution projections) is not "
                "supported yet; open an issue with the model's config.json"
            )
        return cls(hf.hidden_size, hf.conv_L_cache)

    @property
    def channels(self) -> int:
        return self.width

    def shapes(self, hidden: int) -> dict[str, tuple[int, ...]]:
        return {
            self.in_proj: (3 * self.width, hidden),
            self.out: (hidden, self.width),
            self.conv1d: (self.width, 1, self.conv),
        }

    def tensors(self, hidden: int) -> dict[str, tuple[int, ...]]:
        return {f"{self.conv1d}.weight": (self.width, 1, self.conv)}


@dataclass(frozen=True)
class Adapter:
    """Where the parts of a llama-family model are, by module name."""

    families: tuple[str, ...]
    architecture: str = "LlamaForCausalLM"  # config.json's `architectures` entry
    blocks: str = "model.layers"
    embed: str = "model.embed_tokens"
    final_norm: str = "model.norm"
    lm_head: str = "lm_head"
    attn: str = "self_attn"
    mlp: str = "mlp"
    # the norms the branches read (None: the branch reads the residual stream as it is, and
    # only its output is normed: olmo2)
    attn_norm: str | None = "input_layernorm"
    mlp_norm: str | None = "post_attention_layernorm"
    q: str = "self_attn.q_proj"
    k: str = "self_attn.k_proj"
    v: str = "self_attn.v_proj"
    o: str = "self_attn.o_proj"
    gate: str | None = "mlp.gate_proj"  # None: the MLP is down(act(up(x))), not gated (arcee)
    act_module: str = "mlp.act_fn"  # where a learned activation keeps its parameters (xIELU)
    up: str = "mlp.up_proj"
    down: str = "mlp.down_proj"
    # Modules whose buffers are computed from the config, not stored in a checkpoint.
    derived_modules: tuple[str, ...] = ("model.rotary_emb",)
    # Where the family's optional parts are (None: it has none).
    q_norm: str | None = None  # per-head RMSNorm of q and k before rope (qwen3, gemma3)
    k_norm: str | None = None
    # q_norm/k_norm span each head ("head"), all of q, all of k ("full"), or each head with
    # a weight row of its own ("each_head": [heads, head_dim], cohere)
    qk_norm: str = "head"
    # "each_head" norms stored one module per head (`<q_norm>.{h}`: StableLM 2 12B's
    # norms.{h}), not as one [heads, head_dim] weight
    qk_norm_modules: bool = False
    qk_norm_after_rope: bool = False  # q and k normed after rope, not before (hunyuan)
    post_attn_norm: str | None = None  # sandwich norms on the branch outputs (gemma3)
    post_mlp_norm: str | None = None
    qkv: str | None = None  # q/k/v stored as one tensor, rows q then k then v (phi3)
    gate_up: str | None = None  # gate/up stored as one tensor, gate rows first (phi3)
    # Facts the BlockSpec (compress/model/spec.py) reads with the config.
    norm: str = "rms"  # "rms": x·w; "rms1p": x·(1+w); "layer": mean subtracted, then x·w
    norm_eps: str = "rms_norm_eps"  # the config key of the norms' epsilon
    norm_bias: bool = False  # the norms carry a bias (nn.LayerNorm's: starcoder2, nemotron)
    # attention and MLP read one norm's output, both added to the residual (cohere): the
    # block has no mlp_norm
    parallel: bool = False
    logit_scale: str | None = None  # the config key whose value multiplies the logits
    # config keys the family reads that llmpress does not implement: (key, what it turns
    # on); a config with one of them true is refused in one line (adapter_for)
    refused_options: tuple[tuple[str, str], ...] = ()
    # the config key that makes the block parallel (stablelm's use_parallel_residual):
    # where it is true, adapter_for sets `parallel` and drops mlp_norm, unless the parallel
    # block keeps a norm of its own for the MLP (`parallel_mlp_norm`: gpt_neox's two)
    parallel_option: str | None = None
    parallel_mlp_norm: bool = False
    # the fused q/k/v's rows go head by head, each head's q, k, v rows in turn (gpt_neox's
    # query_key_value), not all of q, then k, then v (phi3's qkv_proj)
    qkv_by_head: bool = False
    # tensors, relative to a block, that some checkpoints of the family still hold though
    # the model computes them (GPT-NeoX's causal-mask and rotary buffers): never read
    stale_tensors: tuple[str, ...] = ()
    # the head's module name in transformers' model where its loader renames the
    # checkpoint's (gpt_neox's embed_out is loaded as lm_head; vLLM keeps embed_out): a
    # quantized head's config names both
    head_loaded_as: str | None = None
    biased: tuple[str, ...] = ()  # roles whose linears always carry a bias
    head_bias: bool = False  # the lm_head carries a bias (phi); others' is refused
    bias_options: tuple[tuple[str, tuple[str, ...]], ...] = (
        ("attention_bias", ("q", "k", "v", "o")),
        ("mlp_bias", ("gate", "up", "down")),
    )  # (config key, the roles it gives a bias)
    query_pre_attn_scalar: bool = False  # the attention scale is that key's ** -0.5
    # attention scores capped at attn_logit_softcapping (gemma2; gemma3's config has the
    # key but transformers' Gemma3Attention never applies it)
    attn_softcap: bool = False
    scaled_embedding: bool = False  # the embedding is multiplied by sqrt(hidden)
    # or so where this config key is true (afmoe's mup_enabled)
    scaled_embedding_option: str | None = None
    # the linear whose sigmoid gates attention's output before o (afmoe's gate_proj: as
    # wide as q, reading what q reads)
    attn_gate: str | None = None
    # or q's own rows hold each head's query then its gate, [q_h; g_h] (MiniCPM5-MoE's
    # q_gate_proj): q twice as wide; pruning keeps the attention whole
    attn_gate_in_q: bool = False
    # each head's learned attention sink, a parameter [heads] beside q/k/v (gpt-oss's and
    # granite_swa's `self_attn.sinks`): a score no value stands behind, in every softmax
    sinks: str | None = None
    # (checkpoint name, transformers' name) of a block's parameters named apart (Flint's
    # sinks: self_attn.softmax_offset, which its model calls self_attn.sinks): renamed
    # where a transformers module takes the tensors (model_names) and back where its state
    # is written (checkpoint_names)
    param_aliases: tuple[tuple[str, str], ...] = ()
    # (checkpoint name, transformers' attribute) of a block's modules named apart
    # (MiniCPM5-MoE's q_proj, its model's q_gate_proj): model/aliases.py
    module_aliases: tuple[tuple[str, str], ...] = ()
    # (checkpoint path, transformers' path) of block modules transformers renames as it
    # loads the checkpoint (conversion_mapping.py; Hy3's mlp.shared_mlp is its
    # mlp.shared_experts), where llmpress reads them under the checkpoint's name: the
    # artifact's quantization config targets their linears under both names
    load_renames: tuple[tuple[str, str], ...] = ()
    # with a sliding window, the full-attention layers rotate nothing (exaone4)
    full_layers_without_rope: bool = False
    # only the sliding layers rotate (whatever the window), and the dense layers where
    # prefix_dense_sliding_window_pattern is 1 (cohere2_moe's force_rope)
    rotate_sliding_only: bool = False
    # where this config key is set (not None), every norm is RMS with it as epsilon
    # (cohere2_moe's rms_norm_eps; else its LayerNorms)
    rms_option: str | None = None
    # the config key of the dense layers' MLP width beside experts, where it is not
    # intermediate_size (cohere2_moe's prefix_dense_intermediate_size; null: that)
    dense_width: str | None = None
    # the config's embedding, attention and residual multipliers and logits_scaling set
    # those scales (granite)
    multipliers: bool = False
    # (config key, value): the model rotates q and k only where the key has that value,
    # every layer without rope otherwise (granitemoehybrid's position_embedding_type)
    rope_switch: tuple[str, str] | None = None
    # logits_scaling multiplies the logits where granite's divides them (hyperclovax)
    logits_scaling_multiplies: bool = False
    # the config key without which the branch outputs' norms do not exist (hyperclovax's
    # use_post_norm; adapter_for drops them where it is false)
    post_norm_option: str | None = None
    # MiniCPM's scales: the embedding times scale_emb, each branch times
    # scale_depth / sqrt(layers), the logits divided by logits_scaling (hidden / dim_model_base)
    depth_scaled: bool = False
    # rope rotates each head's dimension pairs (2i, 2i+1), not (i, i + rotary/2) (glm4):
    # the runtime loads q and k with their rows reordered into the halves layout
    # (interleaved_rows), which leaves q·k as it was and every kernel as it is
    rope_interleaved: bool = False
    # the rope tables transformers' layer takes: cos/sin in two halves ("halves": llama's;
    # glm's interleaves them itself), each frequency twice in a row ("pairs": cohere's), or
    # one complex number per frequency ("complex": DeepSeek-V2's freqs_cis)
    rope_tables: str = "halves"
    # loaders need heads × head_dim = hidden, so a pruned shape must keep it: phi3's take
    # the head width as hidden / heads whatever head_dim says (its config checks its rope
    # factors against it); helium's o_proj is [hidden, hidden]
    heads_span_hidden: bool = False
    moe: MoeKeys | None = None  # Mixture-of-Experts families: where their config says so
    # DeepSeek's multi-head latent attention in place of q/k/v (`latent_attention`: bound
    # from config.json by adapter_for as `latent`)
    latent_attention: bool = False
    latent: Latent | None = None
    head_dim: int | None = None  # the config class's head_dim default, if not hidden/heads
    # Mixture-of-Experts: the router, the experts' module list and each expert's linears
    # (gate, up, down) as checkpoints name them; `experts`/`expert_width` are bound from
    # config.json by adapter_for.
    router: str | None = None
    expert: str | None = None
    expert_names: tuple[str, str, str] = ("gate_proj", "up_proj", "down_proj")
    experts: int = 0
    expert_width: int = 0
    # a shared expert beside the routed ones (qwen2_moe): its module (gate/up/down named
    # gate_proj/up_proj/down_proj) and the 16-bit [1, hidden] linear whose sigmoid gates
    # it; `shared_width` is bound from config.json
    shared_expert: str | None = None
    shared_gate: str | None = None  # None beside a shared expert: it is not gated (glm4_moe)
    shared_width: int = 0
    # a per-expert bias added to the router's scores to choose, not to weigh (the
    # checkpoint's e_score_correction_bias, relative to the block), or None; stored [E],
    # or [1, E] with `choice_bias_2d` (ERNIE's moe_statics)
    choice_bias: str | None = None
    choice_bias_2d: bool = False
    # a norm of the experts' output (shared experts' included), before the residual add,
    # in the Mixture-of-Experts layers only (A.X-K1's post_mlp_layernorm, kept on the block
    # by its checkpoints; transformers moves it into the MoE module as it loads them)
    moe_out_norm: str | None = None
    # the config key that gives q and k their per-head norms (glm4_moe's use_qk_norm); the
    # norms exist only where it is true (adapter_for drops them otherwise)
    qk_norm_option: str | None = None
    # the config attribute counting the next-token-prediction blocks a checkpoint holds
    # after the model's own (GLM-4.5's MTP layer, for speculative decoding elsewhere):
    # not the model's forward, so they are carried into the artifact as they are
    predictor_layers: str | None = None
    # the layers of a Mixture-of-Experts model that keep a dense MLP (gate_proj, up_proj,
    # down_proj under `mlp`, as llama's), bound from config.json; `layer(i)` is block i's
    dense_layers: tuple[int, ...] = ()
    # Gated DeltaNet linear attention in the layers config.json's layer_types calls
    # linear_attention (Qwen3.5's): `deltanet` and `linear_layers` are bound from the config
    # by adapter_for; `layer(i)` of such a layer has it as `mixer`, and out_proj as its o
    linear_attention: bool = False
    deltanet_grouped: bool = False  # its projections stored as Qwen3-Next's (GatedDeltaNet)
    deltanet: GatedDeltaNet | None = None
    # what those layers hold instead: "mamba2" (Bamba's, Granite 4.0's: `mamba` bound),
    # "mamba1" (Jamba's: `mamba` a Mamba1), "short_conv" (LFM2's: `short_conv` bound)
    mixer_kind: str = "deltanet"
    mamba: Mamba2 | Mamba1 | None = None
    short_conv: ShortConv | None = None
    # the config attribute listing each layer's kind, and the kind of the recurrent ones
    recurrent_layers: tuple[str, str] = ("layer_types", "linear_attention")
    linear_layers: tuple[int, ...] = ()
    mixer: GatedDeltaNet | Mamba2 | Mamba1 | ShortConv | None = None
    no_rope: bool = False  # no layer rotates q and k (Jamba's attention)
    # the MLP's width from intermediate_size by LFM2's rule (block_auto_adjust_ff_dim)
    adjusted_ff: bool = False

    def shape(self, config: dict) -> ModelShape:
        shape = ModelShape.of(config, self.head_dim)
        if self.dense_width and config.get(self.dense_width):
            shape = replace(shape, intermediate=config[self.dense_width])
        if self.adjusted_ff and config.get("block_auto_adjust_ff_dim", True):
            shape = replace(shape, intermediate=_adjusted_ff(config, shape.intermediate))
        return shape

    def layer(self, i: int) -> Adapter:
        """Block i's adapter: this one; for a layer a Mixture-of-Experts model keeps dense,
        the same without experts; for a linear-attention layer, the same with the
        DeltaNet as its mixer (what every per-block property then describes)."""
        block = self
        if i in self.dense_layers:
            block = replace(block, experts=0, expert_width=0, shared_width=0, dense_layers=())
        if i in self.linear_layers:
            dn = self.deltanet or self.mamba or self.short_conv
            block = replace(
                block, mixer=dn, o=dn.out, q_norm=None, k_norm=None, attn_gate_in_q=False,
                linear_layers=(),
            )  # fmt: skip
        return block

    @property
    def mixed(self) -> bool:
        """Some layers dense, the others Mixture-of-Experts."""
        return bool(self.dense_layers)

    def spec(self, config: dict):
        """What the blocks compute (compress/model/spec.py's BlockSpec)."""
        from compress.model.spec import describe

        return describe(config, self)

    @property
    def head_module(self) -> str:
        """The head's module name in transformers' model (`head_loaded_as`, else lm_head)."""
        return self.head_loaded_as or self.lm_head

    def model_names(self, state: dict) -> dict:
        """A checkpoint's state dict under the names transformers' model gives it
        (gpt_neox: embed_out.* as lm_head.*; param_aliases), for load_state_dict: a whole
        model's, or one block's (names relative to it)."""
        state = self._renamed(state, self.lm_head, self.head_module)
        return _suffixes_renamed(state, self.param_aliases)

    def checkpoint_names(self, state: dict) -> dict:
        """A transformers model's state dict under the names checkpoints of the family use
        (gpt_neox: lm_head.* as embed_out.*, which vLLM's loader reads; param_aliases)."""
        state = self._renamed(state, self.head_module, self.lm_head)
        return _suffixes_renamed(state, tuple((b, a) for a, b in self.param_aliases))

    @staticmethod
    def _renamed(state: dict, old: str, new: str) -> dict:
        if old == new:
            return state

        prefix = old + "."
        return {(new + k[len(old) :] if k.startswith(prefix) else k): v for k, v in state.items()}

    def role(self, role: str) -> str:
        """The module name of a role (q, k, v, o, gate, up, down)."""
        return getattr(self, role)

    @property
    def mlp_inputs(self) -> tuple[str, ...]:
        """The dense MLP's linears that read its input: gate and up, a fused gate_up, or up
        alone (an MLP without a gate)."""
        if self.gate_up:
            return (self.gate_up,)
        return (self.gate, self.up) if self.gate else (self.up,)

    @property
    def attn_linears(self) -> tuple[str, ...]:
        """The attention's linears but o: q/k/v (one fused tensor, or three), or MLA's."""
        if self.mixer:
            return self.mixer.linears
        if self.latent:
            return self.latent.linears
        gate = (self.attn_gate,) if self.attn_gate else ()
        return (self.qkv, *gate) if self.qkv else (self.q, self.k, self.v, *gate)

    @property
    def block_linears(self) -> tuple[str, ...]:
        """Every linear in a block, in execution order (as the checkpoint stores them)."""
        attn = self.attn_linears
        if self.experts:
            return (*attn, self.o, *self.expert_linears, *self.shared_linears)
        return (*attn, self.o, *self.mlp_inputs, self.down)

    @property
    def shared_linears(self) -> tuple[str, ...]:
        """The shared expert's gate, up and down (none without one)."""
        if not self.shared_width:
            return ()
        return tuple(f"{self.shared_expert}.{n}" for n in ("gate_proj", "up_proj", "down_proj"))

    @property
    def expert_linears(self) -> tuple[str, ...]:
        """Every expert's gate, up and down, expert by expert."""
        return tuple(
            f"{self.expert}.{e}.{n}" for e in range(self.experts) for n in self.expert_names
        )

    def expert_linear(self, e: int, role: str) -> str:
        """Expert e's linear of `role` (gate, up, down)."""
        return f"{self.expert}.{e}.{self.expert_names[('gate', 'up', 'down').index(role)]}"

    @property
    def shared_inputs(self) -> tuple[tuple[str, ...], ...]:
        """Linears that read the very same tensor (one GPTQ Hessian serves them): q/k/v,
        gate/up, or each expert's gate/up (each expert sees its own tokens); MLA's q_a and
        kv_a."""
        attn = self.latent.reads_hidden if self.latent else self.attn_linears
        if self.experts:
            pairs = tuple(
                (self.expert_linear(e, "gate"), self.expert_linear(e, "up"))
                for e in range(self.experts)
            )
            shared = (self.shared_linears[:2],) if self.shared_width else ()
            return (attn, *pairs, *shared)
        mlp = self.mlp_inputs
        return ((*attn, *mlp),) if self.one_norm else (attn, mlp)

    @property
    def one_norm(self) -> bool:
        """A parallel block whose attention and MLP read one norm's output (cohere);
        gpt_neox's parallel block norms each branch's input apart."""
        return self.parallel and self.mlp_norm is None

    @property
    def block_norms(self) -> tuple[str, ...]:
        """Every hidden-width norm of a block."""
        every = (self.attn_norm, self.mlp_norm, self.post_attn_norm, self.post_mlp_norm)
        every += (self.moe_out_norm if self.experts else None,)  # (a dense layer has none)
        return tuple(n for n in every if n)

    @property
    def input_groups(self) -> tuple[InputGroup, ...]:
        """Linears by the op that produces their input; a branch without an input norm
        (olmo2) has no producer to fold a scale into, so its group is left out."""
        return tuple(g for g in self._input_groups if g.producer)

    @property
    def _input_groups(self) -> tuple[InputGroup, ...]:
        """Fused checkpoint tensors (phi3) keep only the norm-fed groups: their v and up
        rows are a slice of one tensor, which no producer fold addresses (glm4's v is a
        tensor of its own, so v → o stays). MLA's linears by the norms they read: its v is
        rows of kv_b, which no fold into o addresses either; a DeltaNet's likewise."""
        if self.mixer:
            mlp = replace(self, mixer=None)._input_groups
            mlp = tuple(g for g in mlp if g.producer not in (self.attn_norm, self.v))
            return (*self.mixer.input_groups(self.attn_norm), *mlp)
        if self.latent:
            mlp = replace(self, latent=None)._input_groups
            mlp = tuple(g for g in mlp if g.producer not in (self.attn_norm, self.v))
            return (*self.latent.input_groups(self.attn_norm), *mlp)
        if self.qkv or self.gate_up:
            attn = self.attn_linears
            mlp = self.mlp_inputs
            v_to_o = () if self.qkv else (InputGroup(self.v, (self.o,)),)  # v is its own
            return (InputGroup(self.attn_norm, attn), *v_to_o, InputGroup(self.mlp_norm, mlp))
        if self.experts:  # the router reads the norm too: its columns take the scale, 16-bit
            gates_ups = tuple(
                n for n in self.expert_linears if not n.endswith(self.expert_names[2])
            )
            per_expert = tuple(
                InputGroup(self.expert_linear(e, "up"), (self.expert_linear(e, "down"),))
                for e in range(self.experts)
            )
            norm_fed = (self.router, *gates_ups)
            if self.shared_width:  # its gate, 16-bit like the router, reads the norm too
                sg, su, sd = self.shared_linears
                gate = (self.shared_gate,) if self.shared_gate else ()
                norm_fed = (*norm_fed, *gate, sg, su)
                per_expert = (*per_expert, InputGroup(su, (sd,)))
            if self.one_norm:  # one norm feeds attention and the experts (cohere2_moe)
                return (
                    InputGroup(self.attn_norm, (*self.attn_linears, *norm_fed)),
                    InputGroup(self.v, (self.o,)),
                    *per_expert,
                )
            return (
                InputGroup(self.attn_norm, self.attn_linears),
                InputGroup(self.v, (self.o,)),
                InputGroup(self.mlp_norm, norm_fed),
                *per_expert,
            )
        # up -> down folds a scale only through act(gate) * up, linear in up: an MLP
        # without a gate has none to fold it through
        up_down = (InputGroup(self.up, (self.down,)),) if self.gate else ()
        if self.one_norm:  # one norm feeds both branches
            return (
                InputGroup(self.attn_norm, (*self.attn_linears, *self.mlp_inputs)),
                InputGroup(self.v, (self.o,)),
                *up_down,
            )
        return (
            InputGroup(self.attn_norm, self.attn_linears),
            InputGroup(self.v, (self.o,)),
            InputGroup(self.mlp_norm, self.mlp_inputs),
            *up_down,
        )

    @property
    def fused_linears(self) -> tuple[tuple[str, ...], ...]:
        """Linears that serving engines load as one fused tensor (vLLM's qkv_proj and
        gate_up_proj): they must share one quantization scheme. A tensor the checkpoint
        already stores fused is one linear, so one scheme by construction."""
        groups = []
        if self.mixer:  # in_proj_qkvz, in_proj_ba
            groups.extend(self.mixer.fused)
        elif self.latent:  # vLLM's fused_qkv_a_proj (with q_lora_rank; else none)
            if self.latent.q_rank:
                groups.append(self.latent.reads_hidden)
        elif not self.qkv:
            groups.append((self.q, self.k, self.v))
        if self.experts:  # vLLM's FusedMoE: one scheme for every expert of a layer
            groups.append(self.expert_linears)
            if self.shared_width:  # the shared expert's gate_up_proj
                groups.append(self.shared_linears[:2])
        elif not self.gate_up and self.gate:
            groups.append((self.gate, self.up))
        return tuple(groups)

    @property
    def cut_groups(self) -> tuple[CutGroup, ...]:
        """Per-block axes; `hidden` also runs through the embedding, norms and lm_head."""
        fused = tuple(n for n in (self.qkv, self.gate_up) if n)
        gate_up = tuple(n for n in (self.gate, self.up) if n)  # (up alone without a gate)
        attn_gate = (self.attn_gate,) if self.attn_gate else ()  # as wide as q, head by head
        heads, kv_heads = (self.q, *attn_gate), (self.k, self.v)
        reads_hidden = (self.q, self.k, self.v, *attn_gate)
        if self.mixer:  # a DeltaNet's heads stay whole; its projections read the hidden
            reads_hidden = self.mixer.reads_hidden
        if self.qk_norm in ("full", "each_head") and self.q_norm:  # they span the heads' rows
            heads, kv_heads = (*heads, self.q_norm), (*kv_heads, self.k_norm)
        head_groups = (
            CutGroup("heads", rows=heads, cols=(self.o,)),
            CutGroup("kv_heads", rows=kv_heads, cols=()),
        )
        return (
            # latent attention's heads stay whole, and q's interleaved with the gate's
            *(() if self.latent or self.attn_gate_in_q or self.mixer else head_groups),
            CutGroup("mlp", rows=gate_up, cols=(self.down,)),
            CutGroup(
                "hidden",
                rows=(self.o, self.down, *self.block_norms),
                cols=(*reads_hidden, *gate_up, *fused),
            ),
        )

    def fused_rows(self, shape) -> dict[str, tuple[tuple[str, int], ...]]:
        """Each fused tensor's row parts as (axis, first row) at `shape`: phi3's qkv_proj is
        q, k, v rows, gate_up_proj gate then up, so a cut keeps each part's chosen units."""
        q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
        parts = {}
        if self.qkv and self.qkv_by_head:  # each kept head's q, k and v rows together
            parts[self.qkv] = (("qkv_heads", 0),)
        elif self.qkv:
            parts[self.qkv] = (("heads", 0), ("kv_heads", q), ("kv_heads", q + kv))
        if self.gate_up:
            parts[self.gate_up] = (("mlp", 0), ("mlp", shape.intermediate))
        return parts

    def linear_shapes(self, shape: ModelShape) -> dict[str, tuple[int, int]]:
        """Each block linear (as block_linears names them) with its [out, in] shape."""
        q, kv, hidden, inter = (
            shape.heads * shape.head_dim,
            shape.kv_heads * shape.head_dim,
            shape.hidden,
            shape.intermediate,
        )
        every = {
            self.q: (2 * q if self.attn_gate_in_q else q, hidden),
            self.k: (kv, hidden),
            self.v: (kv, hidden),
            self.o: (hidden, q),
            self.up: (inter, hidden),
            self.down: (hidden, inter),
        }
        if self.qkv:
            every[self.qkv] = (q + 2 * kv, hidden)
        if self.gate:
            every[self.gate] = (inter, hidden)
        if self.attn_gate:
            every[self.attn_gate] = (q, hidden)
        if self.gate_up:
            every[self.gate_up] = (2 * inter, hidden)
        width = self.expert_width
        for e in range(self.experts):
            every[self.expert_linear(e, "gate")] = (width, hidden)
            every[self.expert_linear(e, "up")] = (width, hidden)
            every[self.expert_linear(e, "down")] = (hidden, width)
        if self.shared_width:
            sg, su, sd = self.shared_linears
            every[sg] = every[su] = (self.shared_width, hidden)
            every[sd] = (hidden, self.shared_width)
        if self.latent:
            latent = self.latent.shapes(shape.heads, hidden)
            every.update(latent, **{self.o: latent["o"]})
        if self.mixer:
            every.update(self.mixer.shapes(hidden))
        return {name: every[name] for name in self.block_linears}

    def block_prefix(self, index: int) -> str:
        return f"{self.blocks}.{index}"

    def linear_names(self, num_layers: int) -> list[str]:
        """Fully qualified names of every block linear, block by block."""
        return [
            f"{self.block_prefix(i)}.{name}"
            for i in range(num_layers)
            for name in self.layer(i).block_linears
        ]


def _per_model(hf, key: str) -> int:
    """A count the config may give per layer (Hunyuan's moe_topk, num_experts): one value
    for every layer, or refused in one line."""
    value = getattr(hf, key)
    if isinstance(value, (list, tuple)):
        if len(set(value)) != 1:
            raise LlmpressError(
                f"config.json gives {key} per layer ({sorted(set(value))}): llmpress runs one "
                "value for every layer"
            )
        value = value[0]
    return int(value)


@dataclass(frozen=True)
class MoeKeys:
    """Where a family's config keeps its Mixture-of-Experts facts; called on transformers'
    config object, the MoeSpec (renormalize None: the family always renormalizes)."""

    count: str
    width: str
    renormalize: str | bool | None  # a key, or always (None) or never (False)
    shared: str | None = None  # the shared expert's width
    # or how many experts wide it is: a key (glm4_moe), or the count itself (hunyuan's one,
    # which its config states only by giving it the experts' width key)
    shared_count: str | int | None = None
    first_dense: str | None = None  # the number of first layers that keep a dense MLP
    # or the layers that hold experts: (first, last, every nth) keys (ERNIE's); the others
    # keep a dense MLP
    moe_span: tuple[str, str, str] | None = None
    # or a key listing each layer's MLP, "dense" or "sparse" (glm4_moe_lite's)
    layer_kinds: str | None = None
    # or "sigmoid", "sigmoid_logits" (chosen by logit plus bias: Kolibri's), or
    # "sparsemixer" (PhiMoE's top-2)
    scoring: str = "softmax"
    jitter: str | None = None  # sparsemixer's threshold key (router_jitter_noise)
    scale: str | None = None  # the weights' multiplier
    groups: tuple[str, str] | None = None  # the group count and how many are chosen
    # (key, value): the groups count only where that key says so (DeepSeek-V2's
    # topk_method "group_limited_greedy"; its "greedy" ignores them)
    groups_if: tuple[str, str] | None = None
    group_score: str = "top2"
    # a key naming the scores instead (cohere2_moe's expert_selection_fn): "softmax" (of
    # the chosen logits: renormalized), or "sigmoid" (renormalized as `renormalize` says)
    scoring_key: str | None = None
    # a key whose "average" halves the routed and the shared experts' outputs, "sum" adds
    # them (cohere2_moe's shared_expert_combination_strategy)
    shared_average: str | None = None

    def __call__(self, hf) -> MoeSpec:
        layers = hf.num_hidden_layers
        dense = tuple(getattr(hf, "mlp_only_layers", None) or ())
        step = getattr(hf, "decoder_sparse_step", 1) or 1
        dense += tuple(i for i in range(layers) if (i + 1) % step and i not in dense)
        if self.first_dense:
            dense += tuple(i for i in range(getattr(hf, self.first_dense)) if i not in dense)
        if self.moe_span:
            first, last, every = (getattr(hf, k) for k in self.moe_span)
            last = layers - 1 if last is None or last < 0 else last
            moe = {i for i in range(first, last + 1) if (i + 1) % every == 0}
            dense += tuple(i for i in range(layers) if i not in moe and i not in dense)
        if self.layer_kinds:
            kinds = getattr(hf, self.layer_kinds)
            dense += tuple(i for i, k in enumerate(kinds) if k == "dense" and i not in dense)
        width = getattr(hf, self.width)
        shared = getattr(hf, self.shared) if self.shared else 0
        if self.shared_count:
            count = self.shared_count
            shared = width * ((count if isinstance(count, int) else getattr(hf, count)) or 0)
        groups = (1, 1)
        grouped = self.groups_if is None or getattr(hf, self.groups_if[0]) == self.groups_if[1]
        if self.groups and grouped:
            groups = tuple(int(getattr(hf, k) or 1) for k in self.groups)
        renormalize = self.renormalize
        if isinstance(renormalize, str):
            renormalize = bool(getattr(hf, renormalize))
        scoring = self.scoring
        if self.scoring_key:
            scoring = getattr(hf, self.scoring_key)
            if scoring not in ("softmax", "sigmoid"):
                raise LlmpressError(
                    f"config.json gives {self.scoring_key} {scoring!r}: this family scores "
                    "experts by softmax or sigmoid; set one of them"
                )
            renormalize = scoring == "softmax" or renormalize  # the chosen's softmax sums to 1
        scale = float(getattr(hf, self.scale)) if self.scale else 1.0
        shared_scale = 1.0
        if self.shared_average and shared:
            combine = getattr(hf, self.shared_average)
            if combine not in ("average", "sum"):
                raise LlmpressError(
                    f"config.json gives {self.shared_average} {combine!r}: this family adds "
                    "its shared expert by 'sum' or 'average'; set one of them"
                )
            if combine == "average":  # (routed + shared) / 2, each halved exactly
                scale, shared_scale = scale / 2, 0.5
        top_k = _per_model(hf, "num_experts_per_tok")
        if self.scoring == "sparsemixer" and top_k != 2:
            raise LlmpressError(
                f"config.json gives num_experts_per_tok {top_k}, but this family's router "
                "(sparsemixer) picks 2 experts whatever it says: set it to 2"
            )
        return MoeSpec(
            experts=_per_model(hf, self.count),
            top_k=top_k,
            intermediate=width,
            renormalize=renormalize is None or renormalize,
            dense_layers=tuple(sorted(i for i in dense if i < layers)),
            shared=shared,
            scoring=scoring,
            jitter=float(getattr(hf, self.jitter)) if self.jitter else 0.0,
            scale=scale,
            groups=groups,
            group_score=self.group_score,
            shared_scale=shared_scale,
        )

    def place_dense(self, config: dict, dense: list[int]) -> dict:
        """`config` (at its new depth) with the keys that keep a dense MLP in layers `dense`
        and experts in the others, read back to check that the family's keys can say so."""
        layers = config["num_hidden_layers"]
        moe = [i for i in range(layers) if i not in dense]
        out = dict(config)
        if hasattr(_hf(config), "mlp_only_layers"):  # qwen2_moe, qwen3_moe: any layers
            out.update(mlp_only_layers=list(dense), decoder_sparse_step=1)
        if self.first_dense:
            out[self.first_dense] = len(dense)
        if self.layer_kinds:
            out[self.layer_kinds] = ["dense" if i in dense else "sparse" for i in range(layers)]
        if self.moe_span and moe:
            first, last, every = self.moe_span
            out.update({first: moe[0], last: moe[-1], every: 1})
        if self(_hf(out)).dense_layers != tuple(dense):
            raise LlmpressError(
                f"prune.layers: this family's config cannot keep a dense MLP in layers {dense} "
                f"of {layers}; remove fewer layers, or none"
            )
        return out


def _adjusted_ff(config: dict, width: int) -> int:
    """LFM2's MLP width from intermediate_size: two thirds, times block_ffn_dim_multiplier
    (then rounded up to block_multiple_of) where the config has one."""
    width = int(2 * width / 3)
    multiplier = config.get("block_ffn_dim_multiplier", 1.0)
    if multiplier is None:
        return width
    step = config.get("block_multiple_of", 256)
    return step * ((int(multiplier * width) + step - 1) // step)


LLAMA = Adapter(families=("llama",))

_QWEN_MOE_KEYS = ("num_experts", "moe_intermediate_size", "norm_topk_prob")
_ATTENTION_BIAS = (("attention_bias", ("q", "k", "v", "o")),)
_QK_NORMS = {"q_norm": "self_attn.q_norm", "k_norm": "self_attn.k_norm"}
# qwen3_5_text (Qwen3.5's language model): Gated DeltaNet linear attention in the layers
# layer_types names (3 of every 4), full attention in the rest, whose q_proj holds each
# head's query and output gate ([q_h; g_h]) with per-head q/k norms and a quarter of each
# head rotated; every hidden-wide and q/k norm x·(1+w)
_QWEN3_5 = replace(
    LLAMA,
    families=("qwen3_5_text",),
    architecture="Qwen3_5ForCausalLM",
    bias_options=_ATTENTION_BIAS,
    norm="rms1p",
    attn_gate_in_q=True,
    linear_attention=True,
    **_QK_NORMS,
    head_dim=256,
)
# bamba (IBM's Bamba): llama's attention, a part of each head rotated, in the layers
# layer_types calls full_attention; a Mamba-2 mixer in the others; the MLP under
# `feed_forward`, normed by pre_ff_layernorm
BAMBA = replace(
    LLAMA,
    families=("bamba",),
    architecture="BambaForCausalLM",
    mlp="feed_forward",
    mlp_norm="pre_ff_layernorm",
    gate="feed_forward.gate_proj",
    up="feed_forward.up_proj",
    down="feed_forward.down_proj",
    act_module="feed_forward.act_fn",
    final_norm="model.final_layernorm",
    bias_options=_ATTENTION_BIAS,
    linear_attention=True,
    mixer_kind="mamba2",
)
# jamba (AI21's Jamba Reasoning 3B, and the dense Jambas): Mamba (selective scan) layers
# where layers_block_type says "mamba", attention without rope in the others, the MLP under
# `feed_forward`; Jamba Mini and Large (experts) refused
JAMBA = replace(
    BAMBA,
    families=("jamba",),
    architecture="JambaForCausalLM",
    mixer_kind="mamba1",
    recurrent_layers=("layers_block_type", "mamba"),
    no_rope=True,
    derived_modules=(),  # (no rotary embedding to rebuild)
)
# lfm2 (Liquid AI's LFM2 350M-2.6B): gated short convolutions in the layers layer_types
# calls `conv`, attention with per-head q/k norms in the others, llama's MLP under its own
# names (w1, w3, w2) at the width LFM2's rule makes of intermediate_size; the final norm
# is `embedding_norm`
LFM2 = replace(
    LLAMA,
    families=("lfm2",),
    architecture="Lfm2ForCausalLM",
    attn_norm="operator_norm",
    mlp_norm="ffn_norm",
    final_norm="model.embedding_norm",
    o="self_attn.out_proj",
    mlp="feed_forward",
    gate="feed_forward.w1",
    up="feed_forward.w3",
    down="feed_forward.w2",
    act_module="feed_forward.act_fn",
    q_norm="self_attn.q_layernorm",
    k_norm="self_attn.k_layernorm",
    norm_eps="norm_eps",
    linear_attention=True,
    mixer_kind="short_conv",
    recurrent_layers=("layer_types", "conv"),
    adjusted_ff=True,
)
# granitemoehybrid (IBM Granite 4.0: the dense H-Micro, H-1B and H-350M, and Micro, 1B and
# 350M with attention in every layer): granite's four multipliers, Bamba's Mamba-2 layers
# where layer_types says, rope only where position_embedding_type is "rope" (the H models
# have none), the MLP `shared_mlp` with gate and up as one input_linear, gate rows first;
# the models with experts (H-Tiny, H-Small: stacked input_linear/output_linear) refused
GRANITE_HYBRID = replace(
    LLAMA,
    families=("granitemoehybrid",),
    architecture="GraniteMoeHybridForCausalLM",
    multipliers=True,
    mlp="shared_mlp",
    gate_up="shared_mlp.input_linear",
    down="shared_mlp.output_linear",
    act_module="shared_mlp.activation",
    dense_width="shared_intermediate_size",
    bias_options=_ATTENTION_BIAS,
    linear_attention=True,
    mixer_kind="mamba2",
    rope_switch=("position_embedding_type", "rope"),
    refused_options=(("num_local_experts", "experts beside the shared MLP"),),
)
# Hunyuan's: per head under their own names, after rope
_HUNYUAN_ATTENTION = {
    "q_norm": "self_attn.query_layernorm",
    "k_norm": "self_attn.key_layernorm",
    "qk_norm_after_rope": True,
}
# DeepSeek-V3's experts, as glm4_moe and dots1 keep them: sigmoid scores, the choice
# steered by a bias, groups, renormalized iff norm_topk_prob, scaled; ungated shared
# experts n experts wide; the first layers dense
_DEEPSEEK_V3_EXPERTS = {
    "moe": MoeKeys(
        "n_routed_experts",
        "moe_intermediate_size",
        "norm_topk_prob",
        shared_count="n_shared_experts",
        first_dense="first_k_dense_replace",
        scoring="sigmoid",
        scale="routed_scaling_factor",
        groups=("n_group", "topk_group"),
    ),
    "router": "mlp.gate",
    "expert": "mlp.experts",
    "shared_expert": "mlp.shared_experts",
    "choice_bias": "mlp.gate.e_score_correction_bias",
}

# the same without first_k_dense_replace (families that list their dense layers, or have
# none)
_V3_MOE_EVERY_LAYER = replace(_DEEPSEEK_V3_EXPERTS["moe"], first_dense=None)

_GEMMA3 = replace(
    LLAMA,
    families=("gemma3_text",),
    architecture="Gemma3ForCausalLM",
    mlp_norm="pre_feedforward_layernorm",
    post_attn_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    norm="rms1p",
    bias_options=_ATTENTION_BIAS,
    query_pre_attn_scalar=True,
    scaled_embedding=True,
    head_dim=256,
    **_QK_NORMS,
)
_GEMMA2 = replace(
    _GEMMA3,
    families=("gemma2",),
    architecture="Gemma2ForCausalLM",
    q_norm=None,
    k_norm=None,
    attn_softcap=True,
)

_OLMO2 = replace(
    LLAMA,
    families=("olmo2",),
    architecture="Olmo2ForCausalLM",
    attn_norm=None,
    mlp_norm=None,
    post_attn_norm="post_attention_layernorm",
    post_mlp_norm="post_feedforward_layernorm",
    qk_norm="full",
    **_QK_NORMS,
)

_GLM = replace(
    LLAMA,
    families=("glm",),
    architecture="GlmForCausalLM",
    gate_up="mlp.gate_up_proj",
    bias_options=(("attention_bias", ("q", "k", "v")),),
    rope_interleaved=True,
    head_dim=128,
)

# arcee (AFM-4.5B): llama's block with an MLP without a gate, down(relu(up(x))²)
_ARCEE = replace(LLAMA, families=("arcee",), architecture="ArceeForCausalLM", gate=None)

# starcoder2 (StarCoder2 3B, 7B, 15B): LayerNorms with a bias, an MLP without a gate
# (c_fc, c_proj: gelu_pytorch_tanh), every linear biased with use_bias
_STARCODER2 = replace(
    LLAMA,
    families=("starcoder2",),
    architecture="Starcoder2ForCausalLM",
    gate=None,
    up="mlp.c_fc",
    down="mlp.c_proj",
    norm="layer",
    norm_eps="norm_epsilon",
    norm_bias=True,
    bias_options=(("use_bias", ("q", "k", "v", "o", "up", "down")),),
)

# phi (Phi-1.5, Phi-2): cohere's parallel block under one LayerNorm, with its bias; an MLP
# without a gate (fc1, fc2: gelu_new), every linear biased, the head too; part of each
# head rotated
_PHI = replace(
    LLAMA,
    families=("phi",),
    architecture="PhiForCausalLM",
    mlp_norm=None,
    parallel=True,
    norm="layer",
    norm_eps="layer_norm_eps",
    norm_bias=True,
    final_norm="model.final_layernorm",
    o="self_attn.dense",
    gate=None,
    up="mlp.fc1",
    down="mlp.fc2",
    biased=("q", "k", "v", "o", "up", "down"),
    bias_options=(),
    head_bias=True,
    refused_options=(("qk_layernorm", "LayerNorms of q and k with a bias"),),
)

# stablelm (StableLM 2 1.6B and 12B, StableLM-3B-4E1T): LayerNorms with a bias, part of
# each head rotated, q/k/v biased with use_qkv_bias; parallel with use_parallel_residual
_STABLELM = replace(
    LLAMA,
    families=("stablelm",),
    architecture="StableLmForCausalLM",
    norm="layer",
    norm_eps="layer_norm_eps",
    norm_bias=True,
    bias_options=(("use_qkv_bias", ("q", "k", "v")),),
    parallel_option="use_parallel_residual",
    # StableLM 2 12B's: a LayerNorm (no bias) per head of q and per KV head of k, each its
    # own module
    q_norm="self_attn.q_layernorm.norms",
    k_norm="self_attn.k_layernorm.norms",
    qk_norm="each_head",
    qk_norm_modules=True,
    qk_norm_option="qk_layernorm",
    heads_span_hidden=True,  # its attention takes head_dim as hidden / heads
)

# gpt_neox (Pythia, GPT-NeoX-20B, Dolly v2, RedPajama-INCITE): LayerNorms with a bias,
# the fused q/k/v head by head, an MLP without a gate (the exact gelu), every linear
# biased, a quarter of each head rotated, an untied head; the block is parallel with
# use_parallel_residual, each branch reading a norm of its own
_GPT_NEOX = replace(
    LLAMA,
    families=("gpt_neox",),
    architecture="GPTNeoXForCausalLM",
    blocks="gpt_neox.layers",
    embed="gpt_neox.embed_in",
    final_norm="gpt_neox.final_layer_norm",
    lm_head="embed_out",
    head_loaded_as="lm_head",
    attn="attention",
    qkv="attention.query_key_value",
    qkv_by_head=True,
    o="attention.dense",
    gate=None,
    act_module="mlp.act",
    up="mlp.dense_h_to_4h",
    down="mlp.dense_4h_to_h",
    derived_modules=("gpt_neox.rotary_emb",),
    norm="layer",
    norm_eps="layer_norm_eps",
    norm_bias=True,
    biased=("up", "down"),
    bias_options=(("attention_bias", ("q", "k", "v", "o")),),
    parallel_option="use_parallel_residual",
    parallel_mlp_norm=True,
    heads_span_hidden=True,  # its attention takes the head width as hidden / heads
    stale_tensors=("attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq"),
)

# nemotron (Minitron 4B/8B, Nemotron-Mini-4B): LayerNorm1P, x·(1+w) + b after centering,
# an MLP without a gate (relu²), half of each head rotated
_NEMOTRON = replace(
    LLAMA,
    families=("nemotron",),
    architecture="NemotronForCausalLM",
    gate=None,
    norm="layer1p",
    norm_eps="norm_eps",
    norm_bias=True,
)

# apertus (Apertus 8B, 70B): arcee's MLP without a gate, its activation xIELU with
# learned parameters per layer (mlp.act_fn), qwen3's per-head q/k norms; the branch norms
# under their own names
_APERTUS = replace(
    _ARCEE,
    families=("apertus",),
    architecture="ApertusForCausalLM",
    attn_norm="attention_layernorm",
    mlp_norm="feedforward_layernorm",
    **_QK_NORMS,
)

# cohere (Command R, Aya Expanse): one LayerNorm without a bias feeding attention and MLP
# in parallel, rope over interleaved pairs, the logits times the config's logit_scale
_COHERE = replace(
    LLAMA,
    families=("cohere",),
    architecture="CohereForCausalLM",
    mlp_norm=None,
    norm="layer",
    norm_eps="layer_norm_eps",
    parallel=True,
    logit_scale="logit_scale",
    rope_interleaved=True,
    rope_tables="pairs",
    bias_options=(("attention_bias", ("q", "k", "v", "o")),),
    # Command R+'s per-head LayerNorms of q and k, each head its own weights
    q_norm="self_attn.q_norm",
    k_norm="self_attn.k_norm",
    qk_norm="each_head",
    qk_norm_option="use_qk_norm",
)

ADAPTERS: dict[str, Adapter] = {
    "llama": LLAMA,
    "mistral": replace(
        LLAMA, families=("mistral",), architecture="MistralForCausalLM", bias_options=()
    ),
    # ministral (Ministral-8B-Instruct-2410): mistral's block with its sliding layers listed
    # by layer_types
    "ministral": replace(
        LLAMA, families=("ministral",), architecture="MinistralForCausalLM", bias_options=()
    ),
    # ministral3 (Ministral 3, the language model of Mistral 3 checkpoints): mistral's
    # block with YaRN and Llama 4's query temperature past the original context
    # (rope_parameters' llama_4_scaling_beta: model/rope.py query_scales)
    "ministral3": replace(
        LLAMA, families=("ministral3",), architecture="Ministral3ForCausalLM", bias_options=()
    ),
    # seed_oss (Seed-OSS-36B): llama's block; q/k/v biased by default, o and the MLP each
    # by a key of their own
    "seed_oss": replace(
        LLAMA,
        families=("seed_oss",),
        architecture="SeedOssForCausalLM",
        bias_options=(
            ("attention_bias", ("q", "k", "v")),
            ("attention_out_bias", ("o",)),
            ("mlp_bias", ("gate", "up", "down")),
        ),
        head_dim=128,
    ),
    # granite: llama's block with its embedding, attention, residual and logit scalars
    "granite": replace(
        LLAMA, families=("granite",), architecture="GraniteForCausalLM", multipliers=True
    ),
    # granite_swa (Granite SWASH): granite's block and multipliers with sliding layers
    # (layer_types), each head's learned attention sink (`self_attn.sinks`), and a rope
    # base per layer, 0 for none (spec.py: layer_rope_theta)
    "granite_swa": replace(
        LLAMA,
        families=("granite_swa",),
        architecture="GraniteSWAForCausalLM",
        multipliers=True,
        sinks="self_attn.sinks",
        derived_modules=("model.rotary_emb", "model.rotary_embs"),
    ),
    # smollm3: llama's block; every few layers without rope (spec.py: no_rope_layers)
    "smollm3": replace(LLAMA, families=("smollm3",), architecture="SmolLM3ForCausalLM"),
    # hyperclovax (HyperCLOVA X SEED Think 14B): granite's four multipliers, its logits
    # times logits_scaling (granite divides), and with use_post_norm each branch's output
    # normed before the scaled residual add (post_norm1, post_norm2: Peri-LN)
    "hyperclovax": replace(
        LLAMA,
        families=("hyperclovax",),
        architecture="HyperCLOVAXForCausalLM",
        multipliers=True,
        logits_scaling_multiplies=True,
        post_attn_norm="post_norm1",
        post_mlp_norm="post_norm2",
        post_norm_option="use_post_norm",
    ),
    # qwen2: q/k/v always carry biases; cuts slice them too
    "qwen2": replace(
        LLAMA,
        families=("qwen2",),
        architecture="Qwen2ForCausalLM",
        biased=("q", "k", "v"),
        bias_options=(),
    ),
    "qwen3": replace(
        LLAMA,
        families=("qwen3",),
        architecture="Qwen3ForCausalLM",
        bias_options=_ATTENTION_BIAS,
        **_QK_NORMS,
        head_dim=128,
    ),
    "qwen3_5_text": _QWEN3_5,
    "bamba": BAMBA,
    "granitemoehybrid": GRANITE_HYBRID,
    "lfm2": LFM2,
    "jamba": JAMBA,
    # qwen3_5_moe_text (Qwen3.5-35B-A3B, 122B-A10B, 397B-A17B): qwen3_5_text's layers with
    # qwen2_moe's experts in every layer, always renormalized, and its gated shared expert
    "qwen3_5_moe_text": replace(
        _QWEN3_5,
        families=("qwen3_5_moe_text",),
        architecture="Qwen3_5MoeForCausalLM",
        moe=MoeKeys(
            "num_experts", "moe_intermediate_size", None, shared="shared_expert_intermediate_size"
        ),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_expert",
        shared_gate="mlp.shared_expert_gate",
    ),
    # qwen3_next (Qwen3-Next-80B-A3B): qwen3_5_text's layers with each DeltaNet's
    # projections stored grouped by key head (in_proj_qkvz, in_proj_ba) and qwen2_moe's
    # experts (norm_topk_prob, decoder_sparse_step, mlp_only_layers, a gated shared expert)
    "qwen3_next": replace(
        _QWEN3_5,
        families=("qwen3_next",),
        architecture="Qwen3NextForCausalLM",
        deltanet_grouped=True,
        moe=MoeKeys(*_QWEN_MOE_KEYS, shared="shared_expert_intermediate_size"),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_expert",
        shared_gate="mlp.shared_expert_gate",
    ),
    # hunyuan_v1_dense (Hunyuan 0.5B-7B): qwen3's per-head q/k norms under other names,
    # applied after rope; NTK-alpha rope (rope.py)
    "hunyuan_v1_dense": replace(
        LLAMA,
        families=("hunyuan_v1_dense",),
        architecture="HunYuanDenseV1ForCausalLM",
        **_HUNYUAN_ATTENTION,
    ),
    "gemma3_text": _GEMMA3,
    # gemma (Gemma 1 2B/7B, CodeGemma): llama's block with gemma's (1+w) norms and scaled
    # embedding, head_dim 256 by default
    "gemma": replace(
        LLAMA,
        families=("gemma",),
        architecture="GemmaForCausalLM",
        norm="rms1p",
        scaled_embedding=True,
        bias_options=_ATTENTION_BIAS,
        head_dim=256,
    ),
    # gemma2: gemma3's sandwich norms, scaled embedding and attention scalar, without its
    # q/k norms; attention scores softcapped (spec.attn_softcap)
    "gemma2": _GEMMA2,
    # vaultgemma (VaultGemma): gemma2 without the norms on the branch outputs
    "vaultgemma": replace(
        _GEMMA2,
        families=("vaultgemma",),
        architecture="VaultGemmaForCausalLM",
        post_attn_norm=None,
        post_mlp_norm=None,
    ),
    # olmo2: norms on the branch outputs only, q/k norms over all heads at once
    "olmo2": _OLMO2,
    # olmo3: olmo2's block; 3 sliding : 1 full layers, rope per layer type (spec.py)
    "olmo3": replace(_OLMO2, families=("olmo3",), architecture="Olmo3ForCausalLM"),
    # exaone4: olmo2's output-only norms with per-head q/k norms; with a sliding window
    # (3 sliding : 1 full), the full layers without rope
    "exaone4": replace(
        _OLMO2,
        families=("exaone4",),
        architecture="Exaone4ForCausalLM",
        qk_norm="head",
        full_layers_without_rope=True,
    ),
    # internlm3 (InternLM3-8B) and iquestcoder (IQuest-Coder-V1 7B-40B): llama's block, which
    # transformers runs them as; a head width of 128 where the config gives none
    "internlm3": replace(LLAMA, families=("internlm3",), head_dim=128),
    "iquestcoder": replace(LLAMA, families=("iquestcoder",), head_dim=128),
    # cwm (Code World Model 32B): llama's block (llama3 rope on every layer) with 1 full : 3
    # sliding layers listed by layer_types, q/k/v/o never biased
    "cwm": replace(
        LLAMA,
        families=("cwm",),
        architecture="CwmForCausalLM",
        bias_options=(("mlp_bias", ("gate", "up", "down")),),
        head_dim=128,
    ),
    # jais2 (Jais-2 8B, 70B): LayerNorms with a bias, an MLP without a gate (relu²), q/k/v/o
    # biased by attention_bias and up/down by mlp_bias (both on by default)
    "jais2": replace(
        LLAMA,
        families=("jais2",),
        architecture="Jais2ForCausalLM",
        gate=None,
        norm="layer",
        norm_eps="layer_norm_eps",
        norm_bias=True,
        bias_options=(_ATTENTION_BIAS[0], ("mlp_bias", ("up", "down"))),
        head_dim=128,
    ),
    "arcee": _ARCEE,
    "starcoder2": _STARCODER2,
    "nemotron": _NEMOTRON,
    "phi": _PHI,
    "stablelm": _STABLELM,
    "gpt_neox": _GPT_NEOX,
    "apertus": _APERTUS,
    # apertus1p5_text (Apertus 1.5's language model): apertus's block over a vocabulary
    # extended with visual and audio codes, its head kept to the text ids where
    # output_vocab_size says (fewer rows than the embedding)
    "apertus1p5_text": replace(
        _APERTUS, families=("apertus1p5_text",), architecture="Apertus1p5TextForCausalLM"
    ),
    "cohere": _COHERE,
    # cohere2 (Command R7B, Command A): cohere's block; 3 sliding : 1 full layers, the full
    # ones without rope
    "cohere2": replace(
        _COHERE,
        families=("cohere2",),
        architecture="Cohere2ForCausalLM",
        full_layers_without_rope=True,
    ),
    "qwen3_moe": replace(
        LLAMA,
        families=("qwen3_moe",),
        architecture="Qwen3MoeForCausalLM",
        bias_options=_ATTENTION_BIAS,
        moe=MoeKeys(*_QWEN_MOE_KEYS),
        router="mlp.gate",
        expert="mlp.experts",
        **_QK_NORMS,
    ),
    # flint (Flint): qwen3_moe's block with an attention sink per head (stored as
    # self_attn.softmax_offset), rope on the sliding layers only, sigmoid routing (no
    # choice bias), renormalized where norm_topk_prob, an ungated shared expert added in
    # full, the layers mlp_only_layers lists dense
    "flint": replace(
        LLAMA,
        families=("flint",),
        architecture="FlintForCausalLM",
        bias_options=_ATTENTION_BIAS,
        moe=MoeKeys(*_QWEN_MOE_KEYS, shared="shared_expert_intermediate_size", scoring="sigmoid"),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_expert",
        rotate_sliding_only=True,
        sinks="self_attn.softmax_offset",
        param_aliases=(("self_attn.softmax_offset", "self_attn.sinks"),),
        **_QK_NORMS,
    ),
    # kolibri1 (Aleph Alpha's Kolibri-1): exaone4's attention (per-head q/k norms; 4 sliding
    # : 1 full layers, the full ones without rope) in glm4's sandwich of norms (stored as
    # post_attn_norm, post_ffn_norm), experts in every layer beside a gated shared expert,
    # chosen by logit plus the bias the checkpoint keeps beside the MLP (moe.router),
    # weighted by the chosen logits' sigmoids, renormalized where norm_topk_prob says
    "kolibri1": replace(
        LLAMA,
        families=("kolibri1",),
        architecture="Kolibri1ForCausalLM",
        bias_options=(),
        full_layers_without_rope=True,
        post_attn_norm="post_attn_norm",
        post_mlp_norm="post_ffn_norm",
        module_aliases=(
            ("post_attn_norm", "post_self_attn_layernorm"),
            ("post_ffn_norm", "post_mlp_layernorm"),
        ),
        moe=MoeKeys(
            *_QWEN_MOE_KEYS, shared="shared_expert_intermediate_size", scoring="sigmoid_logits"
        ),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_experts",
        choice_bias="moe.router.expert_bias",
        **_QK_NORMS,
    ),
    # mellum (Mellum): qwen3_moe's block, its dense layers listed by mlp_layer_types, its
    # sliding layers by layer_types, rope per layer type
    "mellum": replace(
        LLAMA,
        families=("mellum",),
        architecture="MellumForCausalLM",
        bias_options=_ATTENTION_BIAS,
        moe=MoeKeys(*_QWEN_MOE_KEYS, layer_kinds="mlp_layer_types"),
        router="mlp.gate",
        expert="mlp.experts",
        **_QK_NORMS,
        head_dim=128,
    ),
    # flex_olmo (FlexOlmo): olmo2's block (norms on the branch outputs only, q/k norms over
    # all heads) with olmoe's experts
    "flex_olmo": replace(
        _OLMO2,
        families=("flex_olmo",),
        architecture="FlexOlmoForCausalLM",
        moe=MoeKeys("num_experts", "intermediate_size", "norm_topk_prob"),
        router="mlp.gate",
        expert="mlp.experts",
    ),
    # olmoe: qwen3_moe's experts (softmax router, top-k renormalized with norm_topk_prob)
    # under olmo2's q/k norms over all heads, in llama's pre-norm block; those norms are
    # hidden wide in transformers, so heads x head_dim stays hidden
    "olmoe": replace(
        LLAMA,
        families=("olmoe",),
        architecture="OlmoeForCausalLM",
        bias_options=_ATTENTION_BIAS,
        moe=MoeKeys("num_experts", "intermediate_size", "norm_topk_prob"),
        router="mlp.gate",
        expert="mlp.experts",
        qk_norm="full",
        heads_span_hidden=True,
        **_QK_NORMS,
    ),
    "mixtral": replace(
        LLAMA,
        families=("mixtral",),
        architecture="MixtralForCausalLM",
        bias_options=(),
        moe=MoeKeys("num_local_experts", "intermediate_size", None),
        mlp="block_sparse_moe",
        router="block_sparse_moe.gate",
        expert="block_sparse_moe.experts",
        expert_names=("w1", "w3", "w2"),
    ),
    # phimoe (Phi-3.5-MoE): mixtral's names and experts, routed by sparsemixer (each of the
    # top 2 weighted by a softmax over the experts near it, not renormalized); LayerNorms
    # with a bias, biased q/k/v/o by attention_bias, a head bias by lm_head_bias, LongRoPE
    # whose cos and sin are scaled by short_mscale (model/rope.py)
    "phimoe": replace(
        LLAMA,
        families=("phimoe",),
        architecture="PhimoeForCausalLM",
        norm="layer",
        norm_bias=True,
        moe=MoeKeys(
            "num_local_experts",
            "intermediate_size",
            False,
            scoring="sparsemixer",
            jitter="router_jitter_noise",
        ),
        mlp="block_sparse_moe",
        router="block_sparse_moe.gate",
        expert="block_sparse_moe.experts",
        expert_names=("w1", "w3", "w2"),
        head_bias=True,
    ),
    # minimax_m2 (MiniMax-M2): mixtral's names, sigmoid routing steered by a choice bias
    # (always renormalized), q/k norms over all heads (olmo2's), a partial rotary
    "minimax_m2": replace(
        LLAMA,
        families=("minimax_m2",),
        architecture="MiniMaxM2ForCausalLM",
        bias_options=(),
        moe=MoeKeys("num_local_experts", "intermediate_size", None, scoring="sigmoid"),
        mlp="block_sparse_moe",
        router="block_sparse_moe.gate",
        expert="block_sparse_moe.experts",
        expert_names=("w1", "w3", "w2"),
        choice_bias="block_sparse_moe.e_score_correction_bias",
        qk_norm="full",
        **_QK_NORMS,
    ),
    # hy_v3 (Tencent's Hy3): llama's pre-norm block with per-head q/k norms (apertus's
    # attention); DeepSeek-V3's routing (sigmoids chosen with a bias), always renormalized,
    # times router_scaling_factor, an fp32 router stored as mlp.router.gate, the bias as
    # mlp.expert_bias, gated shared experts as mlp.shared_mlp; dense layers by
    # mlp_layer_types
    "hy_v3": replace(
        LLAMA,
        families=("hy_v3",),
        architecture="HYV3ForCausalLM",
        bias_options=_ATTENTION_BIAS,
        refused_options=(("mlp_bias", "biases on the dense MLPs and the shared experts"),),
        moe=MoeKeys(
            "num_experts",
            "moe_intermediate_size",
            None,
            shared_count="num_shared_experts",
            layer_kinds="mlp_layer_types",
            scoring="sigmoid",
            scale="router_scaling_factor",
        ),
        router="mlp.router.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_mlp",
        load_renames=(("mlp.shared_mlp", "mlp.shared_experts"),),
        choice_bias="mlp.expert_bias",
        **_QK_NORMS,
    ),
    # glm4_moe (GLM-4.5, GLM-4.5-Air, GLM-4.6): glm's attention (biased q/k/v, half of each
    # head rotated, here in halves) with optional per-head q/k norms; sigmoid routing
    # steered by a choice bias, renormalized and scaled, an ungated shared expert, and its
    # first layers dense
    "glm4_moe": replace(
        LLAMA,
        families=("glm4_moe",),
        architecture="Glm4MoeForCausalLM",
        bias_options=(("attention_bias", ("q", "k", "v")),),
        **_DEEPSEEK_V3_EXPERTS,
        qk_norm_option="use_qk_norm",
        predictor_layers="num_mtp_layers",
        **_QK_NORMS,
    ),
    # deepseek_v3 (DeepSeek-V3, V3.1, R1): multi-head latent attention, with
    # the experts glm4_moe took from it (sigmoid scores steered by a bias, groups, scaled,
    # an ungated shared expert, the first layers dense)
    "deepseek_v3": replace(
        LLAMA,
        families=("deepseek_v3",),
        architecture="DeepseekV3ForCausalLM",
        latent_attention=True,
        **_DEEPSEEK_V3_EXPERTS,
        predictor_layers="num_mtp_layers",
    ),
    # sarvam_mla (Sarvam-105B): DeepSeek-V3's model (transformers runs it as such) with one
    # q_proj and ungrouped routing by default; its config class converts the published
    # legacy keys (head_dim as the latent's width, "deepseek_yarn" rope scaling)
    "sarvam_mla": replace(
        LLAMA,
        families=("sarvam_mla",),
        architecture="DeepseekV3ForCausalLM",
        latent_attention=True,
        **_DEEPSEEK_V3_EXPERTS,
        predictor_layers="num_mtp_layers",
    ),
    # axk1 (SK Telecom's A.X-K1): DeepSeek-V3's model (latent attention, q always through
    # its low-rank pair; grouped sigmoid routing) with the experts' output normed in the
    # layers mlp_layer_types calls sparse
    "axk1": replace(
        LLAMA,
        families=("axk1",),
        architecture="AXK1ForCausalLM",
        latent_attention=True,
        **{
            **_DEEPSEEK_V3_EXPERTS,
            "moe": replace(_V3_MOE_EVERY_LAYER, layer_kinds="mlp_layer_types"),
        },
        moe_out_norm="post_mlp_layernorm",
    ),
    # youtu (Youtu-LLM): DeepSeek-V3's latent attention in llama's block, a dense MLP in
    # every layer, the head tied by default
    "youtu": replace(
        LLAMA, families=("youtu",), architecture="YoutuForCausalLM", latent_attention=True
    ),
    # minicpm3 (MiniCPM3-4B): DeepSeek-V2's latent attention with llama's rope (halves), a
    # dense MLP, MiniCPM's embedding, residual and logit scales
    "minicpm3": replace(
        LLAMA,
        families=("minicpm3",),
        architecture="MiniCPM3ForCausalLM",
        latent_attention=True,
        depth_scaled=True,
    ),
    # solar_open (Solar Open): llama's attention (o unbiased) with glm4_moe's experts in
    # every layer
    "solar_open": replace(
        LLAMA,
        families=("solar_open",),
        architecture="SolarOpenForCausalLM",
        bias_options=(("attention_bias", ("q", "k", "v")),),
        **{**_DEEPSEEK_V3_EXPERTS, "moe": _V3_MOE_EVERY_LAYER},
        head_dim=128,
    ),
    # glm4_moe_lite (GLM-4.7-Flash): DeepSeek-V3's latent attention and experts, its dense
    # layers listed by mlp_layer_types
    "glm4_moe_lite": replace(
        LLAMA,
        families=("glm4_moe_lite",),
        architecture="Glm4MoeLiteForCausalLM",
        latent_attention=True,
        **{
            **_DEEPSEEK_V3_EXPERTS,
            "moe": replace(_V3_MOE_EVERY_LAYER, layer_kinds="mlp_layer_types"),
        },
        predictor_layers="num_nextn_predict_layers",
    ),
    # minicpm5_moe (MiniCPM5-15B-A2.5B): llama's attention whose q_proj holds each head's
    # query and output gate ([q_h; g_h]; transformers' q_gate_proj), the attention's output
    # times the gate's sigmoid; q/k/v/o biased by attention_bias; DeepSeek-V3's experts in
    # the layers mlp_layer_types calls sparse
    "minicpm5_moe": replace(
        LLAMA,
        families=("minicpm5_moe",),
        architecture="MiniCPM5MoeForCausalLM",
        bias_options=_ATTENTION_BIAS,
        attn_gate_in_q=True,
        module_aliases=(("self_attn.q_proj", "self_attn.q_gate_proj"),),
        **{
            **_DEEPSEEK_V3_EXPERTS,
            "moe": replace(_V3_MOE_EVERY_LAYER, layer_kinds="mlp_layer_types"),
        },
        head_dim=128,
    ),
    # afmoe (Arcee Trinity Nano, Mini, Large): sandwich norms under their own names (the
    # attention's output normed by post_attention_layernorm), per-head q/k norms, attention's
    # output times sigmoid(gate_proj(x)); 3 sliding : 1 full layers, only the sliding ones
    # rotated; DeepSeek-V3's sigmoid scores steered by expert_bias (no groups), always
    # renormalized, times route_scale; ungated shared experts; the first num_dense_layers
    # dense; the embedding times sqrt(hidden) where mup_enabled
    "afmoe": replace(
        LLAMA,
        families=("afmoe",),
        architecture="AfmoeForCausalLM",
        mlp_norm="pre_mlp_layernorm",
        post_attn_norm="post_attention_layernorm",
        post_mlp_norm="post_mlp_layernorm",
        bias_options=_ATTENTION_BIAS,
        full_layers_without_rope=True,
        attn_gate="self_attn.gate_proj",
        scaled_embedding_option="mup_enabled",
        moe=MoeKeys(
            "num_experts",
            "moe_intermediate_size",
            None,
            shared_count="num_shared_experts",
            first_dense="num_dense_layers",
            scoring="sigmoid",
            scale="route_scale",
        ),
        router="mlp.router.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_experts",
        choice_bias="mlp.expert_bias",
        head_dim=128,
        **_QK_NORMS,
    ),
    # cohere2_moe (Command A+): cohere2's parallel block under one norm (RMS where
    # rms_norm_eps is set, else the LayerNorm), rope over interleaved pairs on the sliding
    # layers only (and on the dense ones where prefix_dense_sliding_window_pattern is 1);
    # experts as wide as intermediate_size, scored by expert_selection_fn (softmax of the
    # chosen, or sigmoid), ungated shared experts averaged with the routed ones or added;
    # dense layers by mlp_layer_types, prefix_dense_intermediate_size wide
    "cohere2_moe": replace(
        _COHERE,
        families=("cohere2_moe",),
        architecture="Cohere2MoeForCausalLM",
        q_norm=None,
        k_norm=None,
        qk_norm_option=None,
        rotate_sliding_only=True,
        rms_option="rms_norm_eps",
        dense_width="prefix_dense_intermediate_size",
        moe=MoeKeys(
            "num_experts",
            "intermediate_size",
            "norm_topk_prob",  # the sigmoid's; the softmax of the chosen is renormalized
            shared_count="num_shared_experts",
            layer_kinds="mlp_layer_types",
            scoring_key="expert_selection_fn",
            shared_average="shared_expert_combination_strategy",
        ),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_experts",
    ),
    # exaone_moe (K-EXAONE-236B-A23B): llama's pre-norm block, unbiased, with per-head q/k
    # norms; 3 sliding : 1 full layers, the full ones without rope (exaone4's); DeepSeek-V3's
    # experts in the layers mlp_layer_types calls sparse, the choice bias beside the router
    "exaone_moe": replace(
        LLAMA,
        families=("exaone_moe",),
        architecture="ExaoneMoeForCausalLM",
        bias_options=(),
        full_layers_without_rope=True,
        **{
            **_DEEPSEEK_V3_EXPERTS,
            "moe": replace(
                _V3_MOE_EVERY_LAYER,
                count="num_experts",
                shared_count="num_shared_experts",
                layer_kinds="mlp_layer_types",
            ),
            "choice_bias": "mlp.e_score_correction_bias",
        },
        **_QK_NORMS,
    ),
    # deepseek_v2 (DeepSeek-V2, V2.5, V2-Lite, DeepSeek-Coder-V2): V3's latent attention,
    # its rope taken as complex numbers; softmax routing, never renormalized, scaled, within
    # the best groups (by their best expert) where topk_method says group_limited_greedy;
    # shared experts n experts wide, the first layers dense
    "deepseek_v2": replace(
        LLAMA,
        families=("deepseek_v2",),
        architecture="DeepseekV2ForCausalLM",
        latent_attention=True,
        rope_tables="complex",
        moe=MoeKeys(
            "n_routed_experts",
            "moe_intermediate_size",
            False,
            shared_count="n_shared_experts",
            first_dense="first_k_dense_replace",
            scale="routed_scaling_factor",
            groups=("n_group", "topk_group"),
            groups_if=("topk_method", "group_limited_greedy"),
            group_score="max",
        ),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_experts",
    ),
    # dots1 (dots.llm1): qwen3's attention (per-head q/k norms, a sliding window past
    # max_window_layers) with glm4_moe's experts (DeepSeek-V3's routing and shared experts,
    # its first layers dense)
    "dots1": replace(
        LLAMA,
        families=("dots1",),
        architecture="Dots1ForCausalLM",
        bias_options=_ATTENTION_BIAS,
        **_DEEPSEEK_V3_EXPERTS,
        **_QK_NORMS,
    ),
    # ernie4_5_moe (ERNIE-4.5-21B-A3B, 300B-A47B): ernie4_5's attention (every linear biased
    # with use_bias, the whole head rotated in interleaved pairs); softmax routing steered
    # by a choice bias, always renormalized; ungated shared experts; experts in the layers
    # from moe_layer_start_index to moe_layer_end_index, every moe_layer_interval-th
    "ernie4_5_moe": replace(
        LLAMA,
        families=("ernie4_5_moe",),
        architecture="Ernie4_5_MoeForCausalLM",
        bias_options=(("use_bias", ("q", "k", "v", "o", "gate", "up", "down")),),
        rope_interleaved=True,
        moe=MoeKeys(
            "moe_num_experts",
            "moe_intermediate_size",
            None,
            shared_count="moe_num_shared_experts",
            moe_span=("moe_layer_start_index", "moe_layer_end_index", "moe_layer_interval"),
        ),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_experts",
        choice_bias="mlp.moe_statics.e_score_correction_bias",
        choice_bias_2d=True,
    ),
    # hunyuan_v1_moe (Hunyuan-A13B): hunyuan_v1_dense's attention over softmax-routed,
    # renormalized experts and an ungated shared MLP, each as wide as intermediate_size (so
    # cut with the experts, as glm4_moe's)
    "hunyuan_v1_moe": replace(
        LLAMA,
        families=("hunyuan_v1_moe",),
        architecture="HunYuanMoEV1ForCausalLM",
        **_HUNYUAN_ATTENTION,
        moe=MoeKeys("num_experts", "intermediate_size", None, shared_count=1),
        router="mlp.gate.wg",
        expert="mlp.experts",
        shared_expert="mlp.shared_mlp",
    ),
    "qwen2_moe": replace(
        LLAMA,
        families=("qwen2_moe",),
        architecture="Qwen2MoeForCausalLM",
        bias_options=(("qkv_bias", ("q", "k", "v")),),
        moe=MoeKeys(*_QWEN_MOE_KEYS, shared="shared_expert_intermediate_size"),
        router="mlp.gate",
        expert="mlp.experts",
        shared_expert="mlp.shared_expert",
        shared_gate="mlp.shared_expert_gate",
    ),
    # glm (GLM-4-9B-chat-hf, GLM-Edge): llama's block with gate/up stored as one tensor,
    # biased q/k/v, half of each head rotated in interleaved pairs
    "glm": _GLM,
    # glm4: glm's block with gemma3's sandwich norms under its own names (x·w)
    "glm4": replace(
        _GLM,
        families=("glm4",),
        architecture="Glm4ForCausalLM",
        post_attn_norm="post_self_attn_layernorm",
        post_mlp_norm="post_mlp_layernorm",
    ),
    # helium (Kyutai Helium 1): llama's block, q/k/v biased with attention_bias (o never),
    # the whole head rotated in interleaved pairs
    "helium": replace(
        LLAMA,
        families=("helium",),
        architecture="HeliumForCausalLM",
        bias_options=(("attention_bias", ("q", "k", "v")), ("mlp_bias", ("gate", "up", "down"))),
        rope_interleaved=True,
        heads_span_hidden=True,
        head_dim=128,
    ),
    # ernie4_5 (ERNIE 4.5 dense): llama's block, every linear biased with use_bias, the
    # whole head rotated in interleaved pairs (glm4's rope)
    "ernie4_5": replace(
        LLAMA,
        families=("ernie4_5",),
        architecture="Ernie4_5ForCausalLM",
        bias_options=(("use_bias", ("q", "k", "v", "o", "gate", "up", "down")),),
        rope_interleaved=True,
        head_dim=128,
    ),
    "phi3": replace(
        LLAMA,
        families=("phi3",),
        architecture="Phi3ForCausalLM",
        qkv="self_attn.qkv_proj",
        gate_up="mlp.gate_up_proj",
        bias_options=(),
        heads_span_hidden=True,
    ),
}


_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_OPTIONAL_SIZES = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_POSITIVE_NUMBERS = ("rms_norm_eps", "rope_theta")


def check_config(config: dict, where: str) -> ModelShape:
    """The sizes config.json (`where`) describes, each refused in one line when it is
    missing, not a positive integer, or inconsistent with another (heads that do not
    divide the width), so that no malformed config reaches the tensor arithmetic."""
    fix = "fix it or re-download the model"
    for key in (*_SIZES, "vocab_size", *_OPTIONAL_SIZES):
        value = config.get(key)
        if value is None and key in _OPTIONAL_SIZES:
            continue
        if value is None:
            raise LlmpressError(f"{where}: {key} is missing; {fix}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise LlmpressError(f"{where}: {key} is {value!r}, not a positive integer; {fix}")
    for key in _POSITIVE_NUMBERS:
        value = config.get(key)
        if value is not None and not _positive_number(value):
            raise LlmpressError(f"{where}: {key} is {value!r}, not a positive number; {fix}")
    heads, hidden = config["num_attention_heads"], config["hidden_size"]
    kv_heads = config.get("num_key_value_heads") or heads
    # (multi-head latent attention's heads are as wide as its own keys say: GLM-4.7-Flash
    # has 20 heads of a 2048 width)
    if config.get("head_dim") is None and config.get("kv_lora_rank") is None and hidden % heads:
        raise LlmpressError(
            f"{where}: num_attention_heads {heads} does not divide hidden_size {hidden}; {fix}"
        )
    if heads % kv_heads:
        raise LlmpressError(
            f"{where}: num_key_value_heads {kv_heads} does not divide num_attention_heads "
            f"{heads}; {fix}"
        )
    return adapter_for(config).shape(config)


def _positive_number(value: object) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def dense_shapes(adapter: Adapter, shape: ModelShape) -> dict[str, tuple[int, ...]]:
    """Each tensor name a checkpoint of `shape` holds in full (as `.weight`, unless a
    quantized linear), with the shape config.json implies for it."""
    out = {
        f"{adapter.embed}.weight": (shape.vocab, shape.hidden),
        f"{adapter.final_norm}.weight": (shape.hidden,),
        f"{adapter.lm_head}.weight": (shape.head_rows, shape.hidden),
    }
    for i in range(shape.layers):
        block = adapter.layer(i)
        for module, dims in _block_shapes(block, shape).items():
            out[f"{adapter.block_prefix(i)}.{module}.weight"] = dims
        if block.experts and adapter.choice_bias:
            dims = (1, block.experts) if adapter.choice_bias_2d else (block.experts,)
            out[f"{adapter.block_prefix(i)}.{adapter.choice_bias}"] = dims
        if block.mixer:  # the recurrent mixer's tensors besides its linears
            for name, dims in block.mixer.tensors(shape.hidden).items():
                out[f"{adapter.block_prefix(i)}.{name}"] = dims
    return out


def _block_shapes(adapter: Adapter, shape: ModelShape) -> dict[str, tuple[int, ...]]:
    per_block = {n: (shape.hidden,) for n in adapter.block_norms}
    per_block.update(adapter.linear_shapes(shape))
    if adapter.latent:  # MLA's norms of the q and kv latents
        latent = adapter.latent.shapes(shape.heads, shape.hidden)
        per_block.update({n: latent[n] for n in (adapter.latent.q_a_norm, adapter.latent.kv_a_norm)
                          if n in latent})  # fmt: skip
    kind = adapter.qk_norm
    for norm, heads in ((adapter.q_norm, shape.heads), (adapter.k_norm, shape.kv_heads)):
        if norm and adapter.qk_norm_modules:  # one module per head
            per_block.update({f"{norm}.{h}": (shape.head_dim,) for h in range(heads)})
        elif norm:
            per_block[norm] = {
                "full": (heads * shape.head_dim,),
                "each_head": (heads, shape.head_dim),
            }.get(kind, (shape.head_dim,))
    if adapter.experts:
        per_block[adapter.router] = (adapter.experts, shape.hidden)
    if adapter.shared_width and adapter.shared_gate:
        per_block[adapter.shared_gate] = (1, shape.hidden)
    return per_block


def adapter_for(config: dict) -> Adapter:
    """The adapter for a config.json, or a one-line refusal naming what is supported.
    A Mixture-of-Experts adapter comes bound to the config's expert count and width."""
    model_type = config.get("model_type")
    adapter = ADAPTERS.get(model_type or "")
    if adapter is None:
        supported = ", ".join(sorted(ADAPTERS))
        raise LlmpressError(
            f"unsupported architecture {model_type!r}: llmpress supports {supported}; "
            "open an issue with the model's config.json"
        )
    options = (
        adapter.qk_norm_option,
        adapter.parallel_option,
        adapter.post_norm_option,
        adapter.rms_option,
        *adapter.refused_options,
    )
    sized = adapter.latent_attention or adapter.linear_attention  # by the config
    if adapter.moe is None and not any(options) and not sized:
        return adapter
    hf = _hf(config)  # once: transformers' config object, its defaults filled in
    if adapter.linear_attention:
        key, kind = adapter.recurrent_layers
        kinds = tuple(getattr(hf, key))
        mixer = {
            "mamba2": lambda: {"mamba": Mamba2.of(hf)},
            "mamba1": lambda: {"mamba": Mamba1.of(hf)},
            "short_conv": lambda: {"short_conv": ShortConv.of(hf)},
            "deltanet": lambda: {"deltanet": GatedDeltaNet.of(hf, adapter.deltanet_grouped)},
        }[adapter.mixer_kind]()
        adapter = replace(
            adapter, **mixer, linear_layers=tuple(i for i, t in enumerate(kinds) if t == kind)
        )
    if adapter.latent_attention:
        adapter = replace(adapter, latent=Latent.of(hf, adapter.rope_tables == "complex"))
    if adapter.parallel_option and getattr(hf, adapter.parallel_option, False):
        mlp_norm = adapter.mlp_norm if adapter.parallel_mlp_norm else None
        adapter = replace(adapter, parallel=True, mlp_norm=mlp_norm)
    for key, what in adapter.refused_options:
        if getattr(hf, key, False):
            raise LlmpressError(
                f"{model_type}: {key} ({what}) is not supported yet; open an issue with the "
                "model's config.json"
            )
    if adapter.qk_norm_option and not getattr(hf, adapter.qk_norm_option, False):
        adapter = replace(adapter, q_norm=None, k_norm=None)
    if adapter.rms_option and getattr(hf, adapter.rms_option, None) is not None:
        adapter = replace(adapter, norm="rms", norm_eps=adapter.rms_option)
    if adapter.post_norm_option and not getattr(hf, adapter.post_norm_option, False):
        adapter = replace(adapter, post_attn_norm=None, post_mlp_norm=None)
    if adapter.moe is not None:
        moe = adapter.moe(hf)
        adapter = replace(
            adapter,
            experts=moe.experts,
            expert_width=moe.intermediate,
            shared_width=moe.shared,
            dense_layers=moe.dense_layers,
        )
    return adapter


def _hf(config: dict):
    from compress.model.spec import hf_config

    return hf_config(config)
