"""AWQ: activation-aware weight quantization (Lin et al., 2023), calibrated block by block.

For every set of linears that read one input (adapter.input_groups), search per-input-
channel scales s = mean|x|^α / mean|ŵ|^(1-α) (α on a grid over [0, 1); ŵ the weights
normalized per group) that minimize the error of the group's parent output (the
attention for q/k/v, the MLP for gate/up, the linear itself for o and down) with the
weights quantized as W·s and the input as x/s. The chosen s is folded into the producer
(a norm's weight, or the rows of the linear before), so the unquantized model is
unchanged. Then, per linear and per weight group, search a clipping ratio that
minimizes the output error, and quantize. All searches run in fp32 on a few calibration
samples; the activation statistics use all of them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from compress.distributed import all_sum, mean_squared_error, sum_floats
from compress.errors import LlmpressError
from compress.model.adapters import InputGroup
from compress.quantizers.preflight import check_layers
from compress.quantizers.rtn import adjusted_groups
from compress.quantizers.scheme import (
    AUTO,
    DEFAULT_ZERO_POINT,
    QuantizedWeight,
    QuantScheme,
    compute_qparams,
    cpu_slice_rows,
    default_group_size,
    grouped_range,
    qparams_from_range,
    quantize_with,
    resolve_auto,
)
from compress.stage import BlockContext, Described, Workspace, exact_copy, register_stage

# the scale search ran at 1/1.33 of a pass's rate on the default model (estimate.py)
AWQ_SEARCH_FACTOR = 1.33


@dataclass(frozen=True)
class AWQConfig:
    bits: int = 4
    group_size: int | None = AUTO  # 64 below 8 bits, per-channel at 8 (scheme.py)
    zero_point: bool = DEFAULT_ZERO_POINT
    grid: int = 20  # α values 0, 1/grid, ..., (grid-1)/grid
    duo_scaling: bool = True  # divide by the weight magnitude too (AutoAWQ's later form)
    clip: bool = True
    clip_grid: int = 20
    max_shrink: float = 0.5  # smallest clipping ratio tried is 1 - max_shrink
    search_samples: int = 8  # calibration samples the searches evaluate on

    @property
    def scheme(self) -> QuantScheme:
        return QuantScheme(self.bits, self.group_size, self.zero_point)

    def __post_init__(self) -> None:
        resolve_auto(self, group_size=default_group_size(self.bits))
        self.scheme  # noqa: B018 - validates bits and group size as the recipe is read
        if self.grid < 1 or self.clip_grid < 1 or not 0 <= self.max_shrink < 1:
            raise LlmpressError("awq: grid and clip_grid must be >= 1, max_shrink in [0, 1)")
        if self.search_samples < 1:
            raise LlmpressError("awq: search_samples must be >= 1")


def _fake_quant_into(
    out: torch.Tensor, w: torch.Tensor, s: torch.Tensor, scheme: QuantScheme, dtype: torch.dtype
) -> None:
    """out = dequantize(quantize(w·s)) / s, a slice of rows at a time on a CPU: the values
    of quantize_weight and dequantize, while each slice's passes stay in cache and no
    whole-weight temporary is mapped and faulted in (two a linear for every α: the
    search over 64 experts took 3 minutes a block at DeepSeek-V2-Lite's widths). The codes
    stay in fp32 in place, with no int8 copy and back: 4.5 ms against 6.5 an expert."""
    cols = w.shape[1]
    group = scheme.group_for(cols)
    rows = cpu_slice_rows(cols) if w.device.type == "cpu" else w.shape[0]
    for lo in range(0, w.shape[0], rows):
        part = (w[lo : lo + rows].float() * s).reshape(-1, cols // group, group)
        scale, zp = qparams_from_range(grouped_range(part, scheme), scheme, dtype)
        step = scale.float()[..., None]
        q = torch.round(part.div_(step))
        if zp is None:
            q.clamp_(scheme.qmin, scheme.qmax)
        else:
            z = zp.float()[..., None]
            q.add_(z).clamp_(scheme.qmin, scheme.qmax).sub_(z)
        torch.div(q.mul_(step).reshape(-1, cols), s, out=out[lo : lo + rows])


class _SharedChannels:
    """Maps a producer's output channels onto its consumers' inputs when they differ.

    Under grouped-query attention v has n_kv heads and o reads n_heads = n_kv × rep
    heads, each KV head repeated for `rep` consecutive query heads. A scale on o's input
    can be folded into v only if it is equal across those repeats: search it in v's
    channel space and expand it for o.
    """

    def __init__(self, heads: int, kv_heads: int, head_dim: int):
        self.rep, self.kv_heads, self.head_dim = heads // kv_heads, kv_heads, head_dim

    def reduce(self, v: torch.Tensor) -> torch.Tensor:  # consumer space -> producer space
        return v.reshape(self.kv_heads, self.rep, self.head_dim).mean(1).reshape(-1)

    def expand(self, v: torch.Tensor) -> torch.Tensor:  # producer space -> consumer space
        return v.reshape(self.kv_heads, 1, self.head_dim).expand(-1, self.rep, -1).reshape(-1)


def _channel_map(ctx: BlockContext, group: InputGroup) -> _SharedChannels | None:
    """How the producer's channels map onto the group's inputs (one to one, or v → o under
    grouped-query attention); None when the shapes do not allow folding a scale at all."""
    width = ctx.sub(group.linears[0]).in_features
    produced = ctx.sub(group.producer).weight.shape[0]
    if produced == width:
        return _SharedChannels(1, 1, width)
    adapter = ctx.adapter
    shape = adapter.shape(ctx.ws.config)
    heads, kv, head_dim = shape.heads, shape.kv_heads, shape.head_dim
    is_v_to_o = (group.producer, group.linears) == (adapter.v, (adapter.o,))
    if (
        is_v_to_o
        and kv
        and heads % kv == 0
        and (produced, width) == (kv * head_dim, heads * head_dim)
    ):
        return _SharedChannels(heads, kv, head_dim)
    return None


def _clipped(w: torch.Tensor, scheme: QuantScheme, group: int, clip) -> torch.Tensor:
    """`w` clamped per group to the range min-max quantization with `clip` would cover."""
    g = w.reshape(w.shape[0], -1, group)
    clip = torch.as_tensor(clip, dtype=w.dtype, device=w.device)
    if clip.ndim:
        clip = clip[..., None]
    if scheme.zero_point:
        lo = g.amin(-1, keepdim=True).clamp(max=0) * clip
        hi = g.amax(-1, keepdim=True).clamp(min=0) * clip
    else:
        hi = g.abs().amax(-1, keepdim=True) * clip
        lo = -hi
    return torch.maximum(torch.minimum(g, hi), lo).reshape(w.shape)


@register_stage("awq", AWQConfig)
class AWQ(Described):
    tags = ("awq",)

    @staticmethod
    def weight_bits(settings: dict) -> int | None:
        return settings.get("bits")

    per_layer_schemes = True
    activations = None
    needs_calibration = True
    prepares = True  # before gptq: folds scales and clips, leaves the rounding to it

    def work(self, load) -> float:
        """The scale search: every α of the grid runs the searched linears' inputs forward
        on `search_samples` samples (about a block's forward each)."""
        tokens = min(self.config.search_samples, load.samples) * load.length
        return AWQ_SEARCH_FACTOR * self.config.grid * load.forward(tokens)

    def __init__(self, config: AWQConfig):
        self.config = config
        self.deferred = False
        self.groups: dict[str, int] = {}
        self.alphas: dict[str, float] = {}
        self.skipped: list[str] = []
        self.seconds = {"scale search": 0.0, "clip search and quantize": 0.0}
        self._stats: dict[str, torch.Tensor] = {}
        self._inputs: dict[str, torch.Tensor] = {}

    @property
    def scheme(self) -> QuantScheme:
        return self.config.scheme

    def preflight(self, ws: Workspace) -> None:
        check_layers(ws, self.config.scheme)

    # -- calibrate: activation statistics over all samples, inputs of a few kept for search

    def calibrate(self, ctx: BlockContext) -> None:
        kept: dict[str, list[torch.Tensor]] = {}
        keep = ctx.rows_below(self.config.search_samples)  # the first samples, where held

        def observe(rel: str, x: torch.Tensor) -> None:
            sums[rel] += x.abs().reshape(-1, x.shape[-1]).sum(0).double()  # exact in any order
            room = keep - sum(t.shape[0] for t in kept.setdefault(rel, []))
            if room > 0:
                kept[rel].append(x[:room].clone())

        adapter = ctx.adapter
        first = sorted({_input_key(adapter, rel) for rel in adapter.block_linears})
        sums = {  # allocated before any chunk: a rank may hold no sample
            rel: torch.zeros(ctx.sub(rel).in_features, dtype=torch.float64, device=_device(ctx))
            for rel in first
        }
        ctx.observe(first, observe)
        tokens = ctx.samples * ctx.inputs.shape[1]
        self._stats = {rel: (all_sum(s) / tokens).float() for rel, s in sums.items()}
        self._inputs = {rel: torch.cat(v) for rel, v in kept.items() if v}

    # -- transform: scale search and folding, then clipping search and quantization

    @torch.no_grad()
    def transform(self, ctx: BlockContext) -> None:
        targets = set(ctx.targets())
        start = time.perf_counter()
        for group in ctx.adapter.input_groups:
            if not targets.intersection(group.linears):
                continue
            channels = _channel_map(ctx, group)
            if channels is None:
                self.skipped.append(f"{ctx.prefix}.{group.producer}->{group.linears[0]}")
                continue
            self._scale_group(ctx, group, targets, channels)
        middle = time.perf_counter()
        for rel in ctx.targets():
            self._quantize(ctx, rel)
        self.seconds["scale search"] += middle - start
        self.seconds["clip search and quantize"] += time.perf_counter() - middle
        self._stats, self._inputs = {}, {}

    def _parent(self, ctx: BlockContext, group: InputGroup):
        """The module whose output measures a group's error, as a function of the group input."""
        adapter = ctx.adapter
        if group.producer == adapter.attn_norm and adapter.mixer:  # a DeltaNet, no cache:
            return ctx.sub(adapter.mixer.module)  # its output alone (attention's is a pair)
        if group.producer == adapter.attn_norm:
            attn = ctx.sub(adapter.attn)
            kwargs = ctx.rope.kwargs(ctx.module)
            if adapter.one_norm:  # the norm feeds the MLP too: both branches' sum
                mlp = ctx.sub(adapter.mlp)
                return lambda x: attn(hidden_states=x, **kwargs)[0] + mlp(x)
            return lambda x: attn(hidden_states=x, **kwargs)[0]
        if group.producer == adapter.mlp_norm:
            return ctx.sub(adapter.mlp)
        return ctx.sub(group.linears[0])

    @torch.no_grad()
    def _scale_group(
        self,
        ctx: BlockContext,
        group: InputGroup,
        targets: set[str],
        channels: _SharedChannels,
    ) -> None:
        cfg, scheme, dtype = self.config, self.config.scheme, ctx.ws.storage_dtype
        key = group.linears[0]
        x = self._inputs.get(key)  # None on a rank that holds none of the search samples
        x_mean = self._stats[key].clamp(min=1e-6)
        reduce, expand = channels.reduce, channels.expand
        linears = {rel: ctx.sub(rel) for rel in group.linears}
        originals = {rel: exact_copy(m.weight.detach(), dtype) for rel, m in linears.items()}
        parent = self._parent(ctx, group)
        target = self._run(parent, x, ctx.rope.chunk)
        w_mean = None
        if cfg.duo_scaling:
            w_mean = reduce(_weight_mean([m.weight for m in linears.values()], scheme))
        x_mean = reduce(x_mean)
        best = (float("inf"), None, 0.0)
        for i in range(cfg.grid):
            alpha = i / cfg.grid
            s_produced = x_mean.pow(alpha)
            if w_mean is not None:
                s_produced = s_produced / (w_mean.pow(1 - alpha) + 1e-4)
            s_produced = s_produced.clamp(min=1e-4)
            s_produced = s_produced / (s_produced.max() * s_produced.min()).sqrt()
            s = expand(s_produced)
            for rel, m in linears.items():
                if rel in targets:
                    _fake_quant_into(m.weight, originals[rel], s, ctx.scheme(rel, scheme), dtype)
                else:
                    m.weight.copy_(originals[rel] * s / s)
            loss = mean_squared_error(self._run(parent, x, ctx.rope.chunk), target)
            if loss < best[0]:
                best = (loss, s_produced, alpha)
        _, s_produced, alpha = best
        s = expand(s_produced)
        for rel, m in linears.items():
            m.weight.copy_(originals[rel] * s)
            if rel not in targets:
                ctx.mark_changed(rel)
        producer = ctx.sub(group.producer)
        if isinstance(producer, torch.nn.Linear):
            producer.weight.div_(s_produced[:, None])
            if producer.bias is not None:
                producer.bias.div_(s_produced)
        elif ctx.ws.store.spec.norm_offset:  # gemma's, nemotron's norms multiply by 1 + w
            producer.weight.add_(1).div_(s_produced).sub_(1)
        else:
            producer.weight.div_(s_produced)
        norm_bias = getattr(producer, "bias", None)  # a LayerNorm's (starcoder2, nemotron)
        if not isinstance(producer, torch.nn.Linear) and norm_bias is not None:
            norm_bias.div_(s_produced)
        ctx.mark_changed(group.producer)
        if x is not None:
            self._inputs[key] = x / s  # what the scaled linears now read
        self.alphas[f"{ctx.prefix}.{key}"] = alpha

    @staticmethod
    def _run(fn, x: torch.Tensor | None, chunk: int) -> list[torch.Tensor]:
        """fn's output on each chunk of x (the chunks every rank count agrees on)."""
        return [] if x is None else [fn(x[lo : lo + chunk]) for lo in range(0, x.shape[0], chunk)]

    def _quantize(self, ctx: BlockContext, rel: str) -> None:
        cfg, dtype = self.config, ctx.ws.storage_dtype
        scheme = ctx.scheme(rel, cfg.scheme)
        w = ctx.sub(rel).weight.detach()
        group = scheme.group_for(w.shape[1])
        clip: torch.Tensor | float = 1.0
        adapter = ctx.adapter
        # q/k errors act through the attention scores; AWQ found clipping them hurts
        if cfg.clip and rel not in (adapter.q, adapter.k):
            x = self._inputs.get(_input_key(adapter, rel))
            clip = self._search_clip(w, x, group, scheme, ctx.rope.chunk)
        self.groups[f"{ctx.prefix}.{rel}"] = group
        if ctx.round_later:  # a later stage rounds: leave it the scaled, clipped weights
            self.deferred = True
            ctx.sub(rel).weight.copy_(_clipped(w, scheme, group, clip))
            return
        scale, zp = compute_qparams(w, scheme, group, dtype, clip=clip)
        q = quantize_with(w, scale, zp, scheme, group)
        ctx.set_quantized(rel, QuantizedWeight(q, scale, zp, scheme, group))

    def _search_clip(
        self, w: torch.Tensor, x: torch.Tensor | None, group: int, scheme: QuantScheme, chunk: int
    ) -> torch.Tensor:
        """Per (output row, weight group) clipping ratio minimizing that group's output error.

        The error of one group's contribution, mean over tokens of (x_g · δ)², equals
        δ H_g δᵀ with H_g = x_gᵀ x_g / n, so each ratio costs out × g² per group instead
        of out × g × tokens, and every search token counts. On a CPU the rows go a slice
        at a time, laid out [group, row, g] once, so every ratio's passes stay in cache
        and the products need no copy: 2.5× faster at DeepSeek-V2-Lite's expert widths
        than whole-weight passes, the same ratios (quantize_with's arithmetic).
        """
        cfg = self.config
        rows, cols = w.shape
        groups = cols // group
        gram = _gram(x, groups, group, w.device, chunk)  # [G, g, g], over the ranks
        steps = max(1, int(cfg.max_shrink * cfg.clip_grid))
        best = torch.ones(groups, rows, device=w.device)
        step = cpu_slice_rows(cols) if w.device.type == "cpu" else max(rows, 1)
        for lo in range(0, rows, step):
            wg = w[lo : lo + step].float().reshape(-1, groups, group).transpose(0, 1)
            wg = wg.contiguous()  # [G, rows, g]
            extent = grouped_range(wg, scheme)
            best_err = torch.full(wg.shape[:2], float("inf"), device=w.device)
            for i in range(steps):
                ratio = 1 - i / cfg.clip_grid
                scale, zp = qparams_from_range(extent, scheme, torch.float32, clip=ratio)
                s = scale[..., None]
                q = torch.round(wg / s)
                if zp is None:
                    q.clamp_(scheme.qmin, scheme.qmax)
                else:
                    z = zp.float()[..., None]
                    q.add_(z).clamp_(scheme.qmin, scheme.qmax).sub_(z)
                delta = q.mul_(s).sub_(wg)
                err = torch.bmm(delta, gram).mul_(delta).sum(-1)  # [G, rows]
                better = err < best_err
                best_err = torch.where(better, err, best_err)
                best[:, lo : lo + step].masked_fill_(better, ratio)
        return best.T.contiguous()

    def export(self, ws: Workspace) -> dict:
        scheme = self.config.scheme
        return {
            "stage": "awq",
            "scheme": scheme.label(),
            "layers": len(self.groups),
            "rounded": not self.deferred,  # False: scaled and clipped for a later stage
            "group_size_adjusted": adjusted_groups(self.groups, scheme, ws.schemes),
            "alpha": {k: round(v, 3) for k, v in self.alphas.items()},
            "not_scaled": self.skipped,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
        }


def _weight_mean(weights: list[torch.Tensor], scheme: QuantScheme) -> torch.Tensor:
    """Per input channel, the mean over every row of the linears of |w| over its weight
    group's largest: the linears' rows stacked a weight group of columns at a time (all
    columns at once, 64 experts' gate/up at DeepSeek-V2-Lite's widths took three 1.5 GB
    copies), the same values as the whole stack's."""
    cols = weights[0].shape[1]
    g = scheme.group_for(cols)
    out = torch.empty(cols, dtype=torch.float32, device=weights[0].device)
    for lo in range(0, cols, g):
        stacked = torch.cat([w.detach()[:, lo : lo + g] for w in weights]).float()
        norm = stacked.abs()
        norm = norm / norm.amax(dim=-1, keepdim=True).clamp(min=1e-8)
        out[lo : lo + g] = norm.mean(0)
    return out


def _device(ctx: BlockContext) -> torch.device:
    return next(ctx.module.parameters()).device


def _gram(x: torch.Tensor | None, groups: int, group: int, device, chunk: int) -> torch.Tensor:
    """Per weight group, mean over tokens of x_gᵀ x_g, from every rank's search samples
    (chunk by chunk, summed in float64)."""
    gram = torch.zeros(groups, group, group, dtype=torch.float64, device=device)
    n = 0
    if x is not None:
        for lo in range(0, x.shape[0], chunk):
            part = x[lo : lo + chunk].reshape(-1, x.shape[-1])
            xg = part.reshape(part.shape[0], groups, group).transpose(0, 1)  # [G, n, g]
            gram += (xg.transpose(1, 2) @ xg).double()
            n += part.shape[0]
    (n,) = sum_floats(n)
    return (all_sum(gram) / n).float()


def _input_key(adapter, rel: str) -> str:
    """The linear whose recorded input `rel` reads: its input group's first member, or
    itself when no group folds into it (phi3's o and down, behind fused tensors)."""
    return next((g.linears[0] for g in adapter.input_groups if rel in g.linears), rel)
