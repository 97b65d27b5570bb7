"""The packed int4 GEMM of this checkout against the one at an earlier git revision, built
the same way and run interleaved in one process, at the widths of the default model and of
Qwen2.5-0.5B, for decode batches and a served prompt; and the int8 GEMM at the default
model's widths and its int8 head, at the rows decode batches of 1, 8 and 32 give it (two
a sequence: the two-term activations).

End-to-end runs on a shared machine move by 20-30% between runs; one process alternating
two builds of the same kernel over the same weights is the fair test of "not slower". Each
shape has 30 distinct weight copies (more than the L3 cache for the larger shapes), the
earlier kernel gets its zero offsets as it needs them, the current one as it needs them.

Second table: a dense fp32 weight at decode batches (a tied embedding read as the head, a
head kept as stored), torch's `linear` against the runtime's `gemv_f32`, interleaved.

    python benchmarks/kernel_ab.py [--rev cbb33c2] [--rows 1,8,32,512] [--rounds 5]
        [--name kernel_ab]
"""

from __future__ import annotations

import argparse
import ctypes
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
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from batched_decode import cpu_flags  # noqa: E402

from compress.kernels import cpu  # noqa: E402
from compress.kernels.build import FLAG_SETS, FOLDER  # noqa: E402

HEADS = {"default model (tied)": (49152, 576), "Qwen2.5-0.5B": (151936, 896)}
SHAPES = {  # (out, in) of q/k/v, gate/up, down, o
    "default model": [(960, 576), (3072, 576), (576, 1536), (576, 576)],
    "Qwen2.5-0.5B": [(1152, 896), (9728, 896), (896, 4864), (896, 896)],
    # families.py's MoE rows: q/k/v, one expert's gate/up and down, o
    "MoE (hidden 1024, experts 1024)": [(1536, 1024), (2048, 1024), (1024, 1024)],
}
COPIES = 30
# 8-bit weights (an int8 lm_head, rtn:w8): rows as the two-term activations double them
SHAPES8 = {
    "default model, int8 head": [(49152, 576)],
    "default model, int8": [(960, 576), (3072, 576), (576, 1536)],
}
HEAD_COPIES = 6  # 28 MB each


def build(folder: Path, out: Path) -> ctypes.CDLL:
    """The kernels of `folder` (every .c file there, one library) built with the package's
    flags: LLMPRESS_KERNEL_FLAGS where set (another instruction set's paths on this host,
    as the package then builds them), else its native set."""
    flags = os.environ.get("LLMPRESS_KERNEL_FLAGS", "").split() or FLAG_SETS[0]
    sources = sorted(str(path) for path in folder.glob("*.c"))
    subprocess.run(["cc", *flags, "-shared", "-fPIC", *sources, "-o", str(out), "-lm"], check=True)
    lib = ctypes.CDLL(str(out))
    p, i = ctypes.c_void_p, ctypes.c_int
    for name in ("llmp_gemm_q4", "llmp_gemm_q8"):
        getattr(lib, name).argtypes = [p, p, p, i, i, i, p, p, p, i, p]
        getattr(lib, name).restype = None
    lib.llmp_set_threads.argtypes = [i]
    if hasattr(lib, "llmp_amx_enable"):  # tiles as the package has them (LLMPRESS_AMX)
        lib.llmp_amx_enable.argtypes = [i]
        lib.llmp_amx_enable(int(cpu.amx_active()))
    return lib


def git_rev(rev: str) -> str:
    """`rev` as a short commit hash, for the record (HEAD moves on)."""
    out = subprocess.check_output(["git", "rev-parse", "--short", rev], cwd=ROOT, text=True)
    return out.strip()


def builds(rev: str) -> dict[str, ctypes.CDLL]:
    """The kernels at `rev` ("earlier") and of this checkout ("now"), built alike."""
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        rel = FOLDER.relative_to(ROOT)
        names = subprocess.check_output(
            ["git", "ls-tree", "--name-only", f"{rev}:{rel}"], cwd=ROOT, text=True
        ).split()
        for name in names:
            blob = subprocess.check_output(["git", "show", f"{rev}:{rel}/{name}"], cwd=ROOT)
            (old / name).write_bytes(blob)
        return {
            "earlier": build(old, Path(tmp) / "old.so"),
            "now": build(FOLDER, Path(tmp) / "new.so"),
        }


def takes_softcap(rev: str) -> bool:
    """Whether the attention calls at `rev` take a softcap (the argument after `window`)."""
    header = subprocess.check_output(
        ["git", "show", f"{rev}:{FOLDER.relative_to(ROOT)}/llmpress.h"], cwd=ROOT, text=True
    )
    return "int window, float softcap" in header


def zs_ptr(offsets, early: bool):
    """The zero offsets an earlier kernel reads (None: it derives them from the scales)."""
    return cpu._ptr(offsets) if early and offsets is not None else None


def interleaved(fns: dict, rounds: int, repeat: int) -> dict[str, float]:
    """Median seconds per call of each function, the functions taking turns each round."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t = time.perf_counter()
            for _ in range(repeat):
                fn()
            times[name].append((time.perf_counter() - t) / repeat)
    return {name: statistics.median(v) for name, v in times.items()}


def report(model: str, n: int, k: int, rows: int, **figures) -> dict:
    row = {"model": model, "shape": f"{n}x{k}", "rows": rows, **figures}
    print(row, flush=True)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", default="cbb33c2", help="the earlier revision")
    ap.add_argument(
        "--change",
        default="derives a symmetric weight's zero offset from its scale and prefetches 256 "
        "bytes ahead (the earlier reads each group's offset and prefetches 1024)",
        help="what the current kernel changes, for the results table",
    )
    ap.add_argument("--rows", default="1,8,32,512")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=HERE / "results")
    ap.add_argument("--name", default="kernel_ab", help="results file stem (one per machine)")
    args = ap.parse_args()
    libs = builds(args.rev)
    reads_offsets = (
        subprocess.run(
            ["git", "merge-base", "--is-ancestor", "4b373b1", args.rev], cwd=ROOT
        ).returncode
        != 0
    )
    for lib in libs.values():
        lib.llmp_set_threads(args.threads)
    cpu.set_threads(args.threads)
    torch.manual_seed(0)
    ptr = cpu._ptr
    rows = [int(r) for r in args.rows.split(",")]
    results = []
    cases = [(4, model, shape) for model, shapes in SHAPES.items() for shape in shapes]
    cases += [(8, model, shape) for model, shapes in SHAPES8.items() for shape in shapes]
    for bits, model, (n, k) in cases:
        lo = -(1 << (bits - 1))
        copies = HEAD_COPIES if n * k > 1 << 24 else COPIES
        mats = [
            cpu.PackedLinear(
                torch.randint(lo, -lo, (n, k), dtype=torch.int8),
                torch.rand(n, k // 64) * 0.01,
                None,
                64,
                bits,
            )
            for _ in range(copies)
        ]
        # a kernel from before 4b373b1 reads zs = 8 * scale; later ones derive it
        offsets = [m.scale * 8 if reads_offsets and bits == 4 else None for m in mats]
        for m_rows in rows if bits == 4 else [2 * r for r in rows if r <= 32]:
            x = cpu.quantize_input(torch.randn(m_rows, k))
            y = torch.empty(m_rows, n)

            def run(lib, early, x=x, y=y, mats=mats, offsets=offsets, n=n, m_rows=m_rows):
                gemm = lib.llmp_gemm_q4 if mats[0].bits == 4 else lib.llmp_gemm_q8
                for mat, z in zip(mats, offsets, strict=True):
                    gemm(
                        ptr(x.x8), ptr(x.dx), ptr(x.bsum), m_rows, mat.kp, mat.group,
                        ptr(mat.packed), ptr(mat.scale), zs_ptr(z, early), n, ptr(y),
                    )  # fmt: skip

            fns = {
                name: (lambda lib=lib, e=name == "earlier": run(lib, e))
                for name, lib in libs.items()
            }
            outputs = []
            for fn in fns.values():  # the last weight copy's product from each build
                fn()
                outputs.append(y.clone())
            med = {k: v / len(mats) for k, v in interleaved(fns, args.rounds, 1).items()}
            results.append(
                report(model, n, k, m_rows, bits=bits,
                       earlier_us=round(med["earlier"] * 1e6, 1),
                       now_us=round(med["now"] * 1e6, 1),
                       speedup=round(med["earlier"] / med["now"], 3),
                       same_bits=torch.equal(*outputs))
            )  # fmt: skip
    dense = []
    for model, (n, k) in HEADS.items():
        w = torch.randn(n, k)
        for m_rows in (1, 2, 4):
            x = torch.randn(m_rows, k)
            fns = {
                "torch": lambda x=x, w=w: torch.nn.functional.linear(x, w),
                "llmpress": lambda x=x, w=w: cpu.gemv_f32(x, w),
            }
            med = interleaved(fns, args.rounds, 5)
            dense.append(
                report(model, n, k, m_rows, torch_ms=round(med["torch"] * 1e3, 2),
                       llmpress_ms=round(med["llmpress"] * 1e3, 2),
                       GB_s=round(n * k * 4 / med["llmpress"] / 1e9, 1),
                       speedup=round(med["torch"] / med["llmpress"], 3))
            )  # fmt: skip
    record = {
        "command": f"python benchmarks/kernel_ab.py --rev {args.rev} --rows {args.rows}"
        + ("" if args.name == "kernel_ab" else f" --name {args.name}"),
        "cpu": cpu_flags(),
        "change": args.change,
        "rev": args.rev,
        "threads": args.threads,
        "rounds": args.rounds,
        "copies": COPIES,
        "results": results,
        "dense": dense,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
