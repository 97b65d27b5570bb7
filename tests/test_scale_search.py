"""Group scales searched against the inputs' importance, and the `fast` preset that
`--quant w4g64` (no method) names."""

import pytest
import torch

from compress.errors import LlmpressError
from compress.quantizers.gptq import gptq_quantize
from compress.quantizers.scale_search import search_qparams
from compress.quantizers.scheme import (
    QuantScheme,
    compute_qparams,
    dequantize,
    quantize_with,
    storage_rounded,
)
from compress.recipe import parse_quant, quant_recipe, recipe_from_flags
from tests.test_gptq import real_block_inputs


def _weighted_error(w, d, scale, zp, scheme):
    q = quantize_with(w, scale, zp, scheme, 64)
    return float((d * (w - dequantize(q, scale, zp, 64)) ** 2).sum())


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_search_beats_min_max_on_the_error_it_weighs(zero_point, dtype):
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 256, generator=g) * torch.rand(64, 1, generator=g)
    w[:, 7] *= 6  # an outlier column min-max spends its range on
    d = torch.rand(256, generator=g) ** 4  # unequal importance, as activations have
    scheme = QuantScheme(4, 64, zero_point)
    s0, z0 = compute_qparams(w, scheme, 64, dtype)
    s1, z1 = search_qparams(w, scheme, 64, dtype, d)
    assert s1.dtype == dtype and s1.shape == s0.shape and (z1 is None) == (not zero_point)
    assert bool((s1.float() > 0).all())
    e0, e1 = _weighted_error(w, d, s0, z0, scheme), _weighted_error(w, d, s1, z1, scheme)
    assert e1 < 0.8 * e0, (e1, e0)


def test_no_importance_is_min_max():
    """Inputs never seen weigh nothing: the search has nothing to choose by."""
    w = torch.randn(8, 128)
    scheme = QuantScheme(4, 64, False)
    s, _ = search_qparams(w, scheme, 64, torch.float32, torch.zeros(128))
    assert torch.equal(s, compute_qparams(w, scheme, 64, torch.float32)[0])


def test_searched_scales_halve_rtn_error_on_a_real_block(default_ckpt, tokenizer, wikitext):
    """What the search minimises, on the default model's block 3: every linear's output
    error on its calibration inputs (measured: 23-54% lower than min-max)."""
    block, inputs = real_block_inputs(default_ckpt, tokenizer, wikitext)
    scheme = QuantScheme(4, 64, False)
    for name, x in inputs.items():
        w = block.get_submodule(name).weight.detach()
        d = (x * x).mean(0)
        errs = []
        for s, _ in (compute_qparams(w, scheme, 64, torch.float32),
                     search_qparams(w, scheme, 64, torch.float32, d)):  # fmt: skip
            wq = dequantize(quantize_with(w, s, None, scheme, 64), s, None, 64)
            errs.append(float((x @ (wq - w).T).square().sum()))
        assert errs[1] < 0.85 * errs[0], (name, errs)


def test_gptq_keeps_an_outlier_group_from_ruining_a_layer(default_ckpt, tokenizer, wikitext):
    """Block 28's down_proj of the default model: with min-max scales GPTQ's output error
    is 25 times what it is with searched ones (one group's extreme weight takes the
    whole range)."""
    block, inputs = real_block_inputs(default_ckpt, tokenizer, wikitext, index=28)
    x = inputs["mlp.down_proj"]
    w = block.get_submodule("mlp.down_proj").weight.detach()
    h = 2 * x.T @ x / len(x)
    errs = []
    for search in (False, True):
        g = gptq_quantize(w, h, QuantScheme(4, 64, False), torch.float32, True, scale_search=search)
        errs.append(float((x @ (g.dequantize() - w).T).square().sum()))
    assert errs[1] < 0.2 * errs[0], errs


def test_a_spec_without_method_is_the_fast_preset():
    data = quant_recipe("w4g64")
    assert data == quant_recipe("fast:w4g64")
    recipe = recipe_from_flags(None, "w4g64", {}, {})
    assert [n for n, _ in recipe.stages] == ["gptq"]
    assert recipe.stages[0][1].scale_search and recipe.stages[0][1].act_order
    assert recipe.calib.samples == 16 and recipe.calib.source == "self"
    flagged = recipe_from_flags(None, "w3g64zp", {"samples": 8, "source": "a.txt"}, {})
    assert flagged.calib.samples == 8 and flagged.calib.source == "a.txt"
    assert flagged.stages[0][1].scheme == QuantScheme(3, 64, True)
    with pytest.raises(LlmpressError, match="METHOD"):
        parse_quant("w4g64")  # a stage needs its method; only --quant fills one in


@pytest.mark.parametrize("zero_point", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_search_keeps_the_first_least_error_candidate(zero_point, dtype):
    """The search computes each candidate in place; its scales are those of the plain
    definition: each grid clip's min-max parameters, the first of least weighted error,
    then (symmetric) twice the least-squares refit, where it errs less."""
    from compress.quantizers.scale_search import GRID

    g = torch.Generator().manual_seed(2)
    w = torch.randn(40, 256, generator=g) * torch.rand(256, generator=g) * 0.05
    w[3, 10] = 2.0
    d = torch.rand(256, generator=g) ** 3
    d[:64] = 0  # a group whose inputs were never seen
    scheme = QuantScheme(3, 64, zero_point)

    def error(scale, zp):
        wq = dequantize(quantize_with(w, scale, zp, scheme, 64), scale, zp, 64)
        return (d * (w - wq) ** 2).reshape(40, -1, 64).sum(-1)

    candidates = [compute_qparams(w, scheme, 64, dtype, clip=c) for c in GRID]
    errors = torch.stack([error(*c) for c in candidates])
    first = errors.argmin(0)  # torch.argmin: the first of equal minima
    pick = torch.gather(torch.stack([c[0] for c in candidates]), 0, first[None])[0]
    best = torch.gather(errors, 0, first[None])[0]
    zps = torch.stack([c[1] for c in candidates]) if zero_point else None
    if not zero_point:  # twice: the least-squares scale of the chosen integers, if better
        for _ in range(2):
            q = quantize_with(w, pick, None, scheme, 64).float().reshape(40, -1, 64)
            wg, dg = w.reshape(40, -1, 64), d.reshape(-1, 64)
            num, den = (dg * wg * q).sum(-1), (dg * q * q).sum(-1)
            refit = torch.where((num > 0) & (den > 0), num / den.clamp(min=1e-30), pick.float())
            refit = storage_rounded(refit, dtype)
            better = error(refit, None) < best
            pick, best = (
                torch.where(better, refit, pick),
                torch.where(better, error(refit, None), best),
            )
    scale, zp = search_qparams(w, scheme, 64, dtype, d)
    # on the CPU the grid's errors are summed in C, in another order than torch's: a
    # near-tie may go to the other candidate, never to a worse one
    got = error(scale, zp)
    assert (got <= best * (1 + 1e-5) + 1e-12).all()
    same = scale == pick
    if zero_point:
        same &= zp == torch.gather(zps, 0, first[None])[0]
    assert same.float().mean() >= 0.95
