"""AWQ on the real default model: folding is exact, searches help, and it beats RTN."""

import json

import pytest
import torch

from compress.artifact.dense import load_model
from compress.artifact.formats.awq_layout import ORDER, pack_awq, unpack_awq
from compress.calib_data import calibration_samples, eval_windows, read_texts, token_stream
from compress.errors import LlmpressError
from compress.eval.drift import measure_drift
from compress.inspect import describe
from compress.model.blocks import BlockStore, run_block
from compress.model.loading import read_tensors, resolve
from compress.pipeline import compress
from compress.quantizers.awq import AWQ, AWQConfig, _channel_map
from compress.quantizers.scheme import (
    QuantScheme,
    compute_qparams,
    quantize_weight,
    quantize_with,
)
from compress.recipe import parse_recipe
from compress.stage import BlockContext, Workspace
from tests.conftest import write_tiny_llama

FAST = {"grid": 8, "search_samples": 2}  # a coarser search keeps the suite quick


@pytest.fixture(scope="module")
def calib_ids(tokenizer, wikitext):
    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt")))
    return calibration_samples(stream, 4, 256, seed=0)


def _context(default_ckpt, tokenizer, ids, index):
    store = BlockStore(default_ckpt)
    hidden = store.embed(ids)
    rope = store.position_embeddings(ids.shape[1])
    for i in range(index):
        hidden = run_block(store.block(i), hidden, rope)
        store.release(i)
    ws = Workspace(store, tokenizer)
    return BlockContext(ws, index, store.block(index), hidden, rope)


def test_scale_folding_leaves_the_model_unchanged(default_ckpt, tokenizer, calib_ids):
    ctx = _context(default_ckpt, tokenizer, calib_ids[:4], index=3)
    before = run_block(ctx.module, ctx.inputs, ctx.rope)
    awq = AWQ(AWQConfig(**FAST))
    awq.calibrate(ctx)
    for group in ctx.ws.adapter.input_groups:  # search and fold scales, quantize nothing
        awq._scale_group(ctx, group, set(), _channel_map(ctx, group))
    after = run_block(ctx.module, ctx.inputs, ctx.rope)
    assert torch.allclose(after, before, atol=1e-4 * before.abs().max().item(), rtol=0)
    # o's scale folds into v although v has 3 heads and o reads 9 (grouped-query attention)
    assert set(awq.alphas) == {
        f"model.layers.3.{n}"
        for n in ("self_attn.q_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.down_proj")
    }
    assert "model.layers.3.input_layernorm.weight" in ctx.ws.updated


def test_clip_search_lowers_the_output_error():
    torch.manual_seed(0)
    w = torch.randn(64, 256) * 0.02
    w[::7, ::13] *= 12  # heavy-tailed groups, where clipping pays
    x = torch.randn(512, 256)
    scheme = QuantScheme(3, 64, True)
    awq = AWQ(AWQConfig(bits=3, zero_point=True))
    clip = awq._search_clip(w, x, 64, scheme, 8)
    assert clip.shape == (64, 4) and (clip <= 1).all() and (clip >= 0.5).all() and (clip < 1).any()

    def out_err(c):
        scale, zp = compute_qparams(w, scheme, 64, torch.float32, clip=c)
        q = quantize_with(w, scale, zp, scheme, 64).float().reshape(64, 4, 64)
        deq = ((q - zp.float()[..., None]) * scale[..., None]).reshape(64, 256)
        return (x @ (deq - w).T).pow(2).mean().item()

    assert out_err(clip) < out_err(1.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("zero_point", [False, True])
def test_fake_quantization_is_quantize_then_dequantize(monkeypatch, zero_point, dtype):
    """The scale search's stand-in weights, a slice of rows at a time with the codes kept
    in fp32: exactly dequantize(quantize_weight(w·s)) / s, scales as `dtype` holds them."""
    from compress.quantizers import awq as module

    torch.manual_seed(2)
    w = (torch.randn(100, 192) * 0.02).to(dtype)
    w[::9, ::7] *= 20
    s = torch.rand(192) + 0.5
    scheme = QuantScheme(4, 64, zero_point)
    monkeypatch.setattr(module, "cpu_slice_rows", lambda cols: 30)  # 4 slices, the last of 10
    out = torch.full((100, 192), float("nan"))
    module._fake_quant_into(out, w, s, scheme, dtype)
    want = quantize_weight(w.float() * s, scheme, dtype).dequantize() / s
    assert torch.equal(out, want)


@pytest.mark.parametrize("zero_point", [False, True])
def test_clip_search_in_slices_picks_the_whole_weight_ratios(monkeypatch, zero_point):
    """The search works a slice of rows at a time in a [group, row, g] layout: the same
    ratios as whole-weight passes through compute_qparams and quantize_with, on a weight
    of several slices with a partial last one."""
    from compress.quantizers import awq as module

    torch.manual_seed(1)
    w = torch.randn(200, 256) * 0.02
    w[::5, ::11] *= 15
    x = torch.randn(300, 256)
    scheme = QuantScheme(4, 64, zero_point)
    awq = AWQ(AWQConfig(zero_point=zero_point))
    monkeypatch.setattr(module, "cpu_slice_rows", lambda cols: 48)  # 4 slices and 8 rows
    got = awq._search_clip(w, x, 64, scheme, 64)
    gram = module._gram(x, 4, 64, w.device, 64)
    best, best_err = torch.ones(200, 4), torch.full((200, 4), float("inf"))
    for i in range(10):
        ratio = 1 - i / 20
        scale, zp = compute_qparams(w, scheme, 64, torch.float32, clip=ratio)
        q = quantize_with(w, scale, zp, scheme, 64).float().reshape(200, 4, 64)
        if zp is not None:
            q = q - zp.float()[..., None]
        delta = (q * scale[..., None] - w.reshape(200, 4, 64)).transpose(0, 1)
        err = ((delta @ gram) * delta).sum(-1).T
        best = torch.where(err < best_err, ratio, best)
        best_err = torch.minimum(err, best_err)
    assert torch.equal(got, best) and got.is_contiguous() and (got < 1).any()


def test_awq_beats_rtn_on_wikitext(tmp_path, wikitext, base_model, tokenizer, artifacts):
    # the scale and clip searches on one 256-token sample (the statistics use all four):
    # the searches are most of this test's time
    awq = {"bits": 4, "group_size": 64, "zero_point": True, **FAST, "search_samples": 1}
    recipe = parse_recipe(
        {
            "stages": [{"awq": awq}],
            "calib": {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 256},
        }
    )
    out = compress("default", recipe, tmp_path / "awq", log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"][0]["layers"] == 210 and manifest["stages"][0]["alpha"]
    stream = token_stream(tokenizer, read_texts(str(wikitext / "test.txt")))
    windows = eval_windows(stream, 512, limit=2)
    cands = {
        "awq": load_model(resolve(str(out))),
        "rtn": load_model(resolve(str(artifacts["rtn:w4g64"]))),
    }
    r = measure_drift(base_model, cands, windows, progress=False)
    assert r["awq"].kl < 0.8 * r["rtn"].kl
    assert r["awq"].top1 > r["rtn"].top1


def test_layers_that_cannot_take_the_scheme_are_named_first(tmp_path):
    folder = write_tiny_llama(tmp_path / "m", intermediate_size=100)
    recipe = parse_recipe({"stages": [{"awq": {"bits": 4, "group_size": 64}}]})
    with pytest.raises(
        LlmpressError,
        match=r"model\.layers\.\*\.mlp\.down_proj: input width 100 "
        r".*--ignore 'model\.layers\.\*\.mlp\.down_proj'",
    ):
        compress(str(folder), recipe, tmp_path / "out", log=lambda _: None)
    assert not (tmp_path / "out").exists()


def test_bf16_checkpoint(tmp_path, tokenizer):
    folder = write_tiny_llama(tmp_path / "m", vocab_size=49152, dtype="bfloat16")
    from safetensors.torch import load_file, save_file

    tensors = {
        k: (v * 40).to(torch.bfloat16)  # large values: bf16 range, no fp16 overflow risk
        for k, v in load_file(str(folder / "model.safetensors")).items()
    }
    save_file(tensors, str(folder / "model.safetensors"))
    tokenizer.save_pretrained(str(folder))
    text = tmp_path / "calib.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 200)
    recipe = parse_recipe(
        {
            "stages": [{"awq": {"bits": 4, "group_size": 32, **FAST}}],
            "calib": {"source": str(text), "samples": 4, "length": 64},
        }
    )
    out = compress(str(folder), recipe, tmp_path / "out", log=lambda _: None)
    config = json.loads((out / "config.json").read_text())
    assert config["dtype"] == "bfloat16"
    model = load_model(resolve(str(out)))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_awq_gemm_packing_order():
    values = torch.arange(8).repeat(3, 2)  # [3, 16], columns 0..7 twice
    words = pack_awq(values)
    assert words.shape == (3, 2)
    expected = sum(col << (4 * nibble) for nibble, col in enumerate(ORDER))
    assert words[0, 0].item() == expected  # nibble i holds column ORDER[i]
    rand = torch.randint(0, 16, (5, 64))
    assert torch.equal(unpack_awq(pack_awq(rand)), rand)


def test_awq_gemm_export_round_trip(awq_gemm_artifact, default_ckpt, tmp_path):
    """rtn:w4g64zp written as AutoAWQ's GEMM layout (conftest.py) decodes to exactly the
    weights RTN makes with the layout's float16 scales: what the compressed-tensors layout
    of the same rounding decodes to (both go through QuantizedWeight.dequantize)."""
    awq = awq_gemm_artifact
    config = json.loads((awq / "config.json").read_text())["quantization_config"]
    assert (config["quant_method"], config["version"], config["group_size"]) == ("awq", "gemm", 64)
    a = load_model(resolve(str(awq))).model.layers[4].mlp.down_proj.weight
    name = "model.layers.4.mlp.down_proj.weight"
    source = read_tensors(default_ckpt, [name])[name].float()
    b = quantize_weight(source, QuantScheme(4, 64, True), torch.float16).dequantize()
    assert torch.equal(a, b)
    assert "format: awq / gemm: int4 group 64" in describe(str(awq))
    with pytest.raises(LlmpressError, match="one group size"):
        compress(
            "default",
            parse_recipe(
                {
                    "stages": [{"rtn": {"bits": 4, "group_size": 128, "zero_point": True}}],
                    "export": "awq-gemm",
                }
            ),
            tmp_path / "x",
        )


def test_the_weight_mean_stacks_a_weight_group_of_columns_at_a_time():
    """duo scaling's weight term over a group's linears (every expert's gate and up for
    an MoE MLP), a weight group of columns at a time: the whole stack's mean, bit for bit
    (a near-tie of two scales turns on its last bits)."""
    from compress.quantizers.awq import _weight_mean

    gen = torch.Generator().manual_seed(0)
    weights = [torch.randn(rows, 256, generator=gen) for rows in (96, 32, 160)]
    scheme = QuantScheme(4, 64, False)
    stacked = torch.cat(weights).abs().reshape(288, 4, 64)
    want = (stacked / stacked.amax(-1, keepdim=True)).reshape(288, 256).mean(0)
    assert torch.equal(_weight_mean(weights, scheme), want)


def test_a_kept_copy_is_narrow_only_where_exact():
    """Weights kept to try scales on (AWQ) or to re-round (tune) take the checkpoint's
    16 bits while those hold them exactly, and their own dtype once a stage changed them."""
    from compress.stage import exact_copy

    w = torch.randn(64, 64).to(torch.bfloat16).float()
    kept = exact_copy(w, torch.bfloat16)
    assert kept.dtype == torch.bfloat16 and torch.equal(kept.float(), w)
    scaled = w * 1.001
    kept = exact_copy(scaled, torch.bfloat16)
    assert kept.dtype == torch.float32 and torch.equal(kept, scaled)
    assert kept.data_ptr() != scaled.data_ptr()
