"""Does rotating the residual stream before rounding lower drift (QuaRot / SpinQuant's R1,
the incoherence processing of QuIP)? The rotation stays loadable: it is folded into the
weights, so the rotated checkpoint is a plain llama that transformers, vLLM and llmpress
read as they read the original.

How the default model is rotated: every RMSNorm's weight is multiplied into the columns
of the linears that read it (q/k/v, gate/up; the final norm into an untied lm_head) and
set to ones, which makes each norm commute with an orthogonal Q; then the embedding, the
lm_head and every linear reading the residual stream take W·Q, and o_proj and down_proj,
which write it, take Qᵀ·W. Q is a Hadamard matrix of the hidden width (576 = 4·12·12:
Sylvester and Paley blocks) with random signs, scaled to be orthogonal. `fold` applies
the folding alone (Q = I), to separate its effect from the rotation's.

Each row: `llmpress compress` of one source with one `--quant` (lm_head w8, calibration
on WikiText-2 valid), then `llmpress eval --exact` against the original (the first
WINDOWS windows of 512 tokens of test.txt): the weights' drift alone.

    python benchmarks/rotation.py [--windows 16] [--rows SOURCE=QUANT ...] [--name rotation]

`--rows hadamard=best:w4g64zp original=best:w4g64zp` measures other recipes the same way
(SOURCE: original, fold or hadamard), written to `--name`.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from wikitext import DATA, require

HERE = Path(__file__).resolve().parent
WORK = HERE / "work" / "rotation"
ROWS = [  # (source, --quant)
    ("original", "rtn:w4g64"),
    ("fold", "rtn:w4g64"),
    ("hadamard", "rtn:w4g64"),
    ("original", "rtn:w3g64"),
    ("hadamard", "rtn:w3g64"),
    ("original", "w4g64"),
    ("hadamard", "w4g64"),
    ("original", "w3g64"),
    ("hadamard", "w3g64"),
]


def hadamard(n: int) -> torch.Tensor:
    """A Hadamard matrix of order n = 2^a · 12^b (Sylvester doubling, Paley's order 12)."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while n % 12 == 0:
        h, n = torch.kron(h, paley12()), n // 12
    while n > 1:
        if n % 2:
            raise SystemExit(f"no Hadamard construction here for a width with factor {n}")
        h, n = torch.kron(h, torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=h.dtype)), n // 2
    return h


def paley12() -> torch.Tensor:
    """Paley's construction I for q = 11: the Jacobsthal matrix of the quadratic residues
    mod 11, bordered."""
    q = 11
    residues = {i * i % q for i in range(1, q)}
    chi = [0] + [1 if a in residues else -1 for a in range(1, q)]
    jac = torch.tensor([[chi[(j - i) % q] for j in range(q)] for i in range(q)])
    s = torch.zeros(12, 12, dtype=torch.float64)
    s[0, 1:], s[1:, 0], s[1:, 1:] = 1, -1, jac.double()
    return s + torch.eye(12, dtype=torch.float64)


def rotate(kind: str, out: Path) -> Path:
    """The default model folded (and, for `hadamard`, rotated), written to `out`."""
    from compress.model.loading import resolve

    if (out / "config.json").is_file():
        return out
    ckpt = resolve("default")
    sd = {k: v.double() for f in ckpt.files for k, v in load_file(str(f)).items()}
    cfg = dict(ckpt.config)
    d = cfg["hidden_size"]
    q = torch.eye(d, dtype=torch.float64)
    if kind == "hadamard":
        h = hadamard(d)
        signs = torch.randint(0, 2, (d,), generator=torch.Generator().manual_seed(0)) * 2 - 1
        q = signs.double()[:, None] * h / d**0.5
    assert torch.allclose(q @ q.T, torch.eye(d, dtype=torch.float64), atol=1e-10)
    embed = sd["model.embed_tokens.weight"]
    head = sd.get("lm_head.weight", embed) * sd["model.norm.weight"][None, :]
    sd["model.norm.weight"] = torch.ones(d, dtype=torch.float64)
    sd["lm_head.weight"], sd["model.embed_tokens.weight"] = head @ q, embed @ q
    readers = {
        "input_layernorm": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
        "post_attention_layernorm": ("mlp.gate_proj", "mlp.up_proj"),
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for norm, linears in readers.items():
            w = sd[p + norm + ".weight"]
            for lin in linears:
                sd[p + lin + ".weight"] = (sd[p + lin + ".weight"] * w[None, :]) @ q
            sd[p + norm + ".weight"] = torch.ones(d, dtype=torch.float64)
        for lin in ("self_attn.o_proj", "mlp.down_proj"):
            sd[p + lin + ".weight"] = q.T @ sd[p + lin + ".weight"]
    cfg["tie_word_embeddings"] = False
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file({k: v.float().contiguous() for k, v in sd.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
    for f in ckpt.path.iterdir():  # tokenizer and generation settings
        if (
            f.is_file()
            and f.name not in ("model.safetensors", "config.json")
            and "llmpress" not in f.name
        ):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


def llmpress(*args: str) -> None:
    cmd = [sys.executable, "-m", "compress", *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{done.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--windows", type=int, default=16)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--rows", nargs="+", help="SOURCE=QUANT pairs (default: the table's)")
    ap.add_argument("--name", default="rotation", help="results file stem")
    args = ap.parse_args()
    require(DATA)
    todo = [tuple(r.split("=", 1)) for r in args.rows] if args.rows else ROWS
    if any(source not in ("original", "fold", "hadamard") for source, _ in todo):
        raise SystemExit("--rows takes SOURCE=QUANT with SOURCE original, fold or hadamard")
    sources = {"original": "default"}
    sources |= {k: str(rotate(k, WORK / k)) for k in ("fold", "hadamard")}
    rows = []
    for source, quant in todo:
        art = WORK / f"{source}-{quant.replace(':', '-')}"
        t = time.perf_counter()
        llmpress("compress", sources[source], "--quant", quant, "--lm-head", "w8",
                 "--calib", str(DATA / "valid.txt"), "-o", str(art), "--overwrite")  # fmt: skip
        minutes = (time.perf_counter() - t) / 60
        result = art.with_suffix(".json")
        llmpress("eval", str(art), "--base", "default", "--data", str(DATA / "test.txt"),
                 "--windows", str(args.windows), "--exact", "--no-record",
                 "--json", str(result))  # fmt: skip
        drift = json.loads(result.read_text())
        rows.append({"source": source, "quant": quant, "minutes": round(minutes, 2)}
                    | {k: drift[k] for k in ("ppl", "kl", "top1")})  # fmt: skip
        print(rows[-1], flush=True)
    record = {
        "command": "python benchmarks/rotation.py"
        + (f" --windows {args.windows}" if args.windows != 16 else "")
        + (f" --rows {' '.join(args.rows)} --name {args.name}" if args.rows else ""),
        "windows": args.windows,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
