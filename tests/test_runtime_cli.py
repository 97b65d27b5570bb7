"""The runtime as users reach it: `bench`, `eval` through the runtime, and artifacts whose
lm_head and KV cache the recipe quantized."""

import json

import pytest
import torch
from test_cli import llmpress

from compress.artifact.dense import load_model
from compress.eval.run import evaluate
from compress.model.loading import resolve
from compress.runtime import bench, load_weights
from compress.runtime.bench import last_level_cache_bytes, mfu_ceiling
from compress.runtime.kv_cache import KVScheme
from compress.runtime.linears import DenseLinear
from compress.runtime.lm import RuntimeLM


def test_bench_reports_speed_and_mbu(artifacts, tmp_path):
    out = tmp_path / "bench.json"
    args = ["--batch", "1,2", "--prompt-len", "8", "--output-len", "6", "--json", str(out)]
    r = llmpress("bench", str(artifacts["rtn:w4g64"]), *args)
    assert r.returncode == 0, r.stderr
    record = json.loads(out.read_text())
    assert [row["batch"] for row in record["results"]] == [1, 2]
    assert record["bandwidth_bytes_per_s"] > 1e9
    # bytes that must move ÷ what this machine's memory can move: past 1 where the step's
    # bytes fit in the last-level cache (2.16 measured on a Xeon with a 300 MiB L3), so
    # bounded there by what a cache gives over memory, not by memory
    cache = record["last_level_cache_bytes"] or 0
    fits = record["weights_bytes_per_step"] <= cache
    for row in record["results"]:
        assert row["tokens_per_s"] > 0 and row["ttft_s"] > 0
        assert 0 < row["mbu"] < (10 if fits else 2)
    # w4 weights as stored: under a third of the fp32 model's 538 MB
    assert record["weights_bytes_per_step"] < 538e6 / 3 + 113e6
    assert "MBU" in r.stdout
    # prefill's MFU against the arithmetic packed weights run: int8 dot products here
    assert record["int8_dot_ops"] > 0
    assert all(row["mfu_of"].startswith("int8 dot products") for row in record["results"])
    assert "int8 dot products" in r.stdout


def test_mfu_is_a_share_of_what_the_linears_compute_with(artifacts):
    """Packed weights multiply int8 activations, dense ones fp32: MFU's ceiling is the rate
    of each, in proportion to their parameters (an int8 prefill read 257% of fp32's)."""
    w = load_weights(resolve(str(artifacts["rtn:w4g64"])))
    assert mfu_ceiling(w, 100.0, 400.0)[0] == 400.0
    assert mfu_ceiling(w, 100.0, None) == (100.0, "fp32 matmul")  # no int8 rate (a GPU)
    layer = w.layers[0]
    dense = layer.gate_up.out_features * layer.gate_up.in_features
    total = sum(lin.out_features * lin.in_features for x in w.layers for lin in x.linears())
    layer.gate_up = DenseLinear(torch.zeros(layer.gate_up.out_features, layer.gate_up.in_features))
    rate, name = mfu_ceiling(w, 100.0, 400.0)
    assert rate == pytest.approx(total / ((total - dense) / 400.0 + dense / 100.0))
    assert name.startswith("int8 dot products and fp32 matmul")


def test_mbu_past_100_percent_names_the_cache_it_fits(artifacts, tmp_path, monkeypatch):
    """A model whose step fits the last-level cache reads it partly from there: bench says
    so when MBU, counted against the memory, passes 100%, and only then."""
    for i, (kind, size) in enumerate((("Data", "48K"), ("Instruction", "64K"), ("Unified", "3M"))):
        (tmp_path / f"index{i}").mkdir()
        (tmp_path / f"index{i}" / "type").write_text(kind + "\n")
        (tmp_path / f"index{i}" / "size").write_text(size + "\n")
    assert last_level_cache_bytes(tmp_path) == 3 * 2**20
    assert last_level_cache_bytes(tmp_path / "none") is None
    w = load_weights(resolve(str(artifacts["rtn:w4g64"])))
    monkeypatch.setattr(bench, "measure_matmul_flops", lambda *a, **k: 1e11)
    monkeypatch.setattr(bench, "int8_dot_rate", lambda *a, **k: 1e11)
    for cache, bandwidth, says in ((2**30, 1e6, True), (2**10, 1e6, False), (2**30, 1e15, False)):
        monkeypatch.setattr(bench, "last_level_cache_bytes", lambda cache=cache: cache)
        monkeypatch.setattr(bench, "measure_bandwidth", lambda bw=bandwidth, **k: bw)
        lines = []
        record = bench.run_bench(w, [1], 4, 3, log=lines.append)
        assert ("MBU over 100%" in "\n".join(lines)) is says, lines
        assert record["last_level_cache_bytes"] == cache


def test_eval_through_the_runtime_agrees_with_transformers(artifacts, wikitext):
    path = str(artifacts["rtn:w4g64"])
    data = str(wikitext / "test.txt")
    kw = {"data": data, "ctx": 512, "windows": 2, "record": False, "log": lambda _: None}
    served = evaluate(path, engine="runtime", **kw)  # the default: what serve runs
    hf = evaluate(path, engine="transformers", **kw)
    runtime = served.weights_only  # measured beside it: the weights alone
    assert served.kernels == "served" and "int8 per block" in served.activations
    # the artifact's int8 KV cache (the default) as served; the weights alone in fp32
    assert served.kv_cache == "int8" and served.weights_only["kv_cache"] == ""
    assert abs(runtime["kl"] - hf.kl) < 1e-4 * max(hf.kl, 1)
    assert abs(runtime["ppl"] - hf.ppl) < 1e-3 * hf.ppl
    assert abs(runtime["top1"] - hf.top1) < 2 / served.tokens
    exact = evaluate(path, engine="runtime", exact=True, **kw)
    assert exact.kernels == "exact" and exact.weights_only is None
    assert abs(exact.kl - runtime["kl"]) < 1e-9
    # int8 activations add drift of their own: the gated figure is not the weights'
    assert served.kl != exact.kl and served.kl > 0.9 * exact.kl


def test_recipe_quantizes_lm_head_and_sets_kv_cache(head_w8_artifact):
    """rtn:w4g64 with `lm_head: w8` and `kv_cache: int8` (conftest.py)."""
    ckpt = resolve(str(head_w8_artifact))
    assert ckpt.config["tie_word_embeddings"] is False
    assert KVScheme.of_artifact(ckpt.config) == KVScheme(bits=8)
    weights = load_weights(ckpt)
    assert weights.lm_head.kind.startswith("int8")
    fp32_head = 49152 * 576 * 4
    assert weights.lm_head.nbytes < fp32_head / 3.5
    ids = torch.arange(100, 400)[None]
    with torch.no_grad():
        ref = load_model(ckpt)(input_ids=ids).logits  # transformers reads the quantized head
    got = RuntimeLM(weights, 512)(ids).logits
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=5e-4)


def test_runtime_reads_the_awq_gemm_layout(awq_gemm_artifact):
    """rtn:w4g64zp with `export: awq-gemm` (conftest.py)."""
    ckpt = resolve(str(awq_gemm_artifact))
    weights = load_weights(ckpt)
    assert not weights.dense_fallbacks and weights.layers[0].qkv.kind.startswith("int4 g64")
    ids = torch.arange(500, 700)[None]
    with torch.no_grad():
        ref = load_model(ckpt)(input_ids=ids).logits  # llmpress's own AWQ-GEMM decoder
    torch.testing.assert_close(RuntimeLM(weights, 512)(ids).logits, ref, rtol=1e-4, atol=5e-4)


def test_bench_sweep_writes_a_roofline(artifacts, tmp_path, monkeypatch):
    """`bench --sweep` (sizes shrunk for the test): every point measured, bytes and FLOPs
    consistent with the rates, the KV cache's share growing with context, the batch
    raising arithmetic intensity, ceilings measured before and after, and a PNG."""
    from click.testing import CliRunner

    from compress import cli
    from compress.runtime import roofline

    monkeypatch.setattr(roofline, "BATCHES", (1, 4))
    monkeypatch.setattr(roofline, "CONTEXTS", (40, 300))
    monkeypatch.setattr(roofline, "CONTEXT_BATCH", 2)
    out = tmp_path / "roof"
    args = ["bench", str(artifacts["rtn:w4g64"]), "--kv", "int8", "--sweep", str(out)]
    r = CliRunner().invoke(cli.cli, args)
    assert r.exit_code == 0, r.output
    record = json.loads((out / "roofline.json").read_text())
    pts = record["points"]
    assert [(p["sweep"], p["batch"], p["context"]) for p in pts] == [
        ("batch", 1, 40), ("batch", 4, 40), ("context", 2, 40), ("context", 2, 300)
    ]  # fmt: skip
    for p in pts:
        assert p["gbytes_per_s"] * p["step_s"] * 1e9 == pytest.approx(
            p["weight_bytes"] + p["kv_bytes"]
        )
        assert p["gflops_per_s"] * p["step_s"] * 1e9 == pytest.approx(p["flops"])
        assert 0 < p["mbu"] < 2
    assert pts[1]["intensity"] > 3 * pts[0]["intensity"]  # batch 4 reuses each weight 4×
    share = [p["kv_bytes"] / (p["kv_bytes"] + p["weight_bytes"]) for p in pts[2:]]
    assert share[1] > 4 * share[0]
    samples = record["ceilings"]["samples"]
    assert len(samples["before"]["bandwidth"]) == len(samples["after"]["matmul"]) == 5
    assert (out / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert record["kv_cache"]["num_bits"] == 8


def test_bench_sweep_refuses_a_file(artifacts, tmp_path):
    target = tmp_path / "taken"
    target.write_text("x")
    r = llmpress("bench", str(artifacts["rtn:w4g64"]), "--sweep", str(target))
    assert r.returncode != 0
    assert "is a file" in r.stderr and "Traceback" not in r.stderr
