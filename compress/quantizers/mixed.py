"""Mixed precision to a bits budget: the most sensitive linears get more bits.

Recipe form (or `llmpress compress --bits 4.6`), before the quantizing stages:

    - mixed: {bits_budget: 4.6}
    - awq: {bits: 4, group_size: 64}

Sensitivity is the second-order estimate of the KL divergence that quantizing one
linear alone adds: ½ Σ F ⊙ (W − Q(W))², with F the diagonal of the model's Fisher
information, measured with labels sampled from the model's own predictions (so it is the
Fisher of the KL to itself, not the "empirical" one of the data labels). Inputs are the
calibration text and labels are drawn independently per position, so the square of one
sequence's gradient, divided by its length, estimates the per-token Fisher without bias.
benchmarks/sensitivity.py shows it ranks linears as the KL measured one at a time does.

Each linear then takes one of the options (its quantizers' scheme, `options`) so that
the summed estimate is least with the average stored bits per weight — integers, scales
and zero points counted as the manifest counts them — within the budget: a Lagrangian
search on the price of a bit, then the leftover bits spent greedily. Cheaper options
(larger groups) pay for dearer ones (smaller groups, 8 bits). The artifact stays standard
per-layer schemes: one compressed-tensors config group per scheme.

Linears an engine loads fused (q/k/v as vLLM's qkv_proj, gate/up as gate_up_proj: the
adapter's `fused_linears`) are one choice: they take the same scheme, since a fused
tensor has one. Their costs and bits add up.
"""

from __future__ import annotations

import dataclasses
import re
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from compress.draw import draw
from compress.errors import LlmpressError
from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.stage import Described, ModelContext, matches_ignore, register_stage

_LABEL = re.compile(r"^w(?P<bits>\d+)(?:g(?P<group>\d+))?(?P<zp>zp|sym)?$")

# the Fisher pass ran at 1/1.33 of a pass's rate on the default model (estimate.py)
FISHER_FACTOR = 1.33


@dataclass(frozen=True)
class MixedConfig:
    bits_budget: float = 4.5  # average stored bits per quantized weight, scales included
    # schemes a linear may take besides the quantizers' own (zero point as theirs unless
    # the label says zp/sym; no group means per-channel), where their group divides it;
    # None: default_options of the quantizers' scheme
    options: tuple[str, ...] | None = None
    samples: int = 16  # calibration sequences the Fisher information is averaged over
    seed: int = 0
    base: str | None = None  # the quantizing stages' scheme; the recipe fills it in

    def __post_init__(self) -> None:
        if not isinstance(self.bits_budget, (int, float)) or self.bits_budget <= 0:
            raise LlmpressError(f"mixed.bits_budget must be > 0, got {self.bits_budget!r}")
        if self.samples < 1:
            raise LlmpressError("mixed.samples must be >= 1")
        if self.options is None and self.base is not None:  # left None until it is known
            object.__setattr__(
                self, "options", default_options(parse_scheme(self.base, QuantScheme()))
            )
        if self.options is not None:
            object.__setattr__(self, "options", tuple(self.options))
        for label in self.options or ():
            parse_scheme(str(label), QuantScheme())  # refuse a bad label as the recipe is read
        if self.base is not None:
            fewest = min(parse_scheme(x, QuantScheme()).bits for x in (self.base, *self.options))
            if self.bits_budget <= fewest:
                raise LlmpressError(
                    f"mixed.bits_budget {self.bits_budget} leaves nothing for scales: every "
                    f"option stores at least {fewest} bits per weight plus scales; raise it "
                    f"or add a cheaper option (e.g. w{fewest - 1}g64)"
                )


def default_options(base: QuantScheme) -> tuple[str, ...]:
    """What a linear may take besides `base`: 4 bits in groups of 128 and 32, 8 bits per
    channel, and, below 3 bits, one bit more than the base in its groups. A 4-bit
    artifact keeps to the 4- and 8-bit layers that vLLM has kernels for. Before any repair
    (benchmarks/quality.py --mixed-options), w2g64zp to 2.6 bits drifted KL 0.967 with
    w3g64 offered against 1.096 without, while w3g64zp to 3.6 bits drifted 0.2595 with
    w4g64 offered against 0.2534 without."""
    options = ["w4g128", "w4g32", "w8"]
    if base.bits < 3:
        options.insert(0, dataclasses.replace(base, bits=base.bits + 1).label())
    return tuple(options)


def parse_scheme(label: str, base: QuantScheme) -> QuantScheme:
    """`w4g32` → QuantScheme(4, 32, base's zero point); `w8` is per-channel."""
    m = _LABEL.match(label.strip())
    if not m:
        raise LlmpressError(
            f"mixed.options: {label!r} is not a scheme; use w<BITS>[g<GROUP>][zp|sym], e.g. w4g32"
        )
    zero_point = base.zero_point if not m["zp"] else m["zp"] == "zp"
    group = int(m["group"]) if m["group"] else None
    return QuantScheme(int(m["bits"]), group, zero_point)


def stored_bits(
    scheme: QuantScheme, shape: tuple[int, int], scale_bits: int, exact: bool = False
) -> int | None:
    """Bits one linear of `shape` occupies under `scheme` (None: no group size fits, or
    with `exact` the requested one does not divide the width: an option is offered only
    where it stays as named, since vLLM has kernels for groups of 32, 64 and 128 only)."""
    out, width = shape
    group = scheme.group_for(width)
    if group is None or (exact and scheme.group_size and group != min(scheme.group_size, width)):
        return None
    groups = out * (width // group)
    return out * width * scheme.bits + groups * (scale_bits + scheme.bits * scheme.zero_point)


def choice_units(adapter, layers: int, ignore) -> dict[str, list[str]]:
    """{unit: its linears}: each fused group of a block (adapter.fused_linears) is one
    unit, every other block linear its own; ignored linears are left out."""
    units: dict[str, list[str]] = {}
    for i in range(layers):
        prefix, block = adapter.block_prefix(i), adapter.layer(i)
        fused = {rel: group for group in block.fused_linears for rel in group}
        for rel in block.block_linears:
            name = f"{prefix}.{rel}"
            if matches_ignore(name, ignore):
                continue
            key = f"{prefix}.{fused[rel][0]}" if rel in fused else name
            units.setdefault(key, []).append(name)
    return units


def unit_costs(
    units: dict[str, list[str]], single: dict[str, dict[str, tuple[float, int]]]
) -> dict[str, dict[str, tuple[float, int]]]:
    """(cost, bits) of each option for a unit: summed over its linears, offered only where
    every linear can take it."""
    out = {}
    for unit, members in units.items():
        common = set.intersection(*(set(single[n]) for n in members))
        out[unit] = {
            k: (sum(single[n][k][0] for n in members), sum(single[n][k][1] for n in members))
            for k in sorted(common)
        }
    return out


def fisher_diagonal(model, samples: torch.Tensor, names: list[str], seed: int) -> dict:
    """Per-weight Fisher information of the model's own predictive distribution, per token."""
    weights = {n: model.get_submodule(n).weight for n in names}
    saved = {p: p.requires_grad for p in model.parameters()}
    for p in model.parameters():
        p.requires_grad_(False)
    for w in weights.values():
        w.requires_grad_(True)
    fisher = {n: torch.zeros_like(w, dtype=torch.float32) for n, w in weights.items()}
    device = next(iter(weights.values())).device
    gen = torch.Generator(device=device).manual_seed(seed)  # labels drawn where logits are
    try:
        for ids in tqdm(samples, desc="fisher", unit="sample"):
            logits = model(input_ids=ids[None].to(device)).logits[0].float()
            with torch.no_grad():
                labels = draw(logits.softmax(-1), gen)
            loss = F.cross_entropy(logits, labels, reduction="sum")
            grads = torch.autograd.grad(loss, list(weights.values()))
            for n, g in zip(weights, grads, strict=True):
                fisher[n] += g.float().square() / ids.numel()
    finally:
        for p, flag in saved.items():
            p.requires_grad_(flag)
    return {n: f / len(samples) for n, f in fisher.items()}


def allocate(costs: dict[str, dict[str, tuple[float, int]]], budget_bits: float) -> dict:
    """{name: option} least in summed cost with summed bits <= budget_bits.

    `costs[name][option]` = (cost, bits). Each price λ of a bit gives every linear its
    cheapest option in cost + λ·bits; bisection finds the least λ within budget, then the
    leftover bits buy the upgrades with the best cost saved per bit.
    """

    def choose(lam: float) -> dict[str, str]:
        return {n: min(o, key=lambda k: o[k][0] + lam * o[k][1]) for n, o in costs.items()}

    def bits(choice: dict[str, str]) -> int:
        return sum(costs[n][k][1] for n, k in choice.items())

    cheapest = {n: min(o, key=lambda k: o[k][1]) for n, o in costs.items()}
    if bits(cheapest) > budget_bits:
        return {}
    lo, hi = 0.0, 1.0
    while bits(choose(hi)) > budget_bits:
        hi *= 4
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if bits(choose(mid)) > budget_bits else (lo, mid)
    choice = choose(hi)
    left = budget_bits - bits(choice)
    while True:
        best = None
        for n, opts in costs.items():
            c0, b0 = opts[choice[n]]
            for k, (c, b) in opts.items():
                if c < c0 and 0 < b - b0 <= left:
                    rate = (c0 - c) / (b - b0)
                    if best is None or rate > best[0]:
                        best = (rate, n, k, b - b0)
        if best is None:
            return choice
        _, n, k, extra = best
        choice[n], left = k, left - extra


@register_stage("mixed", MixedConfig)
class Mixed(Described):
    """Plans per-linear schemes before the block walk; changes no weight."""

    needs_calibration = True
    whole_model = True
    data_parallel = False  # its sensitivities see the whole model in one process
    changes_model = False
    plans_schemes = True

    @staticmethod
    def summary(record: dict) -> str | None:
        counts = ", ".join(f"{k} ×{v}" for k, v in record["schemes"].items())
        return f"mixed precision: {record['bits_per_weight']} bits/weight ({counts})"

    def work(self, load) -> float:
        """The Fisher pass: forward and backward of every sample, output projection
        included."""
        tokens = min(self.config.samples, load.samples) * load.length
        return FISHER_FACTOR * 3 * load.forward(tokens, head=True)

    def __init__(self, config: MixedConfig):
        self.config = config

    def preflight(self, config: dict) -> None:
        if self.config.base is None:
            raise LlmpressError("recipe: mixed chooses among quantizing schemes: put awq, "
                                "gptq or rtn after it")  # fmt: skip

    def planned_config(self, config: dict) -> dict:
        return config

    def run(self, ctx: ModelContext) -> dict:
        cfg = self.config
        base = parse_scheme(cfg.base, QuantScheme())
        options = {base.label(): base}
        for label in cfg.options:
            scheme = parse_scheme(label, base)
            options.setdefault(scheme.label(), scheme)
        units = choice_units(ctx.adapter, ctx.config["num_hidden_layers"], ctx.ignore)
        names = [n for members in units.values() for n in members]
        scale_bits = torch.finfo(ctx.storage_dtype).bits
        shapes = {n: tuple(ctx.model.get_submodule(n).weight.shape) for n in names}
        stored = {
            n: {
                k: b
                for k, s in options.items()
                if (b := stored_bits(s, shape, scale_bits, exact=s != base))
            }
            for n, shape in shapes.items()
        }
        weights = sum(a * b for a, b in shapes.values())
        least = sum(min(o.values()) for o in stored.values()) / weights
        if cfg.bits_budget < least:  # known from the shapes: refuse before the Fisher pass
            raise LlmpressError(
                f"mixed.bits_budget {cfg.bits_budget} is below the cheapest choice "
                f"({least:.3f} bits per weight with scales): raise it or add a cheaper option"
            )
        started = time.perf_counter()
        samples = ctx.samples[: cfg.samples]
        ctx.log(f"mixed precision: Fisher information on {len(samples)} calibration samples")
        fisher = fisher_diagonal(ctx.model, samples, names, cfg.seed)
        measured = time.perf_counter()
        single: dict[str, dict[str, tuple[float, int]]] = {}
        with torch.no_grad():
            for name in names:
                w = ctx.model.get_submodule(name).weight.detach().float()
                single[name] = {}
                for label, b in stored[name].items():
                    q = quantize_weight(w, options[label], ctx.storage_dtype).dequantize()
                    err = 0.5 * float((fisher[name] * (q - w).square()).sum())
                    single[name][label] = (err, b)
        costs = unit_costs(units, single)
        unit_choice = allocate(costs, cfg.bits_budget * weights)
        choice = {n: k for unit, k in unit_choice.items() for n in units[unit]}
        ctx.schemes.update({n: options[k] for n, k in choice.items() if k != base.label()})
        total = sum(single[n][k][1] for n, k in choice.items())
        uniform = sum(o[base.label()][0] for o in single.values() if base.label() in o)
        counts: dict[str, int] = {}
        for k in choice.values():
            counts[k] = counts.get(k, 0) + 1
        return {
            "stage": "mixed",
            "config": dataclasses.asdict(cfg),
            "bits_per_weight": round(total / weights, 4),
            "schemes": dict(sorted(counts.items())),
            "layers": {n: k for n, k in choice.items() if k != base.label()},
            # the Fisher estimate of the KL all the rounding adds, before and after choosing
            "estimated_kl": {
                base.label(): round(uniform, 5),
                "mixed": round(sum(single[n][k][0] for n, k in choice.items()), 5),
            },
            "seconds": {
                "fisher": round(measured - started, 1),
                "allocate": round(time.perf_counter() - measured, 1),
            },
        }
