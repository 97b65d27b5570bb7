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
from test_cli import llmpress

from compress.artifact.manifest import read_manifest
from compress.pipeline import compress, work_dir
from compress.recipe import parse_recipe

ROOT = Path(__file__).resolve().parents[1]


def _recipe(wikitext, distill: dict, extra=()) -> dict:
    return {
        "stages": [{"prune": {"mlp": 0.5}}, {"distill": distill}, *extra],
        "calib": {"source": str(wikitext / "valid.txt"), "samples": 8, "length": 64},
    }


def _weights(folder):
    return load_file(str(folder / "model.safetensors"))


def test_killed_distillation_resumes_to_the_same_model(tmp_path, wikitext):
    recipe = _recipe(
        wikitext, {"tokens": 12 * 2 * 64, "batch": 2, "lr": 1e-3, "checkpoint_every": 2}
    )
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    whole = tmp_path / "whole"
    r = llmpress("compress", "default", "-o", str(whole), "--recipe", str(path))
    assert r.returncode == 0, r.stderr

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

    r = llmpress("compress", "default", "-o", str(cut), "--recipe", str(path), "--resume")
    assert r.returncode == 0, r.stderr
    assert "resumed from step" in r.stdout + r.stderr
    assert not work_dir(cut).exists()  # removed once the artifact is written
    a, b = _weights(whole), _weights(cut)
    assert a.keys() == b.keys()
    for name in a:
        torch.testing.assert_close(b[name], a[name], atol=1e-6, rtol=0)
    record = read_manifest(cut)["stages"][1]
    assert record["resumed_from"] >= 2 and record["steps"] == 12
    # training moved the student toward the teacher
    losses = [kl for _, kl in record["loss_history"]]
    assert sum(losses[-3:]) / 3 < 0.8 * losses[0]


def test_repair_reduces_drift_on_held_out_text(tmp_path, wikitext):
    """Evaluated on the test split (never trained on): repair lowers KL to the original."""
    from compress.eval.run import evaluate

    kw = {"data": str(wikitext / "test.txt"), "ctx": 256, "windows": 2, "log": lambda _: None}
    unrepaired = tmp_path / "pruned"
    recipe = {"stages": [{"prune": {"mlp": 0.5}}], "calib": _recipe(wikitext, {})["calib"]}
    compress("default", parse_recipe(recipe), unrepaired, log=lambda _: None)
    repaired = tmp_path / "repaired"
    distill = {"tokens": 30 * 4 * 64, "batch": 4, "lr": 1e-3, "data": str(wikitext / "valid.txt")}
    compress("default", parse_recipe(_recipe(wikitext, distill)), repaired, log=lambda _: None)
    before, after = evaluate(str(unrepaired), **kw), evaluate(str(repaired), **kw)
    assert after.kl < 0.9 * before.kl, (before.kl, after.kl)
    assert read_manifest(repaired)["drift"]["kl"] == pytest.approx(after.kl)


def test_prune_distill_awq_kv_in_one_recipe(tmp_path, wikitext):
    from transformers import AutoModelForCausalLM

    recipe = _recipe(
        wikitext,
        {"tokens": 2 * 2 * 64, "batch": 2, "max_minutes": 0.0001},
        extra=[{"awq": {"bits": 4, "group_size": 64}}],
    )
    out = tmp_path / "all"
    compress("default", parse_recipe({**recipe, "kv_cache": "int8"}), out, log=lambda _: None)
    m = read_manifest(out)
    assert [s["stage"] for s in m["stages"]] == ["prune", "distill", "awq"]
    assert m["stages"][1]["stopped_on"] == "time" and m["stages"][1]["steps"] < 2
    assert m["source"]["source"] == "default"
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 768 and config["llmpress_kv_cache_scheme"]["bits"] == 8
    assert m["weights"]["quantized_parameters"] > 0
    # a plain transformers load (compressed-tensors, dequantized) of the smaller model
    from transformers import CompressedTensorsConfig

    model = AutoModelForCausalLM.from_pretrained(
        str(out), quantization_config=CompressedTensorsConfig(dequantize=True)
    )
    assert model.model.layers[0].mlp.down_proj.in_features == 768
    # and the runtime serves it with its int8 KV cache
    data = str(wikitext / "test.txt")
    r = llmpress("eval", str(out), "--data", data, "--ctx", "128", "--windows", "2")
    assert r.returncode == 0, r.stderr
    kl = read_manifest(out)["drift"]["kl"]
    assert 0 < kl < 10
