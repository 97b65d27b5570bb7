"""The original's figures for eval: computed block by block, and cached."""

import torch

from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.reference import BlockwiseOriginal
from compress.eval.run import evaluate


def _windows(tokenizer, wikitext, n=4, ctx=256):
    return eval_windows(token_stream(tokenizer, read_texts(str(wikitext / "test.txt"))), ctx, n)


def test_the_block_walk_gives_transformers_log_probs(default_ckpt, base_model, tokenizer, wikitext):
    windows = _windows(tokenizer, wikitext, n=2, ctx=64)
    walk = BlockwiseOriginal(default_ckpt, windows, log=lambda _: None)
    for i, w in enumerate(windows):
        with torch.no_grad():
            want = torch.log_softmax(base_model(input_ids=w[None]).logits[0, :-1].float(), -1)
        got = walk.reference(i, w)
        assert got.shape == want.shape
        assert (got - want).abs().max() < 2e-4


def test_a_second_eval_reads_the_original_from_the_cache(fresh_cache, wikitext, artifacts):
    lines = []
    args = dict(base="default", data=str(wikitext / "test.txt"), ctx=64, windows=2,
                record=False, exact=True)  # fmt: skip
    first = evaluate(str(artifacts["rtn:w4g64"]), log=lines.append, **args)
    assert first.reference == "computed" and any("block 30/30" in ln for ln in lines)
    assert len(list((fresh_cache / "eval").glob("*.pt"))) == 1
    lines.clear()
    second = evaluate(str(artifacts["rtn:w4g64"]), log=lines.append, **args)
    assert second.reference == "cached" and not any("block" in ln for ln in lines)
    # the cached hidden states give the same bits: every figure is equal, not close
    assert (second.kl, second.ppl, second.base_ppl, second.top1) == (
        first.kl,
        first.ppl,
        first.base_ppl,
        first.top1,
    )
    # another text is another entry, never a wrong hit
    other = evaluate(str(artifacts["rtn:w4g64"]), log=lines.append, **{**args, "ctx": 48})
    assert other.reference == "computed"
