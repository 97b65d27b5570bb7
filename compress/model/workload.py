"""What a checkpoint's calibration costs in FLOPs, and this machine's rate: the numbers
the time estimates (compress/estimate.py, the self-generated text's in calib_data/cost.py)
divide. Below both, so each reads the one count."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Workload:
    """What the work of a recipe depends on: one block's linears, the model's depth and
    output projection, and the calibration tokens."""

    layers: int
    linears: tuple[tuple[int, int], ...]  # one block's [out, in], every expert's too
    # one block's distinct linear inputs (GPTQ's Hessians): (width, share of the
    # calibration tokens it is summed over: top_k / experts for a routed expert's)
    inputs: tuple[tuple[int, float], ...]
    active: float  # share of a block's weights one token multiplies (top_k of experts)
    hidden: int
    vocab: int
    samples: int
    length: int

    @property
    def tokens(self) -> int:
        return self.samples * self.length

    @property
    def block_weights(self) -> int:
        """Every block linear's weights, summed over the depth."""
        return self.layers * sum(o * i for o, i in self.linears)

    def forward(self, tokens: int, head: bool = False) -> float:
        """FLOPs of `tokens` through every block (and the output projection): 2 per weight
        a token multiplies, plus attention over half the sequence on average."""
        weights = self.active * self.block_weights + (self.vocab * self.hidden if head else 0)
        return tokens * (2 * weights + 2 * self.length * self.hidden * self.layers)


def workload(ckpt, samples: int, length: int) -> Workload:
    """The workload of `ckpt` (its bound adapter) on samples × length calibration tokens."""
    adapter, config = ckpt.adapter, ckpt.config
    shape = adapter.shape(config)
    shapes = adapter.linear_shapes(shape)
    shared = {name: group[0] for group in adapter.shared_inputs for name in group}
    mlp = adapter.spec(config).mlp
    total = sum(o * i for o, i in shapes.values())
    active = 1.0
    if mlp is not None:  # a token multiplies top_k of the experts' weights
        experts = sum(o * i for n, (o, i) in shapes.items() if n in adapter.expert_linears)
        active = (total - experts + experts * mlp.top_k / mlp.experts) / total
        inputs = _expert_inputs(adapter, shapes, shared, mlp, samples * length, shape.hidden)
    else:
        inputs = {shared.get(name, name): (shapes[name][1], 1.0) for name in shapes}
    return Workload(
        layers=shape.layers,
        linears=tuple(shapes.values()),
        inputs=tuple(inputs.values()),
        active=active,
        hidden=shape.hidden,
        vocab=shape.head_rows,  # the head's rows (Apertus 1.5's: text ids)
        samples=samples,
        length=length,
    )


def _expert_inputs(adapter, shapes, shared, mlp, tokens: int, hidden: int) -> dict:
    """The inputs of an MoE block as calibration sums them (model/moe.py): an expert routed
    fewer tokens than its input width (here: at the mean count) is calibrated on every
    token, and every such expert's gate/up share one H with the shared expert's
    (gptq._every_token_inputs), each down its own on every token; otherwise each expert's
    inputs sum its routed share (each expert counted on every token, 64 experts' gate/up
    at DeepSeek-V2-Lite's widths were 64 Hessians where calibration sums one)."""
    every = tokens * mlp.top_k / mlp.experts < hidden
    downs = {adapter.expert_linear(e, "down") for e in range(adapter.experts)}
    joined = set(adapter.expert_linears) - downs | set(adapter.shared_linears[:2])
    inputs = {}
    for name in shapes:
        width, share = shapes[name][1], 1.0
        key = shared.get(name, name)
        if every and name in joined:
            key = "every token"
        elif not every and name in adapter.expert_linears:
            share = mlp.top_k / mlp.experts
        inputs[key] = (width, share)
    return inputs


@functools.cache
def matmul_rate(rows: int, width: int, seconds: float = 0.2) -> float:
    """FLOP/s of a float32 [rows, width] × [width, width] product on this machine, measured
    once a process: a fifth of a second each time cost the Python API's repeated
    compresses of a small model more than a seventh of their time."""
    a, b = torch.randn(rows, width), torch.randn(width, width)
    a @ b  # warm-up: threads started, memory touched
    return peak_rate(lambda: a @ b, 2 * rows * width * width, seconds)


def peak_rate(product, flops: float, seconds: float) -> float:
    """FLOP/s of the fastest call of `product` in about `seconds` (five calls at least).
    A shared host only ever slows a call (a neighbour's burst, a thread descheduled), so
    the fastest one is the machine's rate. The median was not enough: in one run, presets
    doing the same work printed 9.4, 16.4 and 10.6 minutes for runs of 7.2, 7.5 and 8.0.
    On a quiet host the peak is 1-2% above the median, so the factors fitted on it stand."""
    best, calls, start = float("inf"), 0, time.perf_counter()
    while calls < 5 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        product()
        best = min(best, time.perf_counter() - t0)
        calls += 1
    return flops / best


def duration(seconds: float) -> str:
    minutes = seconds / 60
    if minutes < 1:
        return "<1 min"
    return f"{minutes:.0f} min" if minutes < 90 else f"{minutes / 60:.1f} h"
