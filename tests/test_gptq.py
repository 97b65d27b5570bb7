"""GPTQ: error-compensating rounding, on synthetic layers and on the real default model."""

import contextlib
import json

import pytest
import torch
from safetensors.torch import load_file

from compress.artifact.dense import load_model
from compress.calib_data import calibration_samples, read_texts, token_stream
from compress.model.adapters import LLAMA
from compress.model.blocks import BlockStore, observe_inputs, observe_pairs, run_block
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.quantizers import gptq
from compress.quantizers.gptq import _toward_original, gptq_quantize
from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.recipe import parse_recipe
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights
from tests.conftest import write_tiny_llama
from tests.family_models import write_family


def _layer(seed=0, rows=96, cols=256, tokens=2048):
    """A weight and inputs whose channels are correlated and of unequal energy, like a
    transformer's."""
    g = torch.Generator().manual_seed(seed)
    mix = torch.randn(cols, cols, generator=g) / cols**0.5
    x = torch.randn(tokens, cols, generator=g) @ mix * torch.linspace(0.2, 3.0, cols)
    w = torch.randn(rows, cols, generator=g) * 0.05
    return w, x, 2 * x.T @ x / tokens


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("act_order", [False, True])
def test_gptq_output_error_is_well_below_rtn(zero_point, act_order):
    w, x, h = _layer()
    scheme = QuantScheme(4, 64, zero_point)
    g = gptq_quantize(w, h, scheme, torch.float32, act_order=act_order)
    r = quantize_weight(w, scheme)
    assert g.q.dtype == torch.int8 and g.scale.shape == (96, 4) and g.group_size == 64
    assert int(g.q.min()) >= scheme.qmin and int(g.q.max()) <= scheme.qmax
    err_g = (x @ (g.dequantize() - w).T).square().mean()
    err_r = (x @ (r.dequantize() - w).T).square().mean()
    assert err_g < 0.8 * err_r, (float(err_g), float(err_r))


def test_uncorrelated_inputs_leave_nothing_to_compensate():
    """With H diagonal no rounding error can be moved onto other columns: GPTQ is RTN."""
    w, _, _ = _layer()
    h = torch.diag(torch.rand(256) + 0.5)
    scheme = QuantScheme(4, 64, False)
    g, r = gptq_quantize(w, h, scheme, torch.float32), quantize_weight(w, scheme)
    assert torch.equal(g.q, r.q) and torch.equal(g.scale, r.scale)


def real_block_inputs(default_ckpt, tokenizer, wikitext, index: int = 3):
    """The default model's block `index` and each of its linears' inputs [tokens, in] on
    8 × 256 WikiText calibration tokens."""
    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt")))
    ids = calibration_samples(stream, 8, 256, seed=0)
    store = BlockStore(default_ckpt)
    hidden, rope = store.embed(ids), store.position_embeddings(ids.shape[1])
    for i in range(index):
        hidden = run_block(store.block(i), hidden, rope)
    block = store.block(index)
    inputs: dict[str, list[torch.Tensor]] = {}
    names = list(LLAMA.block_linears)
    observe_inputs(block, hidden, rope, names, lambda n, x: inputs.setdefault(n, []).append(x))
    return block, {n: torch.cat([t.reshape(-1, t.shape[-1]) for t in inputs[n]]) for n in names}


def test_on_a_real_block_every_linear_errs_less_than_rtn(default_ckpt, tokenizer, wikitext):
    """What GPTQ minimizes, on the default model's block 3 and WikiText calibration text:
    each linear's output error on the calibration inputs, below RTN's for every linear."""
    block, inputs = real_block_inputs(default_ckpt, tokenizer, wikitext)
    scheme = QuantScheme(4, 64, False)
    for name, x in inputs.items():
        w = block.get_submodule(name).weight.detach()
        g = gptq_quantize(w, 2 * x.T @ x / len(x), scheme, torch.float32)
        err_g = (x @ (g.dequantize() - w).T).square().mean()
        err_r = (x @ (quantize_weight(w, scheme).dequantize() - w).T).square().mean()
        assert err_g < 0.9 * err_r, (name, float(err_g), float(err_r))


def test_the_gptq_stage_writes_an_ordinary_artifact(tmp_path, wikitext, tokenizer):
    """Through the pipeline: a recipe stage, its manifest record, and an artifact the dense
    loader and the runtime both read (a small random llama keeps it quick)."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    recipe = parse_recipe(
        {
            "stages": [{"gptq": {"bits": 4, "group_size": 32, "act_order": False}}],
            "calib": {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 64},
        }
    )
    out = compress(str(folder), recipe, tmp_path / "gptq", log=lambda _: None)
    record = json.loads((out / "manifest.json").read_text())["stages"][0]
    assert record["stage"] == "gptq" and record["act_order"] is False and record["layers"] > 0
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    # the blocks' group, and the untied head's int8 one (--lm-head auto)
    group, head = config["config_groups"].values()
    assert group["weights"]["group_size"] == 32 and group["weights"]["num_bits"] == 4
    assert head["weights"]["num_bits"] == 8 and head["targets"] == ["lm_head"]
    ids = torch.randint(0, 100, (1, 80))  # > EXACT_ABOVE rows: the runtime's exact path
    dense = load_model(resolve(str(out)))(ids).logits
    served = RuntimeLM(load_weights(resolve(str(out))), 80)(ids).logits
    torch.testing.assert_close(served, dense, rtol=1e-4, atol=1e-4)


def test_the_original_target_is_the_least_squares_fit_to_it():
    """W + W·C·H⁻¹ is the weight whose outputs on the compressed inputs x come closest to
    W's on the original ones x_o: as close as lstsq's solution (in the objective: the
    inputs' covariance is ill-conditioned, so the weights themselves may differ along
    directions x hardly has)."""
    w, x, h = _layer(tokens=4096)
    g = torch.Generator().manual_seed(1)
    drift = torch.randn(256, 256, generator=g) / 256**0.5  # what x's own values predict
    x_o = x + 0.3 * x @ drift + 0.05 * torch.randn(x.shape, generator=g) * x.std(0)
    c = 2 * (x_o - x).T @ x / len(x)
    fitted = _toward_original(w, h, c, dampening=1e-6)
    best = torch.linalg.lstsq(x.double(), (x_o @ w.T).double()).solution.T.float()

    def miss(q):
        return float((x_o @ w.T - x @ q.T).square().mean())

    assert miss(fitted) <= 1.01 * miss(best) and miss(fitted) < 0.5 * miss(w)


def test_gptq_toward_the_original_errs_less_against_it_on_a_real_block(
    default_ckpt, tokenizer, wikitext
):
    """The default model's block 3 fed hidden states that blocks 0-2 at RTN w3g64 left:
    rounding each linear toward the original model's outputs (target original) leaves less error
    against them than plain GPTQ, which fits the linear's own outputs on those inputs."""
    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt")))
    ids = calibration_samples(stream, 8, 256, seed=0)
    store = BlockStore(default_ckpt)
    rope, scheme = store.position_embeddings(ids.shape[1]), QuantScheme(3, 64, True)
    original = compressed = store.embed(ids)
    for i in range(3):
        block = store.block(i)
        original = run_block(block, original, rope)
        with torch.no_grad():
            for name in LLAMA.block_linears:
                lin = block.get_submodule(name)
                lin.weight.copy_(quantize_weight(lin.weight, scheme).dequantize())
        compressed = run_block(block, compressed, rope)
    block, pairs = store.block(3), {}
    observe_pairs(
        block, compressed, original, rope, ["self_attn.o_proj", "mlp.down_proj"],
        lambda n, x, x_o: pairs.setdefault(n, []).append((x, x_o)),
    )  # fmt: skip
    for name, chunks in pairs.items():
        x = torch.cat([a.reshape(-1, a.shape[-1]) for a, _ in chunks])
        x_o = torch.cat([b.reshape(-1, b.shape[-1]) for _, b in chunks])
        w = block.get_submodule(name).weight.detach()
        h, c = 2 * x.T @ x / len(x), 2 * (x_o - x).T @ x / len(x)
        plain = gptq_quantize(w, h, scheme, torch.float32, act_order=True).dequantize()
        target = _toward_original(w, h, c, 0.3)
        asym = gptq_quantize(target, h, scheme, torch.float32, act_order=True).dequantize()
        err_plain = (x_o @ w.T - x @ plain.T).square().mean()
        err_asym = (x_o @ w.T - x @ asym.T).square().mean()
        assert err_asym < 0.95 * err_plain, (name, float(err_asym), float(err_plain))


def test_pairs_stop_once_every_input_is_seen(default_ckpt):
    """A pass whose output nobody wants stops after the last observed input (the q/k/v
    input costs the norm, not the block), with the same pairs as a pass run to the end."""
    store = BlockStore(default_ckpt)
    block, rope = store.block(2), store.position_embeddings(16)
    gen = torch.Generator().manual_seed(0)
    hidden, other = (torch.randn(3, 16, 576, generator=gen) for _ in range(2))
    down = []
    block.mlp.down_proj.register_forward_pre_hook(lambda _m, a: down.append(1))
    for names in (["self_attn.q_proj"], ["self_attn.o_proj", "mlp.gate_proj"]):
        stopped, whole = {}, {}
        observe_pairs(
            block,
            hidden,
            other,
            rope,
            names,
            lambda n, x, y, into=stopped: into.setdefault(n, (x, y)),
        )
        assert not down  # neither stream reached the MLP's last linear
        outputs = torch.empty_like(hidden)
        observe_pairs(
            block, hidden, other, rope, names,
            lambda n, x, y, into=whole: into.setdefault(n, (x, y)),
            outputs, torch.empty_like(other),
        )  # fmt: skip
        assert len(down) == 2 and torch.equal(outputs, run_block(block, hidden, rope))
        down.clear()
        for n in names:
            assert torch.equal(stopped[n][0], whole[n][0]) and torch.equal(
                stopped[n][1], whole[n][1]
            )


def test_the_other_side_kept_is_not_run_again(default_ckpt):
    """Inputs kept from the other side serve a later call, which then runs no pass over
    `other`, with the same pairs as computing them again."""
    store = BlockStore(default_ckpt)
    block, rope = store.block(2), store.position_embeddings(16)
    gen = torch.Generator().manual_seed(1)
    hidden, other = (torch.randn(12, 16, 576, generator=gen) for _ in range(2))  # 2 chunks
    entered = []

    @contextlib.contextmanager
    def around():
        entered.append(1)
        yield

    def collect(into):
        return lambda n, x, y: into.setdefault(n, []).append((x, y))

    kept = {"mlp.down_proj": []}
    observe_pairs(
        block, hidden, other, rope, ["self_attn.q_proj"], collect({}), None, None, around, kept
    )
    assert len(entered) == 2 and len(kept["mlp.down_proj"]) == 2
    served, again = {}, {}
    observe_pairs(
        block, hidden, other, rope, ["mlp.down_proj"], collect(served), None, None, around, kept
    )
    assert len(entered) == 2  # no pass over `other` this time
    observe_pairs(block, hidden, other, rope, ["mlp.down_proj"], collect(again))
    for (x, y), (x2, y2) in zip(served["mlp.down_proj"], again["mlp.down_proj"], strict=True):
        assert torch.equal(x, x2) and torch.equal(y, y2)


def test_gptq_toward_the_original_runs_through_the_pipeline(
    tmp_path, wikitext, tokenizer, monkeypatch
):
    """The setting reaches the stage, which then walks the original model beside the
    compressed one, its calibration pass computing the original's stream (no pass of its
    own in the manifest's timing), and records it; routed experts are refused before any
    work, and `auto` picks the one that runs."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    calib = {"source": str(wikitext / "valid.txt"), "samples": 12, "length": 64}  # 2 chunks
    stage = {"gptq": {"bits": 3, "group_size": 32, "zero_point": True, "target": "original"}}
    recipe = parse_recipe({"stages": [stage], "calib": calib})
    out = compress(str(folder), recipe, tmp_path / "asym", log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["stages"][0]["target"] == "original"
    assert "original outputs" not in manifest["timing_s"]
    # the original side kept from the first pass, measured again, or kept for the deepest
    # input alone (down_proj's: 12 × 64 tokens × 4 bytes × its width): the same artifact
    kept = load_file(str(out / "model.safetensors"))
    width = json.loads((folder / "config.json").read_text())["intermediate_size"]
    keepable, chosen = gptq._keepable, set()

    def spy(*args):
        keys = keepable(*args)
        chosen.update(keys)
        return keys

    monkeypatch.setattr(gptq, "_keepable", spy)
    for name, limit in (("again", 0), ("deepest", 12 * 64 * 4 * width)):
        monkeypatch.setattr(gptq, "KEEP_BYTES", limit)
        chosen.clear()
        again = compress(str(folder), recipe, tmp_path / name, log=lambda _: None)
        assert chosen == ({"mlp.down_proj"} if limit else set())
        measured = load_file(str(again / "model.safetensors"))
        assert kept.keys() == measured.keys()
        assert all(torch.equal(kept[k], measured[k]) for k in kept)
    monkeypatch.setattr(gptq, "KEEP_BYTES", 12 * 64 * 4 * width)
    assert gptq._keep_deepest([1, 1, width * 12 * 64 * 4]) == [False, False, True]
    assert gptq._keep_deepest([1, 1, width * 12 * 64 * 4 + 1]) == [True, True, False]
    moe = write_family(tmp_path / "moe", "mixtral", tokenizer_from=folder)
    from compress.errors import LlmpressError

    with pytest.raises(LlmpressError, match="routed experts"):
        compress(str(moe), recipe, tmp_path / "moe-out", log=lambda _: None)
    assert not (tmp_path / "moe-out").exists()
    # auto: original where every linear sees every token, reference for routed experts
    stage["gptq"]["target"] = "auto"
    auto = parse_recipe({"stages": [stage], "calib": calib})
    dense = compress(str(folder), auto, tmp_path / "auto", log=lambda _: None)
    assert json.loads((dense / "manifest.json").read_text())["stages"][0]["target"] == "original"
    tensors = load_file(str(dense / "model.safetensors"))
    assert all(torch.equal(tensors[k], kept[k]) for k in kept)
    routed = compress(str(moe), auto, tmp_path / "auto-moe", log=lambda _: None)
    manifest = json.loads((routed / "manifest.json").read_text())
    assert manifest["stages"][0]["target"] == "reference"


def test_bad_gptq_settings_fail_in_one_line():
    from compress.errors import LlmpressError

    with pytest.raises(LlmpressError, match=r"gptq: dampening must be in \(0, 1\)"):
        parse_recipe({"stages": [{"gptq": {"dampening": 2}}]})
    with pytest.raises(LlmpressError, match="gptq: target must be reference, original or auto"):
        parse_recipe({"stages": [{"gptq": {"target": "orig"}}]})
    with pytest.raises(LlmpressError, match="act_ordr"):
        parse_recipe({"stages": [{"gptq": {"act_ordr": True}}]})


@pytest.mark.parametrize(("act_order", "n"), [(True, 2500), (False, 2500), (True, 3200)])
def test_the_in_place_factor_equals_the_textbook_one(act_order, n):
    """H⁻¹'s upper Cholesky factor computed in H's own memory (permuted, factored,
    inverted by blocks and reversed in place) equals the one of two full matrices, across
    a block boundary (2,500 columns; 3,200: several sub-blocks of the products below it)
    and with an input never seen."""
    from compress.quantizers.gptq import _inverse_factor

    gen = torch.Generator().manual_seed(0)
    a = torch.randn(n, n + 64, generator=gen)
    h = a @ a.T / n
    h[7, :] = h[:, 7] = 0  # a dead input
    want = h.clone()
    want[7, 7] = 1
    perm = torch.argsort(torch.diagonal(want), descending=True) if act_order else None
    if perm is not None:
        want = want[perm][:, perm]
    torch.diagonal(want).add_(0.01 * torch.diagonal(want).mean())
    want = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(want)), upper=True)
    got, got_perm = _inverse_factor([h], 0.01, act_order, own=True)
    assert (got_perm is None) == (perm is None)
    assert perm is None or torch.equal(got_perm, perm)
    assert torch.equal(got, got.triu())
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4 * want.abs().max().item())


def test_the_hessians_upper_triangle_mirrors_into_the_whole():
    """Summed by slabs of the upper triangle (half the float64 memory), H comes out whole
    and symmetric: 2·xᵀx / n, across slab boundaries."""
    from compress.quantizers.gptq import _accumulate, _mean_fp32, _slabs

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 150, 4500, generator=gen)
    slabs = _slabs(4500, "cpu")
    for chunk in x:
        _accumulate(slabs, chunk)
    got = _mean_fp32(slabs, 300)
    flat = x.reshape(300, 4500).double()
    torch.testing.assert_close(got.double(), 2 * flat.T @ flat / 300, rtol=1e-5, atol=1e-5)
    assert torch.equal(got, got.T) and not slabs


@pytest.mark.parametrize(
    "bits, group, zero_point, act_order, search, dtype",
    [
        (4, 64, False, True, True, torch.float32),  # the fast preset's settings
        (4, 64, True, False, True, torch.bfloat16),
        (3, 32, True, True, False, torch.float16),
        (8, None, False, False, False, torch.float32),  # per channel: one group per row
        (4, 128, False, False, False, torch.bfloat16),
    ],
)
def test_the_c_column_loop_rounds_as_the_torch_loop(
    monkeypatch, bits, group, zero_point, act_order, search, dtype
):
    """GPTQ's column loop runs in C on the CPU (kernels/gptq.c) and in torch elsewhere:
    the same integers, scales and zero points, bit for bit."""
    from compress.kernels import gptq_loop

    assert gptq_loop.ready()
    w, _, h = _layer(seed=3, rows=150, cols=384)
    w[5, 17] = 1.5  # an outlier group
    scheme = QuantScheme(bits, group, zero_point)
    args = (scheme, dtype, act_order)
    fast = gptq_quantize(w, h, *args, scale_search=search)
    monkeypatch.setattr(gptq_loop, "ready", lambda: False)
    slow = gptq_quantize(w, h, *args, scale_search=search)
    assert torch.equal(fast.q, slow.q) and torch.equal(fast.scale, slow.scale)
    assert (fast.zero_point is None) == (not zero_point)
    if zero_point:
        assert torch.equal(fast.zero_point, slow.zero_point)
    # and it did round: GPTQ's integers differ from rounding each weight to nearest
    assert not torch.equal(fast.q, quantize_weight(w, scheme, dtype).q)


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("per_column", [False, True])
def test_the_c_column_loop_leaves_the_torch_loops_floats(monkeypatch, zero_point, per_column):
    """One block's column range, C against torch: the updated weights and the scaled errors
    to the last bit, not only the integers (which a one-ulp slip rarely flips)."""
    from compress.kernels import gptq_loop
    from compress.quantizers.gptq import _inverse_factor, _round_columns

    w, _, h = _layer(seed=4, rows=70, cols=128)
    hinv, _ = _inverse_factor([h], 0.01, False, False)
    scheme = QuantScheme(4, 32, zero_point)
    g = torch.Generator().manual_seed(5)
    wide = (70, 128) if per_column else (70, 1)
    s = (torch.rand(wide, generator=g) * 0.02 + 0.005).expand(70, 128)
    z = torch.randint(3, 12, wide, generator=g).float().expand(70, 128) if zero_point else None
    out = {}
    for name in ("c", "torch"):
        if name == "torch":
            monkeypatch.setattr(gptq_loop, "ready", lambda: False)
        wb, q = w.clone(), torch.zeros(70, 128, dtype=torch.int8)
        err = torch.zeros(70, 128)
        _round_columns(wb, 32, 96, hinv, s, z, scheme, q, err)  # a middle range
        out[name] = (wb, q, err)
    for a, b in zip(out["c"], out["torch"], strict=True):
        assert torch.equal(a, b)
    assert torch.equal(out["c"][0][:, :33], w[:, :33])  # only later columns are updated
    assert (out["c"][1][:, 32:96] != 0).any() and (out["c"][1][:, 96:] == 0).all()


def test_a_block_is_measured_once_however_many_linears_share_an_input(
    tmp_path, wikitext, tokenizer, monkeypatch
):
    """q/k/v and gate/up share one H and one factor of it: each block's inputs are measured
    in one pass, never again for the later linears that read the same input."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    passes = []
    real = gptq.GPTQ._measure
    monkeypatch.setattr(
        gptq.GPTQ,
        "_measure",
        lambda self, ctx, observed, keep=(): (
            passes.append(ctx.index) or real(self, ctx, observed, keep)
        ),
    )
    recipe = parse_recipe(
        {
            "stages": [{"gptq": {"bits": 4, "group_size": 32}}],
            "calib": {"source": str(wikitext / "valid.txt"), "samples": 2, "length": 32},
        }
    )
    compress(str(folder), recipe, tmp_path / "gptq", log=lambda _: None)
    layers = json.loads((folder / "config.json").read_text())["num_hidden_layers"]
    assert passes == list(range(layers))


def test_experts_calibrated_on_every_token_share_one_hessian(tmp_path, wikitext, monkeypatch):
    """Experts routed fewer tokens than their width are calibrated on every token
    (model/moe.py): their gate/up and the shared expert's read the same input, so gptq
    measures one H for them all, not one each, and writes the artifact that measuring
    each separately writes, bit for bit."""
    model = write_family(tmp_path / "moe", "qwen2_moe", resolve("default").path)
    recipe = parse_recipe(
        {
            "stages": [{"gptq": {}}],
            # 96 tokens: each of the 4 experts (2 a token) is routed fewer than its 128 inputs
            "calib": {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 24},
        }
    )
    keys, own = [], gptq._shared_inputs
    monkeypatch.setattr(gptq, "_shared_inputs", lambda ctx: keys.append(own(ctx)) or keys[-1])
    shared = compress(str(model), recipe, tmp_path / "shared", log=lambda _: None)
    manifest = json.loads((shared / "manifest.json").read_text())
    assert manifest["experts"]["blocks"]["0"]["calibrated_on_all_tokens"] == [0, 1, 2, 3]
    mlp_input = {keys[0][r] for r in keys[0] if r.endswith(("gate_proj", "up_proj"))}
    assert len(mlp_input) == 1, mlp_input  # 5 experts' gate/up (4 and the shared one)
    monkeypatch.setattr(gptq, "_every_token_inputs", lambda block: [])
    keys.clear()
    each = compress(str(model), recipe, tmp_path / "each", log=lambda _: None)
    assert len({keys[0][r] for r in keys[0] if r.endswith(("gate_proj", "up_proj"))}) == 5
    a, b = (load_file(next(f.glob("*.safetensors"))) for f in (shared, each))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("tokens, folded", [(40, False), (600, True)])
def test_a_hessian_keeps_few_inputs_until_it_is_taken(tokens, folded):
    """An input seen on fewer tokens than its triangle's bytes is kept as the inputs and
    summed when taken (a routed expert's): the same H, bit for bit, as summing each chunk
    as it comes."""
    gen = torch.Generator().manual_seed(0)
    chunks = list(torch.randn(tokens, 300, generator=gen).split(tokens // 4))
    gram = gptq._Gram(300, "cpu")
    for x in chunks:
        gram.add(x)
    assert (gram.slabs is not None) == folded and bool(gram.chunks) != folded
    slabs = gptq._slabs(300, "cpu")
    for x in chunks:
        gptq._accumulate(slabs, x)
    assert torch.equal(gram.mean(), gptq._mean_fp32(slabs, tokens))
