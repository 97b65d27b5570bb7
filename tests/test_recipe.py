import dataclasses

import pytest

from compress.errors import LlmpressError
from compress.recipe import load_recipe, parse_quant, parse_recipe


def test_yaml_recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        "stages:\n  - rtn: {bits: 3, group_size: 32, zero_point: false}\n"
        "calib: {source: self, samples: 8}\nignore: ['*.down_proj']\ndtype: bfloat16\n"
    )
    recipe = parse_recipe(load_recipe(path))
    ((name, cfg),) = recipe.stages
    assert name == "rtn" and (cfg.bits, cfg.group_size, cfg.zero_point) == (3, 32, False)
    assert recipe.calib.samples == 8 and recipe.calib.length == 512
    assert recipe.ignore == ("*.down_proj",) and recipe.dtype == "bfloat16"
    assert recipe.to_dict()["stages"] == [
        {"rtn": {"bits": 3, "group_size": 32, "zero_point": False}}
    ]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"stages": [{"rtn": {"bitz": 4}}]}, "unknown key 'bitz' (did you mean 'bits'?)"),
        ({"stages": [{"rnt": {}}]}, "unknown stage 'rnt' (did you mean 'rtn'?)"),
        ({"stage": []}, "unknown key 'stage' (did you mean 'stages'?)"),
        ({"stages": []}, "must be a non-empty list"),
        ({"stages": [{"rtn": {"bits": "4"}}]}, "bits: '4' is not a valid"),
        ({"stages": [{"rtn": {"bits": 12}}]}, "bits must be an integer from 2 to 8"),
        ({"stages": ["rtn"], "dtype": "fp8"}, "dtype 'fp8'"),
        ({"stages": ["rtn"], "calib": {"samples": 0}}, "samples must be >= 1"),
    ],
)
def test_bad_recipes_fail_with_the_fix(data, message):
    with pytest.raises(LlmpressError) as e:
        parse_recipe(data)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_bad_yaml_names_the_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("stages:\n  - rtn: {bits: 4\n")
    with pytest.raises(LlmpressError, match="not valid YAML at line"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("rtn:w4g64", {"bits": 4, "group_size": 64, "zero_point": False}),
        ("rtn:w4", {"bits": 4, "group_size": 64, "zero_point": False}),
        ("rtn:w8", {"bits": 8, "group_size": None, "zero_point": False}),
        ("rtn:w4g128zp", {"bits": 4, "group_size": 128, "zero_point": True}),
        ("rtn:w8g32zp", {"bits": 8, "group_size": 32, "zero_point": True}),
    ],
)
def test_quant_shorthand_and_recipe_keys_mean_the_same(spec, expected):
    """What the shorthand leaves out takes the defaults an omitted recipe key takes."""
    recipe = parse_recipe({"stages": [parse_quant(spec)]})
    assert dataclasses.asdict(recipe.stages[0][1]) == expected


def test_omitted_recipe_keys_equal_the_bare_shorthand():
    for bits in (4, 8):
        keys = parse_recipe({"stages": [{"rtn": {"bits": bits}}]}).stages[0][1]
        short = parse_recipe({"stages": [parse_quant(f"rtn:w{bits}")]}).stages[0][1]
        assert keys == short


def test_bad_shorthand():
    with pytest.raises(LlmpressError, match="awq:w4g64, rtn:w8"):
        parse_quant("rtn-4bit")


def test_auto16_keeps_a_16_bit_checkpoint_and_halves_a_float32_one():
    import torch

    from compress.pipeline import storage_dtype

    assert storage_dtype("auto16", {"dtype": "float32"}) == torch.bfloat16
    assert storage_dtype("auto16", {}) == torch.bfloat16
    assert storage_dtype("auto16", {"torch_dtype": "float16"}) == torch.float16
    assert storage_dtype("auto16", {"dtype": "bfloat16"}) == torch.bfloat16
    assert storage_dtype("auto", {"dtype": "float32"}) == torch.float32
    assert storage_dtype("auto16", {"dtype": "float32"}, "awq-gemm") == torch.float16


def test_kv_cache_is_int8_unless_the_recipe_says_none():
    """int8 (KIVI) is the measured default; `none`, null and `fp32` all mean an fp32 cache,
    which writes no scheme into config.json; a bad scheme is refused when the recipe is
    read, before any work."""
    from compress.pipeline import _extra
    from compress.runtime.kv_cache import CONFIG_KEY, KVScheme

    stages = [{"rtn": {"bits": 4, "group_size": 64}}]
    default = parse_recipe({"stages": stages})
    assert default.kv_cache == "int8" and default.label().endswith("+kv:int8")
    assert KVScheme.of_artifact(_extra(default)) == KVScheme(bits=8)
    for off in ("none", None, "fp32"):
        recipe = parse_recipe({"stages": stages, "kv_cache": off})
        assert recipe.kv_cache == "none" and "kv:" not in recipe.label()
        assert CONFIG_KEY not in _extra(recipe)
    assert parse_recipe({"stages": stages, "kv_cache": "int4:g64"}).kv_cache == "int4:g64"
    with pytest.raises(LlmpressError, match="int3"):
        parse_recipe({"stages": stages, "kv_cache": "int3"})
