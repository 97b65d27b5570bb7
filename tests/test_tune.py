"""Chaining quantizers (awq → gptq) and block-wise tuning of the result."""

import json

import pytest
import torch
from safetensors.torch import load_file

from compress.artifact.dense import load_model
from compress.calib_data import calibration_samples, read_texts, token_stream
from compress.errors import LlmpressError
from compress.model.blocks import BlockStore, run_block
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.quantizers.awq import AWQ, AWQConfig
from compress.quantizers.gptq import GPTQ, GPTQConfig, gptq_quantize
from compress.quantizers.rtn import RTN, RTNConfig
from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.quantizers.tune import Tune, TuneConfig, _Tunable
from compress.recipe import parse_recipe
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights
from compress.stage import BlockContext, Workspace
from tests.conftest import write_tiny_llama


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("method", ["rtn", "gptq"])
def test_tuning_starts_exactly_where_the_earlier_rounding_ended(method, zero_point):
    """Before any step the tuned weight is the earlier stage's dequantized weight, and
    exporting it gives back the same integers and scales (RTN's, or GPTQ's which are not
    nearest-rounded)."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 192, generator=g) * 0.05
    scheme = QuantScheme(4, 64, zero_point)
    if method == "rtn":
        qw = quantize_weight(w, scheme)
    else:
        x = torch.randn(512, 192, generator=g) @ torch.randn(192, 192, generator=g)
        qw = gptq_quantize(w, 2 * x.T @ x / 512, scheme, torch.float32)
    t = _Tunable(qw, w, rounding=True)
    torch.testing.assert_close(t.weight(torch.float32), qw.dequantize(), rtol=0, atol=1e-6)
    back = t.result(torch.float32)
    assert torch.equal(back.q, qw.q) and torch.equal(back.scale, qw.scale)
    if zero_point:
        assert torch.equal(back.zero_point, qw.zero_point)


def _block3(default_ckpt, tokenizer, wikitext, samples, length):
    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt")))
    ids = calibration_samples(stream, samples, length, seed=0)
    ws = Workspace(BlockStore(default_ckpt), tokenizer)
    hidden, rope = ws.store.embed(ids), ws.store.position_embeddings(length)
    for i in range(3):
        hidden = run_block(ws.store.block(i), hidden, rope)
    return ws, ws.store.block(3), hidden, rope


def test_tuning_lowers_a_real_blocks_error_on_unseen_text(default_ckpt, tokenizer, wikitext):
    """The default model's block 3 after RTN w4 g64: tuned on 16 samples, its output error
    on 8 samples it never saw falls well below RTN's (asked: under 0.85×), and the artifact
    integers stay in range."""
    ws, block, hidden, rope = _block3(default_ckpt, tokenizer, wikitext, 24, 128)
    train, held = hidden[:16], hidden[16:]
    ctx = BlockContext(ws, 3, block, train, rope, reference=run_block(block, train, rope))
    reference_held = run_block(block, held, rope)
    rtn = RTN(RTNConfig(bits=4, group_size=64))
    rtn.transform(ctx)
    before = (run_block(block, held, rope) - reference_held).square().mean()
    tune = Tune(TuneConfig(steps=60, batch=2, target="block"))  # default lr and schedule
    tune.transform(ctx)
    after = (run_block(block, held, rope) - reference_held).square().mean()
    assert after < 0.85 * before, (float(after), float(before))
    (pair,) = tune.loss.values()
    assert pair[1] < pair[0] and not tune.kept
    for qw in ws.quantized.values():
        assert int(qw.q.min()) >= -8 and int(qw.q.max()) <= 7


def test_shared_passes_are_the_forwards_they_replace(default_ckpt, tokenizer, wikitext):
    """The first calibration pass over a block as read keeps its output as tune's
    reference, and tune hands on the output it measured last for propagation: both are
    exactly what a separate run of the block gives, so sharing them (two forwards of each
    block over every sample fewer) changes no result."""
    ws, block, hidden, rope = _block3(default_ckpt, tokenizer, wikitext, 4, 64)
    original = run_block(block, hidden, rope)
    ctx = BlockContext(ws, 3, block, hidden, rope, want_reference=True)
    gptq = GPTQ(GPTQConfig(bits=4, group_size=64))
    gptq.calibrate(ctx)
    assert torch.equal(ctx.reference, original)
    kept = ctx.reference
    RTN(RTNConfig(bits=4, group_size=64)).transform(ctx)  # an error tuning surely reduces
    ctx.observe(["mlp.down_proj"], lambda *_: None)  # the block changed: nothing kept
    assert ctx.reference is kept and ctx.output is None
    tune = Tune(TuneConfig(steps=20, lr=1e-2, target="block"))
    tune.transform(ctx)
    assert not tune.kept  # tuning helped: its output is the block's new output
    assert torch.equal(ctx.output, run_block(block, hidden, rope))
    assert not torch.equal(ctx.output, original)


def test_tuning_on_a_prefix_reads_only_the_prefix(default_ckpt, tokenizer, wikitext):
    """`positions: 32` trains on the first 32 tokens of each sample: targets past them can
    be anything and the tuned integers are the same (causal attention makes the prefix's
    output exact), while all positions give other integers."""
    ws, block, hidden, rope = _block3(default_ckpt, tokenizer, wikitext, 4, 64)
    reference = run_block(block, hidden, rope)
    noisy = reference.clone()
    noisy[:, 32:] += torch.randn_like(noisy[:, 32:])
    found = []
    for positions, target in ((32, reference), (32, noisy), (None, noisy)):
        ws.quantized.clear()
        fresh = ws.store.block(3)
        ctx = BlockContext(ws, 3, fresh, hidden, rope, reference=target)
        RTN(RTNConfig(bits=4, group_size=64)).transform(ctx)
        Tune(TuneConfig(steps=5, target="block", positions=positions)).transform(ctx)
        found.append(ws.quantized["model.layers.3.mlp.down_proj"].q.clone())
    assert torch.equal(found[0], found[1]) and not torch.equal(found[0], found[2])


def test_awq_before_gptq_only_scales_and_clips(default_ckpt, tokenizer, wikitext):
    """Followed by a stage that rounds, AWQ folds its scales and clips but quantizes
    nothing; the block still computes nearly what it did (clipping is its only loss)."""
    ws, block, hidden, rope = _block3(default_ckpt, tokenizer, wikitext, 4, 128)
    reference = run_block(block, hidden, rope)
    ctx = BlockContext(ws, 3, block, hidden, rope, round_later=True)
    awq = AWQ(AWQConfig(bits=4, group_size=64, search_samples=2, grid=4, clip_grid=4))
    awq.calibrate(ctx)
    awq.transform(ctx)
    assert not ws.quantized and awq.export(ws)["rounded"] is False
    drift = (run_block(block, hidden, rope) - reference).square().mean() / reference.var()
    assert 0 < drift < 1e-3


def _recipe(stages):
    return parse_recipe({"stages": stages})


def test_recipe_chains():
    scheme = {"bits": 4, "group_size": 64}
    names = [n for n, _ in _recipe([{"awq": scheme}, {"gptq": scheme}, "tune"]).stages]
    assert names == ["awq", "gptq", "tune"]
    _recipe([{"rtn": scheme}, {"tune": {"steps": 5}}])
    assert [n for n, _ in _recipe([{"awq": scheme}, "distill"]).stages] == ["awq", "distill"]
    bad = [
        ([{"gptq": scheme}, {"awq": scheme}], "both quantize the block linears"),
        ([{"rtn": scheme}, {"gptq": scheme}], "both quantize the block linears"),
        (["tune"], "put a quantizing stage"),
        ([{"awq": scheme}, {"gptq": {"bits": 3}}], "give both the same scheme"),
        ([{"rtn": scheme}, "tune", {"gptq": scheme}], "put the refining stage last"),
        ([{"rtn": scheme}, {"tune": {"lr": 3}}], r"tune: lr must be in \(0, 1\)"),
        ([{"rtn": scheme}, {"tune": {"schedule": "cosine"}}], "not one of linear, constant"),
        ([{"rtn": scheme}, {"tune": {"positions": 0}}], "positions must be >= 1"),
        ([{"rtn": scheme}, {"tune": {"step": 3}}], "step"),
        ([{"rtn": scheme}, "distill", "tune"], "put distill last"),
        ([{"rtn": scheme}, {"prune": {"mlp": 0.25}}], "must come before the quantizing"),
        (["distill", {"rtn": scheme}], "repairs a pruned model"),
    ]
    for stages, message in bad:
        with pytest.raises(LlmpressError, match=message):
            _recipe(stages)


def test_awq_gptq_tune_writes_an_ordinary_artifact(tmp_path, wikitext, tokenizer):
    """The whole chain through the pipeline on a small random llama: plain int4 groups the
    dense loader and the runtime read alike, each stage's record in the manifest, and the
    tuning's time in `timing_s`."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    scheme = {"bits": 4, "group_size": 32, "grid": 4, "clip_grid": 4, "search_samples": 2}
    recipe = parse_recipe(
        {
            "stages": [{"awq": scheme}, {"gptq": {"bits": 4, "group_size": 32}}, "tune"],
            "calib": {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 64},
        }
    )
    out = compress(str(folder), recipe, tmp_path / "chain", log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    awq, gptq, tune, head = manifest["stages"]  # the untied head in int8 (--lm-head auto)
    assert (awq["stage"], awq["rounded"], gptq["stage"], tune["stage"], head["stage"]) == (
        "awq", False, "gptq", "tune", "lm_head"
    )  # fmt: skip
    assert tune["output_mse"] and "tune transform" in manifest["timing_s"]
    group, _head = json.loads((out / "config.json").read_text())["quantization_config"][
        "config_groups"
    ].values()
    assert group["weights"]["group_size"] == 32 and group["weights"]["num_bits"] == 4
    ids = torch.randint(0, 100, (1, 80))
    dense = load_model(resolve(str(out)))(ids).logits
    served = RuntimeLM(load_weights(resolve(str(out))), 80)(ids).logits
    torch.testing.assert_close(served, dense, rtol=1e-4, atol=1e-4)


def test_tune_trains_toward_the_original_models_hidden_states(tmp_path, wikitext, tokenizer):
    """With target "original", the output each block is tuned toward is the original
    model's own hidden state after that block (what transformers computes on the same
    calibration tokens), not the block's output on the compressed model's inputs."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152, num_hidden_layers=3)
    tokenizer.save_pretrained(str(folder))
    seen = {}
    transform = Tune.transform

    def spy(self, ctx):
        seen[ctx.index] = (ctx.original.clone(), ctx.inputs.clone(), ctx.reference)
        transform(self, ctx)

    calib = {"source": str(wikitext / "valid.txt"), "samples": 3, "length": 32}
    recipe = parse_recipe(
        {
            "stages": [{"rtn": {"bits": 4, "group_size": 32}}, {"tune": {"target": "original"}}],
            "calib": calib,
        }
    )
    Tune.transform = spy
    try:
        compress(str(folder), recipe, tmp_path / "out", log=lambda _: None)
    finally:
        Tune.transform = transform
    model = load_model(resolve(str(folder)))
    ids = calibration_samples(token_stream(tokenizer, read_texts(calib["source"])), 3, 32, 0)
    with torch.no_grad():
        states = model(ids, output_hidden_states=True).hidden_states
    for i in range(3):
        original, inputs, reference = seen[i]
        assert reference is None  # the block-as-read output is not computed for nothing
        if i < 2:  # transformers' last hidden state is after the final norm
            torch.testing.assert_close(original, states[i + 1], rtol=1e-4, atol=1e-4)
        if i > 0:  # the compressed stream has drifted from the original one
            assert not torch.allclose(inputs, states[i], atol=1e-3)


def test_distill_after_quantization_trains_only_scales(tmp_path, wikitext, tokenizer):
    """`distill` last in a recipe repairs the quantized model: the integers are exactly
    RTN's, the scales moved, the training KL fell, and the artifact reads the same in the
    dense loader and the runtime."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    calib = {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 64}
    rtn = {"rtn": {"bits": 2, "group_size": 32, "zero_point": True}}  # an error to repair
    plain = compress(
        str(folder), parse_recipe({"stages": [rtn], "calib": calib}), tmp_path / "rtn",
        log=lambda _: None,
    )  # fmt: skip
    distill = {"distill": {"tokens": 64 * 2 * 12, "batch": 2, "scale_lr": 0.005}}
    recipe = parse_recipe({"stages": [rtn, distill], "calib": calib})
    out = compress(str(folder), recipe, tmp_path / "repaired", log=lambda _: None)
    record = json.loads((out / "manifest.json").read_text())["stages"][1]
    assert record["stage"] == "distill" and record["trained"].startswith("scales and zero")
    history = [kl for _, kl in record["loss_history"]]
    assert len(history) == 12 and sum(history[-4:]) < 0.9 * sum(history[:4]), str(history)
    a, b = load_file(str(plain / "model.safetensors")), load_file(str(out / "model.safetensors"))
    name = "model.layers.0.mlp.down_proj"
    assert torch.equal(a[f"{name}.weight_packed"], b[f"{name}.weight_packed"])
    assert not torch.equal(a[f"{name}.weight_scale"], b[f"{name}.weight_scale"])
    assert not (tmp_path / ".repaired.llmpress-work").exists()
    ids = torch.randint(0, 100, (1, 80))
    dense = load_model(resolve(str(out)))(ids).logits
    served = RuntimeLM(load_weights(resolve(str(out))), 80)(ids).logits
    torch.testing.assert_close(served, dense, rtol=1e-4, atol=1e-4)


def test_best_preset_is_the_chain_within_its_class():
    """best:wBgG is mixed precision to B + 0.6 bits per weight (w4g64's class of 4.6 in
    issue 16), GPTQ and a 64-step repair on 64 calibration samples, with 16-bit scales; a
    flag given still wins, and a one-scheme export (AutoAWQ's) gets the chain alone."""
    from compress.recipe import quant_recipe, recipe_from_flags

    data = quant_recipe("best:w3g32")
    recipe = parse_recipe(data)
    assert [n for n, _ in recipe.stages] == ["mixed", "gptq", "distill"]
    assert recipe.stages[0][1].bits_budget == 3.6 and recipe.stages[0][1].base == "w3g32sym"
    assert recipe.stages[2][1].tokens == 65536 and recipe.dtype == "auto16"
    assert recipe.stages[1][1].scheme == QuantScheme(3, 32, False)
    assert recipe.calib.samples == 64
    assert quant_recipe("awq:w4g64") == {"stages": [{"awq": {"bits": 4, "group_size": 64}}]}
    flagged = recipe_from_flags(None, "best:w4g64", {"samples": 8}, {"dtype": "float32"}, (), 4.5)
    assert flagged.dtype == "float32" and flagged.stages[0][1].bits_budget == 4.5
    assert flagged.calib.samples == 8
    awq_layout = recipe_from_flags(None, "best:w4g64zp", {}, {"export": "awq-gemm"})
    assert [n for n, _ in awq_layout.stages] == ["gptq", "distill"]


@pytest.mark.parametrize(
    ("stages", "kept"),
    [([{"rtn": {"bits": 4, "group_size": 32}}], False), (["gptq", "tune"], True)],
    ids=["rtn", "gptq+tune"],
)
def test_only_a_recipe_that_reads_them_keeps_the_unrounded_weights(
    tmp_path, wikitext, tokenizer, monkeypatch, stages, kept
):
    """A block's weights from before rounding are a second fp32 copy of the block: kept
    where a stage reads them (tune re-rounds them; gptq's original side computes with
    them), dropped by the walk before the next block is read."""
    import compress.pipeline as pipeline

    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    seen = []

    def recording(*args, **kwargs):
        seen.append(BlockContext(*args, **kwargs))
        return seen[-1]

    monkeypatch.setattr(pipeline, "BlockContext", recording)
    calib = {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 64}
    compress(str(folder), parse_recipe({"stages": stages, "calib": calib}), tmp_path / "o",
             log=lambda _: None)  # fmt: skip
    assert len(seen) == 2 and all(bool(ctx.unrounded) == kept for ctx in seen)
    if kept:  # each linear's weight as read, before its rounding
        store = BlockStore(resolve(str(folder)))
        q = store.block(0).self_attn.q_proj.weight
        assert torch.equal(seen[0].unrounded["self_attn.q_proj"], q)
