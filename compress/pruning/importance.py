"""How much each head, MLP neuron, hidden channel and layer matters, from calibration data.

Minitron-style: one forward pass of the original model over calibration tokens, with
hooks. Widths are scored by what a unit adds to the residual stream: the RMS over tokens
of the norm of its contribution (for an MLP neuron, |activation| times the norm of its
down-projection column; for a head, its slice of o_proj applied to its output). In a
Mixture-of-Experts layer a neuron is scored within its expert, over the tokens routed to
it, and an expert by the RMS over all tokens of its routing-weighted output (a shared
expert's neurons as a dense MLP's, over every token). A dense
layer of such a model (GLM-4.5's first) has its neurons scored as a dense MLP's. Hidden
channels are scored by the RMS of every normalization's output in that channel, summed.
Layers get block influence, 1 − cos(input, output), and, when layers are to be removed,
the KL divergence of the model's output when that layer alone is skipped.

Under torchrun the samples are sharded over the ranks and the sums added in float64, so
every rank gets the one process's scores; the layer-removal KL runs whole on each.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from compress import distributed


@dataclass
class Importance:
    heads: torch.Tensor  # [layers, heads]
    mlp: torch.Tensor  # [layers, intermediate], or [layers, experts, expert width] (MoE)
    hidden: torch.Tensor  # [hidden]
    layer_bi: torch.Tensor  # [layers]: 1 − mean cos(block input, block output)
    layer_drift: torch.Tensor | None = None  # [layers]: KL(original ‖ layer skipped)
    tokens: int = 0
    method: str = "activation"
    experts: torch.Tensor | None = None  # [layers, experts]: MoE only
    # [layers, dense width]: a Mixture-of-Experts model's dense MLP layers (GLM-4.5's first);
    # their rows of `mlp` and `experts` are zero, the others' rows here
    dense_mlp: torch.Tensor | None = None
    dense: tuple[int, ...] = ()  # which layers those are
    shared: torch.Tensor | None = None  # [layers, shared width]: the shared expert's neurons

    def to_manifest(self) -> dict:
        """Every score, rounded to 4 significant digits: small enough to keep, enough to plot."""

        def r(t):
            return None if t is None else [float(f"{v:.4g}") for v in t.flatten().tolist()]

        def mlp(i, row):  # a dense layer of a Mixture-of-Experts model: its own width
            if i in self.dense:
                return r(self.dense_mlp[i])
            return r(row) if row.dim() == 1 else [r(e) for e in row]

        experts = self.experts
        out = {
            "method": self.method,
            "tokens": self.tokens,
            "heads": [r(row) for row in self.heads],
            "mlp": [mlp(i, row) for i, row in enumerate(self.mlp)],
            "experts": None
            if experts is None
            else [None if i in self.dense else r(row) for i, row in enumerate(experts)],
            "shared": None
            if self.shared is None
            else [None if i in self.dense else r(row) for i, row in enumerate(self.shared)],
            "hidden": r(self.hidden),
            "layer_block_influence": r(self.layer_bi),
            "layer_removal_kl": r(self.layer_drift),
        }
        return out


def _first(args, kwargs, key):
    return args[0] if args else kwargs[key]


@torch.no_grad()
def activation_importance(
    model, adapter, samples: torch.Tensor, *, drift_samples: int = 0, chunk: int = 4, log=print
) -> Importance:
    """Score every unit of `model` on `samples` [n, length] (see the module docstring)."""
    from compress.model.adapters import Widths
    from compress.model.moe import moe_modules

    cfg = model.config
    widths = Widths.of(cfg.to_dict())
    layers = model.get_submodule(adapter.blocks)
    n_layers, heads, head_dim = len(layers), widths.heads, widths.head_dim
    dev = next(model.parameters()).device  # sums kept where the model runs
    head_sq = torch.zeros(n_layers, heads, dtype=torch.float64, device=dev)
    units = (widths.experts, widths.intermediate) if widths.experts else (widths.intermediate,)
    mlp_sq = torch.zeros(n_layers, *units, dtype=torch.float64, device=dev)
    dense = adapter.dense_layers  # a Mixture-of-Experts model's dense layers, scored apart
    dense_sq = torch.zeros(n_layers, widths.dense_intermediate, dtype=torch.float64, device=dev)
    shared_sq = torch.zeros(n_layers, widths.shared, dtype=torch.float64, device=dev)
    hidden_sq = torch.zeros(2 * n_layers + 1, cfg.hidden_size, dtype=torch.float64, device=dev)
    cos_sum = torch.zeros(n_layers, dtype=torch.float64, device=dev)
    handles = []

    def on_o(i):
        weight = layers[i].get_submodule(adapter.o).weight  # [hidden, heads*head_dim]
        w = weight.view(weight.shape[0], heads, head_dim)

        def hook(_m, args):
            x = args[0].reshape(-1, heads, head_dim)
            contrib = torch.einsum("thd,ohd->tho", x, w)  # each head's share of o_proj's output
            head_sq[i] += contrib.square().sum(dim=(0, 2)).double()

        return hook

    def on_down(i, *expert, sums=None):
        sums = sums if sums is not None else dense_sq if i in dense else mlp_sq

        def hook(_m, args):
            sums[(i, *expert)] += args[0].reshape(-1, args[0].shape[-1]).square().sum(0).double()

        return hook

    def on_norm(slot):
        def hook(_m, _args, out):
            hidden_sq[slot] += out.reshape(-1, out.shape[-1]).square().sum(0).double()

        return hook

    def on_block(i):
        def hook(_m, args, kwargs, out):
            x = _first(args, kwargs, "hidden_states")
            y = out[0] if isinstance(out, tuple) else out
            cos_sum[i] += torch.nn.functional.cosine_similarity(x, y, dim=-1).sum().double()

        return hook

    for i, block in enumerate(layers):
        handles.append(block.get_submodule(adapter.o).register_forward_pre_hook(on_o(i)))
        if widths.experts and i not in dense:
            for moe in moe_modules(block):
                moe.contributions = torch.zeros(widths.experts, dtype=torch.float64, device=dev)
            for e in range(widths.experts):
                down = block.get_submodule(adapter.expert_linear(e, "down"))
                handles.append(down.register_forward_pre_hook(on_down(i, e)))
            if widths.shared:
                down = block.get_submodule(f"{adapter.shared_expert}.down_proj")
                handles.append(down.register_forward_pre_hook(on_down(i, sums=shared_sq)))
        else:
            down = block.get_submodule(adapter.down)
            handles.append(down.register_forward_pre_hook(on_down(i)))
        # hidden channels as the branches see them: their input norms' outputs, or where a
        # branch reads the residual unnormed (olmo2) its output norm's, what it adds to it
        attn_norm = block.get_submodule(adapter.attn_norm or adapter.post_attn_norm)
        handles.append(attn_norm.register_forward_hook(on_norm(2 * i)))
        mlp_norm = block.get_submodule(adapter.mlp_norm or adapter.post_mlp_norm)
        handles.append(mlp_norm.register_forward_hook(on_norm(2 * i + 1)))
        handles.append(block.register_forward_hook(on_block(i), with_kwargs=True))
    final = model.get_submodule(adapter.final_norm)
    handles.append(final.register_forward_hook(on_norm(2 * n_layers)))
    # under torchrun each rank runs whole chunks of its shard: the one process's forwards
    mine = samples[list(distributed.Shard.of(samples.shape[0], chunk).indices)]
    try:
        bar = tqdm(range(0, mine.shape[0], chunk), desc="importance", unit="chunk",
                   disable=not distributed.is_writer())  # fmt: skip
        for lo in bar:
            model(input_ids=mine[lo : lo + chunk].to(dev), use_cache=False)
    finally:
        for h in handles:
            h.remove()
    for total in (head_sq, mlp_sq, dense_sq, shared_sq, hidden_sq, cos_sum):  # float64: exact
        distributed.all_sum(total)
    tokens = samples.numel()
    experts = None
    if widths.experts:
        contributions = []
        for i, block in enumerate(layers):
            if i in dense:
                contributions.append(torch.zeros(widths.experts, dtype=torch.float64, device=dev))
                continue
            (moe,) = moe_modules(block)
            contributions.append(distributed.all_sum(moe.contributions))
            moe.contributions = None
        experts = (torch.stack(contributions) / tokens).sqrt().float().cpu()

    def down_norms(i, block):
        if not widths.experts:
            return block.get_submodule(adapter.down).weight.norm(dim=0).double()
        if i in dense:
            return torch.zeros(units, dtype=torch.float64, device=dev)
        names = (adapter.expert_linear(e, "down") for e in range(widths.experts))
        return torch.stack([block.get_submodule(n).weight.norm(dim=0).double() for n in names])

    def column_norms(i, block, down, width, where):
        if not where:
            return torch.zeros(width, dtype=torch.float64, device=dev)
        return block.get_submodule(down).weight.norm(dim=0).double()

    def scores(sums, down, width, where) -> torch.Tensor:
        norms = [column_norms(i, b, down, width, where(i)) for i, b in enumerate(layers)]
        return ((sums / tokens).sqrt() * torch.stack(norms)).float().cpu()

    down_norm = torch.stack([down_norms(i, block) for i, block in enumerate(layers)])
    shared_down = f"{adapter.shared_expert}.down_proj"
    result = Importance(  # scores in host memory, where the plan is made
        heads=(head_sq / tokens).sqrt().float().cpu(),
        mlp=((mlp_sq / tokens).sqrt() * down_norm).float().cpu(),
        dense_mlp=scores(dense_sq, adapter.down, widths.dense_intermediate, dense.__contains__)
        if dense
        else None,
        dense=dense,
        shared=scores(shared_sq, shared_down, widths.shared, lambda i: i not in dense)
        if widths.shared
        else None,
        hidden=(hidden_sq / tokens).sqrt().sum(0).float().cpu(),
        layer_bi=(1 - cos_sum / tokens).float().cpu(),
        tokens=tokens,
        experts=experts,
    )
    if drift_samples:
        result.layer_drift = layer_removal_kl(model, adapter, samples[:drift_samples], log=log)
    return result


@torch.no_grad()
def layer_removal_kl(model, adapter, samples: torch.Tensor, log=print) -> torch.Tensor:
    """KL(original ‖ model without layer i) per token, for every layer i.

    One full pass records what enters each layer; skipping layer i then reruns only the
    layers after it, from the input layer i received.
    """
    layers = model.get_submodule(adapter.blocks)
    entering: list[torch.Tensor] = []
    handles = [
        layer.register_forward_pre_hook(
            lambda _m, args, kwargs: entering.append(_first(args, kwargs, "hidden_states")),
            with_kwargs=True,
        )
        for layer in layers
    ]
    try:
        samples = samples.to(next(model.parameters()).device)
        base = torch.log_softmax(model(input_ids=samples, use_cache=False).logits.float(), -1)
    finally:
        for h in handles:
            h.remove()
    from compress.model.blocks import Positions

    rope = Positions(adapter.spec(model.config.to_dict()), samples.shape[1])
    norm, head = model.get_submodule(adapter.final_norm), model.get_submodule(adapter.lm_head)
    out = torch.zeros(len(layers), device="cpu")
    for i in tqdm(range(len(layers)), desc="layer removal", unit="layer"):
        h = entering[i]
        for layer in layers[i + 1 :]:
            h = layer(h, **rope.kwargs(layer))
            h = h[0] if isinstance(h, tuple) else h
        logp = torch.log_softmax(head(norm(h)).float(), -1)
        out[i] = float((base.exp() * (base - logp)).sum(-1).mean())
    return out


def random_importance(config: dict, seed: int, layers: int | None = None) -> Importance:
    """Scores drawn at random (seeded): the baseline an activation-based choice must beat."""
    from compress.model.adapters import Widths, adapter_for

    gen = torch.Generator().manual_seed(seed)
    w = Widths.of(config)
    n = layers or w.layers

    def rand(*shape):
        return torch.rand(*shape, generator=gen, device="cpu")

    units = (w.experts, w.intermediate) if w.experts else (w.intermediate,)
    dense = adapter_for(config).dense_layers
    return Importance(
        heads=rand(n, w.heads),
        mlp=rand(n, *units),
        hidden=rand(w.hidden),
        layer_bi=rand(n),
        layer_drift=rand(n),
        method="random",
        experts=rand(n, w.experts) if w.experts else None,
        dense_mlp=rand(n, w.dense_intermediate) if dense else None,
        dense=dense,
        shared=rand(n, w.shared) if w.shared else None,
    )
