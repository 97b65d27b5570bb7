"""Structured pruning on the real default model: importance finds what does not matter,
surgery keeps the original slices, and the result is a model transformers loads."""

from __future__ import annotations

import copy

import pytest
import torch
from family_models import build_family

from compress.calib_data import calibration_samples, read_texts, token_stream
from compress.errors import LlmpressError
from compress.model.adapters import adapter_for
from compress.model.loading import build_model
from compress.pruning.importance import activation_importance
from compress.pruning.plan import Shape, split_params, target_shape
from compress.pruning.stage import Prune, PruneConfig, output_kl
from compress.pruning.surgery import Keep, prune_state, pruned_config
from compress.recipe import parse_recipe
from compress.stage import ModelContext


@pytest.fixture(scope="module")
def samples(tokenizer, wikitext):
    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt"))[:400])
    return calibration_samples(stream, 4, 64, 0)


def _prune(model, config, adapter, samples, **targets):
    ctx = ModelContext(
        teacher=model,
        model=model,
        config=dict(config),
        adapter=adapter,
        tokenizer=None,
        samples=samples,
        work_dir=None,
        log=lambda _: None,
    )
    record = Prune(PruneConfig(**targets)).run(ctx)
    return ctx, record


@torch.no_grad()
def _logits(model, ids):
    return model(input_ids=ids, use_cache=False).logits


def test_units_that_contribute_nothing_are_the_ones_removed(base_model, default_ckpt, samples):
    """Silence 1 query head per KV group, 96 neurons per layer and 2 whole layers (their
    output projections zeroed): importance must rank exactly those lowest, and the pruned
    model must compute what the silenced one did."""
    model = copy.deepcopy(base_model)
    a = default_ckpt.adapter
    layers = model.get_submodule(a.blocks)
    dead_heads = [1, 5, 6]  # one per group of 3
    gen = torch.Generator().manual_seed(0)
    dead_neurons = [torch.randperm(1536, generator=gen)[:96] for _ in layers]
    with torch.no_grad():
        for i, layer in enumerate(layers):
            o = layer.get_submodule(a.o).weight
            for h in dead_heads:
                o[:, h * 64 : (h + 1) * 64] = 0
            layer.get_submodule(a.down).weight[:, dead_neurons[i]] = 0
        for i in (12, 20):  # a layer that adds nothing to the residual stream
            layers[i].get_submodule(a.o).weight.zero_()
            layers[i].get_submodule(a.down).weight.zero_()
    # one sample for the layer-removal KL: a silenced layer's is 0 however many are used
    cuts = {"heads": 1 / 3, "mlp": 96 / 1536, "layers": 2, "multiple": 32, "drift_samples": 1}
    ctx, record = _prune(model, default_ckpt.config, a, samples, **cuts)
    assert record["shape_after"] == {
        "hidden": 576,
        "heads": 6,
        "kv_heads": 3,
        "head_dim": 64,
        "intermediate": 1440,
        "layers": 28,
    }
    kept = record["kept"]
    assert 12 not in kept["layers"] and 20 not in kept["layers"]
    assert all(not set(dead_heads) & set(h) for h in kept["heads"])
    scores = record["importance"]
    assert scores["layer_removal_kl"][12] < 1e-6 and scores["layer_block_influence"][12] < 1e-6
    torch.testing.assert_close(
        _logits(ctx.model, samples), _logits(model, samples), atol=1e-3, rtol=0
    )
    # the kept weights are the original slices, not a re-initialization
    new0 = ctx.model.get_submodule(a.blocks)[0]
    q_rows = torch.cat([torch.arange(h * 64, (h + 1) * 64) for h in kept["heads"][0]])
    assert torch.equal(new0.get_submodule(a.q).weight, layers[0].get_submodule(a.q).weight[q_rows])


def test_hidden_channels_are_cut_through_every_block(base_model, default_ckpt, samples):
    ctx, record = _prune(base_model, default_ckpt.config, default_ckpt.adapter, samples, hidden=0.1)
    hidden = record["shape_after"]["hidden"]
    assert hidden % 9 == 0 and hidden < 576  # transformers requires hidden % heads == 0
    kept = torch.tensor(record["kept"]["hidden"])
    embed = ctx.model.get_input_embeddings().weight
    assert embed.shape == (49152, hidden)
    assert torch.equal(embed, base_model.get_input_embeddings().weight[:, kept])
    # the most important channels by the norms' outputs survive: they carry SmolLM2's outliers
    imp = torch.tensor(record["importance"]["hidden"])
    assert set(imp.argsort(descending=True)[:8].tolist()) <= set(kept.tolist())
    drift = output_kl(base_model, ctx.model, samples)
    assert 0 < drift < 5


def test_activation_importance_beats_random_at_the_same_shape(base_model, default_ckpt, samples):
    a, cfg = default_ckpt.adapter, default_ckpt.config
    act, _ = _prune(base_model, cfg, a, samples, mlp=0.25)
    rnd, _ = _prune(base_model, cfg, a, samples, mlp=0.25, importance="random")
    kl_act = output_kl(base_model, act.model, samples)
    kl_rnd = output_kl(base_model, rnd.model, samples)
    assert kl_act < 0.5 * kl_rnd, (kl_act, kl_rnd)


def test_importance_scores_have_the_model_shape(base_model, default_ckpt, samples):
    # 2 × 32 tokens (the layer-removal KL on one): the shapes and signs hold on any input,
    # and what removing layer 0 does is the model's, not the sample's
    few = samples[:2, :32]
    imp = activation_importance(base_model, default_ckpt.adapter, few, drift_samples=1)
    assert imp.heads.shape == (30, 9) and imp.mlp.shape == (30, 1536)
    assert imp.hidden.shape == (576,) and imp.layer_drift.shape == (30,)
    assert (imp.mlp >= 0).all() and (imp.heads > 0).all()
    # removing the first layer of a llama is far worse than removing a middle one
    assert imp.layer_drift[0] > imp.layer_drift[15]


def test_params_target_is_split_and_hit():
    full = Shape(576, 9, 3, 64, 1536, 30)
    goal = int(0.7 * full.non_embedding_params())
    for split in (("mlp",), ("mlp", "hidden"), ("mlp", "heads", "hidden"), ("layers",)):
        _, shape = split_params(full, goal, split)
        assert abs(shape.non_embedding_params() / goal - 1) < 0.08, split
        assert shape.hidden % shape.heads == 0 and shape.intermediate % 32 == 0
    _, depth = split_params(full, goal, ("layers",))
    assert depth.layers == 21 and depth.intermediate == 1536
    kv = target_shape(full, {"heads": 1 / 3}, head_mode="kv_groups")
    assert (kv.heads, kv.kv_heads) == (6, 2)


def test_a_multi_head_models_heads_are_cut_whatever_the_head_mode():
    """Multi-head attention (Llama 2 7B, gpt_neox) has groups of one head: cutting within
    groups would keep every head, so a group is cut whole."""
    full = Shape(1024, 16, 16, 64, 2816, 4)
    for mode in ("within_groups", "kv_groups"):
        cut = target_shape(full, {"heads": 0.5}, head_mode=mode)
        assert (cut.heads, cut.kv_heads) == (8, 8), mode


@pytest.mark.parametrize(
    ("stages", "message"),
    [
        ([{"prune": {}}], "nothing to remove"),
        ([{"prune": {"params": 0.7, "mlp": 0.2}}], "not both"),
        ([{"prune": {"mlp": 1.2}}], "fraction"),
        ([{"prune": {"split": ["depth"], "params": 0.5}}], "unknown axis"),
        ([{"rtn": {}}, {"prune": {"mlp": 0.2}}], "must come before"),
        ([{"prune": {"mlp": 0.2}}, {"distill": {"lr": -1}}], "lr"),
        ([{"distill": {}}], "put a prune stage before it"),
    ],
)
def test_bad_prune_recipes_fail_in_one_line(stages, message):
    with pytest.raises(LlmpressError, match=message):
        parse_recipe({"stages": stages})


def test_removing_every_layer_is_refused(default_ckpt):
    with pytest.raises(LlmpressError, match="cannot remove 30 of 30"):
        Prune(PruneConfig(layers=30)).preflight(default_ckpt.config)


@pytest.mark.parametrize("tied", [True, False])
def test_a_scaled_embedding_keeps_its_values_when_the_hidden_width_shrinks(tied):
    """gemma3 multiplies the embedding by sqrt(hidden): after a hidden cut the kept channels
    still enter the residual stream with their original values, and the head (tied: the
    same matrix, rescaled; untied: its own) gives the original logits of the kept channels
    from the same final hidden state, normalized over those channels."""
    original = build_family("gemma3_text", tie_word_embeddings=tied)
    config = original.config.to_dict()
    adapter = adapter_for(config)
    full = Shape.of(config)
    target = Shape(**{**vars(full), "hidden": full.hidden // 2})
    gen = torch.Generator().manual_seed(0)
    kept = sorted(torch.randperm(full.hidden, generator=gen)[: target.hidden].tolist())
    every = [list(range(n)) for n in (full.heads, full.kv_heads, full.intermediate)]
    keep = Keep(list(range(full.layers)), *([x] * full.layers for x in every), kept)
    state = prune_state(original.state_dict(), adapter, full, keep)
    pruned = build_model(pruned_config(config, target, keep), state, adapter).eval()
    ids = torch.randint(0, config["vocab_size"], (1, 12), generator=gen)
    with torch.no_grad():
        want = original.get_submodule("model.embed_tokens")(ids)[..., kept]
        torch.testing.assert_close(pruned.get_submodule("model.embed_tokens")(ids), want)
        h = torch.randn(5, target.hidden, generator=gen)
        w = original.get_submodule(adapter.final_norm).weight[kept]
        eps = config["rms_norm_eps"]
        normed = h * torch.rsqrt(h.square().mean(-1, keepdim=True) + eps) * (1 + w)
        head = original.get_submodule(adapter.lm_head).weight[:, kept]
        got = pruned.get_submodule(adapter.lm_head)(pruned.get_submodule(adapter.final_norm)(h))
        torch.testing.assert_close(got, normed @ head.T, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("after", "multiple", "mlp"),
    [
        ([{"rtn": {"bits": 4, "group_size": 64}}], 64, 1088),
        ([{"gptq": {"bits": 4, "group_size": 128}}], 128, 1024),
        ([], 32, 1056),
        ([{"rtn": {"bits": 8, "group_size": None}}], 32, 1056),  # per channel: no groups
    ],
    ids=["rtn-g64", "gptq-g128", "alone", "per-channel"],
)
def test_pruned_widths_are_whole_groups_of_the_quantizer_after_it(
    default_ckpt, after, multiple, mlp
):
    """Without `multiple`, the kept widths are multiples of the next quantizing stage's
    group size (and of the kernels' 32): 1536 less 31% is 1056 in steps of 32, which a
    w4g64 quantizer would have had to cut into groups of 32 for down_proj alone."""
    stages = [{"prune": {"mlp": 0.31}}, *after]
    (name, config), *_ = parse_recipe({"stages": stages}).stages
    assert name == "prune" and config.multiple == multiple
    _, shape, _ = Prune(config).plan(default_ckpt.config)
    assert shape.intermediate == mlp
    given = parse_recipe({"stages": [{"prune": {"mlp": 0.31, "multiple": 16}}, *after]})
    assert given.stages[0][1].multiple == 16  # as written


def test_a_params_target_never_leaves_a_grouped_router_too_few_experts():
    """DeepSeek-V3's router scores each of its groups by its best two experts and picks
    top_k within the chosen groups: however low the target, every group keeps the same
    count and enough of them (here 2 of 4 in each of 2 groups, one group chosen)."""
    full = Shape(
        hidden=128, heads=4, kv_heads=4, head_dim=32, intermediate=128, layers=2,
        experts=8, top_k=2, groups=2, groups_chosen=1, group_best=2,
    )  # fmt: skip
    cuts, shape = split_params(full, full.non_embedding_params() // 4, ("experts",))
    assert shape.experts == 4 and cuts["experts"] < 0.7
    with pytest.raises(LlmpressError, match=r"^prune.experts: .* 2 groups of 4 .* at most 0.50"):
        Prune(PruneConfig(experts=0.75, multiple=16)).plan(_grouped_config())


def _grouped_config() -> dict:
    from transformers import DeepseekV3Config

    return DeepseekV3Config(
        hidden_size=128, intermediate_size=128, moe_intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8, n_group=2,
        topk_group=1, num_experts_per_tok=2, first_k_dense_replace=1, kv_lora_rank=32,
        q_lora_rank=64, qk_nope_head_dim=16, qk_rope_head_dim=16, v_head_dim=16,
        vocab_size=49152,
    ).to_dict()  # fmt: skip


@pytest.mark.parametrize(
    "name", ["llama3", "arcee", "jais2", "afmoe", "qwen3_moe", "flint", "glm4", "kolibri1"]
)
def test_the_parameter_count_a_target_is_measured_against_is_the_models(name):
    """Widths.non_embedding_params, what a `params` target is measured against and the
    manifest reports, counts a block's matrices as the model holds them: an MLP without a
    gate as two (arcee's, jais2's), afmoe's attention gate, every expert, the router, a
    shared expert and dense layers; plus the blocks' hidden-wide norms (four with sandwich
    norms: glm4's, kolibri1's, afmoe's) and the final norm."""
    model = build_family(name)
    widths = Shape.of(model.config.to_dict())
    blocks = model.model.layers
    matrices = sum(p.numel() for p in blocks.parameters() if p.dim() >= 2)
    hidden = model.config.hidden_size
    norms = sum(
        p.numel()
        for n, p in blocks.named_parameters()
        if n.endswith("norm.weight") and p.numel() == hidden
    )
    assert norms >= 2 * hidden * len(blocks)
    assert widths.non_embedding_params() == matrices + norms + hidden
