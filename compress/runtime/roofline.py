"""`llmpress bench --sweep`: where an artifact's decode is memory-bound, compute-bound, or
bound by its KV cache, on a roofline whose ceilings are measured in the same run.

Each point is one decode step timed at a batch size and a context length. The cache is
filled with random keys and values (`KVCache.fill_random`: a step's cost does not depend
on them), so a 4096-token context costs no prefill. Bytes per step: every weight as stored
plus the KV cache each sequence reads; FLOPs per step: 2 × linear parameters × batch plus
the attention's 4 × heads × head dim × context × layers × batch. The ceilings (memory
read bandwidth, fp32 matmul rate and, on the CPU, the int8 dot-product rate packed
weights compute at) are medians of repeats taken before and after the sweep.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from compress.runtime.bench import measure_ceilings, sync
from compress.runtime.kv_cache import FP32, KVScheme, cache_for
from compress.runtime.model import Model
from compress.runtime.weights import ModelWeights

BATCHES = (1, 2, 4, 8, 16, 32, 64)  # at context CONTEXTS[0]
CONTEXTS = (128, 256, 512, 1024, 2048, 4096)  # at batch CONTEXT_BATCH
CONTEXT_BATCH = 8


@dataclass
class Point:
    sweep: str  # "batch" or "context"
    batch: int
    context: int
    step_s: float
    tokens_per_s: float
    weight_bytes: float  # per step
    kv_bytes: float  # per step
    flops: float  # per step
    gbytes_per_s: float
    gflops_per_s: float
    intensity: float  # FLOP per byte
    mbu: float


def measure_point(model: Model, sweep, batch, context, kv: KVScheme, steps: int) -> Point:
    w, s = model.w, model.w.shape
    gen = torch.Generator().manual_seed(batch * 10_000 + context)
    cache = cache_for(w, batch, context + steps + 2, kv)
    cache.fill_random(batch, context, gen)
    slots = torch.arange(batch, device=model.device)
    tokens = torch.randint(s.vocab, (batch,), generator=gen)
    model.decode(tokens, cache, slots)  # warm-up step
    sync(model.device)
    t = time.perf_counter()
    for _ in range(steps):
        model.decode(tokens, cache, slots)
    sync(model.device)
    step_s = (time.perf_counter() - t) / steps
    mean_ctx = context + 1 + steps / 2
    kv_bytes = cache.bytes_per_token() * mean_ctx * batch
    kv_bytes += 2 * w.state_bytes * batch  # recurrent layers' states, read and written back
    params = w.active_params
    flops = 2 * params * batch + 4 * s.heads * s.head_dim * w.spec.cached_layers * mean_ctx * batch
    nbytes = w.step_bytes + kv_bytes
    return Point(
        sweep, batch, context, step_s, batch / step_s, w.step_bytes, kv_bytes, flops,
        nbytes / step_s / 1e9, flops / step_s / 1e9, flops / nbytes, 0.0,
    )  # fmt: skip


def sweep(
    weights: ModelWeights,
    kv: KVScheme = FP32,
    batches=None,
    contexts=None,
    context_batch: int | None = None,
    steps: int = 8,
    repeats: int = 5,
    log=print,
) -> dict:
    """The roofline record: ceilings (samples and medians) and one Point per setting
    (batches, contexts, context_batch: default BATCHES, CONTEXTS, CONTEXT_BATCH)."""
    batches, contexts = batches or BATCHES, contexts or CONTEXTS
    context_batch = context_batch or CONTEXT_BATCH
    device = weights.embed.device
    model = Model(weights, max(max(contexts), min(contexts)) + steps + 4)
    before = measure_ceilings(device, repeats)
    log(_ceiling_line("before", before))
    todo = [("batch", b, contexts[0]) for b in batches]
    todo += [("context", context_batch, c) for c in contexts]
    points = []
    for i, (kind, b, c) in enumerate(todo, 1):
        p = measure_point(model, kind, b, c, kv, steps)
        points.append(p)
        log(
            f"[{i}/{len(todo)}] batch {b}, context {c}: {p.tokens_per_s:.1f} tok/s, "
            f"{p.gbytes_per_s:.1f} GB/s, {p.gflops_per_s:.1f} GFLOP/s"
        )
    after = measure_ceilings(device, repeats)
    log(_ceiling_line("after", after))
    bandwidth = statistics.median(before["bandwidth"] + after["bandwidth"])
    matmul = statistics.median(before["matmul"] + after["matmul"])
    int8 = statistics.median(before["int8"] + after["int8"]) if "int8" in before else None
    for p in points:
        p.mbu = p.gbytes_per_s * 1e9 / bandwidth
    return {
        "device": str(device),
        "threads": torch.get_num_threads(),
        "kv_cache": kv.config(),
        "ceilings": {
            "bandwidth_bytes_per_s": bandwidth,
            "matmul_flops": matmul,
            "int8_dot_ops": int8,
            "samples": {"before": before, "after": after},
        },
        "points": [asdict(p) for p in points],
    }


def _ceiling_line(when: str, c: dict) -> str:
    bw, mm = statistics.median(c["bandwidth"]), statistics.median(c["matmul"])
    line = f"ceilings {when}: memory read {bw / 1e9:.1f} GB/s, fp32 matmul {mm / 1e9:.0f} GFLOP/s"
    if "int8" in c:
        line += f", int8 dot products {statistics.median(c['int8']) / 1e9:.0f} GOP/s"
    return line


def plot_roofline(record: dict, path: Path, title: str = "") -> None:
    """Achieved GFLOP/s against FLOP/byte, under the measured bandwidth and matmul
    ceilings; the KV cache's share of each step's bytes colours the points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    bw = record["ceilings"]["bandwidth_bytes_per_s"] / 1e9
    peak = record["ceilings"]["matmul_flops"] / 1e9
    pts = record["points"]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    lo = min(p["intensity"] for p in pts) / 2
    int8 = (record["ceilings"].get("int8_dot_ops") or 0) / 1e9
    hi = max(max(p["intensity"] for p in pts) * 2, max(peak, int8) / bw * 4)
    ridge = peak / bw  # FLOP/byte where the two ceilings meet
    ax.plot([lo, ridge], [bw * lo, peak], color="black", lw=1.5,
            label=f"memory read {bw:.1f} GB/s")  # fmt: skip
    ax.plot([ridge, hi], [peak, peak], color="grey", lw=1.5, ls="--",
            label=f"fp32 matmul {peak:.0f} GFLOP/s")  # fmt: skip
    if int8:  # packed weights multiply int8 activations: their own roof
        ax.plot([int8 / bw, hi], [int8, int8], color="grey", lw=1.5, ls=":",
                label=f"int8 dot products {int8:.0f} GOP/s")  # fmt: skip
    for kind, marker in (("batch", "o"), ("context", "s")):
        sel = [p for p in pts if p["sweep"] == kind]
        share = [p["kv_bytes"] / (p["kv_bytes"] + p["weight_bytes"]) for p in sel]
        sc = ax.scatter(
            [p["intensity"] for p in sel], [p["gflops_per_s"] for p in sel], c=share,
            cmap="viridis", vmin=0, vmax=1, marker=marker, s=45, edgecolors="black",
            label=f"{kind} sweep",
        )  # fmt: skip
        for p in sel:
            label = f"B{p['batch']}" if kind == "batch" else f"L{p['context']}"
            offset = (4, -9 if kind == "context" else 4)
            xy = (p["intensity"], p["gflops_per_s"])
            ax.annotate(label, xy, xytext=offset, textcoords="offset points", fontsize=7)
    fig.colorbar(sc, ax=ax, label="KV cache share of bytes per step")
    ax.set_xscale("log")
    ax.set_yscale("log")
    for axis in (ax.xaxis, ax.yaxis):  # plain numbers at 1, 2, 5 × 10^k
        axis.set_major_locator(matplotlib.ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        axis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("arithmetic intensity (FLOP per byte read)")
    ax.set_ylabel("achieved GFLOP/s")
    ax.set_title(title or "decode roofline", fontsize=10)
    ax.legend(loc="lower right", fontsize=8, title="ceilings (medians) and points",
              title_fontsize=8)  # fmt: skip
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def format_sweep(record: dict) -> str:
    head = "| sweep | batch | context | tok/s | GB/s | GFLOP/s | FLOP/B | KV share | MBU |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    for p in record["points"]:
        share = p["kv_bytes"] / (p["kv_bytes"] + p["weight_bytes"])
        lines.append(
            f"| {p['sweep']} | {p['batch']} | {p['context']} | {p['tokens_per_s']:.1f} | "
            f"{p['gbytes_per_s']:.1f} | {p['gflops_per_s']:.1f} | {p['intensity']:.1f} | "
            f"{100 * share:.0f}% | {100 * p['mbu']:.0f}% |"
        )
    return "\n".join(lines)
