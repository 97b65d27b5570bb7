"""From targets (`mlp: 0.25`, `heads: 0.33`, `hidden: 0.1`, `layers: 4`, `experts: 0.5`,
`params: 0.7`) to the widths and depth of the pruned model, before any importance is
computed. In a Mixture-of-Experts model `mlp` cuts each expert's width and `experts`
removes whole experts (every layer the same count, at least top_k). Where such a model
keeps a dense MLP in some layers (GLM-4.5's first), `mlp` cuts that width by the same
fraction, and `layers` removes only its expert layers: the dense ones stay, and the keys
that place them (first_k_dense_replace and the like) are rewritten for the new depth.

Widths stay uniform across layers (every layer keeps the same number of heads and
neurons) so that the result is a plain config.json that transformers loads. Hidden and
MLP widths are rounded to a multiple (32 by default: the CPU kernels pack 32 inputs);
the hidden width must also be a multiple of the head count (transformers' llama config
refuses anything else), so it moves in steps of lcm(heads, multiple), or lcm(heads, 8)
where that step would be coarser than an eighth of the width.
A `params` target is split across the `split` axes by cutting the same fraction from
each, the fraction found by search over the discrete widths.
"""

from __future__ import annotations

import math

from compress.errors import LlmpressError
from compress.model.adapters import Widths

AXES = ("mlp", "heads", "hidden", "layers", "experts")
HEAD_MODES = ("within_groups", "kv_groups")


Shape = Widths  # the widths a pruning plan changes


def _round(width: int, keep: float, multiple: int) -> int:
    if keep >= 1.0:
        return width
    kept = round(width * keep / multiple) * multiple
    return max(multiple, min(width, kept)) if width > multiple else max(1, round(width * keep))


def target_shape(
    shape: Shape,
    cuts: dict[str, float],
    *,
    head_mode: str = "within_groups",
    multiple: int = 32,
) -> Shape:
    """The shape after removing fraction cuts[axis] of each width axis and cuts['layers']
    whole layers (a count)."""
    group = shape.heads // shape.kv_heads
    heads_cut = cuts.get("heads", 0.0)
    if head_mode == "kv_groups" or group == 1:  # multi-head: a group is one head
        kv = max(1, round(shape.kv_heads * (1 - heads_cut)))
        heads = kv * group
    else:
        kv = shape.kv_heads
        heads = max(1, round(group * (1 - heads_cut))) * kv
    step = math.lcm(heads, multiple)
    if step > shape.hidden // 8:
        step = math.lcm(heads, 8)
    intermediate = _round(shape.intermediate, 1 - cuts.get("mlp", 0.0), multiple)
    per_group = shape.experts // shape.groups
    return Shape(
        hidden=_round(shape.hidden, 1 - cuts.get("hidden", 0.0), step),
        heads=heads,
        kv_heads=kv,
        head_dim=shape.head_dim,
        intermediate=intermediate,
        layers=shape.layers - int(cuts.get("layers", 0)),
        # (every group of a grouped router keeps as many)
        experts=round(per_group * (1 - cuts.get("experts", 0.0))) * shape.groups,
        top_k=shape.top_k,
        # a shared expert n experts wide (GLM-4.5's) is cut with them; one of its own width
        # (qwen2_moe's) keeps it: only the hidden width runs through it
        shared=intermediate * shape.shared_experts if shape.shared_experts else shape.shared,
        shared_experts=shape.shared_experts,
        dense_layers=shape.dense_layers,  # never removed: see check_targets
        dense_intermediate=(
            _round(shape.dense_intermediate, 1 - cuts.get("mlp", 0.0), multiple)
            if shape.dense_layers
            else 0
        ),
        attention=shape.attention,  # a whole attention's parameters (latent: never cut)
        groups=shape.groups,
        groups_chosen=shape.groups_chosen,
        group_best=shape.group_best,
        gated_mlp=shape.gated_mlp,
        attn_gate=shape.attn_gate,
        norms=shape.norms,
        moe_norms=shape.moe_norms,
    )


def routable(shape: Shape, kept: int) -> bool:
    """Whether `kept` experts of `shape` still route: at least top_k, and under a grouped
    router the same count in each group, enough for a group's score (its best
    `group_best`) and, in the groups chosen, for top_k."""
    per = kept // shape.groups
    if shape.groups > 1 and (per < shape.group_best or per * shape.groups_chosen < shape.top_k):
        return False
    return kept >= shape.top_k


def split_params(
    shape: Shape,
    target: int,
    split: tuple[str, ...],
    *,
    head_mode: str = "within_groups",
    multiple: int = 32,
) -> tuple[dict[str, float], Shape]:
    """Cut the same fraction from every axis in `split` so that the non-embedding
    parameters come closest to `target`; returns the cuts (layers as a count) and shape."""
    best = None
    for step in range(0, 951):
        frac = step / 1000
        cuts = {a: frac for a in split if a != "layers"}
        if "layers" in split:
            cuts["layers"] = round(shape.layers * frac)
        candidate = target_shape(shape, cuts, head_mode=head_mode, multiple=multiple)
        if candidate.layers <= candidate.dense_layers or not routable(shape, candidate.experts):
            break
        miss = abs(candidate.non_embedding_params() - target)
        if best is None or miss < best[0]:
            best = (miss, cuts, candidate)
    assert best is not None
    return best[1], best[2]


def check_targets(cuts: dict, split: tuple[str, ...], head_mode: str, shape: Shape | None) -> None:
    for axis in split:
        if axis not in AXES:
            raise LlmpressError(f"prune.split: unknown axis {axis!r}; use some of {AXES}")
    if head_mode not in HEAD_MODES:
        raise LlmpressError(f"prune.head_mode: {head_mode!r} is not one of {HEAD_MODES}")
    for axis in ("mlp", "heads", "hidden", "experts"):
        if not 0.0 <= cuts.get(axis, 0.0) < 1.0:
            raise LlmpressError(
                f"prune.{axis}: {cuts[axis]} is not a fraction to remove in [0, 1), e.g. 0.25"
            )
    if shape is not None and (cuts.get("experts") or "experts" in split) and not shape.experts:
        raise LlmpressError(
            "prune.experts: this is not a Mixture-of-Experts model; cut mlp, heads, hidden or "
            "layers instead"
        )
    if shape is not None and shape.experts and cuts.get("experts"):
        kept = target_shape(shape, {"experts": cuts["experts"]}).experts
        per, g = kept // shape.groups, shape.groups
        if g > 1 and not routable(shape, kept):
            size = shape.experts // g
            least = max(shape.group_best, -(-shape.top_k // shape.groups_chosen))
            most = (
                f"remove at most {1 - least / size:.2f} of them"
                if least < size
                else "none can be removed; cut mlp or layers instead"
            )
            raise LlmpressError(
                f"prune.experts: the router chooses within {g} groups of {size} experts; "
                f"keeping {per} of each leaves too few to route to (at least {least} a "
                f"group): {most}"
            )
        if kept < shape.top_k:
            raise LlmpressError(
                f"prune.experts: keeping {kept} of {shape.experts} experts leaves fewer than "
                f"the {shape.top_k} each token is routed to; remove at most "
                f"{(shape.experts - shape.top_k) / shape.experts:.2f} of them"
            )
    if (
        shape is not None
        and shape.dense_layers
        and cuts.get("layers", 0) >= shape.layers - shape.dense_layers
    ):
        moe = shape.layers - shape.dense_layers
        raise LlmpressError(
            f"prune.layers: a model that keeps a dense MLP in {shape.dense_layers} of its "
            f"layers keeps them all and at least one of its {moe} Mixture-of-Experts layers; "
            f"remove at most {moe - 1}"
        )
    if shape is not None and not 0 <= cuts.get("layers", 0) < shape.layers:
        raise LlmpressError(
            f"prune.layers: cannot remove {cuts['layers']} of {shape.layers} layers; "
            f"give a count from 0 to {shape.layers - 1}"
        )
