"""How much each head, MLP neuron, hidden channel and layer matters, from calibration data.

Minitron-style: one forward pass of the original model over calibration tokens, with
hooks. Widths are scored by what a unit adds to the residual stream: the RMS over tokens
of the norm of its contribution (for an MLP neuron, |activation| times the norm of its
down-projection column; for a head, its slice of o_proj applied to its output). In a
Mixture-of-Experts layer a neuron is scored within its expert, over the tokens routed to
it, and an expert by the RMS over all tokens of its routing-weighted output; a shared
expert's neurons, and those of a dense layer of such a model (GLM-4.5's first), as a
dense MLP's, over every token. Hidden channels are scored by the RMS of every
normalization's output in that channel, summed. Layers get block influence,
1 − cos(input, output), and, when layers are to be removed, the KL divergence of the
model's output when that layer alone is skipped.

Under torchrun the samples are sharded over the ranks and the sums added in float64, so
every rank gets the one process's scores; the layer-removal KL runs whole on each. The
same hooks (Scores) score a whole model here and one block at a time in streamed.py.
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


class Scores:
    """The sums a scoring pass adds to, with the hooks that add them: attached to a whole
    model's blocks at once (activation_importance) or to each block as it is read from the
    checkpoint (pruning/streamed.py). Each block's weights are read while it is there."""

    def __init__(self, widths, adapter, n_layers: int, hidden: int, dev):
        self.w, self.adapter, self.dev, self.n = widths, adapter, dev, n_layers
        self.dense = adapter.dense_layers  # a Mixture-of-Experts model's dense layers

        def zeros(*shape):
            return torch.zeros(*shape, dtype=torch.float64, device=dev)

        w = widths
        self.units = (w.experts, w.intermediate) if w.experts else (w.intermediate,)
        self.head_sq, self.mlp_sq = zeros(n_layers, w.heads), zeros(n_layers, *self.units)
        self.dense_sq, self.shared_sq = (
            zeros(n_layers, w.dense_intermediate),
            zeros(n_layers, w.shared),
        )
        self.hidden_sq, self.cos_sum = zeros(2 * n_layers + 1, hidden), zeros(n_layers)
        self.down_norm, self.dense_norm = (
            zeros(n_layers, *self.units),
            zeros(n_layers, w.dense_intermediate),
        )
        self.shared_norm, self.contributions = zeros(n_layers, w.shared), zeros(n_layers, w.experts)

    def attach(self, i: int, block) -> list:
        """Hooks on block i (original index) that add its sums; returns their handles."""
        from compress.model.moe import moe_modules

        a, w, handles = self.adapter, self.w, []
        weight = block.get_submodule(a.o).weight  # [hidden, heads*head_dim]
        w_o = None if a.latent else weight.view(weight.shape[0], w.heads, w.head_dim)

        def on_o(_m, args):
            x = args[0].reshape(-1, w.heads, w.head_dim)
            contrib = torch.einsum("thd,ohd->tho", x, w_o)  # each head's share of o_proj's output
            self.head_sq[i] += contrib.square().sum(dim=(0, 2)).double()

        def on_down(sums, *expert):
            def hook(_m, args):
                x = args[0].reshape(-1, args[0].shape[-1])
                sums[(i, *expert)] += x.square().sum(0).double()

            return hook

        def on_norm(slot):
            def hook(_m, _args, out):
                self.hidden_sq[slot] += out.reshape(-1, out.shape[-1]).square().sum(0).double()

            return hook

        def on_block(_m, args, kwargs, out):
            x = _first(args, kwargs, "hidden_states")
            y = out[0] if isinstance(out, tuple) else out
            self.cos_sum[i] += torch.nn.functional.cosine_similarity(x, y, dim=-1).sum().double()

        def on(path, hook):
            handles.append(block.get_submodule(path).register_forward_pre_hook(hook))

        if w_o is not None:  # (latent attention keeps every head: no scores to take)
            on(a.o, on_o)
        if w.experts and i not in self.dense:
            for moe in moe_modules(block):
                moe.contributions = torch.zeros(w.experts, dtype=torch.float64, device=self.dev)
            for e in range(w.experts):
                down = block.get_submodule(a.expert_linear(e, "down"))
                on(a.expert_linear(e, "down"), on_down(self.mlp_sq, e))
                self.down_norm[i, e] = down.weight.norm(dim=0).double()
            if w.shared:
                down = f"{a.shared_expert}.down_proj"
                on(down, on_down(self.shared_sq))
                self.shared_norm[i] = block.get_submodule(down).weight.norm(dim=0).double()
        else:
            sums, norms = (
                (self.dense_sq, self.dense_norm)
                if i in self.dense
                else (self.mlp_sq, self.down_norm)
            )
            on(a.down, on_down(sums))
            norms[i] = block.get_submodule(a.down).weight.norm(dim=0).double()
        # hidden channels as the branches see them: their input norms' outputs, or where a
        # branch reads the residual unnormed (olmo2) its output norm's, what it adds to it
        attn_norm = block.get_submodule(a.attn_norm or a.post_attn_norm)
        handles.append(attn_norm.register_forward_hook(on_norm(2 * i)))
        # (a parallel block's MLP reads the attention's norm: cohere)
        mlp_norm = block.get_submodule(a.attn_norm if a.one_norm else a.mlp_norm or a.post_mlp_norm)
        handles.append(mlp_norm.register_forward_hook(on_norm(2 * i + 1)))
        handles.append(block.register_forward_hook(on_block, with_kwargs=True))
        return handles

    def detach(self, i: int, block, handles: list) -> None:
        """Remove block i's hooks and keep its experts' routed contributions."""
        from compress.model.moe import moe_modules

        for h in handles:
            h.remove()
        for moe in moe_modules(block) if self.w.experts and i not in self.dense else ():
            self.contributions[i] = moe.contributions
            moe.contributions = None

    def final_norm(self, norm) -> object:
        """The final norm's hook (its outputs score the hidden channels too)."""

        def hook(_m, _args, out):
            self.hidden_sq[2 * self.n] += out.reshape(-1, out.shape[-1]).square().sum(0).double()

        return norm.register_forward_hook(hook)

    def result(self, tokens: int) -> Importance:
        """The scores, summed over the ranks (float64: exact in any order)."""
        sums = (self.head_sq, self.mlp_sq, self.dense_sq, self.shared_sq, self.hidden_sq,
                self.cos_sum, self.contributions)  # fmt: skip
        for total in sums:
            distributed.all_sum(total)

        def rms(t):
            return (t / tokens).sqrt()

        w, dense = self.w, self.dense
        return Importance(  # scores in host memory, where the plan is made
            heads=rms(self.head_sq).float().cpu(),
            mlp=(rms(self.mlp_sq) * self.down_norm).float().cpu(),
            dense_mlp=(rms(self.dense_sq) * self.dense_norm).float().cpu() if dense else None,
            dense=dense,
            shared=(rms(self.shared_sq) * self.shared_norm).float().cpu() if w.shared else None,
            hidden=rms(self.hidden_sq).sum(0).float().cpu(),
            layer_bi=(1 - self.cos_sum / tokens).float().cpu(),
            tokens=tokens,
            experts=rms(self.contributions).float().cpu() if w.experts else None,
        )


@torch.no_grad()
def activation_importance(
    model, adapter, samples: torch.Tensor, *, drift_samples: int = 0, chunk: int = 4, log=print
) -> Importance:
    """Score every unit of `model` on `samples` [n, length] (see the module docstring)."""
    from compress.model.adapters import Widths

    cfg = model.config
    layers = model.get_submodule(adapter.blocks)
    dev = next(model.parameters()).device  # sums kept where the model runs
    scores = Scores(Widths.of(cfg.to_dict()), adapter, len(layers), cfg.hidden_size, dev)
    handles = [scores.attach(i, block) for i, block in enumerate(layers)]
    final = scores.final_norm(model.get_submodule(adapter.final_norm))
    # under torchrun each rank runs whole chunks of its shard: the one process's forwards
    mine = samples[list(distributed.Shard.of(samples.shape[0], chunk).indices)]
    try:
        bar = tqdm(range(0, mine.shape[0], chunk), desc="importance", unit="chunk",
                   disable=not distributed.is_writer())  # fmt: skip
        for lo in bar:
            model(input_ids=mine[lo : lo + chunk].to(dev), use_cache=False)
    finally:
        for i, (block, hooks) in enumerate(zip(layers, handles, strict=True)):
            scores.detach(i, block, hooks)
        final.remove()
    result = scores.result(samples.numel())
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
    from compress.runtime.model import final_logits  # the family's scale and softcap

    spec = adapter.spec(model.config.to_dict())
    rope = Positions(spec, samples.shape[1], tables=adapter.rope_tables, attn=adapter.attn)
    norm, head = model.get_submodule(adapter.final_norm), model.get_submodule(adapter.head_module)
    out = torch.zeros(len(layers), device="cpu")
    for i in tqdm(range(len(layers)), desc="layer removal", unit="layer"):
        h = entering[i]
        for layer in layers[i + 1 :]:
            h = layer(h, **rope.kwargs(layer))
            h = h[0] if isinstance(h, tuple) else h
        logp = torch.log_softmax(final_logits(head(norm(h)).float(), rope.spec), -1)
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
