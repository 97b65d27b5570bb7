"""Decode steps of several engines alternating in one process, so that a noisy neighbour
slows all alike: the A/B harness of benchmarks/hugepages.py and decode_step.py."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from compress.runtime.engine import Engine, Request
from compress.runtime.sampling import SamplingParams


def running_engine(
    weights, scheme, batch: int = 1, temperature: float = 0.0, top_p: float = 1.0
) -> Engine:
    """An engine decoding `batch` sequences (32-token prompts, up to 300 tokens out),
    past its prefill and first step; greedy, or sampled (at `top_p`) with sequence b
    seeded b."""
    e = Engine(weights, batch, 400, scheme, prefill_tokens=32 * batch)
    for b in range(batch):
        params = SamplingParams(
            max_tokens=300,
            ignore_eos=True,
            temperature=temperature,
            top_p=top_p,
            seed=b if temperature else None,
        )
        e.submit(Request(list(range(100 + b, 132 + b)), params))
    e.step()  # prefill
    e.step()
    return e


def step_medians(
    fresh: dict[str, Callable[[], Engine]], steps: int, before: Callable[[str], None] | None = None
) -> dict[str, float]:
    """Median milliseconds per step of each engine `fresh[name]()` makes (remade when its
    sequences finish), steps alternating, the order reversed every other round.
    `before(name)` runs ahead of each of that engine's steps, untimed."""
    engines = {name: make() for name, make in fresh.items()}
    times: dict[str, list[float]] = {name: [] for name in fresh}
    for i in range(steps):
        for name in list(fresh) if i % 2 else list(fresh)[::-1]:
            if engines[name].idle:
                engines[name] = fresh[name]()
            if before is not None:
                before(name)
            t = time.perf_counter()
            engines[name].step()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def save(out: Path, name: str, command: str, rows: list[dict]) -> None:
    """out/name: the rows with the command, the CPU and torch's thread count."""
    from batched_decode import cpu_flags

    record = {"command": command, "cpu": cpu_flags(), "threads": torch.get_num_threads()}
    out.mkdir(parents=True, exist_ok=True)
    (out / name).write_text(json.dumps({**record, "rows": rows}, indent=1) + "\n")
