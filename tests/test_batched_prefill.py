"""Prompts that arrive together are prefilled in one pass (Model.prefill_batch), with the
running sequences' decode rows (Model.step): each gets what its own pass gives, and the
engine's replies do not depend on how prompts were grouped or how many prompt tokens a
step admits."""

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
    """Three prompts decoding when two more arrive: all admitted in one step, at most ~40
    prompt tokens a step (the two wait behind the three running), and one at a time: the
    same greedy replies."""
    params = SamplingParams(max_tokens=12, ignore_eos=True)

    def replies(prefill_tokens):
        engine = Engine(weights, max_batch=5, max_len=512, prefill_tokens=prefill_tokens)
        reqs = [engine.submit(Request(list(p), params)) for p in prompts[:3]]
        engine.step()  # a burst at an idle engine: one pass, whatever the budget
        assert all(len(r.output) == 1 for r in reqs)
        reqs += [engine.submit(Request(list(p), params)) for p in prompts[3:]]
        steps = 1
        while not engine.idle:
            engine.step()
            steps += 1
        return [r.output for r in reqs], steps

    one_pass, steps_all = replies(4096)
    budgeted, steps_budget = replies(40)
    single = Engine(weights, max_batch=1, max_len=512)  # one prompt at a time
    alone = [r.output for r in single.generate(prompts, params)]
    assert one_pass == budgeted == alone
    assert steps_all == 13 and steps_budget > steps_all  # admitted over several steps


def test_a_step_takes_a_budget_for_each_running_stream_its_prompts_outnumber(weights, prompts):
    """The budget bounds what each decoding stream waits for: with one stream decoding,
    four waiting prompts get four budgets in one step, where two streams hold a single
    waiting prompt to one budget (chunked)."""
    params = SamplingParams(max_tokens=20, ignore_eos=True)
    budget = 40
    engine = Engine(weights, max_batch=5, max_len=512, prefill_tokens=budget)
    first = engine.submit(Request(list(prompts[0][:30]), params))
    engine.step()
    assert len(first.output) == 1
    late = [engine.submit(Request(list(p[:budget]), params)) for p in prompts[1:]]
    assert sum(len(r.prompt) for r in late) > budget
    engine.step()  # four budgets
    assert all(len(r.output) == 1 for r in late)

    engine = Engine(weights, max_batch=3, max_len=512, prefill_tokens=budget)
    running = [engine.submit(Request(list(p[:30]), params)) for p in prompts[:2]]
    engine.step()
    long = engine.submit(Request([t for p in prompts for t in p][: 3 * budget], params))
    engine.step()
    assert not long.output and long.prefilled == budget  # one budget: two streams wait
    assert all(len(r.output) == 2 for r in running)


def test_a_long_prompt_is_prefilled_in_chunks_while_another_decodes(weights, prompts):
    """A prompt longer than the step's budget is prefilled over several steps, and the
    sequence already running gets a token in every one of them; the long prompt's reply
    is the one a whole prefill gives (fp32 cache: the chunks read the prompt's own k/v)."""
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    long = [t for p in prompts for t in p][:150]
    whole = Engine(weights, max_batch=1, max_len=512).generate([long], params)[0].output
    engine = Engine(weights, max_batch=2, max_len=512, prefill_tokens=32)
    short = engine.submit(Request(list(prompts[0]), SamplingParams(max_tokens=40)))
    engine.step()
    assert len(short.output) == 1
    late = engine.submit(Request(long, params))
    steps = 0
    while not late.output:
        touched = engine.step()
        steps += 1
        assert short in touched  # never held up by the long prompt
    assert steps == -(-len(long) // 32)  # 32 prompt tokens a step, the short one decoding
    while not engine.idle:
        engine.step()
    assert late.output == whole


def test_a_steps_prefill_half_gives_first_tokens_with_the_running_ones_next(weights, prompts):
    """A server sends a new request's first token after the step's one pass, in which the
    running sequences' decode rows joined the prompt's rows: the prefill half returns the
    prompt it finished, with one token, and the running one with its next; the decode half
    has nothing left to do."""
    engine = Engine(weights, max_batch=2, max_len=512)
    old = engine.submit(Request(list(prompts[0]), SamplingParams(max_tokens=8)))
    engine.step()
    new = engine.submit(Request(list(prompts[1]), SamplingParams(max_tokens=8)))
    assert engine.prefill_step() == [new, old]
    assert (len(new.output), len(old.output)) == (1, 2)
    assert engine.decode_step() == []
    assert engine.step() == [old, new]


def _same_sequences(a: KVCache, b: KVCache, slots, layers) -> bool:
    """Whether two caches hold the same k/v for `slots` (their blocks may lie elsewhere)."""
    for layer in layers:
        for slot in slots:
            n = int(a.lengths[slot])
            got = a.read(layer, torch.tensor([slot]), n)
            want = b.read(layer, torch.tensor([slot]), n)
            if not all(torch.equal(x, y) for x, y in zip(got, want, strict=True)):
                return False
    return torch.equal(a.lengths, b.lengths)


@pytest.mark.parametrize("kv", ["none", "int8", "int4"])
def test_a_step_prefills_and_decodes_in_one_call_with_the_same_bits(weights, prompts, kv):
    """Model.step: three running sequences' decode rows join a pass with a new prompt and
    a chunked prompt's second chunk (over a quantized cache, attending to its first in full
    precision) in one C call; every row's logits, and the cache, are the bits of a prefill
    pass followed by a decode step."""
    s, scheme = weights.shape, parse_kv(kv)
    model = Model(weights, 512)
    fused, calls = model.backend.fused, []
    one_call = fused.prefill
    fused.prefill = lambda *a: (calls.append((a[2], list(a[5]))), one_call(*a))[1]
    caches = [KVCache(s.layers, 5, s.kv_heads, 511, s.head_dim, scheme) for _ in range(2)]
    long = torch.tensor([t for p in prompts for t in p][:140])
    running = [torch.tensor(p) for p in prompts[:3]]
    prefixes = [[], []]  # the chunked prompt's k/v in full precision, per cache
    for cache, prefix in zip(caches, prefixes, strict=True):
        for slot, p in enumerate(running):
            model.prefill(p, cache, slot)
        model.prefill_batch([Chunk(long[:70], 4, 0, False, prefix)], cache)
    tokens, slots = [int(p[-1]) for p in running], [0, 1, 2]

    def chunks(prefix):
        return [Chunk(torch.tensor(prompts[3]), 3), Chunk(long[70:], 4, 70, True, prefix)]

    calls.clear()
    mixed, rows = model.step(chunks(prefixes[0]), caches[0], tokens, slots)
    assert calls == [([(3, 0, len(prompts[3])), (4, 70, 70)], slots)]  # one pass
    alone = model.prefill_batch(chunks(prefixes[1]), caches[1])
    want = model.decode_ids(tokens, caches[1], slots)
    assert torch.equal(rows, want)
    assert all(torch.equal(a, b) for a, b in zip(mixed, alone, strict=True))
    assert _same_sequences(caches[0], caches[1], range(5), range(s.layers))
    if kv != "none":
        assert all(
            torch.equal(x, y)
            for a, b in zip(*prefixes, strict=True)
            for x, y in zip(a, b, strict=True)
        )
    # the next step decodes every sequence the same from either cache
    last = [int(r.argmax()) for r in rows] + [int(mixed[0].argmax()), int(mixed[1][-1].argmax())]
    every = [0, 1, 2, 3, 4]
    assert torch.equal(
        model.decode_ids(last, caches[0], every), model.decode_ids(last, caches[1], every)
    )


@pytest.mark.parametrize("kv", ["none", "int8", "int4"])
def test_a_prompt_scored_in_chunks_scores_as_one(weights, prompts, kv):
    """echo + logprobs over a prompt prefilled in chunks of 16: the same log-probabilities
    as one pass, on a quantized cache too (the chunks attend to the prompt's own k/v, not
    to the rounded prefix: reading that moved log-probabilities by up to 0.43)."""
    prompt = [t for p in prompts for t in p][:90]
    params = SamplingParams(max_tokens=0, logprobs=1, prompt_logprobs=True)

    def scored(budget):
        engine = Engine(weights, max_batch=1, max_len=256, kv=parse_kv(kv), prefill_tokens=budget)
        (req,) = engine.generate([prompt], params)
        return torch.tensor([p.logprob for p in req.prompt_logprobs[1:]])

    one, chunked = scored(4096), scored(16)
    assert one.shape == chunked.shape == (len(prompt) - 1,)
    assert (one - chunked).abs().max() < 1e-3
