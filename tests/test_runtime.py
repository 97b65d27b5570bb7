"""The decode runtime on the real default model: agreement with transformers, batched
decode at ragged lengths, continuous batching, sampling, and the KV-cache schemes."""

import pytest
import torch

from compress.artifact.dense import load_model
from compress.calib_data import eval_windows, read_texts, token_stream
from compress.eval.drift import measure_drift
from compress.model.loading import resolve
from compress.runtime import Engine, Request, SamplingParams, load_weights
from compress.runtime.kv_cache import KVScheme, parse_kv
from compress.runtime.lm import RuntimeLM


@pytest.fixture(scope="module")
def fp32_weights(default_ckpt):
    return load_weights(default_ckpt)


@pytest.fixture(scope="module")
def text_ids(tokenizer, wikitext):
    return eval_windows(token_stream(tokenizer, read_texts(str(wikitext / "test.txt"))), 300, 1)[0]


def test_fp32_runtime_matches_transformers(fp32_weights, base_model, text_ids):
    with torch.no_grad():
        ref = base_model(input_ids=text_ids[None]).logits[0]
    got = RuntimeLM(fp32_weights, 512)(text_ids[None]).logits[0]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=5e-4)


@pytest.mark.parametrize("spec", ["rtn:w4g64", "rtn:w4g128sym", "rtn:w8"])
def test_quantized_runtime_matches_transformers(artifacts, spec, text_ids):
    ckpt = resolve(str(artifacts[spec]))
    weights = load_weights(ckpt)
    assert not weights.dense_fallbacks
    assert all(lin.kind.startswith("int") for layer in weights.layers for lin in layer.linears())
    with torch.no_grad():
        ref = load_model(ckpt)(input_ids=text_ids[None]).logits[0]
    got = RuntimeLM(weights, 512)(text_ids[None]).logits[0]  # prefill: the exact path
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=5e-4)


def test_batched_decode_at_ragged_lengths_matches_prefill(artifacts, text_ids):
    """Two sequences at different positions decode together; each must follow what a
    single prefill of its whole text predicts (int8 activations: close, not bit-equal)."""
    weights = load_weights(resolve(str(artifacts["rtn:w4g64"])))
    full = RuntimeLM(weights, 512)(text_ids[None]).logits[0]
    engine = Engine(weights, max_batch=3, max_len=512)
    engine.model.prefill(text_ids[:100], engine.cache, 0)
    engine.model.prefill(text_ids[:40], engine.cache, 2)
    for t in range(8):
        step = engine.model.decode(
            torch.stack([text_ids[100 + t], text_ids[40 + t]]), engine.cache, torch.tensor([0, 2])
        )
        for row, pos in ((0, 100 + t), (1, 40 + t)):
            p, q = torch.log_softmax(full[pos], -1), torch.log_softmax(step[row], -1)
            assert (p.exp() * (p - q)).sum() < 0.02
            assert step[row].argmax() == full[pos].argmax()


def test_the_exact_pass_is_exact_at_any_window_or_chunk_size(w4_runtime, text_ids):
    """eval's weights-only pass dequantizes the weights for every row: a window of
    EXACT_ABOVE tokens or fewer (`--ctx 64`), or a window's last short chunk over a
    quantized cache, computes what the same rows of a long single-chunk window compute.
    (They took the served int8 kernels, and eval reported the served figure twice, the
    second labelled weights only.)"""
    from compress.kernels.cpu import EXACT_ABOVE

    ids = text_ids[:160]
    whole = RuntimeLM(w4_runtime, 512)(ids[None]).logits[0].clone()
    short = RuntimeLM(w4_runtime, 512)(ids[None, :40]).logits[0]
    assert EXACT_ABOVE >= 40 and (short - whole[:40]).abs().max() < 1e-4
    chunked = RuntimeLM(w4_runtime, 512, chunk=128)(ids[None]).logits[0]  # 128 + 32 rows
    assert (chunked - whole).abs().max() < 1e-4
    served = RuntimeLM(w4_runtime, 512, exact=False)(ids[None, :40]).logits[0]
    assert (served - whole[:40]).abs().max() > 1e-3  # the check can fail: int8 differs


def test_8bit_weights_are_served_as_they_are_evaluated_exactly(artifacts, text_ids, monkeypatch):
    """8-bit layers read two-term int8 activations, so what serve runs is the weights alone
    to within 1e-4 KL per token, on the prompt's packed path and in the one-call decoder;
    with one int8 term (SPLIT_W8 off) the activations add about as much drift as the weights
    (served KL 0.0061 against 0.0036 exact on 16 windows)."""
    from compress.kernels import cpu

    weights = load_weights(resolve(str(artifacts["rtn:w8"])))
    ids = text_ids[:80]
    exact = RuntimeLM(weights, 512)(ids[None]).logits[0]  # > EXACT_ABOVE rows: dequantized

    def kl(logits):
        p, q = torch.log_softmax(exact[63:79], -1), torch.log_softmax(logits, -1)
        return float((p.exp() * (p - q)).sum(-1).mean())

    def served():
        engine = Engine(weights, max_batch=1, max_len=128)
        prompt = engine.model.prefill(ids[:64], engine.cache, 0)[-1:]  # packed (64 rows)
        assert (
            engine.model.backend.fused.head is not None
        )  # each decode step, head included, is one call
        steps = [
            engine.model.decode(ids[64 + t : 65 + t], engine.cache, torch.tensor([0]))
            for t in range(15)
        ]
        return torch.cat([prompt, *steps])

    assert kl(served()) < 1e-4
    monkeypatch.setattr(cpu, "SPLIT_W8", False)
    assert kl(served()) > 5e-4  # the check can fail: one term drifts measurably


def test_continuous_batching_refills_slots_and_matches_single_runs(fp32_weights, text_ids):
    prompts = [text_ids[:12].tolist(), text_ids[20:30].tolist(), text_ids[40:47].tolist()]
    lengths = [3, 12, 5]
    alone = []
    for p, n in zip(prompts, lengths, strict=True):
        e = Engine(fp32_weights, max_batch=1, max_len=64)
        alone.append(e.generate([p], SamplingParams(max_tokens=n, ignore_eos=True))[0].output)
    engine = Engine(fp32_weights, max_batch=2, max_len=64)
    reqs = [
        engine.submit(Request(p, SamplingParams(max_tokens=n, ignore_eos=True)))
        for p, n in zip(prompts, lengths, strict=True)
    ]
    steps = 0
    started_third = None
    while not engine.idle:
        engine.step()
        steps += 1
        if started_third is None and reqs[2].output:
            started_third = steps
            assert not reqs[1].done  # joined while the long request was still running
    assert [r.output for r in reqs] == alone
    assert [r.finish_reason for r in reqs] == ["length"] * 3
    assert started_third == lengths[0] + 1  # the slot the short request left, at the next step


def test_sampling_is_seeded_and_degenerates_to_greedy(fp32_weights, text_ids):
    engine = Engine(fp32_weights, max_batch=2, max_len=64)
    prompt = [text_ids[:10].tolist()]

    def run(**kw):
        return engine.generate(prompt, SamplingParams(max_tokens=8, ignore_eos=True, **kw))[
            0
        ].output

    greedy = run()
    assert run(temperature=1.0, top_k=1, seed=1) == greedy
    assert run(temperature=1.0, top_p=1e-6, seed=2) == greedy
    a, b = run(temperature=1.5, seed=7), run(temperature=1.5, seed=7)
    assert a == b
    assert any(run(temperature=1.5, seed=s) != a for s in (8, 9, 10))


def test_cancel_frees_the_slot_at_once(fp32_weights, text_ids):
    engine = Engine(fp32_weights, max_batch=1, max_len=64)
    r1 = engine.submit(Request(text_ids[:5].tolist(), SamplingParams(max_tokens=50)))
    r2 = engine.submit(Request(text_ids[5:9].tolist(), SamplingParams(max_tokens=2)))
    engine.step()
    engine.cancel(r1)
    assert r1.finish_reason == "cancelled" and engine.free == [0]
    engine.step()
    assert r2.output and r2.slot == 0


def test_requests_beyond_the_context_are_refused(fp32_weights):
    engine = Engine(fp32_weights, max_batch=1, max_len=32)
    with pytest.raises(ValueError, match="exceeds the context of 32 tokens"):
        engine.submit(Request(list(range(30)), SamplingParams(max_tokens=8)))


def test_kv_cache_quantization_drift_and_size(fp32_weights, base_model, tokenizer, wikitext):
    windows = eval_windows(token_stream(tokenizer, read_texts(str(wikitext / "test.txt"))), 512, 2)
    models = {
        name: RuntimeLM(fp32_weights, 512, kv=parse_kv(name)) for name in ("none", "int8", "int4")
    }
    drift = measure_drift(base_model, models, windows, progress=False)
    assert drift["none"].kl < 1e-6
    assert 0 < drift["int8"].kl < 0.01
    assert drift["int8"].kl < drift["int4"].kl < 0.5
    sizes = {n: m.cache.bytes_per_token() for n, m in models.items()}
    assert sizes["none"] == 2 * 30 * 3 * 64 * 4
    assert sizes["int8"] < sizes["none"] / 3 and sizes["int4"] < sizes["int8"] * 0.6


def test_kv_scheme_round_trips_through_config():
    scheme = KVScheme(bits=4, group=64)
    assert KVScheme.from_config(scheme.config()) == scheme
    assert KVScheme.from_config(None) == KVScheme()


def test_one_call_decoder_with_outlier_columns_matches_the_per_op_path(tmp_path, wikitext):
    """LLM.int8()-style layers run in the one-call C decoder too; it must compute what
    the layer-by-layer path computes. Not bit for bit: the outlier sums are added in
    another order, and a 1e-6 difference can flip an int8 rounding of an activation, so
    the two agree to the level of that rounding (a single layer agrees to 1e-5)."""
    from compress.pipeline import compress
    from compress.recipe import parse_recipe

    out = tmp_path / "int8-outliers"
    calib = {"source": str(wikitext / "valid.txt"), "samples": 4, "length": 128}
    recipe = parse_recipe({"stages": [{"int8": {"fraction": 0.01}}], "calib": calib})
    compress("default", recipe, out, log=lambda _: None)
    weights = load_weights(resolve(str(out)))
    assert weights.layers[0].qkv.outlier_index is not None  # fused q/k/v kept its columns
    logits = []
    for fused in (True, False):
        engine = Engine(weights, max_batch=2, max_len=64)
        if not fused:
            engine.model.backend.fused = None
        else:
            assert engine.model.backend.fused is not None
        engine.model.prefill(torch.arange(100, 120), engine.cache, 0)
        engine.model.prefill(torch.arange(200, 210), engine.cache, 1)
        steps = [
            engine.model.decode(torch.tensor([7 + t, 9 + t]), engine.cache, torch.tensor([0, 1]))
            for t in range(4)
        ]
        logits.append(torch.stack(steps))
    p, q = torch.log_softmax(logits[0], -1), torch.log_softmax(logits[1], -1)
    assert (p.exp() * (p - q)).sum(-1).mean() < 0.005
    assert (p.argmax(-1) == q.argmax(-1)).float().mean() >= 0.85


@pytest.mark.parametrize("temperature", [1e-300, 5e-324, 1e-20])
def test_a_tiny_temperature_samples_the_greedy_token(temperature):
    """Its limit is greedy: no NaN from dividing by a temperature float32 cannot hold."""
    from compress.runtime.sampling import SamplingParams, sample

    logits = torch.randn(1000, generator=torch.Generator().manual_seed(0))
    got = sample(logits, SamplingParams(temperature=temperature), torch.Generator())
    assert got == int(logits.argmax())


@pytest.mark.parametrize("bad", [{"temperature": float("nan")}, {"top_p": float("inf")}])
def test_non_finite_sampling_parameters_are_refused(bad):
    from compress.runtime.sampling import SamplingParams

    with pytest.raises(ValueError, match="out of range"):
        SamplingParams(**bad)


def test_a_drawn_token_follows_the_distribution_and_never_a_zero(monkeypatch):
    """`draw`: 40,000 draws from an unnormalized distribution with zeros (what top-k and
    top-p leave), each token's frequency within 4 standard errors of its probability; a
    seed repeats its draws; a uniform draw rounded up to the total gives the last possible
    token, not a zero-probability one after it."""
    from compress.runtime import sampling

    weights = torch.tensor([0.0, 3.0, 0.5, 0.0, 1.5, 2.0, 0.0, 0.0], dtype=torch.float64)
    p = weights / weights.sum()
    gen = torch.Generator().manual_seed(3)
    trials = 40_000
    counts = torch.bincount(
        torch.tensor([sampling.draw(weights, gen) for _ in range(trials)]), minlength=8
    )
    freq = counts.double() / trials
    se = (p * (1 - p) / trials).sqrt()
    assert ((freq - p).abs() <= 4 * se + 1e-12).all(), (freq, p)
    assert (counts[p == 0] == 0).all()
    seeded = [torch.Generator().manual_seed(9) for _ in range(2)]
    assert [sampling.draw(weights, seeded[0]) for _ in range(50)] == [
        sampling.draw(weights, seeded[1]) for _ in range(50)
    ]
    for bad in (torch.zeros(8), torch.tensor([1.0, float("nan"), 2.0])):
        with pytest.raises(ValueError, match="all zeros or not finite"):
            sampling.draw(bad, gen)
    monkeypatch.setattr(sampling.torch, "rand", lambda *a, **k: torch.ones(1, dtype=k["dtype"]))
    assert sampling.draw(weights, gen) == 5


@pytest.mark.parametrize("params", [{"temperature": 0.7}, {"temperature": 1.3, "top_k": 4}])
def test_sampled_tokens_follow_the_tempered_distribution(params):
    """`sample` over 30,000 draws: each token's frequency within 4 standard errors of the
    softmax of logits / temperature (top-k's survivors renormalized), with or without the
    unnormalized path that plain temperature sampling takes."""
    from compress.runtime.sampling import SamplingParams, sample

    logits = torch.tensor([2.0, -1.0, 0.5, 1.5, -3.0, 0.0])
    p = torch.softmax(logits.double() / params["temperature"], -1)
    if "top_k" in params:
        p[p < p.topk(params["top_k"]).values[-1]] = 0
        p /= p.sum()
    gen, trials = torch.Generator().manual_seed(4), 30_000
    drawn = [sample(logits, SamplingParams(**params), gen) for _ in range(trials)]
    freq = torch.bincount(torch.tensor(drawn), minlength=6).double() / trials
    assert ((freq - p).abs() <= 4 * (p * (1 - p) / trials).sqrt() + 1e-12).all(), (freq, p)


def test_a_steps_rows_are_chosen_in_one_call_as_each_row_alone():
    """sample_rows: greedy and sampled rows (top-k and top-p too) in one C call, each the
    token `sample` gives that row alone from the same seed; a temperature too tiny for
    float32 is left to `sample` (None)."""
    from compress.runtime.sampling import SamplingParams, sample, sample_rows

    logits = torch.randn(6, 3000, generator=torch.Generator().manual_seed(5)) * 4
    params = [
        SamplingParams(),
        SamplingParams(temperature=0.7),
        SamplingParams(temperature=1.3),
        SamplingParams(temperature=1.0, top_k=5),
        SamplingParams(temperature=1e-300),
        SamplingParams(temperature=1.0, top_p=0.9),
    ]

    def gens():
        return [torch.Generator().manual_seed(10 + i) for i in range(6)]

    batched = sample_rows(logits, params, gens())
    assert [t is None for t in batched] == [False, False, False, False, True, False]
    alone = [sample(row, p, g) for row, p, g in zip(logits, params, gens(), strict=True)]
    assert all(b == a for b, a in zip(batched, alone, strict=True) if b is not None)
    assert alone[0] == int(logits[0].argmax()) and alone[4] == int(logits[4].argmax())
    assert len(set(sample_rows(logits[1:2].expand(40, -1), params[1:2] * 40, [None] * 40))) > 1


def test_one_call_draws_the_float64_draws_tokens_and_never_a_zero():
    """llmp_choose_tokens against the float64 inverse cumulative (compress/draw.py) at the
    same uniform numbers over a 49k vocabulary: the same token in all but a rounding's
    share of rows; a weight under e^-87 (-inf included) is never drawn, a uniform number
    just under 1 takes the last drawable token, and a row with NaN, +inf or nothing
    drawable gives -1 (`sample` then refuses it)."""
    from compress.draw import _search
    from compress.kernels.cpu import choose_tokens
    from compress.runtime.sampling import SamplingParams, _tempered, probabilities, sample

    gen = torch.Generator().manual_seed(6)
    logits = torch.randn(200, 49152, generator=gen) * 3
    u = torch.rand(200, dtype=torch.float64, generator=gen)
    ours = choose_tokens(logits, [1 / 0.8] * 200, u.tolist())
    theirs = [
        int(_search(_tempered(row, 0.8).exp_(), u[i : i + 1])[0]) for i, row in enumerate(logits)
    ]
    assert sum(a == b for a, b in zip(ours, theirs, strict=True)) >= 199
    for k, top_p in ((40, 1.0), (0, 0.9), (50, 0.95), (1, 1.0)):  # probabilities' cuts
        params = SamplingParams(temperature=0.8, top_k=k, top_p=top_p)
        ours = choose_tokens(logits[:60], [1 / 0.8] * 60, u[:60].tolist(), [k] * 60, [top_p] * 60)
        theirs = [int(_search(probabilities(row, params), u[i : i + 1])[0])
                  for i, row in enumerate(logits[:60])]  # fmt: skip
        assert sum(a == b for a, b in zip(ours, theirs, strict=True)) >= 59, (k, top_p)
    x = torch.tensor([[-200.0, 1.0, float("-inf"), 0.5, -300.0] * 20])
    drawn = choose_tokens(x.expand(2000, -1).contiguous(), [1.0] * 2000, torch.rand(2000).tolist())
    assert {t % 5 for t in drawn} == {1, 3}
    assert choose_tokens(x, [1.0], [1 - 2**-53]) == [98]
    bad = torch.tensor([[1.0, float("nan")], [float("-inf")] * 2, [1.0, float("inf")]])
    assert choose_tokens(bad, [1.0] * 3, [0.5] * 3) == [-1, -1, -1]
    with pytest.raises(ValueError, match="all zeros or not finite"):
        sample(bad[1], SamplingParams(temperature=1.0), None)
    # ties at a cut: top-k keeps every token tied at the k-th; top-p the fewest (by index)
    tied = torch.tensor([[1.0, 2.0, 1.0, 2.0, 1.0, 0.0]])
    many = tied.expand(3000, -1).contiguous()
    uniforms = torch.rand(3000).tolist()
    assert set(choose_tokens(many, [1.0] * 3000, uniforms, [3] * 3000)) == {0, 1, 2, 3, 4}
    assert set(choose_tokens(many, [1.0] * 3000, uniforms, None, [0.5] * 3000)) == {1, 3}
    assert set(choose_tokens(many, [1.0] * 3000, uniforms, None, [0.7] * 3000)) == {0, 1, 3}


def test_seeded_sampled_requests_decode_in_a_batch_as_alone(fp32_weights, text_ids):
    """Sampled requests with seeds: batched, their tokens come from one call per step (the
    same tokens each request draws alone)."""
    prompts = [text_ids[:12].tolist(), text_ids[20:30].tolist(), text_ids[40:47].tolist()]
    params = [SamplingParams(max_tokens=6, temperature=t, seed=s, ignore_eos=True)
              for t, s in ((1.0, 1), (0.7, 2), (0.0, None))]  # fmt: skip
    alone = [
        Engine(fp32_weights, max_batch=1, max_len=64).generate([p], q)[0].output
        for p, q in zip(prompts, params, strict=True)
    ]
    engine = Engine(fp32_weights, max_batch=3, max_len=64)
    reqs = [engine.submit(Request(p, q)) for p, q in zip(prompts, params, strict=True)]
    while not engine.idle:
        engine.step()
    assert [r.output for r in reqs] == alone
