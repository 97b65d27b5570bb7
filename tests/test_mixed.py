"""Mixed precision to a bits budget: the allocation, the Fisher estimate, the artifact."""

from __future__ import annotations

import itertools
import json

import pytest
import torch

from compress.artifact.dense import load_model
from compress.draw import draw
from compress.errors import LlmpressError
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.quantizers.mixed import allocate, fisher_diagonal, parse_scheme, stored_bits
from compress.quantizers.scheme import QuantScheme
from compress.recipe import parse_quant, parse_recipe, recipe_from_flags
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights
from tests.conftest import write_tiny_llama


def test_allocation_is_the_best_choice_within_budget():
    """Against every combination of a small random problem: never over budget, and as
    good as the best one found by brute force on most draws (the price search is exact
    on the convex hull; the greedy fill closes most of the rest)."""
    gen = torch.Generator().manual_seed(0)
    exact = 0
    for _ in range(40):
        costs = {}
        for n in range(4):
            bits = sorted(torch.randint(10, 100, (3,), generator=gen).tolist())
            errs = sorted(torch.rand(3, generator=gen).tolist(), reverse=True)
            costs[f"l{n}"] = {f"o{k}": (errs[k], bits[k]) for k in range(3)}
        budget = float(sum(o["o1"][1] for o in costs.values()))
        choice = allocate(costs, budget)
        assert sum(costs[n][k][1] for n, k in choice.items()) <= budget
        got = sum(costs[n][k][0] for n, k in choice.items())
        best = min(
            sum(costs[n][k][0] for n, k in zip(costs, combo, strict=True))
            for combo in itertools.product(["o0", "o1", "o2"], repeat=4)
            if sum(costs[n][k][1] for n, k in zip(costs, combo, strict=True)) <= budget
        )
        assert got >= best - 1e-12
        exact += got <= best + 1e-12
    assert exact >= 30, exact
    assert allocate({"a": {"x": (1.0, 10)}}, 5) == {}  # nothing fits


def test_options_apply_only_where_their_group_divides():
    """SmolLM2's 576-wide inputs would take w4g128 as groups of 96, which vLLM has no
    kernel for: the option is not offered there, but is on 1536-wide down_proj."""
    g128 = parse_scheme("w4g128", QuantScheme(zero_point=False))
    assert stored_bits(g128, (576, 576), 32, exact=True) is None
    assert stored_bits(g128, (576, 576), 32) == 576 * 576 * 4 + 576 * 6 * 32
    assert stored_bits(g128, (576, 1536), 32, exact=True) == 576 * 1536 * 4 + 576 * 12 * 32
    assert (
        stored_bits(parse_scheme("w8", g128), (64, 576), 16, exact=True) == 64 * 576 * 8 + 64 * 16
    )


def test_fisher_labels_follow_the_models_distribution(monkeypatch):
    """The Fisher pass's labels: per row, each token's frequency over 100,000 rows within 4
    standard errors of its softmax probability, a token whose probability underflows to 0
    never drawn, and a seed repeating its labels, also when the rows' running totals are
    summed a few rows at a time (as a long sample over a large vocabulary is)."""
    logits = torch.tensor([[0.0, -200.0, 1.0, -1.0, 0.5]]).repeat(100_000, 1)
    p = logits[0].softmax(-1).double()
    labels = draw(logits.softmax(-1), torch.Generator().manual_seed(0))
    freq = torch.bincount(labels, minlength=5).double() / len(labels)
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / len(labels)).sqrt() + 1e-12).all(), freq
    assert freq[1] == 0
    again = draw(logits[:50].softmax(-1), torch.Generator().manual_seed(0))
    assert torch.equal(again, labels[:50])
    monkeypatch.setattr("compress.draw.TOTALS_AT_ONCE", 5 * 3)  # 3 rows at a time
    assert torch.equal(draw(logits[:50].softmax(-1), torch.Generator().manual_seed(0)), again)


def test_fisher_predicts_the_kl_of_a_small_change(tmp_path):
    """½ Σ F δ² is the second-order KL of perturbing a weight by δ: on a small random
    llama it matches the KL measured over the same text within 25%."""
    folder = write_tiny_llama(tmp_path / "tiny")
    model = load_model(resolve(str(folder))).float().eval()
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (256, 32), generator=gen)
    name = "model.layers.0.mlp.down_proj"
    fisher = fisher_diagonal(model, ids, [name], seed=0)[name]
    weight = model.get_submodule(name).weight
    delta = 0.3 * weight.detach().std() * torch.randn(weight.shape, generator=gen)
    with torch.no_grad():
        before = model(ids).logits.log_softmax(-1)
        weight.add_(delta)
        after = model(ids).logits.log_softmax(-1)
    measured = float((before.exp() * (before - after)).sum(-1).mean())
    predicted = 0.5 * float((fisher * delta.square()).sum())
    assert 0.75 < predicted / measured < 1.25, (predicted, measured)


def test_mixed_artifact_meets_its_budget(tmp_path, wikitext, tokenizer):
    """`--bits` over RTN w4 g64 on a small llama: the artifact's bits per weight (scales
    counted) equal the plan and stay within budget, the chosen layers carry their own
    schemes as extra config groups, and the dense loader and the runtime read it alike."""
    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    tokenizer.save_pretrained(str(folder))
    calib = {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 64}
    recipe = recipe_from_flags(None, "rtn:w4g64", {**calib}, {}, (), 5.2)
    assert [n for n, _ in recipe.stages] == ["mixed", "rtn"]
    out = compress(str(folder), recipe, tmp_path / "mixed", log=lambda _: None)
    manifest = json.loads((out / "manifest.json").read_text())
    plan = manifest["stages"][0]
    stored = manifest["weights"]["bits_per_quantized_weight"]
    assert plan["stage"] == "mixed" and stored == pytest.approx(plan["bits_per_weight"], abs=1e-3)
    assert 4.5 < stored <= 5.2 and plan["layers"], plan
    assert plan["estimated_kl"]["mixed"] < plan["estimated_kl"]["w4g64sym"]
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert len(groups) > 1
    schemes = {
        (g["weights"]["num_bits"], g["weights"].get("group_size")): g["targets"]
        for g in groups.values()
    }
    assert len(schemes) > 1 and not (tmp_path / ".mixed.llmpress-work").exists()
    chosen = plan["layers"]  # the linears that left the base scheme, and what they took
    for i in range(2):  # vLLM loads q/k/v and gate/up as one fused tensor each: one scheme
        block = f"model.layers.{i}"
        for fused in (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj")):
            kind = "self_attn" if "q_proj" in fused else "mlp"
            assert len({chosen.get(f"{block}.{kind}.{rel}") for rel in fused}) == 1, chosen
    assert manifest["engines"]["vllm"] == [], manifest["engines"]
    ids = torch.randint(0, 100, (1, 80))
    dense = load_model(resolve(str(out)))(ids).logits
    served = RuntimeLM(load_weights(resolve(str(out))), 80)(ids).logits
    torch.testing.assert_close(served, dense, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "stages, message",
    [
        ([{"mixed": {}}], "follow it with awq, gptq or rtn"),
        ([{"mixed": {}}, "int8"], "(not int8)"),
        ([{"awq": {}}, {"mixed": {}}], "must come before the quantizing stages"),
        ([{"mixed": {"options": ["x4"]}}, "awq"], "'x4' is not a scheme"),
        ([{"mixed": {"bits_budget": 0}}, "awq"], "bits_budget must be > 0"),
        ([{"mixed": {"bits_budget": 4}}, "awq"], "leaves nothing for scales"),
        ([{"mixed": {}}, {"prune": {"mlp": 0.25}}, "awq"], "put prune before it"),
    ],
)
def test_mixed_recipe_errors(stages, message):
    with pytest.raises(LlmpressError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_recipe({"stages": stages})


def test_default_options_follow_the_scheme():
    """A recipe naming no options gets them from its quantizers' scheme: a 4- or 3-bit one
    only 4- and 8-bit schemes besides its own (a 4-bit artifact stays in the layouts vLLM
    runs), a 2-bit one also 3 bits in its groups; options named stay as named, and the
    best preset gets the same."""

    def options(spec: str, **mixed) -> tuple[str, ...]:
        stages = [{"mixed": {"bits_budget": 5, **mixed}}, parse_quant(spec)]
        return parse_recipe({"stages": stages}).stages[0][1].options

    assert options("rtn:w4g64") == options("gptq:w3g64zp") == ("w4g128", "w4g32", "w8")
    assert options("gptq:w2g64zp") == ("w3g64zp", "w4g128", "w4g32", "w8")
    assert options("rtn:w2g128") == ("w3g128sym", "w4g128", "w4g32", "w8")
    assert options("rtn:w2g64", options=["w4g64"]) == ("w4g64",)
    best = recipe_from_flags(None, "best:w2g64zp", {}, {})
    assert best.stages[0][1].options == ("w3g64zp", "w4g128", "w4g32", "w8")


def test_bits_flag_sets_or_adds_the_budget():
    recipe = recipe_from_flags(None, "best:w4g64", {}, {}, (), 4.6)
    assert [n for n, _ in recipe.stages] == ["mixed", "gptq", "distill"]
    assert recipe.stages[0][1].bits_budget == 4.6 and recipe.stages[0][1].base == "w4g64sym"
    with pytest.raises(LlmpressError, match="export holds one scheme"):
        recipe_from_flags(None, "awq:w4g64zp", {}, {"export": "awq-gemm"}, (), 4.6)
