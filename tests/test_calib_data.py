import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from compress.calib_data import calibration_samples, eval_windows, read_texts, token_stream
from compress.calib_data.generated import generate_samples, self_generated
from compress.errors import LlmpressError


def test_file_formats_agree(tmp_path, wikitext):
    lines = [t for t in (wikitext / "valid.txt").read_text().split("\n \n") if t.strip()][:20]
    (tmp_path / "a.jsonl").write_text(
        "\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(lines))
    )
    pq.write_table(pa.table({"body": lines}), tmp_path / "a.parquet")
    assert read_texts(str(tmp_path / "a.jsonl")) == lines
    assert read_texts(str(tmp_path / "a.parquet"), text_field="body") == lines
    whole = read_texts(str(wikitext / "valid.txt"))
    assert len(whole) == 1 and whole[0].startswith(" \n = Homarus gammarus = \n")


def test_bad_sources(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"content": "x"}\n')
    with pytest.raises(LlmpressError, match=r"no text field 'text'.*--text-field"):
        read_texts(str(tmp_path / "a.jsonl"))
    with pytest.raises(LlmpressError, match="no such text file"):
        read_texts(str(tmp_path / "missing.txt"))
    (tmp_path / "a.csv").write_text("x")
    with pytest.raises(LlmpressError, match="unknown text format"):
        read_texts(str(tmp_path / "a.csv"))


def test_dataset_by_name_offline_fails_at_once(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(LlmpressError, match="cannot be fetched offline"):
        read_texts("Salesforce/wikitext:wikitext-2-raw-v1:validation")


def test_samples_are_seeded_and_fixed_length(tokenizer, wikitext):
    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt")))
    a = calibration_samples(stream, 16, 128, seed=0)
    assert a.shape == (16, 128)
    assert torch.equal(a, calibration_samples(stream, 16, 128, seed=0))
    assert not torch.equal(a, calibration_samples(stream, 16, 128, seed=1))
    windows = eval_windows(stream, 512, limit=3)
    assert windows.shape == (3, 512) and torch.equal(windows.flatten(), stream[:1536])
    with pytest.raises(LlmpressError, match="fewer than one window"):
        eval_windows(stream[:100], 512)
    with pytest.raises(LlmpressError, match="lower the sample length"):
        calibration_samples(stream[:100], 4, 512, seed=0)


def test_self_generated_text_is_seeded_and_plausible(base_model, tokenizer, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path))
    a = generate_samples(base_model, tokenizer, 3, 24, seed=7)
    b = self_generated(lambda: base_model, tokenizer, 3, 24, seed=7, cache_key="k" * 16)
    assert a.shape == (3, 24) and torch.equal(a, b)
    assert list(tmp_path.glob("calib/self-*.pt"))  # cached for the next run
    c = self_generated(lambda: None, tokenizer, 3, 24, seed=7, cache_key="k" * 16)
    assert torch.equal(a, c)  # served from the cache without loading the model
    # the model's own samples are far more likely under it than random tokens are
    with torch.no_grad():
        nll = base_model(input_ids=a, labels=a).loss
        rand = torch.randint(0, 49152, a.shape)
        nll_rand = base_model(input_ids=rand, labels=rand).loss
    assert nll < nll_rand - 3


def test_the_runtime_writes_self_generated_text(
    default_ckpt, base_model, tokenizer, tmp_path, monkeypatch
):
    """compress has the runtime write `self` text (it decodes many samples together):
    each sample from its own seeded generator, so the same ids in any batch and on any
    number of threads (every sum in one thread, in one order), and far more likely under
    the original (transformers' forward) than random tokens. (Mean NLL against
    transformers' own samples, 64 × 64 tokens each: 3.633 vs 3.608.)"""
    from compress.kernels.cpu import set_threads
    from compress.runtime.calib_text import runtime_samples, runtime_writer
    from compress.runtime.weights import load_weights

    weights = load_weights(default_ckpt)
    a = runtime_samples(weights, tokenizer, 5, 40, seed=3)
    assert a.shape == (5, 40) and bool((a[:, 0] == tokenizer.bos_token_id).all())
    assert torch.equal(runtime_samples(weights, tokenizer, 2, 40, seed=3), a[:2])
    saved = torch.get_num_threads()
    for n in {1, 3} - {saved}:
        set_threads(n)
        try:
            assert torch.equal(runtime_samples(weights, tokenizer, 5, 40, seed=3), a), n
        finally:
            set_threads(saved)
    assert not torch.equal(runtime_samples(weights, tokenizer, 2, 40, seed=4), a[:2])
    with torch.no_grad():
        nll = base_model(input_ids=a, labels=a).loss
        rand = torch.randint(0, 49152, a.shape)
        nll_rand = base_model(input_ids=rand, labels=rand).loss
    assert nll < nll_rand - 3
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path))
    said = []
    write = runtime_writer(default_ckpt, tokenizer, said.append)
    c = self_generated(lambda: None, tokenizer, 5, 40, 3, "r" * 16, write)
    assert torch.equal(c, a) and not said


def test_a_model_the_runtime_refuses_writes_its_text_with_transformers(
    default_ckpt, base_model, tokenizer, tmp_path, monkeypatch
):
    import compress.runtime.calib_text as calib_text

    def refuse(ckpt):
        raise LlmpressError("the runtime cannot run this")

    monkeypatch.setattr(calib_text, "load_weights", refuse)
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path))
    said = []
    write = calib_text.runtime_writer(default_ckpt, tokenizer, said.append)
    c = self_generated(lambda: base_model, tokenizer, 2, 16, 1, "t" * 16, write)
    assert torch.equal(c, generate_samples(base_model, tokenizer, 2, 16, seed=1))
    assert said == [
        "generating calibration text with transformers (slower): the runtime cannot run this"
    ]


def test_a_files_tokens_are_kept_exactly_and_rekeyed_by_its_bytes_and_tokenizer(
    tokenizer, wikitext, fresh_cache, tmp_path, monkeypatch
):
    """The second read of a file comes from the cache (no tokenizing), equal to
    tokenizing it; changed bytes, another field or another tokenizer tokenize again; a
    damaged entry is tokenized again, never trusted."""
    import tokenizers

    from compress.calib_data import token_cache

    text = tmp_path / "t.txt"
    text.write_text(wikitext.joinpath("valid.txt").read_text()[:20000])
    want = token_stream(tokenizer, read_texts(str(text)))
    calls = []
    real = token_cache.token_stream
    monkeypatch.setattr(token_cache, "token_stream", lambda *a: calls.append(1) or real(*a))

    def read(tok=tokenizer):
        token_cache._memo.clear()  # as a new process would
        return token_cache.source_stream(tok, str(text))

    assert torch.equal(read(), want) and calls == [1]
    got = read()
    got[0] = -1  # what a caller holds is its own
    assert torch.equal(read(), want) and calls == [1]
    (entry,) = (fresh_cache / "tokens").glob("*.pt")
    entry.write_bytes(b"damaged")
    assert torch.equal(read(), want) and calls == [1, 1]
    text.write_text(text.read_text() + " more words")
    assert read().numel() > want.numel() and calls == [1, 1, 1]
    other = type(tokenizer).from_pretrained(tokenizer.name_or_path)
    other.backend_tokenizer.normalizer = tokenizers.normalizers.Lowercase()
    lowered = read(other)
    assert calls == [1, 1, 1, 1] and not torch.equal(lowered[: want.numel()], want)
