"""The time a recipe will take, said before it starts and kept in the manifest: the
workload read from the checkpoint, each stage's work, and the line and record compress
writes. (How close the estimate comes is measured by benchmarks/quality.py, which keeps
each row's estimate beside its timing: docs/results.md.)"""

from __future__ import annotations

import json
import time

import pytest
from family_models import write_family
from test_no_silent import tiny_model

from compress.distill import precision
from compress.estimate import estimate, estimate_line
from compress.model.loading import resolve
from compress.model.workload import peak_rate, workload
from compress.pipeline import compress
from compress.quantizers import gptq
from compress.recipe import parse_recipe, recipe_from_flags

RATE = 1.3e11  # a fixed matrix-multiply rate: the figures below do not depend on the machine


def _stages(quant: str):
    return recipe_from_flags(None, quant, {}, {}).build()


def test_workload_of_the_default_model(default_ckpt):
    load = workload(default_ckpt, 16, 512)
    per_block = 576 * (576 + 192 + 192 + 576) + 3 * 576 * 1536
    assert load.block_weights == 30 * per_block
    # q/k/v read one input, gate/up another: four Hessians a block (attention in, o, MLP in,
    # down)
    assert sorted(load.inputs) == [(576, 1.0), (576, 1.0), (576, 1.0), (1536, 1.0)]
    assert load.tokens == 16 * 512 and load.active == 1.0


def test_experts_count_at_top_k_of_their_weights(tmp_path):
    folder = write_family(tmp_path / "mixtral", "mixtral")
    load = workload(resolve(str(folder)), 4, 64)
    attention = 128 * (64 + 32 + 32) + 64 * 128  # q, k, v (2 KV heads of 16), o
    experts = 4 * 3 * 128 * 128
    assert load.block_weights == 2 * (attention + experts)
    assert load.active == pytest.approx((attention + experts / 2) / (attention + experts))


def test_expert_hessians_count_the_tokens_each_sums(tmp_path):
    """As calibration sums them (model/moe.py, gptq._every_token_inputs): few tokens, every
    expert on every token and their gate/up one H; many, each expert on its routed share
    (top_k of experts)."""
    folder = write_family(tmp_path / "mixtral", "mixtral")
    ckpt = resolve(str(folder))
    experts, top_k = ckpt.adapter.experts, ckpt.adapter.spec(ckpt.config).mlp.top_k
    hidden = ckpt.adapter.shape(ckpt.config).hidden
    few = workload(ckpt, 1, hidden * experts // top_k - 1)  # the mean count under `hidden`
    many = workload(ckpt, 1, hidden * experts // top_k)
    assert few.inputs[:2] == many.inputs[:2]  # q/k/v's input, o's: every token
    assert few.inputs[0] == (hidden, 1.0) and few.inputs[1][1] == 1.0
    assert sorted(few.inputs[2:]) == sorted([(hidden, 1.0)] + [(hidden, 1.0)] * experts)
    share = top_k / experts
    assert len(many.inputs) == 2 + 2 * experts and all(s == share for _, s in many.inputs[2:])
    (stage,) = _stages("gptq:w4g64")
    per_token = stage.work(many) / many.tokens, stage.work(few) / few.tokens
    assert per_token[0] < per_token[1]  # the routed share's Hessians cost less a token


def test_each_preset_costs_what_its_stages_do(default_ckpt, monkeypatch):
    """More calibration, more stages: more time; each stage that does work is named. (The
    repair's figure is a CPU's without bf16; with AMX- or AVX512-BF16 it is faster, below.)"""
    monkeypatch.setattr(precision, "bf16_support", lambda device: False)
    fast = estimate(_stages("w4g64"), workload(default_ckpt, 16, 512), 2, RATE)
    more = estimate(_stages("w4g64"), workload(default_ckpt, 128, 512), 2, RATE)
    best = estimate(_stages("best:w4g64"), workload(default_ckpt, 64, 512), 2, RATE)
    assert set(fast) == {"calibration passes", "gptq"}
    assert set(best) == {"calibration passes", "mixed", "gptq", "distill"}
    assert sum(fast.values()) < sum(more.values()) < sum(best.values())
    assert more["gptq"] > fast["gptq"]  # the Hessians grow with the tokens
    assert max(best, key=best.get) == "distill"  # as measured: 306 s of 9.6 min
    assert estimate_line(fast) == (
        "estimated time here: ~1 min (gptq 39 s, calibration passes 39 s; reading and "
        "writing not counted)"
    )
    assert estimate_line(best).startswith("estimated time here: ~19 min (distill 14 min, ")
    assert estimate_line({"rtn": 1.0}).startswith("estimated time here: <1 min")
    # an explicit bf16 this CPU lacks is estimated, not refused: the run may be on a GPU
    explicit = parse_recipe({"stages": [{"rtn": {}}, {"distill": {"precision": "bf16"}}]})
    load = workload(default_ckpt, 64, 512)
    assert estimate(explicit.build(), load, 1, RATE)["distill"] > 0
    monkeypatch.setattr(precision, "bf16_support", lambda device: True)
    for kind, speedup in (("amx", 9.5 / 5.5), ("avx512", 11.9 / 6.1)):  # as repair_sweep measured
        monkeypatch.setattr(precision, "cpu_bf16", lambda kind=kind: kind)
        fast16 = estimate(_stages("best:w4g64"), workload(default_ckpt, 64, 512), 2, RATE)
        assert fast16["distill"] == pytest.approx(best["distill"] / speedup, abs=0.1)
        assert {k: v for k, v in fast16.items() if k != "distill"} == {
            k: v for k, v in best.items() if k != "distill"
        }


def test_gptq_toward_the_original_counts_its_passes(default_ckpt, monkeypatch):
    """Target original measures each later input of the block once the linears before it
    are rounded, each pass stopping at that input: three more half-block passes a side for
    the default model's four inputs, one side only where the original's is kept, and a full
    product per input beside H's triangle."""
    stage = {"bits": 4, "group_size": 64}
    plain, toward = (
        parse_recipe({"stages": [{"gptq": {**stage, "target": t}}]}).build()
        for t in ("reference", "original")
    )

    def extra(samples: int) -> float:
        load = workload(default_ckpt, samples, 512)
        more = estimate(toward, load, 2, RATE)["gptq"] - estimate(plain, load, 2, RATE)["gptq"]
        return more / estimate([], load, 1, RATE)["calibration passes"]

    kept = extra(16)  # 16 × 512 tokens' four inputs: 107 MB, kept
    assert 2 < kept < 3  # 1.5 passes, and the products
    monkeypatch.setattr(gptq, "KEEP_BYTES", 0)
    assert extra(16) - kept == pytest.approx(1.5, abs=0.01)


def test_compress_says_the_estimate_first_and_keeps_it(tmp_path):
    model = tiny_model(tmp_path / "tiny")
    lines: list[str] = []
    text = tmp_path / "calib.txt"
    text.write_text("The estimate comes before the work. " * 400)
    calib = {"source": str(text), "samples": 4, "length": 32}
    recipe = recipe_from_flags(None, "gptq:w4g64", calib, {})
    out = compress(str(model), recipe, tmp_path / "a", log=lines.append)
    said = [i for i, ln in enumerate(lines) if ln.startswith("estimated time here:")]
    planned = [i for i, ln in enumerate(lines) if ln.startswith("calibration:")]
    assert len(said) == 1 and said[0] < planned[0]
    manifest = json.loads((out / "manifest.json").read_text())
    estimate_s = manifest["estimate_s"]
    assert set(estimate_s) == {"calibration passes", "gptq", "total"}
    assert estimate_s["total"] == pytest.approx(
        estimate_s["calibration passes"] + estimate_s["gptq"], abs=0.11
    )
    assert "gptq transform" in manifest["timing_s"] and manifest["compress_seconds"] > 0


def test_the_rate_is_the_fastest_call():
    """Calls the machine was taken away from (here: two in three sleep thirty times as
    long, where the median would be a slow one) do not move the rate. The bound allows a
    2 ms sleep to overrun to 12 ms on a loaded host (seen: 6 ms during the suite)."""
    calls = []

    def product():
        calls.append(1)
        time.sleep(0.002 if len(calls) % 3 == 0 else 0.06)

    rate = peak_rate(product, 1e9, 0.05)
    assert len(calls) >= 5
    assert 1e9 / 0.012 < rate <= 1e9 / 0.002
