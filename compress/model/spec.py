"""What a family's decoder blocks compute, as one description (BlockSpec).

The adapter says where the parts are (module names); the BlockSpec says what they compute:
norms and where they sit, activation, biases, rope per layer, attention and embedding
scales, the residual and logit multipliers, attention and logit softcapping, the
sliding-window pattern, the head and the MLP kind. It is read from config.json through
transformers' own config class, so class defaults and derived fields (gemma3's
layer_types, nested rope_parameters, Phi-3's original context) are the ones transformers
applies. Every consumer that implements blocks (the runtime, in torch, C and Triton)
checks the whole description against what it implements and refuses the rest in one
line; tests/test_families.py checks that no field goes unread.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from compress.errors import LlmpressError
from compress.model.rope import RopeSpec, latent_attn_scale, rope_spec

ROLES = ("q", "k", "v", "o", "gate", "up", "down")


@dataclass(frozen=True)
class MoeSpec:
    """Experts in place of the dense MLP: a router picks top_k of `experts` per token."""

    experts: int
    top_k: int
    intermediate: int  # each expert's MLP width
    renormalize: bool  # the top-k weights are rescaled to sum to 1
    dense_layers: tuple[int, ...] = ()  # layers that keep a dense MLP
    shared: int = 0  # width of a shared expert every token runs (0: none), its output
    # times sigmoid(shared_gate · x) (qwen2_moe) or as it is (glm4_moe), added to the
    # routed experts'
    # the router's scores: softmax of the logits, "sigmoid"s, "sigmoid_logits" (sigmoids
    # chosen by logit plus the choice bias: Kolibri's), or "sparsemixer" (PhiMoE's top-2,
    # each weight a softmax over the experts within `jitter` of its pick: route_scores)
    scoring: str = "softmax"
    jitter: float = 0.0  # sparsemixer's threshold (router_jitter_noise)
    scale: float = 1.0  # the chosen weights times this (glm4_moe's routed_scaling_factor)
    groups: tuple[int, int] = (1, 1)  # (n_group, topk_group): chosen within the best groups
    group_score: str = "top2"  # a group's score: its best two summed (V3's), or its "max" (V2's)
    # the shared expert's output times this (cohere2_moe's "average" of routed and shared:
    # both halved, the routed ones through `scale`)
    shared_scale: float = 1.0


@dataclass(frozen=True)
class BlockSpec:
    # "rms": x·w; "rms1p": x·(1+w) (gemma); "layer": the mean subtracted first, then x·w
    # (cohere's LayerNorm without a bias); "layer1p": that, times (1+w) (nemotron); each
    # normalized in fp32
    norm: str
    eps: float
    pre_norm: bool  # the branches read the residual normed (olmo2's read it as it is)
    sandwich: bool  # the branch outputs are normed, before the residual add (gemma3, olmo2)
    # norms of q and k before rope: "none", "head" (each head, one weight), "full" (all heads
    # at once: olmo2), "each_head" (each head with its own weight row: cohere's LayerNorms)
    qk_norm: str
    activation: str  # transformers' ACT2FN name: silu, gelu_pytorch_tanh
    biases: frozenset[str]  # the roles (ROLES) whose linears carry a bias
    fused_checkpoint: bool  # q/k/v and gate/up are stored as one tensor each (phi3)
    rope: tuple[RopeSpec, ...]  # per layer
    attn_scale: float  # multiplies q·k
    attn_softcap: float | None  # scores = c·tanh(scores/c), before the mask (gemma2)
    embed_scale: float  # multiplies the embedding lookup
    residual_scale: float  # multiplies each branch's output before the residual add (granite)
    logit_scale: float  # multiplies the logits, before any softcap (granite: 1/logits_scaling)
    logit_softcap: float | None  # logits = c·tanh(logits/c)
    windows: tuple[int | None, ...]  # per layer: keys within the last W positions, or all
    tied: bool  # the lm_head is the embedding matrix
    mlp: MoeSpec | None  # None: a dense gated MLP
    qkv_clip: float | None = None  # q, k and v clamped to [-c, c] after their norms (olmoe)
    qk_norm_after_rope: bool = False  # the q/k norms follow rope instead (hunyuan)
    # attention and MLP read the same normed input and both add to the residual (cohere)
    parallel: bool = False
    # the dense MLP is down(act(gate) · up); without a gate, down(act(up)) (arcee)
    gated_mlp: bool = True
    norm_bias: bool = False  # the norms add a bias after the weight (starcoder2, nemotron)
    # DeepSeek's multi-head latent attention (Adapter.latent) in place of q/k/v
    latent_attention: bool = False
    # attention's output times sigmoid(gate(x)), channel by channel, before o: x the
    # attention's input, gate a linear as wide as q (afmoe's self_attn.gate_proj)
    attn_gate: bool = False
    # each head's softmax denominator plus exp(sink), a learned per-head score with no value
    # behind it (Adapter.sinks: gpt-oss, granite_swa)
    attn_sinks: bool = False
    # the layers whose mixer is Gated DeltaNet linear attention, not attention
    # (Adapter.deltanet: Qwen3.5's); their rope and window entries are unused
    linear_layers: tuple[int, ...] = ()

    @property
    def layers(self) -> int:
        return len(self.rope)

    @property
    def kv_layers(self) -> tuple[int, ...]:
        """Each layer's place among the layers the KV cache holds, -1 for a DeltaNet layer
        (its state is not keys and values): the cache keeps the attention layers alone, a
        quarter of Qwen3.5's."""
        linear, places, n = set(self.linear_layers), [], 0
        for i in range(self.layers):
            places.append(-1 if i in linear else n)
            n += i not in linear
        return tuple(places)

    @property
    def cached_layers(self) -> int:
        """The layers the KV cache holds."""
        return self.layers - len(self.linear_layers)

    @property
    def centered(self) -> bool:
        """The norms subtract the mean first (LayerNorms)."""
        return self.norm in ("layer", "layer1p")

    @property
    def norm_offset(self) -> float:
        """What the stored norm weight is offset by: 1 for x·(1+w) norms."""
        return 1.0 if self.norm.endswith("1p") else 0.0


def hf_config(config: dict):
    """transformers' config object for a config.json dict (its class defaults filled in)."""
    from transformers import AutoConfig

    clean = {k: _floats(v) for k, v in config.items() if k != "quantization_config"}
    try:
        return AutoConfig.for_model(**clean)
    except Exception as e:  # a config transformers itself rejects
        raise LlmpressError(
            f"config.json is not one transformers accepts ({str(e).splitlines()[0][:160]}); "
            "fix it or re-download the model"
        ) from None


def _floats(value):
    """A config value with transformers' JSON form of non-finite floats decoded:
    {"__float__": "Infinity"} (Bamba's time_step_limit, as save_pretrained writes it)."""
    if isinstance(value, dict):
        tag = value.get("__float__") if len(value) == 1 else None
        if tag in ("Infinity", "-Infinity", "NaN"):
            return float(tag.lower().replace("infinity", "inf"))
        return {k: _floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_floats(v) for v in value]
    return value


def describe(config: dict, adapter) -> BlockSpec:
    """The BlockSpec of a config.json dict, for the family `adapter` names."""
    hf = hf_config(config)
    layers = hf.num_hidden_layers
    head_dim = getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    types = getattr(hf, "layer_types", None) or ["full_attention"] * layers
    window = getattr(hf, "sliding_window", None) or None
    if getattr(hf, "layer_types", None) is not None:
        windows = tuple(window if t == "sliding_attention" else None for t in types)
    else:
        windows = (window,) * layers
    params = getattr(hf, "rope_parameters", None) or {}  # (none: Jamba, which rotates nothing)
    top = {"partial_rotary_factor": getattr(hf, "partial_rotary_factor", None)}
    ropes = []
    # granite_swa's base per layer, 0 for a layer without rope (its model builds one
    # rotary embedding per distinct base)
    thetas = getattr(hf, "layer_rope_theta", None) or [None] * len(types)
    if len(thetas) != len(types):
        raise LlmpressError(
            f"config.json's layer_rope_theta names {len(thetas)} layers, its layer_types "
            f"{len(types)}: give each layer one base (0: no rope)"
        )
    for t, theta in zip(types, thetas, strict=True):
        p = params.get(t, params) if isinstance(params.get(t), dict) else params
        p = {**{k: v for k, v in top.items() if v is not None}, **p}
        if theta:
            p = {**p, "rope_theta": theta}
        rope = rope_spec(p, head_dim, hf.max_position_embeddings)
        ropes.append(rope if theta != 0 else replace(rope, kind="none", params=()))
    switched = adapter.rope_switch and getattr(hf, adapter.rope_switch[0], None)
    if adapter.no_rope or (adapter.rope_switch and switched != adapter.rope_switch[1]):
        ropes = [replace(r, kind="none", params=()) for r in ropes]  # (granitemoehybrid's NoPE)
    for i, rotates in enumerate(getattr(hf, "no_rope_layers", None) or ()):
        if not rotates:  # SmolLM3's NoPE layers: 0 in no_rope_layers
            ropes[i] = replace(ropes[i], kind="none", params=())
    if adapter.full_layers_without_rope and window is not None:  # exaone4's global layers
        for i, t in enumerate(types):
            if t == "full_attention":
                ropes[i] = replace(ropes[i], kind="none", params=())
    if adapter.rotate_sliding_only:  # cohere2_moe's: the sliding layers, and force_rope's
        kinds = getattr(hf, "mlp_layer_types", None) or ["sparse"] * layers
        forced = getattr(hf, "prefix_dense_sliding_window_pattern", None) == 1
        for i, t in enumerate(types):
            sliding = t == "sliding_attention" and window is not None
            if not (sliding or (forced and kinds[i] == "dense")):
                ropes[i] = replace(ropes[i], kind="none", params=())
    biases = set(adapter.biased)
    for key, roles in adapter.bias_options:
        if getattr(hf, key, False):
            biases.update(roles)
    act = getattr(hf, "hidden_activation", None) or getattr(hf, "hidden_act", "silu")
    scalar = getattr(hf, "query_pre_attn_scalar", None) if adapter.query_pre_attn_scalar else None
    attn_scale = float((scalar or head_dim) ** -0.5)
    scaled = adapter.scaled_embedding or bool(
        adapter.scaled_embedding_option and getattr(hf, adapter.scaled_embedding_option, False)
    )
    embed_scale = float(hf.hidden_size**0.5) if scaled else 1.0
    residual_scale = 1.0
    logit_scale = getattr(hf, adapter.logit_scale) if adapter.logit_scale else 1.0
    if adapter.depth_scaled:  # MiniCPM's
        embed_scale = float(hf.scale_emb)
        residual_scale = float(hf.scale_depth) / layers**0.5
        logit_scale = 1.0 / hf.logits_scaling
    if adapter.latent_attention:  # q·k over each head's unrotated and rotated parts
        attn_scale = latent_attn_scale(ropes[0], hf.qk_nope_head_dim + hf.qk_rope_head_dim)
    if adapter.multipliers:  # granite's four config scalars, in place of the derived ones
        attn_scale, embed_scale = float(hf.attention_multiplier), float(hf.embedding_multiplier)
        residual_scale = float(hf.residual_multiplier)
        scaling = float(hf.logits_scaling)
        logit_scale = scaling if adapter.logits_scaling_multiplies else 1.0 / scaling
    return BlockSpec(
        norm=adapter.norm,
        eps=float(getattr(hf, adapter.norm_eps)),
        pre_norm=adapter.attn_norm is not None,
        sandwich=adapter.post_attn_norm is not None,
        qk_norm=adapter.qk_norm if adapter.q_norm is not None else "none",
        activation=act,
        biases=frozenset(biases),
        fused_checkpoint=adapter.qkv is not None,
        rope=tuple(ropes),
        attn_scale=attn_scale,
        attn_softcap=getattr(hf, "attn_logit_softcapping", None) if adapter.attn_softcap else None,
        embed_scale=embed_scale,
        residual_scale=residual_scale,
        logit_scale=float(logit_scale),
        logit_softcap=getattr(hf, "final_logit_softcapping", None),
        windows=windows,
        tied=bool(hf.tie_word_embeddings),
        mlp=adapter.moe(hf) if adapter.moe is not None else None,
        qkv_clip=getattr(hf, "clip_qkv", None),
        qk_norm_after_rope=adapter.qk_norm_after_rope and adapter.q_norm is not None,
        parallel=adapter.parallel,
        gated_mlp=adapter.gate is not None or adapter.gate_up is not None,
        norm_bias=adapter.norm_bias,
        latent_attention=adapter.latent is not None,
        attn_gate=adapter.attn_gate is not None or adapter.attn_gate_in_q,
        attn_sinks=adapter.sinks is not None,
        linear_layers=adapter.linear_layers,
    )
