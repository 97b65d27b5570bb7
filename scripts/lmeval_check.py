#!/usr/bin/env python3
"""Score text with lm-eval through `llmpress serve`, and through transformers in-process.

    .venv/bin/python scripts/lmeval_check.py [--docs 8] [--max-length 256] [--mc-docs 40]
                                             [--gen-docs 24]

lm-eval's `local-completions` backend is how evaluation harnesses reach an OpenAI-style
server: token ids, `echo`, `logprobs` 1, and the prompt's log-probabilities read back. This
runs the same lm-eval task two ways on the same model and compares the figures:

1. Makes a venv (default .venv-lmeval, gitignored) with lm-eval[api] from PyPI; it reads
   this project's .venv (torch, transformers, datasets) through a .pth file.
2. Writes three tasks from WikiText-2 test.txt as local jsonl files, one per kind of
   request lm-eval makes:
   - llmpress_wikitext: the first `--docs` articles scored as rolling log-likelihood (word
     and byte perplexity, bits per byte), as lm-eval's own wikitext task does;
   - llmpress_cloze (log-likelihood of a continuation, multiple choice): a sentence, and
     the sentence after it among three sentences from other paragraphs (acc, acc_norm);
   - llmpress_continue (generation, greedy until a newline, 16 tokens): a paragraph's
     first 24 words; the check compares the two backends' generated texts one by one.
3. For each model (the default model as shipped, fp32; its `rtn:w4g64` artifact): runs the
   task with lm-eval's `hf` backend (transformers `from_pretrained`, in fp32), then starts
   `llmpress serve` on it and runs the task with `local-completions`.
4. Writes benchmarks/results/lmeval_check.json: both figures per model and their ratio,
   and the share of identical generations.
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
METRICS = {
    "llmpress_wikitext": ("word_perplexity", "byte_perplexity", "bits_per_byte"),
    "llmpress_cloze": ("acc", "acc_norm"),
    "llmpress_continue": ("exact_match",),
}
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
CLOZE = """task: llmpress_cloze
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{context}}}}"
doc_to_choice: choices
doc_to_target: label
metric_list:
  - metric: acc
  - metric: acc_norm
"""
CONTINUE = """task: llmpress_continue
dataset_path: json
dataset_kwargs:
  data_files:
    test: {docs}
test_split: test
output_type: generate_until
doc_to_text: "{{{{prompt}}}}"
doc_to_target: "{{{{target}}}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 16
  do_sample: false
  temperature: 0.0
metric_list:
  - metric: exact_match
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


def paragraphs() -> list[str]:
    """WikiText-2 test's body paragraphs of at least 40 words, in file order."""
    lines = TEST.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if not ln.startswith(" =") and len(ln.split()) >= 40]


def cloze_docs(n: int) -> list[dict]:
    """A sentence, and the one after it among the following sentence of three other
    paragraphs (the right one at a rotating place)."""
    pairs = []
    for p in paragraphs():
        sents = [x.strip() + " ." for x in p.split(" . ") if len(x.split()) >= 6]
        if len(sents) >= 2:
            pairs.append((sents[0], " " + sents[1]))
    docs = []
    for i in range(min(n, len(pairs))):
        others = [pairs[(i + 7 * j) % len(pairs)][1] for j in (1, 2, 3)]
        label = i % 4
        choices = [*others[:label], pairs[i][1], *others[label:]]
        docs.append({"context": pairs[i][0], "choices": choices, "label": label})
    return docs


def continue_docs(n: int) -> list[dict]:
    """A paragraph's first 24 words, and its next 8 as the target."""
    out = []
    for p in paragraphs()[:n]:
        words = p.split()
        out.append({"prompt": " ".join(words[:24]), "target": " " + " ".join(words[24:32])})
    return out


def generations(out: Path) -> list[str]:
    """The generated texts lm-eval logged for llmpress_continue, in document order."""
    (samples,) = out.rglob("samples_llmpress_continue_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines() if line.strip()]
    return [r["resps"][0][0] for r in sorted(rows, key=lambda r: r["doc_id"])]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def lm_eval(py: Path, tasks: Path, model: str, args: str, out: Path) -> dict:
    started = time.perf_counter()
    run([str(py), "-m", "lm_eval", "--model", model, "--model_args", args, "--tasks",
         ",".join(METRICS), "--include_path", str(tasks), "--output_path", str(out),
         "--log_samples"], check=True)  # fmt: skip
    (result,) = out.rglob("results_*.json")
    scores = json.loads(result.read_text())["results"]
    return {
        **{f"{t}/{m}": scores[t][f"{m},none"] for t, ms in METRICS.items() for m in ms},
        "generations": generations(out),
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
    ap.add_argument("--mc-docs", type=int, default=40, help="cloze questions")
    ap.add_argument("--gen-docs", type=int, default=24, help="continuations generated")
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
        for name, text, made in (
            ("cloze", CLOZE, cloze_docs(args.mc_docs)),
            ("continue", CONTINUE, continue_docs(args.gen_docs)),
        ):
            data = tmp / f"{name}.jsonl"
            data.write_text("".join(json.dumps(d) + "\n" for d in made))
            (tmp / f"{name}.yaml").write_text(text.format(docs=data))
        for name, folder in (("default model, fp32", source), ("rtn:w4g64", artifact)):
            hf_args = (f"pretrained={folder},dtype=float32,max_length={args.max_length},"
                       f"prefix_token_id={prefix}")  # fmt: skip
            hf = lm_eval(py, tmp, "hf", hf_args, tmp / f"hf-{len(rows)}")
            served = serve_and_score(
                py, tmp, folder, source, args.max_length, prefix, tmp / f"served-{len(rows)}"
            )
            same = [a == b for a, b in zip(hf.pop("generations"), served.pop("generations"),
                                           strict=True)]  # fmt: skip
            rows[name] = {
                "transformers (lm-eval hf)": hf,
                "llmpress serve (lm-eval local-completions)": served,
                "ratio served / transformers": {
                    m: served[m] / hf[m] for m in hf if m != "seconds" and hf[m]
                },
                "identical generations": f"{sum(same)}/{len(same)}",
            }
            print(name, json.dumps(rows[name]), flush=True)
    record = {
        "benchmark": "lmeval_check",
        "command": f"scripts/lmeval_check.py --docs {args.docs} --max-length {args.max_length}"
        f" --mc-docs {args.mc_docs} --gen-docs {args.gen_docs}",
        "lm_eval": version,
        "task": f"the first {args.docs} articles of WikiText-2 test.txt, rolling "
        f"log-likelihood in windows of {args.max_length} tokens",
        "tasks": {
            "llmpress_cloze": f"{args.mc_docs} questions from WikiText-2 test.txt: a sentence "
            "and its next among four (log-likelihood of each continuation)",
            "llmpress_continue": f"{args.gen_docs} paragraphs' first 24 words, greedy "
            "generation until a newline, 16 tokens at most",
        },
        "results": rows,
    }
    (RESULTS / "lmeval_check.json").write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
