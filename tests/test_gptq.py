"""GPTQ: error-compensating rounding, on synthetic layers and on the real default model."""

import json

import pytest
import torch

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import measure_drift
from compress.model.loading import resolve
from compress.pipeline import compress
from compress.quantizers.gptq import gptq_quantize
from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.recipe import parse_recipe


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


def test_gptq_beats_rtn_on_wikitext(tmp_path, wikitext, base_model, tokenizer, artifacts):
    recipe = parse_recipe(
        {
            "stages": [{"gptq": {"bits": 4, "group_size": 64}}],
            "calib": {"source": str(wikitext / "valid.txt"), "samples": 8, "length": 256},
        }
    )
    out = compress("default", recipe, tmp_path / "gptq", log=lambda _: None)
    record = json.loads((out / "manifest.json").read_text())["stages"][0]
    assert record["stage"] == "gptq" and record["layers"] == 210
    stream = token_stream(tokenizer, read_texts(str(wikitext / "test.txt")))
    windows = eval_windows(stream, 512, limit=2)
    cands = {
        "gptq": load_model(resolve(str(out))),
        "rtn": load_model(resolve(str(artifacts["rtn:w4g64"]))),  # the same scheme
    }
    r = measure_drift(base_model, cands, windows, progress=False)
    # measured with these settings: KL 0.42 vs 0.46 over 4 windows (0.41 with 64 × 512
    # calibration samples); perplexity was not better (benchmarks to come, issue 16)
    assert r["gptq"].kl < 0.95 * r["rtn"].kl, (r["gptq"].kl, r["rtn"].kl)
    assert r["gptq"].top1 > r["rtn"].top1
