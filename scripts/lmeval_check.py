#!/usr/bin/env python3
"""Score text with lm-eval through `llmpress serve`, and through transformers in-process.

    .venv/bin/python scripts/lmeval_check.py [--docs 8] [--max-length 256]

lm-eval's `local-completions` backend is how evaluation harnesses reach an OpenAI-style
server: token ids, `echo`, `logprobs` 1, and the prompt's log-probabilities read back. This
runs the same lm-eval task two ways on the same model and compares the figures:

1. Makes a venv (default .venv-lmeval, gitignored) with lm-eval[api] from PyPI; it reads
   this project's .venv (torch, transformers, datasets) through a .pth file.
2. Writes a task: the first `--docs` articles of WikiText-2 test.txt as a local jsonl,
   scored as rolling log-likelihood (word and byte perplexity, bits per byte), as lm-eval's
   own wikitext task does.
3. For each model (the default model as shipped, fp32; its `rtn:w4g64` artifact): runs the
   task with lm-eval's `hf` backend (transformers `from_pretrained`, in fp32), then starts
   `llmpress serve` on it and runs the task with `local-completions`.
4. Writes benchmarks/results/lmeval_check.json: both figures per model and their ratio.
   On the fp32 model the two must agree (the served figure is transformers' forward); on
   the artifact, serve computes with int8 activations, so it may differ by the served
   drift (docs/eval.md).
"""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "benchmarks" / "work" / "lmeval-check"
RESULTS = ROOT / "benchmarks" / "results"
TEST = ROOT.parent / "shared" / "data" / "wikitext-2-raw" / "test.txt"
LMEVAL_SPEC = "lm-eval[api]==0.4.13"
METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
TASK = """task: llmpress_wikitext
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{{{text}}}}"
metric_list:
  - metric: word_perplexity
  - metric: byte_perplexity
  - metric: bits_per_byte
"""


def run(cmd: list[str], **kw) -> subprocess.CompletedProcess:
    print("$", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(cmd, text=True, **kw)


def setup_venv(venv: Path) -> Path:
    py = venv / "bin" / "python"
    if not py.exists():
        run([sys.executable, "-m", "venv", str(venv)], check=True)
    site = run([str(py), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
               capture_output=True, check=True).stdout.strip()  # fmt: skip
    ours = run([sys.executable, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
               capture_output=True, check=True).stdout.strip()  # fmt: skip
    (Path(site) / "llmpress-venv.pth").write_text(ours + "\n")
    stamp = venv / ".lmeval-check-spec"
    if not stamp.exists() or stamp.read_text() != LMEVAL_SPEC:
        run([str(py), "-m", "pip", "install", "-q", LMEVAL_SPEC], check=True)
        stamp.write_text(LMEVAL_SPEC)
    return py


def articles(n: int) -> list[str]:
    """WikiText-2's first n articles (a ' = Title = ' line starts each)."""
    docs: list[list[str]] = []
    for line in TEST.read_text(encoding="utf-8").splitlines(keepends=True):
        if line.startswith(" = ") and not line.startswith(" = = "):
            docs.append([])
        if docs:
            docs[-1].append(line)
    return ["".join(d).strip() for d in docs[:n]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lm_eval(py: Path, tasks: Path, model: str, args: str, out: Path) -> dict:
    started = time.perf_counter()
    run([str(py), "-m", "lm_eval", "--model", model, "--model_args", args, "--tasks",
         "llmpress_wikitext", "--include_path", str(tasks), "--output_path", str(out)],
        check=True)  # fmt: skip
    (result,) = out.rglob("results_*.json")
    scores = json.loads(result.read_text())["results"]["llmpress_wikitext"]
    return {
        **{m: scores[f"{m},none"] for m in METRICS},
        "seconds": round(time.perf_counter() - started, 1),
    }


def serve_and_score(py, tasks: Path, folder: Path, tokenizer: Path, n: int, prefix: int, out):
    """lm-eval's local-completions against `llmpress serve FOLDER` on a free port. It
    keeps one token of max_length for the reply and its rolling windows predict one fewer
    than that (hf's predict max_length): given n + 2, both score the same windows of n."""
    port = free_port()
    llmpress = str(ROOT / ".venv" / "bin" / "llmpress")
    server = subprocess.Popen(
        [llmpress, "serve", str(folder), "--port", str(port), "--max-len", str(n + 3),
         "--model-name", "m"]
    )  # fmt: skip
    try:
        deadline = time.time() + 300
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if time.time() > deadline or server.poll() is not None:
                    raise RuntimeError("llmpress serve did not come up") from None
                time.sleep(1)
        args = (
            f"model=m,base_url=http://127.0.0.1:{port}/v1/completions,tokenizer={tokenizer},"
            f"tokenized_requests=True,max_length={n + 2},num_concurrent=1,"
            f"custom_prefix_token_id={prefix}"
        )
        return lm_eval(py, tasks, "local-completions", args, out)
    finally:
        server.terminate()
        server.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=8)
    ap.add_argument("--max-length", type=int, default=256)
    ap.add_argument("--venv", type=Path, default=ROOT / ".venv-lmeval")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from compress.model.loading import load_tokenizer, resolve

    py = setup_venv(args.venv)
    version = run([str(py), "-c", "import lm_eval; print(lm_eval.__version__)"],
                  capture_output=True, check=True).stdout.strip()  # fmt: skip
    source = resolve("default").path
    # each document's first token is scored after this one: the same for both backends
    # (hf would take the tokenizer's BOS, local-completions its EOS)
    prefix = load_tokenizer(resolve("default")).eos_token_id
    artifact = WORK / "rtn-w4g64"
    if not (artifact / "manifest.json").is_file():
        run([str(ROOT / ".venv" / "bin" / "llmpress"), "compress", "default", "-o",
             str(artifact), "--quant", "rtn:w4g64", "--overwrite"], check=True)  # fmt: skip
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        docs = tmp / "docs.jsonl"
        docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in articles(args.docs)))
        (tmp / "task.yaml").write_text(TASK.format(docs=docs))
        for name, folder in (("default model, fp32", source), ("rtn:w4g64", artifact)):
            hf_args = (f"pretrained={folder},dtype=float32,max_length={args.max_length},"
                       f"prefix_token_id={prefix}")  # fmt: skip
            hf = lm_eval(py, tmp, "hf", hf_args, tmp / f"hf-{len(rows)}")
            served = serve_and_score(
                py, tmp, folder, source, args.max_length, prefix, tmp / f"served-{len(rows)}"
            )
            rows[name] = {
                "transformers (lm-eval hf)": hf,
                "llmpress serve (lm-eval local-completions)": served,
                "ratio served / transformers": {m: served[m] / hf[m] for m in METRICS},
            }
            print(name, json.dumps(rows[name]), flush=True)
    record = {
        "benchmark": "lmeval_check",
        "command": f"scripts/lmeval_check.py --docs {args.docs} --max-length {args.max_length}",
        "lm_eval": version,
        "task": f"the first {args.docs} articles of WikiText-2 test.txt, rolling "
        f"log-likelihood in windows of {args.max_length} tokens",
        "results": rows,
    }
    (RESULTS / "lmeval_check.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
