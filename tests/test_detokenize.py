"""The served text, a piece per token: equal to decoding the whole reply, for a byte-level
BPE (the default model's) and a SentencePiece-style tokenizer, with characters split over
tokens, and at a cost per token that does not grow with the reply."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from compress.calib_data.sources import read_texts
from compress.serve.detokenize import CONTEXT, Detokenizer, window_decoder

MIXED = "Déjà vu: 東京タワー 🤖🚀 naïve café — ½ ∑ x² ≈ 3.14 ✓ \u00a0(fin)\n\nNext line."


def lines(wikitext, n: int) -> str:
    """WikiText-2 test's first n lines (its Chinese poem titles spell out bytes)."""
    return "\n".join(read_texts(str(wikitext / "test.txt"))[0].splitlines()[:n])


def pieces(tokenizer, ids: list[int]) -> list[str]:
    detok = Detokenizer(tokenizer)
    return [detok.push(i) for i in ids]


def check(tokenizer, text: str) -> list[str]:
    ids = tokenizer.encode(text, add_special_tokens=False)
    out = pieces(tokenizer, ids)
    assert "".join(out) == tokenizer.decode(ids, skip_special_tokens=True)
    assert not any("\ufffd" in p for p in out)
    return out


@pytest.fixture(scope="module")
def sentencepiece_style(wikitext):
    """A Llama-2-style tokenizer (Metaspace words, byte fallback) trained here on
    WikiText-2: decoded alone, its word tokens lose their leading space."""
    bpe = models.BPE(unk_token="<unk>", byte_fallback=True)
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens]
    )
    texts = read_texts(str(wikitext / "valid.txt"))[0].splitlines()[:2000]
    tok.train_from_iterator(texts, trainer)
    spec = json.loads(tok.to_str())
    for added in spec["added_tokens"]:  # Llama-2's byte tokens are plain vocabulary
        added["special"] = added["content"] in ("<unk>", "<s>", "</s>")
    tok = Tokenizer.from_str(json.dumps(spec))
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="</s>", unk_token="<unk>")


def test_default_tokenizer_pieces_add_up(tokenizer, wikitext):
    text = lines(wikitext, 40)
    check(tokenizer, text)
    out = check(tokenizer, MIXED)
    ids = tokenizer.encode(MIXED, add_special_tokens=False)
    assert len(out) == len(ids) and "" in out  # some characters span tokens: held back
    # the special tokens a reply may hold (EOS with ignore_eos) have no text
    eos = tokenizer.eos_token_id
    assert "".join(pieces(tokenizer, [*ids[:5], eos, *ids[5:]])) == tokenizer.decode(
        ids, skip_special_tokens=True
    )


def test_sentencepiece_style_keeps_leading_spaces(sentencepiece_style, wikitext):
    tok = sentencepiece_style
    text = lines(wikitext, 80).replace("\n", " ")
    out = check(tok, text)
    check(tok, MIXED)  # characters outside the vocabulary: byte fallback over tokens
    ids = tok.encode(text, add_special_tokens=False)
    alone = "".join(tok.decode([i]) for i in ids)  # what a token-by-token decode would send
    assert alone != "".join(out)  # the context is needed: the test can tell


def test_cost_per_token_is_bounded(tokenizer, wikitext):
    """Every decode call sees at most CONTEXT + a few ids, however long the reply."""
    ids = tokenizer.encode(lines(wikitext, 300))
    assert len(ids) > 2000
    seen = []

    class Counting:
        def decode(self, window, **kwargs):
            seen.append(len(window))
            return tokenizer.decode(window, **kwargs)

    detok = Detokenizer(Counting())
    text = "".join(detok.push(i) for i in ids)
    assert text == tokenizer.decode(ids, skip_special_tokens=True)
    assert max(seen) <= CONTEXT + 8


def test_windows_decode_as_transformers_does(tokenizer, sentencepiece_style, wikitext):
    """The Rust tokenizer decodes the windows directly only where transformers' decode would
    give the same text; a tokenizer that cleans up spaces after decoding keeps its decode."""
    text = lines(wikitext, 60) + MIXED
    for tok in (tokenizer, sentencepiece_style):
        decode = window_decoder(tok)
        assert decode.func == tok.backend_tokenizer.decode
        ids = tok.encode(text, add_special_tokens=False)
        ids[7:7] = [tok.eos_token_id]  # special tokens are skipped as transformers skips them
        for a in range(0, len(ids) - 9, 3):
            window = ids[a : a + 1 + a % 9]
            assert decode(window) == tok.decode(window, skip_special_tokens=True)
    before, tokenizer.clean_up_tokenization_spaces = tokenizer.clean_up_tokenization_spaces, True
    try:
        assert window_decoder(tokenizer).func == tokenizer.decode
    finally:
        tokenizer.clean_up_tokenization_spaces = before
