"""LLM.int8()-style outliers: selection, the decomposed layer, artifacts, and the amplified
model where plain int8 breaks and outlier-aware int8 does not."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from compress.artifact.dense import DecomposedLinear, load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.errors import LlmpressError
from compress.eval.drift import measure_drift
from compress.model.amplify import amplify_checkpoint
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.quantizers.int8_outlier import Int8OutlierConfig
from compress.recipe import parse_quant, parse_recipe

CHANNELS = [17, 101, 333]


def test_outlier_selection():
    amax = torch.tensor([0.5, 7.0, 2.0, 9.0, 6.0])
    assert Int8OutlierConfig(threshold=6.0).select(amax).tolist() == [1, 3]  # the paper's
    assert Int8OutlierConfig().fraction == 0.01 and Int8OutlierConfig().group_size == 64
    assert Int8OutlierConfig(activations="int8").group_size is None  # vLLM's W8A8: per channel
    assert Int8OutlierConfig(threshold=1.0).select(amax).tolist() == [1, 2, 3, 4]
    assert Int8OutlierConfig(top_k=1).select(amax).tolist() == [3]
    assert Int8OutlierConfig(fraction=0.4).select(amax).tolist() == [1, 3]
    with pytest.raises(LlmpressError, match="one of threshold, top_k, fraction"):
        Int8OutlierConfig(threshold=6.0, top_k=3)
    assert parse_quant("int8") == {"int8": {}}
    assert parse_quant("int8:g128") == {"int8": {"group_size": 128}}


def test_decomposed_linear_keeps_outlier_columns_exact():
    torch.manual_seed(0)
    w = torch.randn(32, 64)
    x = torch.randn(5, 64)
    x[:, [3, 40]] *= 200  # two outlier features
    exact = x @ w.T
    split = DecomposedLinear(w, None, torch.tensor([3, 40]))(x)
    naive = DecomposedLinear(w, None, torch.tensor([], dtype=torch.long))(x)
    err_split = (split - exact).abs().max()
    err_naive = (naive - exact).abs().max()
    assert err_split < 0.05 * err_naive  # per-token int8 of the rest, outliers untouched


@pytest.fixture(scope="module")
def amplified(default_ckpt, tmp_path_factory):
    return amplify_checkpoint(default_ckpt, tmp_path_factory.mktemp("amp") / "m", CHANNELS, 100.0)


def test_amplification_is_exact(amplified, base_model, tokenizer):
    ids = tokenizer("A reparametrized model computes the same logits.", return_tensors="pt")
    with torch.no_grad():
        a = load_model(resolve(str(amplified)))(ids.input_ids).logits
        b = base_model(ids.input_ids).logits
    assert torch.allclose(a, b, atol=1e-3 * b.abs().max().item(), rtol=0)


def test_outliers_rescue_int8_where_plain_int8_breaks(
    amplified, wikitext, base_model, tokenizer, tmp_path
):
    # 2 samples: the channels amplified 100× lead every norm output on any text
    calib = {"source": str(wikitext / "valid.txt"), "samples": 2, "length": 256}
    plain = compress(
        str(amplified),
        parse_recipe({"stages": [parse_quant("rtn:w8")]}),
        tmp_path / "plain",
        log=lambda _: None,
    )
    # the amplified channels are the largest of every norm output: the 4 largest input
    # channels of each layer cover them (the paper's fixed 6.0 also takes many natural
    # MLP outliers in this model, see benchmarks/int8_outliers.py)
    aware = compress(
        str(amplified),
        parse_recipe({"stages": [{"int8": {"top_k": 4}}], "calib": calib}),
        tmp_path / "aware",
        log=lambda _: None,
    )
    record = json.loads((aware / "manifest.json").read_text())["stages"][0]
    assert 0 < record["outlier_share"] < 0.01
    for i in range(30):
        assert set(CHANNELS) <= set(record["outliers"][f"model.layers.{i}.mlp.up_proj"])
    stream = token_stream(tokenizer, read_texts(str(wikitext / "test.txt")))
    windows = eval_windows(stream, 256, limit=2)
    cands = {"plain": load_model(resolve(str(plain))), "aware": load_model(resolve(str(aware)))}
    r = measure_drift(base_model, cands, windows, progress=False)
    assert r["plain"].kl > 0.1  # the tiny weights of the amplified columns round to zero
    assert r["aware"].kl < 0.01 and r["aware"].kl < r["plain"].kl / 20


def test_artifact_layouts(default_ckpt, wikitext, tmp_path):
    """The int8 weight is ordinary compressed-tensors (W8A8 when activations are int8); the
    16-bit outlier columns ride along, and `--export compressed-tensors` leaves them out."""
    calib = {"source": str(wikitext / "valid.txt"), "samples": 2, "length": 128}
    stage = {"int8": {"fraction": 0.01, "activations": "int8"}}
    ours = compress(
        "default",
        parse_recipe({"stages": [stage], "calib": calib}),
        tmp_path / "ours",
        log=lambda _: None,
    )
    qc = json.loads((ours / "config.json").read_text())["quantization_config"]
    # the blocks' W8A8 group, and the head's weight-only int8 copy (--lm-head auto)
    group, head = sorted(qc["config_groups"].values(), key=lambda g: g["targets"] == ["lm_head"])
    assert head["targets"] == ["lm_head"] and head["input_activations"] is None
    assert (qc["quant_method"], qc["format"]) == ("compressed-tensors", "mixed-precision")
    assert (group["format"], head["format"]) == ("int-quantized", "pack-quantized")
    assert group["input_activations"]["strategy"] == "token"
    assert "model.layers.0.mlp.down_proj.weight_outlier" in resolve(str(ours)).tensors
    model = load_model(resolve(str(ours)))
    layer = model.model.layers[0].mlp.down_proj
    assert type(layer).__name__ == "DecomposedLinear" and 0 < layer.index.numel() <= 15

    plain = compress(
        "default",
        parse_recipe({"stages": [stage], "calib": calib, "export": "compressed-tensors"}),
        tmp_path / "plain",
        log=lambda _: None,
    )
    assert not any(n.endswith("_outlier") for n in resolve(str(plain)).tensors)
    hf = AutoModelForCausalLM.from_pretrained(str(plain), dtype=torch.float32)
    ids = torch.arange(100, 164)[None]
    with torch.no_grad():  # same W8A8 arithmetic as compressed-tensors' own
        a, b = hf(ids).logits, load_model(resolve(str(plain)))(ids).logits
    assert torch.allclose(a, b, atol=1e-3 * b.abs().max().item(), rtol=0)
