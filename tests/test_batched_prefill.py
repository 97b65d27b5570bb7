"""Prompts that arrive together are prefilled in one pass (Model.prefill_batch): each
gets what its own prefill gives, and the engine's replies do not depend on how prompts
were grouped or how many prompt tokens a step admits."""

import pytest
import torch
from conftest import wikitext_passages

from compress.runtime.engine import Engine, Request
from compress.runtime.kv_cache import KVCache, parse_kv
from compress.runtime.model import Chunk, Model
from compress.runtime.sampling import SamplingParams


@pytest.fixture(scope="module")
def weights(w4_runtime):
    return w4_runtime


@pytest.fixture(scope="module")
def prompts(tokenizer, wikitext):  # five of 60 to 420 characters
    return wikitext_passages(tokenizer, wikitext, [(i * 500, i * 590 + 60) for i in range(5)])


@pytest.mark.parametrize("kv", ["none", "int4"])
def test_a_batch_of_chunks_gives_each_its_own_prefill(weights, prompts, kv):
    """Three chunks in one pass: a whole prompt, one continuing a cached prefix, and one
    scored at every row; logits and the cache they leave match one prefill each."""
    s, scheme = weights.shape, parse_kv(kv)
    model = Model(weights, 512)
    caches = [KVCache(s.layers, 3, s.kv_heads, 511, s.head_dim, scheme) for _ in range(2)]
    a, b, c = (torch.tensor(p) for p in prompts[:3])
    for cache in caches:  # slot 1 already holds the first 10 tokens of b
        model.prefill(b[:10], cache, 1)
    chunks = [Chunk(a, 0), Chunk(b[10:], 1, start=10), Chunk(c, 2, all_logits=True)]
    batched = model.prefill_batch(chunks, caches[0])
    alone = [
        model.prefill(a, caches[1], 0, last_only=True),
        model.prefill(b[10:], caches[1], 1, start=10, last_only=True),
        model.prefill(c, caches[1], 2),
    ]
    for got, want in zip(batched, alone, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)  # summation order
    assert torch.equal(caches[0].lengths, caches[1].lengths)
    for layer in (0, s.layers - 1):
        for slot in range(3):
            n = int(caches[0].lengths[slot])
            got = caches[0].read(layer, torch.tensor([slot]), n)
            want = caches[1].read(layer, torch.tensor([slot]), n)
            for x, y in zip(got, want, strict=True):
                torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


def test_replies_do_not_depend_on_how_prompts_were_admitted(weights, prompts):
    """All five prompts in one step, at most ~100 prompt tokens a step, and one at a
    time: the same greedy replies."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)

    def replies(prefill_tokens):
        engine = Engine(weights, max_batch=5, max_len=512, prefill_tokens=prefill_tokens)
        reqs = [engine.submit(Request(list(p), params)) for p in prompts]
        steps = 0
        while not engine.idle:
            engine.step()
            steps += 1
        return [r.output for r in reqs], steps

    one_pass, steps_all = replies(4096)
    budgeted, steps_budget = replies(100)
    single = Engine(weights, max_batch=1, max_len=512)  # one prompt at a time
    alone = [r.output for r in single.generate(prompts, params)]
    assert one_pass == budgeted == alone
    assert steps_all == 12 and steps_budget > steps_all  # admitted over several steps
