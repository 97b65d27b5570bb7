"""The `prune` stage: score units on calibration data, keep the best, write a smaller model.

Recipe form:

    - prune: {mlp: 0.25, heads: 0.33, hidden: 0.1, layers: 4}
    - prune: {params: 0.7}                       # of the non-embedding parameters
    - prune: {params: 0.7, split: [layers]}      # depth only
    - prune: {params: 0.7, importance: random}   # the baseline to beat
    - prune: {experts: 0.5, mlp: 0.25}           # MoE: half the experts, narrower ones
                                                 # (and any dense MLP layers narrower)
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from compress import distributed
from compress.errors import LlmpressError
from compress.model.adapters import adapter_for
from compress.model.loading import build_model
from compress.pruning.importance import activation_importance, random_importance
from compress.pruning.plan import Shape, check_targets, split_params, target_shape
from compress.pruning.surgery import Keep, choose, prune_state, pruned_config
from compress.stage import Described, Figure, ModelContext, register_stage

MULTIPLE = 32  # the CPU kernels pack 32 inputs


@dataclass(frozen=True)
class PruneConfig:
    mlp: float = 0.0  # fraction of MLP neurons to remove (every layer the same)
    heads: float = 0.0  # fraction of query heads to remove
    hidden: float = 0.0  # fraction of hidden (embedding) channels to remove
    layers: int = 0  # whole layers to remove
    experts: float = 0.0  # MoE: fraction of each layer's experts to remove
    params: float | None = None  # target non-embedding parameters: fraction (<= 1) or count
    split: str | tuple[str, ...] = "auto"  # axes a `params` target is cut from (auto: try)
    head_mode: str = "within_groups"  # or kv_groups: drop a KV head with its query heads
    layer_metric: str = "drift"  # rank layers by removal KL (drift) or block influence (bi)
    importance: str = "activation"  # or random (a baseline)
    # kept hidden/MLP widths are multiples of this; None: MULTIPLE, or the group size of the
    # quantizing stage after it where that is larger (recipe.py), so the widths are whole
    # groups (a V2-Lite MLP pruned to 1056 left its experts' down_proj in groups of 32
    # beside gate/up in 64, which vLLM's one-scheme fused MoE refuses)
    multiple: int | None = None
    samples: int | None = None  # calibration samples to score on (default: all)
    drift_samples: int = 2  # samples for the layer-removal KL and the `auto` split
    seed: int = 0  # for importance: random

    def __post_init__(self) -> None:
        axes = (self.mlp, self.heads, self.hidden, self.layers, self.experts)
        if self.params is None and not any(axes):
            raise LlmpressError("prune: nothing to remove; give e.g. {mlp: 0.25} or {params: 0.7}")
        if self.params is not None and any(axes):
            raise LlmpressError("prune: give either `params` or per-axis targets, not both")
        if self.params is not None and (
            self.params <= 0 or (self.params > 1 and self.params != int(self.params))
        ):
            raise LlmpressError(
                f"prune.params: {self.params!r} is neither a fraction in (0, 1] of the "
                "non-embedding parameters nor a whole count of them (e.g. 0.7 or 90000000)"
            )
        if self.importance not in ("activation", "random"):
            raise LlmpressError(f"prune.importance: {self.importance!r}: use activation or random")
        if self.layer_metric not in ("drift", "bi"):
            raise LlmpressError(f"prune.layer_metric: {self.layer_metric!r}: use drift or bi")
        if self.multiple is not None and self.multiple < 1:
            raise LlmpressError("prune.multiple: must be >= 1")
        cuts = {"mlp": self.mlp, "heads": self.heads, "hidden": self.hidden}
        cuts["experts"] = self.experts
        check_targets(cuts, self.splits()[0], self.head_mode, None)

    @property
    def widths_multiple(self) -> int:
        return self.multiple or MULTIPLE

    def splits(self, full: Shape | None = None) -> list[tuple[str, ...]]:
        """The candidate splits of a `params` target (one unless `auto`; a
        Mixture-of-Experts model, `full`, also tries removing whole experts)."""
        if self.split == "auto":
            splits = list(AUTO_SPLITS) + (list(MOE_SPLITS) if full and full.experts else [])
            if full and full.attention:  # an attention left whole: its heads and hidden stay
                splits = [s for s in splits if not set(s) & WHOLE_ATTENTION]
            return splits
        return [(self.split,) if isinstance(self.split, str) else tuple(self.split)]


# Tried by `split: auto`, in this order; the pruned model that drifts least on calibration
# samples wins. (On SmolLM2-135M at 70%: MLP alone drifts least before repair.)
AUTO_SPLITS = (
    ("mlp",),
    ("mlp", "heads"),
    ("mlp", "hidden"),
    ("mlp", "heads", "hidden"),
    ("layers",),
)
MOE_SPLITS = (("experts",), ("experts", "mlp"))  # `mlp` is each expert's width there
# what multi-head latent attention keeps: every head reads the latents, which are as wide
# as the config says, and the hidden width runs through them
WHOLE_ATTENTION = {"heads", "hidden"}


@register_stage("prune", PruneConfig)
class Prune(Described):
    tags = ("pruned", "minitron")
    changes_architecture = True

    @staticmethod
    def summary(record: dict) -> str | None:
        a, n = record["shape_after"], record["non_embedding_params"]
        experts = f", experts {a['experts']}" if a.get("experts") else ""
        if a.get("dense_layers"):
            experts += f", dense MLP {a['dense_intermediate']} in {a['dense_layers']} layers"
        return (
            f"pruned: hidden {a['hidden']}, heads {a['heads']} (KV {a['kv_heads']}), "
            f"MLP {a['intermediate']}, layers {a['layers']}{experts}; non-embedding "
            f"parameters {n['before']:,} → {n['after']:,}"
        )

    @staticmethod
    def figures(record: dict) -> list[Figure]:
        return [Figure("Pruning importance", "pruning.png", "pruning", record)]

    needs_calibration = True
    whole_model = True
    data_parallel = True  # its scores summed over the ranks

    def work(self, load) -> float:
        """Scoring every unit (one pass), and the layer-removal KL: each layer's removal
        reruns the layers after it, half the model on average."""
        c = self.config
        n = min(c.samples or load.samples, load.samples)
        drift = load.layers / 2 * load.forward(c.drift_samples * load.length, head=True)
        return load.forward(n * load.length, head=True) + drift

    def __init__(self, config: PruneConfig):
        self.config = config

    def plan(self, config: dict, split: tuple[str, ...] | None = None) -> tuple[Shape, Shape, dict]:
        """Shapes before and after, and the cuts; a `params` target uses `split` (default:
        the first candidate)."""
        c = self.config
        adapter = _prunable(config)
        full = Shape.of(config)
        asked = {a for a in WHOLE_ATTENTION if getattr(c, a)} if c.params is None else set()
        asked |= set(split or ()) & WHOLE_ATTENTION
        if adapter.latent and asked:
            raise LlmpressError(
                f"prune: {adapter.families[0]}'s multi-head latent attention keeps its "
                f"{' and '.join(sorted(asked))} (every head reads latents shared by all); "
                "cut mlp, experts or layers instead"
            )
        if adapter.attn_gate_in_q and asked:
            raise LlmpressError(
                f"prune: {adapter.families[0]}'s attention keeps its "
                f"{' and '.join(sorted(asked))} (each head's query and output gate share one "
                "projection, which pruning does not split yet); cut mlp, experts or layers "
                "instead"
            )
        if full.heads % full.kv_heads:
            raise LlmpressError(
                f"prune: {full.heads} heads do not split into {full.kv_heads} KV groups"
            )
        if c.params is None:
            cuts = {"mlp": c.mlp, "heads": c.heads, "hidden": c.hidden, "layers": c.layers}
            cuts["experts"] = c.experts
            check_targets(cuts, (), c.head_mode, full)
            shape = target_shape(full, cuts, head_mode=c.head_mode, multiple=c.widths_multiple)
            return full, _check_hidden(config, full, shape), cuts
        before = full.non_embedding_params()
        goal = int(c.params * before) if c.params <= 1 else int(c.params)
        if goal >= before:
            raise LlmpressError(
                f"prune.params: target {goal:,} is not below the model's {before:,} "
                "non-embedding parameters"
            )
        split = split or c.splits(full)[0]
        check_targets({}, split, c.head_mode, full)
        cuts, shape = split_params(
            full, goal, split, head_mode=c.head_mode, multiple=c.widths_multiple
        )
        return full, _check_hidden(config, full, shape), cuts

    def preflight(self, config: dict) -> None:
        """Every candidate split is planned now, so an impossible target fails at once."""
        _prunable(config)
        full = Shape.of(config)
        for split in self.config.splits(full) if self.config.params is not None else [()]:
            self.plan(config, split or None)

    def planned_config(self, config: dict) -> dict:
        return self.plan(config)[1].apply(config)

    def run(self, ctx: ModelContext) -> dict:
        """Prune the model in memory (after another whole-model stage changed it)."""

        def score(samples, drift):
            return activation_importance(
                ctx.model, ctx.adapter, samples, drift_samples=drift, log=ctx.log
            )

        def kls(samples, full, candidates):
            out = []
            for config, keep in candidates:
                model = self._build(ctx, full, keep, config)
                out.append(output_kl(ctx.model, model, samples))
                del model
            return out

        record, full, keep, config = self._prune(ctx.config, ctx.samples, ctx.log, score, kls)
        ctx.model = self._build(ctx, full, keep, config)
        ctx.config, ctx.adapter = config, adapter_for(config)  # the dense layers' new indices
        ctx.layer_map = [ctx.layer_map[i] for i in keep.layers] if ctx.layer_map else keep.layers
        ctx.hidden_index = _compose(ctx.hidden_index, keep.hidden)
        return record

    @staticmethod
    def _build(ctx: ModelContext, full: Shape, keep: Keep, config: dict):
        state = {k: v.cpu() for k, v in ctx.model.state_dict().items()}
        state = prune_state(ctx.adapter.checkpoint_names(state), ctx.adapter, full, keep)
        return build_model(config, state, adapter_for(config)).to(ctx.device)

    def run_streamed(self, store, samples, tokenizer, out, source_sha: str, log) -> tuple:
        """Prune the checkpoint `store` reads into a checkpoint at `out`, one block in memory
        at a time (pruning/streamed.py); returns the record and the units kept."""
        from compress.pruning import streamed

        def score(samples, drift):
            return streamed.streamed_importance(store, samples, drift_samples=drift)

        def kls(samples, full, candidates):
            return streamed.candidate_kls(store, samples, full, candidates)

        record, full, keep, config = self._prune(store.ckpt.config, samples, log, score, kls)
        if distributed.is_writer():  # every rank chose the same: rank 0 writes it
            streamed.write_pruned(store, full, keep, config, tokenizer, out, source_sha)
        distributed.barrier()
        return record, keep

    def _prune(self, config: dict, samples, log, score, kls) -> tuple[dict, Shape, Keep, dict]:
        """Score, choose the units of each candidate shape, keep the candidate that drifts
        least (`kls`, when there are several): (record, full shape, kept units, config)."""
        c = self.config
        started = time.perf_counter()
        samples = samples[: c.samples] if c.samples else samples
        splits = c.splits(Shape.of(config)) if c.params is not None else [()]
        candidates = _reaching([self.plan(config, split or None) for split in splits], c.params)
        full = candidates[0][0]
        if c.importance == "random":
            imp = random_importance(config, c.seed)
        else:
            deeper = any(shape.layers < full.layers for _, shape, _ in candidates)
            log(f"prune: scoring units on {samples.shape[0]} × {samples.shape[1]} tokens")
            imp = score(samples, c.drift_samples if deeper else 0)
        chosen = []
        for _, shape, cuts in candidates:
            keep = choose(imp, full, shape, c.head_mode, c.layer_metric)
            chosen.append((shape, cuts, keep, pruned_config(config, shape, keep)))
        tried, best = [], 0
        if len(chosen) > 1:
            drift = kls(samples[: c.drift_samples], full, [(cfg, k) for _, _, k, cfg in chosen])
            for (_, cuts, _, _), kl in zip(chosen, drift, strict=True):
                log(f"prune: split {'+'.join(k for k in cuts if cuts[k])}: KL {kl:.4f}")
                tried.append({"cuts": cuts, "kl": round(kl, 5)})
            best = min(range(len(drift)), key=drift.__getitem__)  # the first of equals
        target, cuts, keep, pruned = chosen[best]
        before, after = full.non_embedding_params(), target.non_embedding_params()
        log(
            f"prune: {before:,} → {after:,} non-embedding parameters ({after / before:.1%}): "
            f"hidden {full.hidden}→{target.hidden}, heads {full.heads}→{target.heads} "
            f"(KV {full.kv_heads}→{target.kv_heads}), MLP {full.intermediate}→"
            f"{target.intermediate}, layers {full.layers}→{target.layers}"
            + (f", experts {full.experts}→{target.experts}" if full.experts else "")
            + (
                f", dense MLP {full.dense_intermediate}→{target.dense_intermediate}"
                if full.dense_layers
                else ""
            )
        )
        record = {
            "stage": "prune",
            "cuts": cuts,
            "splits_tried": tried,
            "shape_before": _shape_record(full),
            "shape_after": _shape_record(target),
            "non_embedding_params": {"before": before, "after": after},
            "kept": keep.to_manifest(full),
            "importance": imp.to_manifest(),
            "seconds": round(time.perf_counter() - started, 2),
        }
        return record, full, keep, pruned


@torch.no_grad()
def output_kl(reference, model, samples: torch.Tensor) -> float:
    """KL(reference ‖ model) per token on `samples`: how far a candidate drifts, unrepaired."""
    samples = samples.to(next(model.parameters()).device)
    p = torch.log_softmax(reference(input_ids=samples, use_cache=False).logits.float(), -1)
    q = torch.log_softmax(model(input_ids=samples, use_cache=False).logits.float(), -1)
    return float((p.exp() * (p - q)).sum(-1).mean())


MOE_ONLY = ("experts", "top_k", "shared", "shared_experts", "dense_layers", "dense_intermediate")


GROUPED_ONLY = ("groups", "groups_chosen", "group_best")


def _shape_record(shape: Shape) -> dict:
    """The manifest's shape: the experts' sizes only for a Mixture-of-Experts model, their
    groups only where the router has them, the attention's count only where it is whole."""
    left_out = (*(() if shape.experts else MOE_ONLY), *(() if shape.groups > 1 else GROUPED_ONLY))
    left_out += () if shape.attention else ("attention",)
    left_out += ("gated_mlp", "attn_gate", "norms", "moe_norms")  # what blocks compute
    return {k: v for k, v in vars(shape).items() if k not in left_out}


def _compose(previous, kept: list[int]):
    kept_t = torch.tensor(kept, device="cpu")
    return kept_t if previous is None else previous[kept_t]


REACH = 0.05  # of the non-embedding parameters: how far a split may land from its goal


def _reaching(candidates: list, params: float | None) -> list:
    """The splits that land within REACH of a `params` goal (all of them otherwise, or the
    closest when none does): a split that cannot cut enough (layers, where a model has too
    few that may go) would else win the drift contest by removing less."""
    if params is None or len(candidates) == 1:
        return candidates
    before = candidates[0][0].non_embedding_params()
    goal = params * before if params <= 1 else params
    miss = [abs(shape.non_embedding_params() - goal) / before for _, shape, _ in candidates]
    near = [cand for cand, m in zip(candidates, miss, strict=True) if m <= REACH]
    return near or [candidates[min(range(len(miss)), key=miss.__getitem__)]]


def _check_hidden(config: dict, full: Shape, shape: Shape) -> Shape:
    """A family whose loaders need heads × head_dim = hidden (phi3, helium) must keep it."""
    adapter = adapter_for(config)
    if adapter.heads_span_hidden and shape.hidden != shape.heads * shape.head_dim:
        raise LlmpressError(
            f"prune: {adapter.families[0]} loaders need heads × head_dim = hidden, which this "
            f"cut makes {shape.heads} × {shape.head_dim} against {shape.hidden}; cut hidden "
            "and heads by the same fraction, or neither"
        )
    return shape


def _mixer_name(adapter) -> str:
    """What a model's recurrent layers are, for messages."""
    if adapter.mamba:
        return "Mamba-2" if adapter.mixer_kind == "mamba2" else "Mamba"
    return "short-convolution" if adapter.short_conv else "Gated DeltaNet"


def _prunable(config: dict):
    """The config's adapter, or a one-line refusal where pruning cannot cut its blocks."""
    adapter = adapter_for(config)
    if adapter.linear_layers:  # its widths, depth and parameter count are attention's
        raise LlmpressError(
            f"prune: {adapter.families[0]}'s {_mixer_name(adapter)} "
            "layers are not pruned yet "
            "(their heads, the widths they read and the layer kinds a cut depth keeps); "
            "compress it without a prune stage"
        )
    return adapter
