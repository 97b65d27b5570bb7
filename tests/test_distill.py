"""Distillation repair: it reduces the drift pruning caused, a killed run resumes to the
same result, budgets stop it, and prune → distill → AWQ → KV quantization is one recipe."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file
from test_bad_input import run_cli

from compress.artifact.manifest import read_manifest
from compress.calib_data import calibration_samples, eval_windows, read_texts, token_stream
from compress.distill.loop import DistillSettings, distill
from compress.errors import LlmpressError
from compress.pipeline import compress, work_dir
from compress.pruning.stage import Prune, PruneConfig, output_kl
from compress.recipe import parse_recipe
from compress.stage import ModelContext

ROOT = Path(__file__).resolve().parents[1]


def _recipe(wikitext, distill: dict, extra=(), length=64) -> dict:
    return {
        "stages": [{"prune": {"mlp": 0.5}}, {"distill": distill}, *extra],
        "calib": {"source": str(wikitext / "valid.txt"), "samples": 8, "length": length},
    }


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_repair_reduces_drift_on_held_out_text(
    base_model, default_ckpt, tokenizer, wikitext, tmp_path
):
    """Trained on valid, evaluated on test (never trained on): a short repair of a model
    with half its MLP neurons removed lowers the KL to the original substantially."""
    valid = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt")))
    train = calibration_samples(valid, 64, 128, 0)
    test = eval_windows(
        token_stream(tokenizer, read_texts(str(wikitext / "test.txt"))[:600]), 256, 2
    )
    ctx = ModelContext(
        teacher=base_model,
        model=base_model,
        config=dict(default_ckpt.config),
        adapter=default_ckpt.adapter,
        tokenizer=tokenizer,
        samples=train[:4],
        work_dir=None,
        log=lambda _: None,
    )
    Prune(PruneConfig(mlp=0.5)).run(ctx)
    before = output_kl(base_model, ctx.model, test)
    settings = DistillSettings(
        steps=4,
        batch=4,
        lr=5e-4,
        warmup=0.05,
        min_lr_ratio=0.1,
        weight_decay=0.0,
        temperature=1.0,
        hidden_weight=0.0,
        checkpoint_every=100,
        max_seconds=None,
        train_embeddings=False,
        seed=0,
    )
    record = distill(
        ctx.model, base_model, train, settings, work_dir=tmp_path, resume=False, run_id="t"
    )
    after = output_kl(base_model, ctx.model, test)
    assert after < 0.85 * before, (before, after)
    assert record["steps"] == 4 and record["tokens"] == 4 * 4 * 128
    assert record["stopped_on"] == "tokens" and record["peak_rss_mb"] > 0
    # the original was only read
    assert all(not p.requires_grad for p in base_model.parameters())


def test_killed_distillation_resumes_to_the_same_model(tmp_path, wikitext):
    recipe = _recipe(wikitext, {"tokens": 4 * 2 * 32, "batch": 2, "checkpoint_every": 2}, length=32)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    # the uninterrupted run and the resumed one: the CLI in this process; the one killed
    # is a process of its own
    whole = tmp_path / "whole"
    code, _, err = run_cli(["compress", "default", "-o", str(whole), "--recipe", str(path)])
    assert code == 0, err

    cut = tmp_path / "cut"
    cmd = [sys.executable, "-m", "compress", "compress", "default", "-o", str(cut)]
    proc = subprocess.Popen(
        [*cmd, "--recipe", str(path)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 300
    while not list(work_dir(cut).glob("distill-*.pt")) and time.time() < deadline:
        assert proc.poll() is None, "finished before its first checkpoint"
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert not cut.exists() and list(work_dir(cut).glob("distill-*.pt"))

    code, out, err = run_cli(
        ["compress", "default", "-o", str(cut), "--recipe", str(path), "--resume"]
    )
    assert code == 0, err
    assert "resumed from step" in out + err
    assert not work_dir(cut).exists()  # removed once the artifact is written
    a, b = _weights(whole), _weights(cut)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-6, rtol=0)
    record = read_manifest(cut)["stages"][1]
    assert record["resumed_from"] == 2 and record["steps"] == 4


def test_prune_distill_awq_kv_in_one_recipe(tmp_path, wikitext):
    """One recipe, then the same artifact through transformers, the runtime and a report."""
    from transformers import AutoModelForCausalLM, CompressedTensorsConfig

    # AWQ's searches at their smallest: this test is about the stages chaining, not quality
    awq = {"bits": 4, "group_size": 64, "grid": 2, "clip_grid": 4, "search_samples": 1}
    recipe = _recipe(
        wikitext, {"tokens": 2 * 2 * 64, "batch": 2, "max_minutes": 0.0001}, extra=[{"awq": awq}]
    )
    out = tmp_path / "all"
    compress("default", parse_recipe({**recipe, "kv_cache": "int8"}), out, log=lambda _: None)
    m = read_manifest(out)
    assert [s["stage"] for s in m["stages"]] == ["prune", "distill", "awq", "lm_head"]
    assert m["stages"][1]["stopped_on"] == "time" and m["stages"][1]["steps"] < 2
    assert m["source"]["source"] == "default"
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 768
    assert config["llmpress_kv_cache_scheme"]["num_bits"] == 8
    assert m["weights"]["quantized_parameters"] > 0
    # a plain transformers load (compressed-tensors, dequantized) of the smaller model
    model = AutoModelForCausalLM.from_pretrained(
        str(out), quantization_config=CompressedTensorsConfig(dequantize=True)
    )
    assert model.model.layers[0].mlp.down_proj.in_features == 768
    # the runtime evaluates it with its int8 KV cache; the report plots the importance
    report = tmp_path / "report"
    args = ["eval", str(out), "--data", str(wikitext / "test.txt"), "--windows", "1"]
    code, _, err = run_cli([*args, "--ctx", "128", "--report", str(report)])
    assert code == 0, err
    assert 0 < read_manifest(out)["drift"]["kl"] < 10
    assert (report / "pruning.png").is_file() and (report / "layer_error.png").is_file()
    assert not (report / "outliers.png").exists()
    scores = read_manifest(out)["stages"][0]["importance"]
    assert len(scores["heads"]) == 30 and len(scores["mlp"][0]) == 1536
    errors = json.loads((report / "report.json").read_text())["layer_error"]
    # AWQ changed the attention linears (same shape as the original's); the pruned MLP has
    # no original of its shape to compare with
    assert any(".q_proj" in k for k in errors) and not any(".down_proj" in k for k in errors)


def test_budgets_are_validated(wikitext):
    with pytest.raises(LlmpressError, match="max_minutes"):
        parse_recipe(_recipe(wikitext, {"max_minutes": 0}))
