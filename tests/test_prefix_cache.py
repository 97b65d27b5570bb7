"""The prefix cache: requests whose prompts share full blocks of tokens prefill only what
follows them, and reply exactly as if they had prefilled everything, on every KV-cache kind."""

import pytest
import torch
from conftest import wikitext_passages

from compress.runtime.engine import Engine
from compress.runtime.kv_cache import parse_kv
from compress.runtime.prefix_cache import PrefixCache
from compress.runtime.sampling import SamplingParams


def _kv(layers: int, n: int, seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(2, n, 4, generator=g), torch.randn(2, n, 4, generator=g))] * layers


def test_a_block_matches_only_behind_the_same_whole_prefix():
    cache = PrefixCache(1 << 20, block=4)
    a = list(range(10))
    kv = _kv(2, 10, 0)
    cache.insert(a, kv)
    assert len(cache.blocks) == 2  # the full blocks only: tokens 0-3 and 4-7
    n, got = cache.lookup(a + [99], limit=10)
    assert n == 8
    torch.testing.assert_close(got[1][0], kv[1][0][:, :8], rtol=0, atol=0)
    assert cache.lookup(a, limit=7)[0] == 4  # at most `limit` tokens
    changed = [5] + a[1:]  # same second block, different first: nothing matches
    assert cache.lookup(changed, limit=10) == (0, None)
    assert cache.hit_tokens == 12 and cache.prompt_tokens == 11 + 10 + 10


def test_eviction_keeps_the_budget_and_drops_a_chain_tail_first():
    one = 2 * 2 * 2 * 4 * 4 * 4  # bytes of one block: 2 layers x (k, v) x [2, 4, 4] fp32
    cache = PrefixCache(3 * one, block=4)
    a, b = list(range(12)), list(range(100, 112))
    cache.insert(a, _kv(2, 12, 0))
    cache.insert(b, _kv(2, 12, 1))
    assert cache.bytes <= 3 * one and len(cache.blocks) == 3
    assert cache.lookup(b, 12)[0] == 12  # the newest chain whole
    assert cache.lookup(a, 12)[0] == 0  # the oldest went first
    cache.insert(a[:4], _kv(2, 4, 0))  # a's head back: b's tail goes, its head stays
    assert cache.lookup(a, 12)[0] == 4 and cache.lookup(b, 12)[0] == 8


@pytest.fixture(scope="module")
def prompts(tokenizer, wikitext):
    """A shared preamble of 100+ tokens, then three different questions."""
    (preamble,) = wikitext_passages(tokenizer, wikitext, [(2000, 2600)])
    tails = wikitext_passages(tokenizer, wikitext, [(i * 700, i * 700 + 90) for i in range(3)])
    return [preamble + t for t in tails]


@pytest.mark.parametrize("kv", ["none", "int8", "int4"])
def test_shared_prefixes_are_computed_once_and_replies_do_not_change(w4_runtime, prompts, kv):
    params = SamplingParams(max_tokens=10, ignore_eos=True)

    def run(cache_bytes: int, prefill_tokens: int):
        engine = Engine(
            w4_runtime, 2, 512, parse_kv(kv), prefill_tokens=prefill_tokens,
            prefix_cache_bytes=cache_bytes,
        )  # fmt: skip
        replies = []
        for p in prompts:  # one after another: each finds what the ones before left
            (req,) = engine.generate([p], params)
            replies.append(req.output)
        return engine, replies

    _, plain = run(0, 1024)
    engine, cached = run(1 << 28, 1024)
    assert cached == plain
    shared = min(len(p) for p in prompts)
    common = next(i for i in range(shared) if len({p[i] for p in prompts}) > 1)
    reused = common // 32 * 32
    assert reused >= 96
    assert engine.prefix.hit_tokens == 2 * reused  # the second and third prompts
    _, chunked = run(1 << 28, 40)  # a hit followed by chunks of the rest
    assert chunked == plain


def test_echoed_prompts_are_scored_whole(w4_runtime, prompts):
    """A prompt whose every token is scored takes nothing from the cache (the cached
    tokens' logits were never kept), and its log-probabilities match an engine without one."""
    params = SamplingParams(max_tokens=1, prompt_logprobs=True, logprobs=0)
    got, want = Engine(w4_runtime, 1, 512), Engine(w4_runtime, 1, 512, prefix_cache_bytes=0)
    got.generate([prompts[0]], SamplingParams(max_tokens=1))
    (a,) = got.generate([prompts[1]], params)
    (b,) = want.generate([prompts[1]], params)
    lp = [r.logprob for r in a.prompt_logprobs[1:]]
    assert lp == pytest.approx([r.logprob for r in b.prompt_logprobs[1:]], abs=1e-4)
    assert got.prefix.hit_tokens == 0
