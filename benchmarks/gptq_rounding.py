"""GPTQ's rounding (the column solve with searched scales) per linear: the C column loop
against the torch loop, interleaved in one process, and the fit of the estimate's model.

Shapes: every linear of one block of the default model (its real weights) and of a
Llama-3.2-1B-shaped and a Qwen2.5-7B-shaped gate/up (random weights). Each linear's Hessian is
2·XᵀX of 2,048 correlated inputs whose energy spreads over the channels as a
transformer's does; w4g64 symmetric, act_order, searched scales: the fast preset's
settings. Both paths must give the same integers and scales (checked on every linear).

Reported per shape: seconds of each path (median of `--rounds`, the paths taking turns),
their ratio, and the estimate's seconds from gptq.py's work model (SOLVE_FACTOR,
SEARCH_FLOPS, COLUMN_FLOPS, FACTOR_FLOPS) at this machine's probed matmul rate; `--fit` prints the
least-squares factors for that model from the C loop's times. `--against REV` also runs
the README's first compress (`compress default --quant w4g64`: the fast preset) with
REV's code and with this checkout's, taking turns, and reports their wall times, GPTQ's
rounding time (the manifest's `gptq transform`) and the sha256 of each run's weights
file, so that which runs wrote the same bytes can be read off.

    python benchmarks/gptq_rounding.py [--rounds 3] [--fit] [--against REV]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from batched_decode import cpu_flags  # noqa: E402
from revision import checkout  # noqa: E402

from compress.estimate import PASS_EFFICIENCY  # noqa: E402
from compress.kernels import gptq_loop  # noqa: E402
from compress.model.workload import matmul_rate  # noqa: E402
from compress.quantizers import gptq  # noqa: E402
from compress.quantizers.scheme import QuantScheme  # noqa: E402

# (name, rows, columns): q/o, k/v, gate/up, down of each shape
SHAPES = [
    ("default q/o", 576, 576),
    ("default k/v", 192, 576),
    ("default gate/up", 1536, 576),
    ("default down", 576, 1536),
    ("1B q/o", 2048, 2048),
    ("1B k/v", 512, 2048),
    ("1B gate/up", 8192, 2048),
    ("1B down", 2048, 8192),
    ("7B gate/up", 18944, 3584),
]


def default_weights() -> dict[str, torch.Tensor]:
    """Block 3's linears of the default model, by shape name."""
    from safetensors import safe_open

    from compress.model.loading import resolve

    ckpt = resolve("default")
    files = sorted(Path(ckpt.path).glob("*.safetensors"))
    out = {}
    names = {"q/o": "self_attn.q_proj", "k/v": "self_attn.k_proj", "gate/up": "mlp.gate_proj"}
    names["down"] = "mlp.down_proj"
    for f in files:
        with safe_open(str(f), "pt") as st:
            for short, name in names.items():
                key = f"model.layers.3.{name}.weight"
                if key in st.keys():  # noqa: SIM118 (safe_open is no dict)
                    out[f"default {short}"] = st.get_tensor(key).float()
    return out


def end_to_end(rev: str, rounds: int) -> dict:
    """The fast preset's compress of the default model, REV's code and this checkout's in
    turn, each in a process of its own."""
    root = HERE.parent
    times: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp, checkout(rev) as tree:
        for _ in range(rounds):
            for side, code in ((rev, tree), ("this checkout", root)):
                out = Path(tmp) / "out"
                cmd = [sys.executable, "-m", "compress", "compress", "default", "-o", str(out)]
                env = {**os.environ, "PYTHONPATH": str(code)}
                start = time.perf_counter()
                cmd += ["--quant", "w4g64", "--overwrite"]
                subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
                wall = time.perf_counter() - start
                manifest = json.loads((out / "manifest.json").read_text())
                rec = times.setdefault(side, {"wall_s": [], "gptq_transform_s": [], "sha": []})
                rec["wall_s"].append(round(wall, 1))
                rec["gptq_transform_s"].append(manifest["timing_s"]["gptq transform"])
                digest = hashlib.sha256((out / "model.safetensors").read_bytes())
                rec["sha"].append(digest.hexdigest()[:12])
    return {"rev": rev, "runs": times}


def hessian(cols: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    mix = torch.eye(cols) + torch.randn(cols, cols, generator=g) / cols
    x = torch.randn(2048, cols, generator=g) @ mix * torch.rand(cols, generator=g) ** 2
    return 2 * x.T @ x / 2048


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--fit", action="store_true")
    ap.add_argument("--against", metavar="REV", help="also the fast preset end to end")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "gptq_rounding.json")
    args = ap.parse_args()
    torch.manual_seed(0)
    assert gptq_loop.ready(), "the C kernels did not build"
    real = default_weights()
    scheme = QuantScheme(4, 64, False)
    rows_out, fit_rows = {}, []
    rate = matmul_rate(512, 1024) * PASS_EFFICIENCY
    for i, (name, rows, cols) in enumerate(SHAPES):
        w = real.get(name, torch.randn(rows, cols) * 0.02)
        h = hessian(cols, i)
        times = {"c": [], "torch": []}
        results = {}
        for _ in range(args.rounds):
            for path in ("c", "torch"):
                ready = gptq_loop.ready
                if path == "torch":
                    gptq_loop.ready = lambda: False
                try:
                    start = time.perf_counter()
                    results[path] = gptq.gptq_quantize(
                        w, h, scheme, torch.float32, act_order=True, scale_search=True
                    )
                    t = time.perf_counter() - start
                finally:
                    gptq_loop.ready = ready
                times[path].append(t)
        same = torch.equal(results["c"].q, results["torch"].q) and torch.equal(
            results["c"].scale, results["torch"].scale
        )
        c, slow = statistics.median(times["c"]), statistics.median(times["torch"])
        model = gptq.solve_flops(rows, cols) / rate
        rows_out[name] = {
            "rows": rows,
            "columns": cols,
            "c_s": round(c, 3),
            "torch_s": round(slow, 3),
            "speedup": round(slow / c, 2),
            "estimate_s": round(model, 3),
            "identical": same,
        }
        fit_rows.append((rows, cols, c * rate))
        print(name, rows_out[name], flush=True)
    record = {
        "benchmark": "gptq_rounding",
        "command": "python benchmarks/gptq_rounding.py" + (" --fit" if args.fit else ""),
        "cpu": cpu_flags(),
        "threads": torch.get_num_threads(),
        "probe_flops": round(rate / PASS_EFFICIENCY),
        "rows": rows_out,
    }
    if args.fit:  # flop-equivalents = A·out·in² + B·out·in + C·in + D·in³, relative errors
        terms = [[o * i * i, o * i, i, i**3] for o, i, _ in fit_rows]
        terms = torch.tensor(terms, dtype=torch.float64)
        target = torch.tensor([f for *_, f in fit_rows], dtype=torch.float64)
        weights = 1 / target  # relative errors: small shapes count as much as large ones
        sol = torch.linalg.lstsq(terms * weights[:, None], target * weights).solution
        record["fit"] = {"SOLVE_FACTOR": sol[0].item(), "SEARCH_FLOPS": sol[1].item()}
        record["fit"].update(COLUMN_FLOPS=sol[2].item(), FACTOR_FLOPS=sol[3].item())
        print("fit", record["fit"])
    if args.against:
        record["command"] += f" --against {args.against}"
        record["end_to_end"] = end_to_end(args.against, args.rounds)
        print(record["end_to_end"])
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
