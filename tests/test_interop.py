"""Every artifact kind the README documents, opened by the other tools with nothing but
their documented call, computes what llmpress's runtime computes; and every config is
checked against the rules vLLM's compressed-tensors loader applies (engines.py)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, CompressedTensorsConfig

from compress.artifact.engines import (
    engine_problems,
    transformers_problems,
    transformers_route,
    vllm_problems,
)
from compress.model.loading import resolve
from compress.model.safetensors_check import check_safetensors
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.runtime import load_weights
from compress.runtime.lm import RuntimeLM


@pytest.fixture(scope="module")
def ids(tokenizer, wikitext):
    text = (wikitext / "test.txt").read_text()[:4000]
    return tokenizer(text, return_tensors="pt").input_ids[:, :160]


@pytest.fixture(scope="module")
def more_artifacts(tmp_path_factory, wikitext, head_w8_artifact):
    """The kinds the artifacts fixture does not make: a quantized lm_head (conftest.py's,
    whose config also names an int8 KV cache, which no engine reads), LLM.int8() outliers
    in the layout other tools read (--export compressed-tensors), and the best:w4g64 chain.
    These claims are about layouts, not quality: calibration and searches are minimal."""
    root = tmp_path_factory.mktemp("interop")
    calib = {"source": str(wikitext / "valid.txt"), "samples": 2, "length": 128}
    recipes = {
        "int8+export:compressed-tensors": {
            "stages": [parse_quant("int8")],
            "calib": calib,
            "export": "compressed-tensors",
        },
        "awq+gptq+tune": {
            "stages": [
                {"awq": {"bits": 4, "grid": 2, "clip_grid": 4, "search_samples": 1}},
                {"gptq": {"bits": 4, "scale_search": False}},  # the layout is the same
                {"tune": {"steps": 4}},
            ],
            "calib": calib,
        },
    }
    out = {"rtn:w4g64+lm_head:w8": head_w8_artifact}
    for name, recipe in recipes.items():
        out[name] = root / name.replace(":", "-").replace("+", "_")
        compress("default", parse_recipe(recipe), out[name], log=lambda _: None)
    return out


def _runtime_logits(path, ids):
    weights = load_weights(resolve(str(path)))
    assert not weights.dense_fallbacks
    return RuntimeLM(weights, 512)(ids).logits


def _transformers_logits(path, ids, **kwargs):
    model = AutoModelForCausalLM.from_pretrained(str(path), **kwargs)
    with torch.no_grad():
        return model(ids).logits.float()


def _same_logits(a, b):
    # both dequantize the same stored integers; only the order of float sums differs
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "kind", ["rtn:w4g64", "rtn:w4g128sym", "rtn:w8", "rtn:w4g64zp"], ids=lambda k: k
)
def test_transformers_documented_call_gives_runtime_logits(artifacts, kind, ids):
    path = artifacts[kind]
    config = json.loads((path / "config.json").read_text())
    route = transformers_route(config)  # zero points: the one documented extra argument
    assert (route == {"dequantize": True}) == kind.endswith("zp") and route is not None
    kwargs = {"quantization_config": CompressedTensorsConfig(**route)} if route else {}
    _same_logits(_transformers_logits(path, ids, **kwargs), _runtime_logits(path, ids))


@pytest.mark.parametrize(
    "kind", ["rtn:w4g64+lm_head:w8", "int8+export:compressed-tensors", "awq+gptq+tune"]
)
def test_transformers_loads_head_and_int8_kinds(more_artifacts, kind, ids):
    path = more_artifacts[kind]
    assert transformers_problems(json.loads((path / "config.json").read_text())) == []
    _same_logits(_transformers_logits(path, ids), _runtime_logits(path, ids))


def test_best_presets_layout_opens_in_plain_transformers(tmp_path, wikitext, ids):
    """What `best:w4g64` writes for the default model (float32): one config group per
    scheme that mixed precision chose, scales and embedding in bfloat16. The plain call
    computes in the config's bfloat16, so it agrees with the runtime to bf16 rounding;
    asked for float32, it gives the runtime's logits."""
    # which linears get more bits does not matter here, only that several schemes are
    # written: two samples for the Fisher estimate
    calib = {"source": str(wikitext / "valid.txt"), "samples": 2, "length": 128}
    stages = [{"mixed": {"bits_budget": 4.6, "samples": 2}}, {"rtn": {"bits": 4}}]
    recipe = parse_recipe({"stages": stages, "calib": calib, "dtype": "auto16"})
    out = compress("default", recipe, tmp_path / "best", log=lambda _: None)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16" and len(config["quantization_config"]["config_groups"]) > 1
    assert transformers_problems(config) == [] and vllm_problems(config, _names(out)) == []
    served = _runtime_logits(out, ids)
    model = AutoModelForCausalLM.from_pretrained(str(out))
    assert model.dtype == torch.bfloat16
    with torch.no_grad():
        plain = model(ids).logits.float()
    assert (plain.argmax(-1) == served.argmax(-1)).float().mean() > 0.9
    assert (plain - served).abs().mean() < 0.1 * served.abs().mean()
    _same_logits(_transformers_logits(out, ids, dtype=torch.float32), served)


def test_default_artifact_config_is_what_loaders_dispatch_on(artifacts):
    config = json.loads((artifacts["rtn:w4g64"] / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "_name_or_path" not in config
    assert not any(isinstance(v, str) and v.startswith("/") for v in config.values())
    weights = config["quantization_config"]["config_groups"]["group_0"]["weights"]
    assert weights["symmetric"] is True and weights["group_size"] == 64


def _names(path):
    return [n for f in path.glob("*.safetensors") for n in check_safetensors(f)]


def test_vllm_rules_accept_the_default_kinds(artifacts, more_artifacts):
    for kind in ("rtn:w4g64", "rtn:w8", "rtn:w4g64zp"):
        path = artifacts[kind]
        config = json.loads((path / "config.json").read_text())
        assert vllm_problems(config, _names(path)) == [], kind
        manifest = json.loads((path / "manifest.json").read_text())
        assert manifest["engines"] == engine_problems(config, _names(path))
    int8 = more_artifacts["int8+export:compressed-tensors"]
    config = json.loads((int8 / "config.json").read_text())
    assert config["quantization_config"]["format"] == "pack-quantized"  # not int-quantized
    assert vllm_problems(config, _names(int8)) == []


def test_vllm_rules_name_what_it_refuses(artifacts, more_artifacts):
    mixed = artifacts["rtn:w4g128sym"]
    found = vllm_problems(json.loads((mixed / "config.json").read_text()), _names(mixed))
    assert len(found) == 1 and found[0].startswith("group size 96 has no CUDA kernel"), found
    # on vLLM's CPU build only the int8 copy of the fp32-tied head (--lm-head auto) is refused
    found = vllm_problems(json.loads((mixed / "config.json").read_text()), device="cpu")
    assert len(found) == 1 and "8-bit" in found[0], found
    head = more_artifacts["rtn:w4g64+lm_head:w8"]  # vLLM 0.32 reads a quantized lm_head
    config = json.loads((head / "config.json").read_text())
    assert vllm_problems(config, _names(head)) == []
    found = vllm_problems(config, _names(head), device="cpu")
    assert len(found) == 1 and "8-bit" in found[0], found


def _group(**weights):
    args = {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel"}
    return {"targets": ["Linear"], "weights": {**args, **weights}, "input_activations": None}


@pytest.mark.parametrize(
    ("group", "fmt", "expected"),
    [
        (_group(), "int-quantized", "must be pack-quantized"),  # what llmpress wrote before
        (_group(), "pack-quantized", None),
        (_group(symmetric=False, strategy="group", group_size=64), "pack-quantized", "zero"),
        (_group(num_bits=4, strategy="group", group_size=96), "pack-quantized", "group size 96"),
        (
            {
                **_group(strategy="group", group_size=64),
                "input_activations": {"num_bits": 8, "strategy": "token", "dynamic": True},
            },
            "int-quantized",
            "per channel",
        ),
    ],
)
def test_vllm_rules_on_hand_made_configs(group, fmt, expected):
    config = {
        "quantization_config": {
            "quant_method": "compressed-tensors",
            "format": fmt,
            "config_groups": {"group_0": {**group, "format": fmt}},
        }
    }
    found = vllm_problems(config)
    if expected is None:
        assert found == []
    else:
        assert len(found) == 1 and expected in found[0], found


@pytest.mark.parametrize("bits", [3, 5, 6])
def test_plain_transformers_opens_symmetric_weights_of_any_width(tmp_path, tokenizer, bits):
    """Widths vLLM has no kernel for (the 3-bit presets, the 5- and 6-bit linears a recipe
    may offer mixed precision) still open with the plain `from_pretrained` when symmetric,
    and compute what llmpress's dense loader computes from the same packed integers."""
    from compress.artifact.dense import load_model
    from tests.conftest import write_tiny_llama

    folder = write_tiny_llama(tmp_path / "m", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    recipe = parse_recipe({"stages": [parse_quant(f"rtn:w{bits}g64")]})  # RTN: no calibration
    out = compress(str(folder), recipe, tmp_path / "out", log=lambda _: None)
    assert transformers_route(json.loads((out / "config.json").read_text())) == {}
    ids = torch.randint(0, 1000, (1, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = load_model(resolve(str(out)))(ids).logits
    _same_logits(_transformers_logits(out, ids), ours)
