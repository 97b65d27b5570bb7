"""Speculative decoding (compress/runtime/speculative.py): greedy output is plain
decoding's on every KV-cache kind with either proposer, sampled output follows the
target's distribution, k adapts, and bench and the serving loop carry every token."""

import json

import pytest
import torch
from conftest import wikitext_passages
from test_bad_input import error_lines, run_cli

from compress.model.loading import resolve
from compress.runtime.engine import Engine, Request
from compress.runtime.kv_cache import parse_kv
from compress.runtime.sampling import SamplingParams, accept_drafts, probabilities
from compress.runtime.speculative import (
    PROBE_EVERY,
    VERIFY_ROW_COST,
    DraftModelProposer,
    NgramProposer,
    Speculator,
    best_k,
    make_speculator,
)
from compress.runtime.weights import load_weights


@pytest.fixture(scope="module")
def target(w4_runtime):
    return w4_runtime


@pytest.fixture(scope="module")
def prompts(tokenizer, wikitext):
    """Three passages of WikiText-2's test split (the first one's headings repeat)."""
    return wikitext_passages(tokenizer, wikitext, [(i * 900, i * 900 + 700) for i in range(3)])


def _generate(weights, prompts, kv, speculator=None, params=None):
    params = params or SamplingParams(max_tokens=40, ignore_eos=True)
    engine = Engine(weights, max_batch=1, max_len=320, kv=kv, speculator=speculator)
    return [r.output for r in engine.generate(prompts, params)]  # one at a time


@pytest.mark.parametrize("kv", ["none", "int8", "int4"])
def test_greedy_output_is_plain_decodings_with_both_proposers(target, artifacts, prompts, kv):
    """The 8-bit artifact drafts for the 4-bit one (same tokenizer, other weights: some
    drafts are refused); KIVI groups of 32 complete inside verified chunks."""
    scheme = parse_kv(kv)
    plain = _generate(target, prompts, scheme)
    # both draft 3 tokens at every step, whatever they cost on this machine (8-bit costs
    # more than the 4-bit target: left to the cost model, it would pause)
    ngram = Speculator(NgramProposer(), k=3, adapt=False)
    assert _generate(target, prompts, scheme, ngram) == plain
    draft_weights = load_weights(resolve(str(artifacts["rtn:w8"])), device="cpu")
    draft = Speculator(DraftModelProposer(draft_weights, 400), k=3, adapt=False)
    assert _generate(target, prompts, scheme, draft) == plain
    for spec in (ngram, draft):  # both proposed and were checked; neither always right
        assert spec.steps > 0 and spec.proposed > spec.accepted > 0
    assert draft.acceptance > 0.5  # 8-bit and 4-bit copies of one model mostly agree


def _first_tokens(logits, drafts, q, params, trials, seed):
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(logits.shape[1])
    for _ in range(trials):
        kept, token = accept_drafts(logits, drafts, q, params, gen)
        counts[drafts[0] if kept else token] += 1
    return counts / trials


@pytest.mark.parametrize("proposer", ["model", "ngram"])
def test_sampled_tokens_follow_the_targets_distribution(proposer):
    """The first emitted token over 20,000 draws: for a model proposer, drafts drawn from
    its own q, which differs from the target's p; for n-gram lookup, a fixed guess. Each
    token's frequency is within 4 standard errors of p, and far from q."""
    torch.manual_seed(0)
    params = SamplingParams(temperature=0.8, top_k=5)
    logits = torch.randn(2, 8) * 2
    p = probabilities(logits[0], params).float()
    gen = torch.Generator().manual_seed(1)
    trials = 20000
    counts = torch.zeros(8)
    q_logits = torch.randn(8) * 2
    q = probabilities(q_logits, params)
    for _ in range(trials):
        if proposer == "model":
            d = int(torch.multinomial(q, 1, generator=gen))
            kept, token = accept_drafts(logits, [d], q[None], params, gen)
        else:
            d = int(q_logits.argmax())
            kept, token = accept_drafts(logits, [d], None, params, gen)
        counts[d if kept else token] += 1
    freq = counts / trials
    se = (p * (1 - p) / trials).sqrt()
    assert ((freq - p).abs() <= 4 * se + 1e-9).all(), (freq, p)
    assert (freq - q.float()).abs().max() > 0.05  # the test can tell p from q


def test_greedy_check_keeps_the_agreeing_prefix():
    logits = torch.zeros(4, 10)
    for i, best in enumerate([3, 5, 7, 9]):
        logits[i, best] = 1.0
    greedy = SamplingParams()
    assert accept_drafts(logits, [3, 5, 7], None, greedy, None) == (3, 9)
    assert accept_drafts(logits, [3, 4, 7], None, greedy, None) == (1, 5)
    assert accept_drafts(logits, [0, 5, 7], None, greedy, None) == (0, 3)


def test_draft_length_follows_acceptance_and_stops_when_it_does_not_pay():
    assert best_k(0.95, 7) > best_k(0.75, 7) > best_k(0.1, 7) == 0
    spec = Speculator(NgramProposer())
    for _ in range(10):
        spec.record(spec.length() or 1, 0)
    assert spec.k == 0 and spec.acceptance == 0.0
    asked = [spec.length() for _ in range(32)]  # off, but a probe now and then
    assert asked.count(1) == 2 and asked.count(0) == 30
    for _ in range(10):
        spec.record(1, 1)
    assert spec.k >= 3


def test_a_paused_model_draft_costs_nothing_until_a_later_sequence(target):
    """A model draft would have to prefill every token it missed to propose again, so
    once paused it asks for nothing on that sequence, and tries one token again at every
    PROBE_EVERY-th new sequence."""
    spec = Speculator(DraftModelProposer(target, 64, step_cost=0.3))
    spec.begin(1)
    for _ in range(10):
        spec.record(spec.length() or 1, 0)
    assert spec.k == 0
    assert [spec.length() for _ in range(64)] == [0] * 64
    tried = []
    for sequence in range(2, 2 + 2 * PROBE_EVERY):
        spec.begin(sequence)
        spec.begin(sequence)  # the same sequence again: nothing new
        tried.append(spec.length())
        if spec.k:
            spec.record(1, 0)  # refused again: paused again
    assert tried.count(1) == 2 and tried.count(0) == 2 * PROBE_EVERY - 2


def test_an_engine_measures_what_a_checked_row_costs_on_this_machine(target):
    """The cost model's row cost is measured when a speculating engine starts: a check of
    5 rows reads the weights once, so each row past the first costs less than a step."""
    spec = Speculator(NgramProposer())
    Engine(target, max_batch=1, max_len=128, speculator=spec)
    assert 0.02 <= spec.row_cost < 1.0
    fixed = Speculator(NgramProposer(), k=3, adapt=False)  # told k: nothing to measure
    Engine(target, max_batch=1, max_len=128, speculator=fixed)
    assert fixed.row_cost == VERIFY_ROW_COST


def test_a_draft_that_could_never_pay_is_refused_in_one_line(artifacts):
    """The target drafting for itself costs a whole step per token: slower than no
    draft even when every draft is kept."""
    code, _, err = run_cli(
        ["bench", str(artifacts["rtn:w4g64"]), "--batch", "1", "--draft",
         str(artifacts["rtn:w4g64"])]
    )  # fmt: skip
    assert code == 2 and len(error_lines(err)) == 1, err
    assert "100% of the target's bytes" in err and "--draft ngram" in err


def test_ngram_lookup_proposes_what_followed_the_latest_match():
    context = [5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6, 7]
    assert NgramProposer().propose(context, 3, None, None) == ([9, 2, 5], None)
    assert NgramProposer().propose([1, 2, 3], 3, None, None) == ([], None)


def test_bench_reports_acceptance_and_speedup(artifacts, tmp_path):
    out = tmp_path / "bench.json"
    code, stdout, err = run_cli(
        ["bench", str(artifacts["rtn:w4g64"]), "--batch", "1", "--prompt-len", "16",
         "--output-len", "24", "--draft", "ngram", "--json", str(out)]
    )  # fmt: skip
    assert code == 0, err
    plain, spec = json.loads(out.read_text())["results"]
    assert plain["draft"] is None and spec["draft"] == "ngram"
    assert 0 <= spec["acceptance"] <= 1 and spec["speedup"] > 0
    assert "| ngram |" in stdout


def test_a_draft_with_another_vocabulary_is_refused_in_one_line(target, tmp_path, monkeypatch):
    from conftest import write_tiny_llama

    from compress.errors import LlmpressError
    from compress.runtime import weights as runtime_weights
    from compress.serve import app

    tiny = write_tiny_llama(tmp_path / "tiny")
    with pytest.raises(Exception) as e:
        make_speculator(str(tiny), target, 64)
    assert "vocabulary" in str(e.value) and "same tokenizer" in str(e.value)

    def loaded(*args, **kwargs):  # bench and serve refuse from the configs, before this
        raise AssertionError("the target's weights were loaded before the draft was checked")

    monkeypatch.setattr(runtime_weights, "load_weights", loaded)
    monkeypatch.setattr(app, "load_weights", loaded)
    code, _, err = run_cli(["bench", "default", "--batch", "1", "--draft", str(tiny)])
    assert code == 2 and len(error_lines(err)) == 1 and "vocabulary" in err
    with pytest.raises(LlmpressError, match="its vocabulary has 128 tokens, the target's 49152"):
        app.build_app("default", max_batch=1, max_len=64, draft=str(tiny))


def test_the_serving_loop_streams_every_token_of_a_verified_step(target, prompts):
    """A verified step adds several tokens at once; the stream gets each, in order."""
    from compress.serve.metrics import Metrics
    from compress.serve.scheduler import DONE, Scheduler, ServingEngine

    engine = ServingEngine(
        target, max_batch=2, max_len=320, speculator=Speculator(NgramProposer(), k=3, adapt=False)
    )
    scheduler = Scheduler(engine, Metrics(2)).start()
    try:
        stream = scheduler.submit(Request(list(prompts[0]), SamplingParams(max_tokens=40)))
        got = []
        while (token := stream.tokens.get(timeout=60)) is not DONE:
            got.append(token)
    finally:
        scheduler.stop()
    assert engine.speculator.steps > 0 and engine.speculator.accepted > 0
    assert got == stream.request.output and len(got) == 40
    metrics = scheduler.metrics.render()
    assert f"llmpress_speculative_accepted_tokens_total {engine.speculator.accepted}" in metrics
    assert f"llmpress_speculative_draft_tokens_total {engine.speculator.proposed}" in metrics


@pytest.mark.parametrize("kv", ["none", "int4"])
def test_the_triton_backend_verifies_through_its_decode_path(tmp_path, tokenizer_dir, kv):
    """The GPU backend has no one-call decoder: its check runs decode's per-op path with
    the rows as one slot at successive positions (its attention kernel reads each row's
    keys up to its own position; compiled on a GPU, under TRITON_INTERPRET=1 here), and
    keeps plain decoding's greedy output. The model drafts 3 tokens for itself at every
    step: most drafts are kept."""
    from family_models import write_family

    from compress.pipeline import compress
    from compress.recipe import parse_quant, parse_recipe

    device = "cuda" if torch.cuda.is_available() else "cpu"
    src = write_family(tmp_path / "src", "qwen3", tokenizer_dir)
    recipe = parse_recipe({"stages": [parse_quant("rtn:w4g32")]})
    art = compress(str(src), recipe, tmp_path / "w4", log=lambda _: None)
    weights = load_weights(resolve(str(art)), device, "triton")
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1000, (24,), generator=gen).tolist()]
    params = SamplingParams(max_tokens=16, ignore_eos=True)  # past the KIVI group at 32
    scheme = parse_kv(kv)
    plain = _generate(weights, prompts, scheme, params=params)
    spec = Speculator(DraftModelProposer(weights, 128), k=3, adapt=False)
    assert _generate(weights, prompts, scheme, spec, params) == plain
    assert spec.steps > 0 and spec.accepted > spec.steps
