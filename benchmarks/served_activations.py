"""Where a w8 artifact's served drift comes from: the int8 activations of which linears.

`eval` gates the artifact as served: the CPU kernels quantize every linear's input to int8
per block of 32. For an 8-bit-weight artifact that adds about as much KL as the weights
themselves (benchmarks/served_drift.py). This script measures, on the default model's
`rtn:w8` artifact, the served KL when one role's linears (q/k/v, o, gate/up, down) take
fp32 inputs instead (their weights dequantized: the weights-only product), and when the
norm-fed linears keep their K largest-norm-weight input channels in fp32 beside int8 for
the rest (the runtime's LLM.int8() outlier mechanism with a static channel choice).

    python benchmarks/served_activations.py [--windows 8] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

import compress  # noqa: E402
from compress.kernels.cpu import QuantizedInput  # noqa: E402
from compress.runtime import linears  # noqa: E402
from compress.runtime import weights as runtime_weights  # noqa: E402

DATA = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
ROLES = ("qkv", "o", "gate_up", "down")


class Variant:
    """What the runtime's loaded weights are changed to: roles with fp32 inputs, or K
    fp32 outlier channels on the norm-fed linears."""

    fp32_roles: tuple[str, ...] = ()
    outlier_channels: int = 0


def _parts(lin):
    return getattr(lin, "parts", [lin])


def _install(variant: type[Variant]) -> None:
    load, call = runtime_weights.load_weights, linears.QuantLinear.__call__

    def load_changed(*args, **kwargs):
        w = load(*args, **kwargs)
        for layer in w.layers:
            for role in variant.fp32_roles:
                for part in _parts(getattr(layer, role)):
                    part.fp32_inputs = True
            if variant.outlier_channels:
                for lin, norm in ((layer.qkv, layer.attn_norm), (layer.gate_up, layer.mlp_norm)):
                    idx = norm.abs().topk(variant.outlier_channels).indices.sort().values
                    for part in _parts(lin):
                        part.outlier_index = idx
                        part.outlier_weight = part.packed.dense()[:, idx].float()
        return w

    def call_changed(self, x, exact=None):
        if getattr(self, "fp32_inputs", False) and isinstance(x, QuantizedInput):
            return call(self, x.x, True)
        return call(self, x, exact)

    runtime_weights.load_weights = load_changed
    linears.QuantLinear.__call__ = call_changed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--windows", type=int, default=8)
    ap.add_argument("--data", type=Path, default=DATA)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    args = ap.parse_args()
    _install(Variant)
    started = time.time()
    variants = [("as served (int8 inputs everywhere)", (), 0)]
    variants += [(f"{role} inputs in fp32", (role,), 0) for role in ROLES]
    variants += [("every input in fp32", ROLES, 0)]
    variants += [
        (f"{k} largest-norm channels of q/k/v and gate/up in fp32", (), k) for k in (8, 32)
    ]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        art = compress.compress("default", Path(tmp) / "w8", quant="rtn:w8", overwrite=True)
        for name, roles, k in variants:
            Variant.fp32_roles, Variant.outlier_channels = roles, k
            d = compress.evaluate(art, data=str(args.data), windows=args.windows, record=False)
            results[name] = {
                "kl": round(d.kl, 5),
                "top1": round(d.top1, 4),
                "weights_only_kl": round(d.weights_only["kl"], 5),
            }
            print(name, results[name], flush=True)
    record = {
        "command": f"python benchmarks/served_activations.py --windows {args.windows}",
        "artifact": "llmpress compress default --quant rtn:w8",
        "protocol": f"{args.windows} windows of 512 tokens of {args.data.name}",
        "minutes": round((time.time() - started) / 60, 1),
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "served_activations.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
