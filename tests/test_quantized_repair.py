"""The quantized model's repair: bf16 autocast trains the same fp32 values about as well
as fp32, `auto` picks bf16 only where the hardware multiplies it and `bf16` where it cannot
is refused in one line; `train_dense` trains the norms and biases the artifact stores;
`code_lr` trains the integer codes."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from compress.calib_data import calibration_samples, eval_windows, read_texts, token_stream
from compress.distill import precision
from compress.distill.loop import DistillSettings, distill
from compress.distill.quantized import QuantLinear, param_groups, wrap
from compress.distill.stage import DistillConfig
from compress.errors import LlmpressError
from compress.model.loading import read_tensors, resolve
from compress.pipeline import compress
from compress.pruning.stage import output_kl
from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.recipe import parse_recipe


def _settings(prec: str) -> DistillSettings:
    return DistillSettings(
        steps=6, batch=2, lr=3e-3, warmup=0.05, min_lr_ratio=0.1, weight_decay=0.0,
        temperature=1.0, hidden_weight=0.0, checkpoint_every=100, max_seconds=None,
        train_embeddings=False, seed=0, precision=prec,
    )  # fmt: skip


SCHEME = QuantScheme(bits=3, group_size=64, zero_point=True)


def _quantized_student(base_model, code_lr: float = 0.0):
    """A 3-bit RTN copy of the blocks' linears, wrapped for the repair: (student, optimizer
    groups, wrapped linears, their starting QuantizedWeights)."""
    student = copy.deepcopy(base_model)
    names = [n for n, m in student.named_modules() if isinstance(m, torch.nn.Linear)]
    quantized = {n: quantize_weight(student.get_submodule(n).weight.data, SCHEME)
                 for n in names if ".layers." in n}  # fmt: skip
    wrapped = wrap(student, quantized, codes=code_lr > 0)
    student.requires_grad_(False)
    return student, param_groups(wrapped, 3e-3, 3e-3, code_lr), wrapped, quantized


def _first_blocks(model, n: int):
    """The model cut to its first n blocks, embedding, final norm and head kept: the same
    weights and data at a fraction of the cost where torch emulates bf16 (a CPU without
    bf16 instructions multiplies it at a few GFLOP/s)."""
    short = copy.deepcopy(model)
    short.model.layers = short.model.layers[:n]
    short.config.num_hidden_layers = n
    return short


def test_bf16_repair_lowers_drift_like_fp32(base_model, tokenizer, wikitext, tmp_path):
    """Both precisions lower the held-out KL of a 3-bit RTN model (the default model's
    first 8 blocks) in a few steps, bf16 to within a fifth of fp32's gain, and what trains
    stays fp32."""
    base_model = _first_blocks(base_model, 8)
    valid = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt"))[:2000])
    train = calibration_samples(valid, 16, 64, 0)
    test = eval_windows(
        token_stream(tokenizer, read_texts(str(wikitext / "test.txt"))[:600]), 128, 2
    )
    gains = {}
    for prec in ("fp32", "bf16"):
        student, groups, _, _ = _quantized_student(base_model)
        with torch.no_grad():
            before = output_kl(base_model, student, test)
        record = distill(student, base_model, train, _settings(prec), work_dir=tmp_path,
                         resume=False, run_id=prec, param_groups=groups)  # fmt: skip
        with torch.no_grad():
            after = output_kl(base_model, student, test)
        assert record["precision"] == prec
        assert after < 0.95 * before, (prec, before, after)
        gains[prec] = before - after
        for m in student.modules():
            if isinstance(m, QuantLinear):
                assert m.log_scale.dtype == torch.float32 and m.log_scale.abs().max() > 0
    assert gains["bf16"] > 0.8 * gains["fp32"], gains


def test_auto_follows_the_hardware_and_bf16_without_it_is_refused(monkeypatch):
    cpu = torch.device("cpu")
    native = precision.bf16_support(cpu)
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():  # AMX-BF16 or AVX512-BF16, as the kernel lists them, is what counts
        flags = set(cpuinfo.read_text().split())
        assert native == bool(flags & {"amx_bf16", "avx512_bf16"}), sorted(flags)
    assert precision.resolve("auto", cpu) == ("bf16" if native else "fp32")
    assert precision.resolve("fp32", cpu) == "fp32"
    monkeypatch.setattr(precision, "bf16_support", lambda device: True)
    assert precision.resolve("auto", cpu) == "bf16"
    assert precision.resolve("bf16", cpu) == "bf16"
    monkeypatch.setattr(precision, "bf16_support", lambda device: False)
    assert precision.resolve("auto", cpu) == "fp32"
    with pytest.raises(LlmpressError, match="use precision: fp32 or auto"):
        precision.resolve("bf16", cpu)
    with pytest.raises(LlmpressError, match=r"distill\.precision: .fp16. is not one of"):
        DistillConfig(precision="fp16")


def _distill_recipe(wikitext, stage: dict, distill: dict) -> dict:
    return parse_recipe({
        "stages": [stage, {"distill": {"tokens": 3 * 2 * 64, "batch": 2, **distill}}],
        "calib": {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 64},
    })  # fmt: skip


def test_train_dense_stores_the_trained_norms(wikitext, tmp_path):
    """The norms train beside the scales and the artifact stores them; the integers stay."""
    rtn = {"rtn": {"bits": 4, "group_size": 64}}
    recipe = _distill_recipe(wikitext, rtn, {"train_dense": True, "scale_lr": 1e-2})
    out = compress("default", recipe, tmp_path / "out", log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    record = next(s for s in manifest["stages"] if s["stage"] == "distill")
    assert record["trained"].endswith(", and 61 norm weights and biases"), record["trained"]
    stored = load_file(str(out / "model.safetensors"))
    names = ["model.norm.weight", "model.layers.7.post_attention_layernorm.weight"]
    source = read_tensors(resolve("default"), names)
    for name in names:
        moved = (stored[name].float() - source[name].float()).abs().max()
        assert moved > 1e-3, (name, float(moved))


def test_train_dense_after_pruning_is_refused(wikitext, tmp_path):
    recipe = _distill_recipe(wikitext, {"prune": {"mlp": 0.5}}, {"train_dense": True})
    with pytest.raises(LlmpressError, match="train_dense: applies to repairing a quantized"):
        compress("default", recipe, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_code_offsets_move_codes_by_at_most_what_the_lr_allows(
    base_model, tokenizer, wikitext, tmp_path
):
    """With `code_lr` the integers train too: over 6 steps at 0.2 a level a step (at most
    0.66 of a level with warm-up and decay) some codes move by one level, none by two, and
    what is exported is what the forward used."""
    valid = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt"))[:2000])
    train = calibration_samples(valid, 16, 64, 0)
    student, groups, wrapped, quantized = _quantized_student(base_model, code_lr=0.2)
    record = distill(student, base_model, train, _settings("fp32"), work_dir=tmp_path,
                     resume=False, run_id="codes", param_groups=groups)  # fmt: skip
    assert record["steps"] == 6
    moved = total = 0
    for name, module in wrapped.items():
        stored = module.result(torch.float32).q
        step = (stored.int() - quantized[name].q.int()).abs()
        assert int(step.max()) <= 1, name
        assert torch.equal(stored.float(), module.codes().detach())
        assert SCHEME.qmin <= int(stored.min()) and int(stored.max()) <= SCHEME.qmax
        moved, total = moved + int((step > 0).sum()), total + step.numel()
    assert 0 < moved < 0.5 * total, (moved, total)


def test_code_lr_after_pruning_is_refused(wikitext, tmp_path):
    recipe = _distill_recipe(wikitext, {"prune": {"mlp": 0.5}}, {"code_lr": 1e-3})
    with pytest.raises(LlmpressError, match="code_lr: applies to repairing a quantized"):
        compress("default", recipe, tmp_path / "out", log=lambda _: None)
