"""`llmpress bench`: TTFT, time per output token, tokens/s and MBU of the runtime.

MBU (model bandwidth utilization) = bytes one decode step must read × steps per second ÷
the memory read bandwidth measured on this machine in the same run. Bytes per step: every
weight as stored (codes, scales, zero points; the lm_head once) plus the KV cache each
sequence reads at its mean context during the run. MFU for prefill: 2 × the blocks'
parameters × prompt tokens per second ÷ the rate their arithmetic allows, measured in the
same run: on the CPU, packed weights multiply int8 activations by integer dot products
(kernels/cpu/peak.c: their rate on this processor), dense ones run fp32 matmuls; on a GPU,
the fp32 matmul rate. (Against the fp32 rate an int8 prefill read 257%.) The head is left
out: a prefill computes it for one row a sequence.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from compress.kernels import hugepages
from compress.kernels.cpu import PackedLinear, amx_active, int8_dot_rate
from compress.runtime.engine import Engine, Request
from compress.runtime.kv_cache import FP32, KVScheme
from compress.runtime.sampling import SamplingParams
from compress.runtime.speculative import make_speculator
from compress.runtime.weights import ModelWeights


def measure_bandwidth(gib: float = 1.0, repeats: int = 5, device="cpu") -> float:
    """Memory read bandwidth of `device` in bytes/s: the median time to sum `gib` GiB. On
    the CPU the GiB sits in huge pages, as the runtime's weights do (hugepages.py): the
    ceiling is the best the memory gives, not what 4 KB pages leave of it."""
    n = int(gib * 2**30) // 4
    if torch.device(device).type == "cpu":
        x = hugepages.empty((n,)).fill_(1.0)
    else:
        x = torch.ones(n, device=device)
    return x.numel() * 4 / _median_time(x.sum, repeats, device)


def last_level_cache_bytes(root: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int | None:
    """The largest CPU cache's size (Linux sysfs), None where it cannot be read: a decode
    step whose bytes fit in it reads them partly from the cache, and MBU, counted against
    the memory's bandwidth, can pass 100% (a 135M w4 model on a 480 MiB L3 read 105%)."""
    sizes = []
    for entry in root.glob("index*"):
        try:
            if (entry / "type").read_text().strip() == "Instruction":
                continue
            text = (entry / "size").read_text().strip()
        except OSError:
            continue
        unit = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * unit)
    return max(sizes, default=None)


def measure_matmul_flops(n: int = 1024, repeats: int = 5, device="cpu") -> float:
    """fp32 matmul rate of `device` in FLOP/s (n × n by n × n, median of repeats)."""
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    return 2 * n**3 / _median_time(lambda: a @ b, repeats, device)


def measure_ceilings(device="cpu", samples: int = 5) -> dict[str, list[float]]:
    """`samples` readings of each ceiling (each itself a median of 3): for medians that
    one noisy reading cannot move."""
    out = {
        "bandwidth": [measure_bandwidth(repeats=3, device=device) for _ in range(samples)],
        "matmul": [measure_matmul_flops(repeats=3, device=device) for _ in range(samples)],
    }
    if torch.device(device).type == "cpu":  # packed weights' arithmetic (mfu_ceiling)
        out["int8"] = [int8_dot_rate() for _ in range(samples)]
    return out


def sync(device) -> None:
    """Wait for queued GPU work, so that a timer measures it (no-op on CPU)."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _median_time(fn, repeats: int, device) -> float:
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


@dataclass
class BenchResult:
    batch: int
    prompt_len: int
    output_len: int
    ttft_s: float  # first token of the whole batch, all prompts prefilled
    tpot_s: float  # time per decode step (one token for each sequence)
    tokens_per_s: float  # decode tokens/s, all sequences together
    bytes_per_step: float
    mbu: float
    prefill_tokens_per_s: float
    mfu: float
    mfu_of: str = "fp32 matmul"  # the ceiling MFU is a share of (mfu_ceiling)
    draft: str | None = None  # speculative decoding's proposer (`--draft`), if any
    acceptance: float | None = None  # drafted tokens the target kept
    speedup: float | None = None  # tokens/s over the same run without a draft
    row_cost: float | None = None  # a checked row past the first, in decode steps (measured)


def bench_one(
    weights: ModelWeights,
    batch: int,
    prompt_len: int,
    output_len: int,
    bandwidth: float,
    flops: float,
    kv: KVScheme = FP32,
    seed: int = 0,
    draft: str | None = None,
    int8_ops: float | None = None,
) -> BenchResult:
    max_len = prompt_len + output_len + 1
    speculator = None if draft is None else make_speculator(draft, weights, max_len)
    engine = Engine(  # every prompt prefilled in the first step: TTFT is the whole batch's
        weights, batch, max_len, kv, speculator=speculator, prefill_tokens=batch * prompt_len
    )
    gen = torch.Generator().manual_seed(seed)
    vocab = weights.shape.vocab
    params = SamplingParams(max_tokens=output_len, ignore_eos=True)
    warm = torch.randint(vocab, (prompt_len,), generator=gen).tolist()
    engine.submit(Request(warm, SamplingParams(max_tokens=min(4, output_len), ignore_eos=True)))
    while not engine.idle:
        engine.step()
    reqs = [
        engine.submit(Request(torch.randint(vocab, (prompt_len,), generator=gen).tolist(), params))
        for _ in range(batch)
    ]
    t0 = time.perf_counter()
    engine.step()  # admits and prefills every prompt, one token each
    t1 = time.perf_counter()
    read0 = weights.expert_bytes_read()
    steps = 0
    while not engine.idle:
        engine.step()
        steps += 1
    t2 = time.perf_counter()
    assert all(len(r.output) == output_len for r in reqs)
    step_s = (t2 - t1) / max(steps, 1)  # a pass over the weights (a verified step, drafting)
    token_s = (t2 - t1) / max(output_len - 1, 1)  # per sequence: a verified step gives several
    mean_ctx = prompt_len + output_len / 2
    kv_bytes = engine.cache.bytes_per_token() * mean_ctx * batch
    kv_bytes += 2 * weights.state_bytes * batch  # recurrent layers' states, read and written back
    experts = (weights.expert_bytes_read() - read0) / max(steps, 1)  # as routing chose
    bytes_per_step = weights.step_bytes - weights.expert_step_bytes + experts + kv_bytes
    prefill_tps = batch * prompt_len / (t1 - t0)
    params_count = sum(layer.active_params for layer in weights.layers)
    ceiling, ceiling_of = mfu_ceiling(weights, flops, int8_ops)
    return BenchResult(
        batch=batch,
        prompt_len=prompt_len,
        output_len=output_len,
        ttft_s=t1 - t0,
        tpot_s=token_s,
        tokens_per_s=batch / token_s,
        bytes_per_step=bytes_per_step,
        mbu=bytes_per_step / step_s / bandwidth,
        prefill_tokens_per_s=prefill_tps,
        mfu=2 * params_count * prefill_tps / ceiling,
        mfu_of=ceiling_of,
        draft=draft,
        acceptance=None if speculator is None else speculator.acceptance,
        row_cost=None if speculator is None else speculator.row_cost,
    )


def mfu_ceiling(weights: ModelWeights, flops: float, int8_ops: float | None):
    """(operations per second, what they are) the blocks' linears can reach at most: the
    int8 dot-product rate for packed weights where it was measured (the CPU), the fp32
    matmul rate for dense ones, in proportion to their parameters."""
    packed = dense = 0
    for layer in weights.layers:
        for lin in layer.linears():
            n = lin.out_features * lin.in_features
            if isinstance(getattr(lin, "packed", None), PackedLinear):
                packed += n
            else:
                dense += n
    if int8_ops is None or packed == 0:
        return flops, "fp32 matmul"
    rate = (packed + dense) / (packed / int8_ops + dense / flops)
    name = "int8 dot products" + (" and fp32 matmul" if dense else "")
    if amx_active():
        name += " (AMX tiles not counted: they go past it)"
    return rate, name


def run_bench(weights, batches, prompt_len, output_len, kv=FP32, log=print, draft=None) -> dict:
    """The bandwidth is read before and after the runs and the higher reading kept: on a
    shared machine a neighbour's burst only ever lowers a reading, and one low reading
    once put a family's MBU at 115%. With `draft`, each batch size runs without and then
    with speculative decoding, and the second row gives the acceptance and the speedup."""
    device = weights.embed.device  # the ceilings of the device that runs the model
    before = measure_bandwidth(device=device)
    flops = measure_matmul_flops(device=device)
    int8_ops = int8_dot_rate() if torch.device(device).type == "cpu" else None
    runs = []
    for b in batches:
        args = (weights, b, prompt_len, output_len, before, flops, kv)
        runs.append(bench_one(*args, int8_ops=int8_ops))
        if draft is not None:
            spec = bench_one(*args, draft=draft, int8_ops=int8_ops)
            spec.speedup = spec.tokens_per_s / runs[-1].tokens_per_s
            runs.append(spec)
    bandwidth = max(before, measure_bandwidth(device=device))
    log(
        f"measured on {device}: memory read {bandwidth / 1e9:.1f} GB/s, "
        f"fp32 matmul {flops / 1e9:.0f} GFLOP/s"
        + ("" if int8_ops is None else f", int8 dot products {int8_ops / 1e9:.0f} GOP/s")
    )
    if runs:
        log(f"MFU: prefill's share of {runs[0].mfu_of}")
    cache = last_level_cache_bytes() if torch.device(device).type == "cpu" else None
    over = [r.bytes_per_step for r in runs if r.mbu * before / bandwidth > 1]
    if cache and over and min(over) < cache:
        log(
            f"MBU over 100%: a step's {min(over) / 1e6:.0f} MB fits in this CPU's "
            f"{cache / 2**20:.0f} MiB last-level cache, so part of each step is read from "
            "the cache, not from the memory MBU counts against"
        )
    results = []
    for r in runs:
        r.mbu *= before / bandwidth
        spec = (
            ""
            if r.draft is None
            else f", draft {r.draft}: {100 * r.acceptance:.0f}% accepted, {r.speedup:.2f}x"
        )
        log(
            f"batch {r.batch}: {r.tokens_per_s:.1f} tok/s, {r.tpot_s * 1e3:.2f} ms/token, "
            f"TTFT {r.ttft_s * 1e3:.0f} ms, MBU {100 * r.mbu:.0f}%{spec}"
        )
        results.append(asdict(r))
    return {
        "bandwidth_bytes_per_s": bandwidth,
        "matmul_flops": flops,
        "int8_dot_ops": int8_ops,
        "threads": torch.get_num_threads(),
        "last_level_cache_bytes": cache,
        "weights_bytes_per_step": weights.step_bytes,
        "kv_cache": kv.config(),
        "kv_bytes_per_token": _kv_bytes(weights, kv),
        "results": results,
    }


def _kv_bytes(weights: ModelWeights, kv: KVScheme) -> float:
    from compress.runtime.kv_cache import cache_for

    return cache_for(weights, 1, kv.group, kv).bytes_per_token()


def format_bench(record: dict, title: str = "") -> str:
    spec = any(r.get("draft") for r in record["results"])
    head = "| batch | tokens/s | ms/token | TTFT ms | MB/step | MBU | prefill tok/s | MFU |"
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    if spec:
        lines = [head[:-1] + " draft | accepted | speedup |", lines[0] + "---|---|---|"]
    for r in record["results"]:
        row = (
            f"| {r['batch']} | {r['tokens_per_s']:.1f} | {r['tpot_s'] * 1e3:.2f} | "
            f"{r['ttft_s'] * 1e3:.0f} | {r['bytes_per_step'] / 1e6:.1f} | {100 * r['mbu']:.0f}% | "
            f"{r['prefill_tokens_per_s']:.0f} | {100 * r['mfu']:.1f}% |"
        )
        if spec:
            row += (
                " none | | |"
                if not r.get("draft")
                else f" {r['draft']} | {100 * r['acceptance']:.0f}% | {r['speedup']:.2f}x |"
            )
        lines.append(row)
    return (f"{title}\n\n" if title else "") + "\n".join(lines)
