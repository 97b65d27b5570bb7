"""Keep the most important units and slice them out of the original weights.

The pruned model's weights are the kept rows and columns of the original ones (never a
re-initialization). Which tensors an axis cuts, and along which dimension, comes from the
adapter's cut groups, so any llama-family model prunes the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compress.model.adapters import adapter_for
from compress.pruning.importance import Importance
from compress.pruning.plan import Shape


@dataclass
class Keep:
    """Original indices kept: layers, and per kept layer its heads, KV heads and neurons
    (in a Mixture-of-Experts model: its experts, and per kept expert its neurons)."""

    layers: list[int]
    heads: list[list[int]]
    kv_heads: list[list[int]]
    mlp: list[list[int]] | list[list[list[int]]]  # a dense layer's: list[int]
    hidden: list[int]
    experts: list[list[int] | None] | None = None  # None for a dense layer
    shared: list[list[int] | None] | None = None  # a shared expert's neurons, where cut

    def to_manifest(self, full: Shape) -> dict:
        out: dict = {"layers": self.layers}
        if any(len(h) < full.heads for h in self.heads):
            out["heads"] = self.heads
        if any(len(h) < full.kv_heads for h in self.kv_heads):
            out["kv_heads"] = self.kv_heads
        if len(self.hidden) < full.hidden:
            out["hidden"] = self.hidden
        if self.shared is not None:
            out["shared"] = self.shared
        if self.experts is not None:
            if any(e is not None and len(e) < full.experts for e in self.experts):
                out["experts"] = self.experts
            widths = [
                len(per) if e is None else [len(m) for m in per]
                for e, per in zip(self.experts, self.mlp, strict=True)
            ]
            if widths != [
                full.dense_intermediate if e is None else [full.intermediate] * len(e)
                for e in self.experts
            ]:
                out["mlp_kept"] = widths
        elif any(len(m) < full.intermediate for m in self.mlp):
            out["mlp_kept"] = [len(m) for m in self.mlp]
        return out


def _top(scores: torch.Tensor, k: int) -> list[int]:
    """Indices of the k highest scores, in their original order (ties: lower index)."""
    order = torch.sort(-scores.flatten(), stable=True).indices[:k]
    return sorted(order.tolist())


def choose(imp: Importance, full: Shape, target: Shape, head_mode: str, layer_metric: str) -> Keep:
    """Which units survive: whole layers by the chosen metric (lowest removed), then per
    layer the best heads (grouped-query structure kept) and neurons, and globally the
    best hidden channels."""
    layer_score = imp.layer_drift if layer_metric == "drift" else imp.layer_bi
    if layer_score is None:
        layer_score = imp.layer_bi
    layer_score = layer_score.clone()
    layer_score[list(imp.dense)] = float("inf")  # a dense layer stays (plan.check_targets)
    layers = _top(layer_score, target.layers)
    group = full.heads // full.kv_heads
    heads, kv_heads, mlp, experts, shared = [], [], [], [], []
    for i in layers:
        per_group = imp.heads[i].view(full.kv_heads, group)
        if head_mode == "kv_groups" or group == 1:  # multi-head: a group is one head
            kept_kv = _top(per_group.sum(1), target.kv_heads)
            kept_q = [g * group + j for g in kept_kv for j in range(group)]
        else:
            kept_kv = list(range(full.kv_heads))
            per = target.heads // target.kv_heads
            kept_q = [g * group + j for g in kept_kv for j in _top(per_group[g], per)]
        heads.append(kept_q)
        kv_heads.append(kept_kv)
        cut_shared = target.shared < full.shared  # GLM-4.5's: as wide as n experts
        shared.append(_top(imp.shared[i], target.shared) if cut_shared else None)
        if i in imp.dense:  # a Mixture-of-Experts model's dense layer
            experts.append(None)
            shared[-1] = None
            mlp.append(_top(imp.dense_mlp[i], target.dense_intermediate))
        elif full.experts:  # the strongest experts, and each one's strongest neurons
            experts.append(_top_per_group(imp.experts[i], target.experts, full.groups))
            mlp.append([_top(imp.mlp[i][e], target.intermediate) for e in experts[-1]])
        else:
            mlp.append(_top(imp.mlp[i], target.intermediate))
    hidden = _top(imp.hidden, target.hidden)
    return Keep(
        layers, heads, kv_heads, mlp, hidden, experts if full.experts else None,
        shared if any(s is not None for s in shared) else None,
    )  # fmt: skip


def _top_per_group(scores: torch.Tensor, k: int, groups: int) -> list[int]:
    """The k highest scores, k / groups from each of `groups` equal runs (a router that
    chooses within groups keeps them equal), in their original order."""
    if groups == 1:
        return _top(scores, k)
    runs = scores.view(groups, -1)
    return [g * runs.shape[1] + j for g in range(groups) for j in _top(runs[g], k // groups)]


def _units(index: list[int], size: int) -> torch.Tensor:
    """Row/column indices of whole units (e.g. a head is head_dim rows)."""
    cpu = torch.device("cpu")  # the surgery cuts a state dict in host memory
    rows = torch.tensor(index, device=cpu)[:, None] * size
    return (rows + torch.arange(size, device=cpu)).flatten()


def prune_state(
    state: dict[str, torch.Tensor], adapter, full: Shape, keep: Keep
) -> dict[str, torch.Tensor]:
    """The state dict of the pruned model (tied lm_head left out, as checkpoints store it)."""
    out: dict[str, torch.Tensor] = {}
    for new, old in enumerate(keep.layers):
        src = adapter.block_prefix(old) + "."
        block = {n[len(src) :]: t for n, t in state.items() if n.startswith(src)}
        out.update(prune_block(block, adapter, full, keep, new))
    head = f"{adapter.lm_head}.weight"
    embed = state[f"{adapter.embed}.weight"]
    tied = head not in state or state[head].data_ptr() == embed.data_ptr()
    blocks = adapter.blocks + "."
    rest = {n: t for n, t in state.items() if not n.startswith(blocks) and n != head}
    if not tied:
        rest[head] = state[head]
    out.update(prune_globals(rest, adapter, full, keep))
    return out


def prune_block(
    tensors: dict[str, torch.Tensor], adapter, full: Shape, keep: Keep, new: int
) -> dict[str, torch.Tensor]:
    """Kept block `new`'s tensors, by their names in the pruned model, from the original
    block's (`tensors`, named relative to the block)."""
    old = keep.layers[new]
    hidden = torch.tensor(keep.hidden, device="cpu")
    out: dict[str, torch.Tensor] = {}
    cut = {g.axis: g for g in adapter.cut_groups}
    block = adapter.layer(old)  # a dense layer of a Mixture-of-Experts model: no experts
    fused = block.fused_rows(full)
    prefix = adapter.block_prefix(new)
    index = {
        "heads": _units(keep.heads[new], full.head_dim),
        "kv_heads": _units(keep.kv_heads[new], full.head_dim),
        "qkv_heads": _units(keep.heads[new], 3 * full.head_dim),  # q/k/v fused head by head
        "mlp": torch.tensor(keep.mlp[new], device="cpu"),
        "hidden": hidden,
    }
    experts = _expert_renames(adapter, keep, new) if block.experts else {}
    for rel, tensor in tensors.items():
        module, _, leaf = rel.rpartition(".")
        if block.experts and module.startswith(adapter.expert + "."):
            if module not in experts:  # a removed expert
                continue
            module, role, neurons = experts[module]
            rows, cols = (hidden, neurons) if role == "down" else (neurons, hidden)
            t = tensor.index_select(0, rows).index_select(1, cols)
            out[f"{prefix}.{module}.{leaf}"] = t.contiguous()
            continue
        if block.shared_width and module.startswith(adapter.shared_expert + "."):
            down = module.endswith("down_proj")
            t = tensor.index_select(0 if down else 1, hidden)
            if keep.shared is not None:  # its neurons too, where cut with the experts'
                kept = torch.tensor(keep.shared[new], device="cpu")
                t = t.index_select(1 if down else 0, kept)
            out[f"{prefix}.{rel}"] = t.contiguous()
            continue
        if module == adapter.shared_gate and block.shared_width:
            out[f"{prefix}.{rel}"] = tensor.index_select(1, hidden)
            continue
        if rel == adapter.sinks:  # one per query head: the kept heads'
            out[f"{prefix}.{rel}"] = tensor.index_select(0, torch.tensor(keep.heads[new]))
            continue
        if rel == adapter.choice_bias and block.experts:  # [E] or [1, E]
            kept = torch.tensor(keep.experts[new], device="cpu")
            out[f"{prefix}.{rel}"] = tensor.index_select(-1, kept)
            continue
        if module == adapter.router and block.experts:
            t = tensor.index_select(0, torch.tensor(keep.experts[new], device="cpu"))
            out[f"{prefix}.{rel}"] = t.index_select(1, hidden).contiguous()
            continue
        if block.qk_norm_modules and module.rpartition(".")[0] in (block.q_norm, block.k_norm):
            norms, _, h = module.rpartition(".")  # one module per head: kept ones renumbered
            kept = keep.heads[new] if norms == block.q_norm else keep.kv_heads[new]
            if int(h) in kept:
                out[f"{prefix}.{norms}.{kept.index(int(h))}.{leaf}"] = tensor.contiguous()
            continue
        t = tensor
        if module in (adapter.q_norm, adapter.k_norm) and t.dim() == 2:  # [heads, head_dim]
            t = t.reshape(-1)  # (cohere's): cut as the heads' rows, then shaped back
        if module in fused:  # each part's kept rows, at its offset in the tensor
            rows = [index[axis] + start for axis, start in fused[module]]
            t = t.index_select(0, torch.cat(rows))
        for axis, rows_cols in cut.items():
            if module in rows_cols.rows:
                t = t.index_select(0, index[axis])
            elif module in rows_cols.cols and leaf == "weight":
                t = t.index_select(1, index[axis])
        if t.dim() != tensor.dim():
            t = t.reshape(-1, tensor.shape[-1])
        out[f"{prefix}.{rel}"] = t.contiguous()
    return out


def prune_globals(
    tensors: dict[str, torch.Tensor], adapter, full: Shape, keep: Keep
) -> dict[str, torch.Tensor]:
    """The pruned model's tensors outside the blocks, from the original's (`tensors`: an
    untied lm_head among them, a tied one not)."""
    hidden = torch.tensor(keep.hidden, device="cpu")
    head = f"{adapter.lm_head}.weight"
    tied = head not in tensors
    embed_scale, head_scale = _embedding_rescale(adapter, full.hidden, len(keep.hidden), tied)
    out = {}
    for name, tensor in tensors.items():
        if name.startswith(adapter.embed + "."):  # rescaled in fp32 (a 16-bit table widened)
            kept = tensor.index_select(1, hidden)
            out[name] = kept if embed_scale == 1.0 else (kept.float() * embed_scale).contiguous()
        elif name.startswith(adapter.final_norm + "."):
            kept = tensor.index_select(0, hidden)
            kept = kept if head_scale == 1.0 else kept.float()
            out[name] = _scale_norm(kept, head_scale, adapter.norm).contiguous()
        elif name == head:
            out[name] = tensor.index_select(1, hidden).contiguous()
        else:
            out[name] = tensor
    return out


def _expert_renames(adapter, keep: Keep, layer: int) -> dict[str, tuple[str, str, torch.Tensor]]:
    """Each kept expert linear of kept layer `layer`: its new name (kept experts renumbered
    in order), its role and the neurons it keeps."""
    out = {}
    for new, (old, neurons) in enumerate(zip(keep.experts[layer], keep.mlp[layer], strict=True)):
        index = torch.tensor(neurons, device="cpu")
        for role in ("gate", "up", "down"):
            out[adapter.expert_linear(old, role)] = (adapter.expert_linear(new, role), role, index)
    return out


def _embedding_rescale(adapter, before: int, after: int, tied: bool) -> tuple[float, float]:
    """A family that multiplies the embedding by sqrt(hidden) (gemma3) would scale what
    enters the residual stream by sqrt(after / before) once the width shrinks: the stored
    embedding takes the inverse factor so the kept channels carry the original values. A
    tied head reads that same matrix, so the final norm takes the factor back and the
    logits are unchanged. Returns (embedding factor, final-norm factor)."""
    if not adapter.scaled_embedding or after == before:
        return 1.0, 1.0
    factor = (before / after) ** 0.5
    return factor, (1 / factor if tied else 1.0)


def _scale_norm(weight: torch.Tensor, factor: float, kind: str) -> torch.Tensor:
    """A norm weight whose output is `factor` times the original's: x·w or x·(1+w)."""
    if factor == 1.0:
        return weight
    if kind.endswith("1p"):
        return ((1 + weight.double()) * factor - 1).to(weight.dtype)
    return (weight.double() * factor).to(weight.dtype)


def pruned_config(config: dict, target: Shape, keep: Keep) -> dict:
    """config.json of the pruned model: the new widths, and any per-layer lists cut too."""
    new = target.apply(config)
    n = config["num_hidden_layers"]
    for key, value in config.items():
        if isinstance(value, list) and len(value) == n and key != "architectures":
            new[key] = [value[i] for i in keep.layers]
    adapter = adapter_for(config)
    if adapter.predictor_layers:  # GLM-4.5's MTP block is not cut: the pruned model has none
        from compress.model.spec import hf_config

        key = type(hf_config(config)).attribute_map.get(adapter.predictor_layers)
        new[key or adapter.predictor_layers] = 0
    if adapter.mixed and len(keep.layers) < n:  # the dense layers, at their new indices
        dense = [j for j, i in enumerate(keep.layers) if i in adapter.dense_layers]
        new = adapter.moe.place_dense(new, dense)
    return new
