"""The prefix cache: requests whose prompts share full blocks of tokens prefill only what
follows them, and reply exactly as if they had prefilled everything, on every KV-cache kind."""

import pytest
from conftest import wikitext_passages

from compress.runtime.engine import Engine, Request
from compress.runtime.kv_cache import parse_kv
from compress.runtime.sampling import SamplingParams


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


@pytest.mark.parametrize("kv", ["none", "int4"])
def test_admission_waits_for_free_blocks_and_shared_blocks_let_more_in(w4_runtime, prompts, kv):
    """A pool with room for one request's prompt and reply, and for a second one's past
    the shared preamble: without the prefix cache the three requests run one at a time,
    each admitted when the one before gave its blocks back; with it, a second one shares
    the preamble's blocks and runs beside the first. Replies equal those of an engine
    whose pool holds everything, and blocks are taken as sequences grow, not all at
    admission."""
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    roomy = Engine(w4_runtime, 3, 512, parse_kv(kv), prefix_cache_bytes=0)
    want = [r.output for r in roomy.generate(prompts, params)]
    need = roomy.cache.blocks_for(max(len(p) for p in prompts) + 40)
    common = next(i for i in range(len(prompts[0])) if len({p[i] for p in prompts}) > 1)
    shared = common // roomy.cache.block

    def run(cache_bytes: int):
        engine = Engine(
            w4_runtime, 3, 512, parse_kv(kv), prefix_cache_bytes=cache_bytes,
            kv_blocks=2 * need - shared,
        )  # fmt: skip
        reqs = [engine.submit(Request(list(p), params)) for p in prompts]
        most, used = 0, []
        while not engine.idle:
            engine.step()
            most = max(most, len(engine.running))
            used.append(engine.cache.pool.used)
        assert engine.cache.pool.used == 0  # every block back
        return [r.output for r in reqs], most, used

    got, most, used = run(0)
    assert got == want and most == 1
    assert used[0] < used[-2]  # a sequence takes blocks as it grows
    got, most, _ = run(1 << 28)
    assert got == want and most >= 2
    with pytest.raises(ValueError, match="KV-cache blocks"):
        Engine(w4_runtime, 3, 512, kv_blocks=2).submit(Request(list(prompts[0]), params))


@pytest.mark.parametrize("split", [1, 2, 17])
def test_a_prompts_last_rows_come_out_the_same_after_a_cached_prefix(w4_runtime, prompts, split):
    """A prompt prefilled whole and the same prompt whose first tokens were cached give
    bit-identical logits for its last token, however few rows are left to compute (one
    row once took another BLAS path whose sums differed in the last bits; rounded to
    int8 activations, a greedy reply could then change)."""
    import torch

    from compress.runtime.kv_cache import KVCache
    from compress.runtime.model import Model

    s, ids = w4_runtime.shape, torch.tensor(prompts[0])
    model = Model(w4_runtime, 512)

    def cache():
        return KVCache(s.layers, 1, s.kv_heads, 512, s.head_dim, parse_kv("none"), "cpu")

    whole = model.prefill(ids, cache(), 0, last_only=True)[-1]
    c, cut = cache(), len(ids) - split
    model.prefill(ids[:cut], c, 0, last_only=True)
    rest = model.prefill(ids[cut:], c, 0, start=cut, last_only=True)[-1]
    assert torch.equal(whole, rest)


@pytest.mark.parametrize("kv", ["none", "int8", "int4"])
def test_later_choices_fork_the_first_ones_prompt_and_sample_as_if_alone(w4_runtime, prompts, kv):
    """`n` > 1: choices 2..n wait for choice 1's prompt, then hold every block of it (the
    partly written last block copied on write), so the prompt is computed once; each
    choice's reply is the one its seed gives alone, greedy replies are equal, and every
    block goes back to the pool."""
    prompt = prompts[0][:75]  # two full blocks of 32 and a partial one
    assert len(prompt) % 32
    sampled = [
        SamplingParams(max_tokens=12, temperature=0.9, seed=s, ignore_eos=True) for s in (3, 4, 5)
    ]

    def run(params, fork):
        engine = Engine(w4_runtime, 3, 512, parse_kv(kv))
        computed = []
        real = engine.model.step
        engine.model.step = lambda chunks, cache, *rows: (
            computed.extend(c.tokens.shape[0] for c in chunks) or real(chunks, cache, *rows)
        )
        reqs = [Request(list(prompt), p) for p in params]
        if fork:
            for r in reqs[1:]:
                r.fork_of = reqs[0]
        for r in reqs:
            engine.submit(r)
        while not engine.idle:
            engine.step()
        assert engine.cache.pool.used == 0 and not any(engine.cache.held)
        return [r.output for r in reqs], sum(computed)

    forked, computed = run(sampled, fork=True)
    alone = [run([p], fork=False)[0][0] for p in sampled]
    assert forked == alone and len({tuple(o) for o in forked}) > 1
    assert computed == len(prompt)  # once, not three times
    greedy = [SamplingParams(max_tokens=12, ignore_eos=True)] * 3
    outputs, _ = run(greedy, fork=True)
    assert outputs[0] == outputs[1] == outputs[2] == run(greedy[:1], fork=False)[0][0]


def test_a_fork_with_no_room_is_admitted_as_any_prompt(w4_runtime, prompts):
    """A later choice that finds no free slot when its first choice's prompt is cached
    waits, and is then admitted through the prefix cache like any other prompt."""
    prompt = prompts[0][:75]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    engine = Engine(w4_runtime, 1, 512)  # one slot: the fork cannot start beside its first
    first, later = Request(list(prompt), params), Request(list(prompt), params)
    later.fork_of = first
    engine.submit(first), engine.submit(later)
    while not engine.idle:
        engine.step()
    assert later.output == first.output
    assert engine.prefix.hit_tokens == 64  # its two full blocks came from the cache


@pytest.mark.parametrize("kv", ["none", "int8"])
def test_prompts_arriving_together_compute_their_shared_prefix_once(w4_runtime, prompts, kv):
    """Three prompts sharing a preamble (128 tokens of whole blocks), submitted together,
    with a token budget of 100: the first prompt's first chunk ends inside the shared
    blocks and the second is admitted beside its last chunk. The later ones wait for the
    first one's blocks instead of prefilling them again beside it, and reply as if alone."""
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    plain = [
        Engine(w4_runtime, 1, 512, parse_kv(kv), prefix_cache_bytes=0).generate([p], params)[0]
        for p in prompts
    ]
    engine = Engine(w4_runtime, 3, 512, parse_kv(kv), prefill_tokens=100)
    together = engine.generate(prompts, params)
    assert [r.output for r in together] == [r.output for r in plain]
    shared = min(len(p) for p in prompts)
    common = next(i for i in range(shared) if len({p[i] for p in prompts}) > 1)
    reused = common // 32 * 32
    assert 100 < reused < min(map(len, prompts)) and engine.prefix.hit_tokens == 2 * reused
