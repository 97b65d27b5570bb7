"""Drift measurement on real WikiText-2 windows."""

import importlib.util
import math

import pytest
import torch

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import measure_drift
from compress.model.loading import resolve


def test_drift_of_the_original_against_itself_is_zero(base_model, tokenizer, wikitext):
    stream = token_stream(tokenizer, read_texts(str(wikitext / "test.txt")))
    windows = eval_windows(stream, 256, limit=2)
    (d,) = measure_drift(base_model, {"same": base_model}, windows, progress=False).values()
    assert d.tokens == 2 * 255 and d.windows == 2
    assert abs(d.kl) < 1e-6 and d.top1 == 1.0 and d.ppl == d.base_ppl
    # perplexity agrees with transformers' own cross-entropy on the same windows
    with torch.no_grad():
        loss = torch.stack([base_model(input_ids=w[None], labels=w[None]).loss for w in windows])
    assert math.isclose(d.base_ppl, loss.mean().exp().item(), rel_tol=1e-4)
    assert 10 < d.base_ppl < 60


def test_fewer_bits_more_drift(base_model, tokenizer, wikitext, artifacts):
    stream = token_stream(tokenizer, read_texts(str(wikitext / "test.txt")))
    windows = eval_windows(stream, 512, limit=2)
    cands = {k: load_model(resolve(str(artifacts[k]))) for k in ("rtn:w8", "rtn:w4g64")}
    r = measure_drift(base_model, cands, windows, progress=False)
    assert 0 < r["rtn:w8"].kl < 0.05 < r["rtn:w4g64"].kl
    assert r["rtn:w8"].top1 > r["rtn:w4g64"].top1
    assert r["rtn:w4g64"].ppl > r["rtn:w8"].ppl


def test_engine_transformers_without_compressed_tensors_says_what_to_install(
    artifacts, monkeypatch
):
    """compressed-tensors is an extra (llmpress reads the format itself); transformers
    needs it to open a quantized artifact, and its absence is one line naming the fix."""
    from compress.errors import LlmpressError
    from compress.eval.run import load_with_transformers

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "compressed_tensors" else real(name, *a),
    )
    with pytest.raises(LlmpressError, match=r"pip install 'llmpress\[transformers\]'"):
        load_with_transformers(resolve(str(artifacts["rtn:w4g64"])))


@pytest.mark.parametrize(("rows", "vocab"), [(511, 49152), (3, 152064), (40, 7)])
def test_log_probs_in_place_are_the_float64_log_softmax(rows, vocab):
    """In C on the CPU (the normalization divergence_rows gives a candidate's logits), in
    slices of rows through torch otherwise: in place, within float rounding of float64's;
    the original against itself measures a KL of 0."""
    from compress.eval.drift import log_softmax_
    from compress.kernels.cpu import divergence_rows

    g = torch.Generator().manual_seed(rows)
    logits = torch.randn(rows, vocab, generator=g) * 4
    raw = logits.clone()
    want = torch.log_softmax(logits.double(), dim=-1)
    got = log_softmax_(logits)
    assert got is logits
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-6)
    kl, _, top = divergence_rows(got, raw)
    assert kl.abs().max() < 1e-9 and torch.equal(top, raw.argmax(-1))
    wide = torch.randn(rows, 2 * vocab, generator=g) * 4
    view = wide[:, ::2]  # not contiguous: torch's log_softmax, a slice at a time
    want = torch.log_softmax(view.double(), dim=-1)
    assert log_softmax_(view) is view  # (torch's own is up to 1.4e-5 off float64's here)
    torch.testing.assert_close(view.double(), want, rtol=1e-6, atol=5e-5)


def test_self_text_is_written_by_the_runtime_as_compress_writes_it(
    tmp_path, fresh_cache, monkeypatch, tokenizer_dir
):
    """`eval`'s default data, the text the original writes itself, comes from the runtime
    holding the original as stored (what compress's calibration text comes from), not from
    transformers' forward in fp32; a second call reads the cached text."""
    from conftest import write_tiny_llama

    import compress.calib_data.generated as generated
    from compress.calib_data.sources import SELF
    from compress.eval.run import EVAL_SEED, windows_for
    from compress.model.loading import load_tokenizer
    from compress.runtime.calib_text import runtime_samples
    from compress.runtime.weights import load_weights

    folder = write_tiny_llama(tmp_path / "tiny", vocab_size=49152)
    load_tokenizer(resolve(str(tokenizer_dir))).save_pretrained(str(folder))
    ckpt = resolve(str(folder))
    tokenizer = load_tokenizer(ckpt)

    def refuse(*args, **kwargs):
        raise AssertionError("transformers wrote the text")

    monkeypatch.setattr(generated, "generate_samples", refuse)
    wins = windows_for(SELF, ckpt, tokenizer, 24, 3, "text", ckpt.sha256, log=lambda s: None)
    want = runtime_samples(load_weights(ckpt), tokenizer, 3, 24, EVAL_SEED)
    assert torch.equal(wins, want)
    assert generated.cached_samples(ckpt.sha256, 3, 24, EVAL_SEED) is not None
    monkeypatch.setattr("compress.eval.run.runtime_writer", refuse)  # cached: none written
    assert torch.equal(windows_for(SELF, ckpt, tokenizer, 24, 3, "text", ckpt.sha256), want)
