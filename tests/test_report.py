"""Reports, gate files, integrity checks and publishing, as users reach them: the CLI."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import torch
from test_cli import llmpress

from compress.errors import LlmpressError
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.recipe import parse_recipe


@pytest.fixture(scope="module")
def int8_artifact(tmp_path_factory, wikitext):
    """LLM.int8()-style artifact: every report section but pruning has something to show."""
    out = tmp_path_factory.mktemp("report") / "int8"
    recipe = {
        "stages": [{"int8": {"threshold": 6.0}}],
        "calib": {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 128},
    }
    compress("default", parse_recipe(recipe), out, log=lambda _: None)
    return out


def test_report_and_gate_file(int8_artifact, wikitext, tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("kl: {max: 0.05}\ntop1: {min: 0.9}\nppl: {max_increase: 5%}\n")
    report = tmp_path / "report"
    out = tmp_path / "result.json"
    args = ["eval", str(int8_artifact), "--data", str(wikitext / "test.txt"), "--windows", "2"]
    args += ["--ctx", "256", "--no-record", "--json", str(out)]
    r = llmpress(*args, "--gate-file", str(gates), "--report", str(report))
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("gate PASS") == 3
    assert "[original " in r.stdout and "+5.0% (max_increase)" in r.stdout
    result = json.loads(out.read_text())
    assert result["passed"] and [g["metric"] for g in result["gates"]] == ["kl", "top1", "ppl"]
    files = {p.name for p in report.iterdir()}
    assert {"report.md", "report.json", "drift.png", "token_kl.png"} <= files
    assert {"layer_error.png", "outliers.png"} <= files  # int8 ran: errors and outliers
    data = json.loads((report / "report.json").read_text())
    assert data["drift"]["tokens"] == 510
    assert 0 < data["token_kl_quantiles"]["p50"] < data["token_kl_quantiles"]["p99"]
    # int8 per-channel: every block linear changed a little, none a lot
    errors = data["layer_error"]
    assert len(errors) == 30 * 7 and all(0 < e < 0.05 for e in errors.values())
    md = (report / "report.md").read_text()
    assert "![Per-token KL" not in md and "(token_kl.png)" in md and "| original |" in md
    for png in ("drift.png", "token_kl.png", "layer_error.png", "outliers.png"):
        assert (report / png).read_bytes()[:4] == b"\x89PNG"
    # shared files name no folder of this machine (the artifact, the data, the command)
    for written in (report / "report.json", report / "report.md", out):
        text = written.read_text()
        assert str(tmp_path) not in text and str(wikitext) not in text, written

    strict = tmp_path / "strict.yaml"
    strict.write_text("kl: {max: 1.0e-6}\nsize_mb: {max_increase: -90%}\n")
    bad = llmpress(*args, "--gate-file", str(strict))
    assert bad.returncode == 1
    assert "gate FAIL kl" in bad.stdout and "gate FAIL size_mb" in bad.stdout
    assert "quality gate failed: kl, size_mb" in bad.stderr
    assert json.loads(out.read_text())["passed"] is False


def test_verify_and_loading_name_the_damaged_file(int8_artifact, tmp_path):
    art = tmp_path / "copy"
    shutil.copytree(int8_artifact, art)
    r = llmpress("verify", str(art))
    assert r.returncode == 0 and "files match" in r.stdout
    manifest = json.loads((art / "manifest.json").read_text())
    assert {"model.safetensors", "config.json", "tokenizer.json"} <= set(manifest["sha256"])

    # altered: same size, one byte changed in the middle of the weights
    weights = art / "model.safetensors"
    blob = bytearray(weights.read_bytes())
    blob[len(blob) // 2] ^= 0x01
    weights.write_bytes(bytes(blob))
    r = llmpress("verify", str(art))
    assert r.returncode == 1 and "FAIL model.safetensors: altered" in r.stdout
    with pytest.raises(LlmpressError, match=r"model\.safetensors: altered"):
        resolve(str(art))

    # truncated config: named, and loading fails with one line
    shutil.copy(int8_artifact / "model.safetensors", weights)
    config = art / "config.json"
    config.write_text(config.read_text()[:-20])
    r = llmpress("eval", str(art), "--windows", "1")
    assert r.returncode == 2
    assert "config.json" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = llmpress("verify", str(art))
    assert "FAIL config.json: truncated" in r.stdout


def test_push_dry_run_shows_files_and_card(int8_artifact):
    r = llmpress("push", str(int8_artifact), "--repo", "acme/smollm2-int8", "--dry-run")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "would create public model repo acme/smollm2-int8" in out
    digest = json.loads((int8_artifact / "manifest.json").read_text())["sha256"]
    assert "model.safetensors" in out and digest["model.safetensors"][:16] in out
    assert "base_model: HuggingFaceTB/SmolLM2-135M-Instruct" in out
    assert "license: apache-2.0" in out and "- 8-bit" in out and "- llm.int8" in out
    assert "base_model_relation: quantized" in out
    assert "llmpress compress" in out  # the command that made it


def test_push_fails_at_once_offline_and_on_bad_input(int8_artifact, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    start = time.perf_counter()
    r = llmpress("push", str(int8_artifact), "--repo", "acme/smollm2-int8")
    assert r.returncode == 2 and time.perf_counter() - start < 30
    assert "cannot reach the Hugging Face Hub" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = llmpress("push", str(int8_artifact), "--repo", "no-slash", "--dry-run")
    assert r.returncode == 2 and "not a hub id" in r.stderr
    r = llmpress("push", str(tmp_path), "--repo", "acme/x", "--dry-run")
    assert r.returncode == 2 and "no manifest.json" in r.stderr


def test_layer_error_undoes_awq_column_scaling():
    """AWQ stores W·diag(s): the report must show the rounding error, not the rescaling."""
    from compress.eval.report import column_scale
    from compress.quantizers.scheme import QuantScheme, quantize_weight

    torch.manual_seed(0)
    w = torch.randn(256, 192)
    s = torch.rand(192) * 3.5 + 0.5
    stored = quantize_weight(w * s, QuantScheme(bits=4, group_size=64)).dequantize()
    raw = float((stored - w).norm() / w.norm())
    undone = stored / column_scale(stored, w)
    err = float((undone - w).norm() / w.norm())
    exact = float((stored / s - w).norm() / w.norm())  # with the scales known
    assert raw > 1.0  # comparing the scaled weight directly is meaningless
    assert 0.05 < err < 0.4  # 4-bit rounding error
    assert abs(err - exact) < 0.01 * exact
