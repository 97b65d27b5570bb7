"""Speculative decoding for a sequence that runs alone: a cheap proposer guesses up to k
next tokens, the target scores them all in one pass (`Model.verify`: the weights are read
once for k + 1 rows), and `sampling.accept_drafts` keeps exactly the target's output
(greedy: identical tokens; sampling: the target's distribution).

Proposers:
- `NgramProposer` (`--draft ngram`): prompt lookup, no model. The last n tokens (n from 3
  down to 1) are searched for earlier in the sequence and the tokens that followed are
  proposed; text that repeats its input (summaries, code edits, quotes) gains most.
- `DraftModelProposer` (`--draft ARTIFACT`): a smaller model with the same tokenizer, for
  example a pruned, distilled, 4-bit copy of the target that llmpress made. It keeps its
  own one-slot cache in step with the accepted tokens.

k adapts to the measured acceptance (a moving average over verified steps): each step
takes the length with the most expected tokens per unit of time (`best_k`), and none
(plain decoding) while no length pays. Then the n-gram lookup still drafts one token every
`PROBE_EVERY`-th step, so a stretch of text that starts to repeat turns speculation back
on. A model draft does not: to propose it would first have to prefill every token it
missed, so while paused it costs nothing, and it tries again at every `PROBE_EVERY`-th
sequence. A draft so large that it could not pay even if always right is refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from compress.errors import LlmpressError
from compress.kernels.cpu import argmax
from compress.runtime.kv_cache import FP32, cache_for
from compress.runtime.model import Model
from compress.runtime.sampling import SamplingParams, draw, probabilities
from compress.runtime.states import mixer_kind
from compress.runtime.weights import ModelWeights

# A verified step of 1 + k rows costs about 1 + row_cost * k decode steps: the weights are
# read once, but each row's int8 products are computed. What a row costs depends on the
# machine (default model, 4-bit, 2 cores: 0.25 of a step on an AVX2 EPYC, 0.41 on an
# AVX512-VNNI Xeon whose decode step is twice as fast), so each engine measures it on its
# own target when it starts (`measure_row_cost`); VERIFY_ROW_COST is the figure used
# before that. 9 rows cost 5.4 steps on the EPYC (past the head's one-read GEMV), hence
# MAX_K = 7.
VERIFY_ROW_COST = 0.25
MAX_K = 7
PROBE_EVERY = 16
CALIBRATION_SECONDS = 0.3  # measuring the row cost: at least this long, 3 rounds or more


class NgramProposer:
    """Prompt lookup: the continuation of the latest earlier occurrence of the sequence's
    last n tokens (the longest n that occurs, from `max_n` down to `min_n`)."""

    name = "ngram"
    step_cost = 0.0  # of a target decode step, per proposed token
    probes = True  # proposing after a pause costs nothing

    def __init__(self, max_n: int = 3, min_n: int = 1):
        self.max_n, self.min_n = max_n, min_n

    def propose(self, context: list[int], k: int, params, generator):
        for n in range(min(self.max_n, len(context) - 1), self.min_n - 1, -1):
            tail = context[-n:]
            for start in range(len(context) - n - 1, -1, -1):  # latest occurrence first
                if context[start : start + n] == tail:
                    follow = context[start + n : start + n + k]
                    return follow, None
        return [], None


class DraftModelProposer:
    """A draft model of the same vocabulary. Its cache holds the sequence's tokens but the
    last; before proposing, it rolls back to what it shares with the sequence (refused
    drafts) and prefills what it lacks (the target's correction, a new prompt). The cache
    is fp32 whatever the target's: a KIVI one could not roll back across a group's end."""

    name = "draft"
    probes = False  # after a pause it would catch up on every token it missed

    def __init__(self, weights: ModelWeights, max_len: int, step_cost: float = 1.0):
        self.step_cost = step_cost  # a draft decode step, in target decode steps
        self.model = Model(weights, max_len + 1)
        self.cache = cache_for(weights, 1, max_len, FP32)
        self.fed: list[int] = []  # the tokens whose k/v the cache holds, in order

    def propose(self, context: list[int], k: int, params: SamplingParams, generator):
        keep = 0
        limit = min(len(self.fed), len(context) - 1)
        while keep < limit and self.fed[keep] == context[keep]:
            keep += 1
        self.fed = self.fed[:keep]
        self.cache.lengths[0] = keep
        if keep < len(context) - 1:
            missing = context[keep:-1]
            self.model.prefill(torch.tensor(missing), self.cache, 0, start=keep, last_only=True)
            self.fed += missing
        room = self.cache.max_len - len(self.fed) - 1
        tokens, probs, last = [], [], context[-1]
        for _ in range(max(0, min(k, room))):
            logits = self.model.decode_ids([last], self.cache, [0])[0]
            self.fed.append(last)
            if params.temperature == 0:
                token = argmax(logits)
            else:
                p = probabilities(logits, params)
                token = draw(p, generator)
                probs.append(p)
            tokens.append(token)
            last = token
        return tokens, (torch.stack(probs) if probs else None)


@dataclass
class Speculator:
    """A proposer and the adaptive draft length, with the counts `bench` reports."""

    proposer: object
    max_k: int = MAX_K
    k: int = 2
    acceptance_ema: float = 0.6  # per drafted token; a prior until steps are seen
    proposed: int = 0
    accepted: int = 0
    steps: int = 0  # verified steps
    idle_steps: int = 0  # steps decoded plainly since speculation last ran
    sequence: int | None = None  # the sequence speculated on last
    sequences: int = 0  # sequences speculated on (or offered to be)
    adapt: bool = True  # False: k stays as given (to measure a draft's acceptance)
    row_cost: float = VERIFY_ROW_COST  # a verified row, in decode steps (Engine measures it)

    @property
    def acceptance(self) -> float:
        return self.accepted / self.proposed if self.proposed else 0.0

    def begin(self, sequence: int) -> None:
        """The running sequence is `sequence`: a paused model draft tries again (one
        token) at every PROBE_EVERY-th new one."""
        if sequence == self.sequence:
            return
        self.sequence, self.sequences = sequence, self.sequences + 1
        if not self.k and not self.proposer.probes and self.sequences % PROBE_EVERY == 0:
            self.k = 1

    def length(self) -> int:
        """Drafts to ask for this step (0: decode plainly)."""
        if self.k or not self.proposer.probes:
            return self.k
        self.idle_steps += 1
        return 1 if self.idle_steps % PROBE_EVERY == 0 else 0

    def record(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted
        self.steps += 1
        self.acceptance_ema = 0.8 * self.acceptance_ema + 0.2 * accepted / proposed
        if self.adapt:
            row = self.row_cost + self.proposer.step_cost
            self.k = best_k(self.acceptance_ema, self.max_k, row)


def best_k(acceptance: float, max_k: int, row_cost: float = VERIFY_ROW_COST) -> int:
    """The draft length with the most expected tokens per unit of time for a per-token
    acceptance a: a verified step of k drafts yields (1 - a^(k+1)) / (1 - a) tokens and
    costs 1 + row_cost * k decode steps. 0 when no length beats plain decoding."""
    a = min(max(acceptance, 0.0), 0.99)
    best, best_rate = 0, 1.0
    for k in range(1, max_k + 1):
        rate = (1 - a ** (k + 1)) / (1 - a) / (1 + row_cost * k)
        if rate > best_rate * 1.02:  # a gain within noise is not worth the pass
            best, best_rate = k, rate
    return best


def measure_row_cost(model: Model, kv, rows: int = 5) -> float:
    """What one more row of a verified step costs, in decode steps of `model` on this
    machine: median times of a one-row decode and of a `rows`-row check, on a scratch
    one-sequence cache of 32 tokens."""
    import statistics
    import time

    s, dev = model.w.shape, model.device
    cache = cache_for(model.w, 1, 64, kv)
    model.prefill(torch.arange(32, device=dev) % s.vocab, cache, 0, last_only=True)
    start, tokens = int(cache.lengths[0]), torch.arange(rows, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)

    def timed(run) -> float:
        cache.lengths[0] = start
        t = time.perf_counter()
        run()
        sync()
        return time.perf_counter() - t

    one, many, began = [], [], time.perf_counter()
    while len(one) < 3 or time.perf_counter() - began < CALIBRATION_SECONDS:
        one.append(timed(lambda: model.decode_ids([1], cache, [0])))
        many.append(timed(lambda: model.verify(tokens, cache, 0)))
    step, check = statistics.median(one), statistics.median(many)
    return min(max((check - step) / ((rows - 1) * step), 0.02), 2.0)


def check_draft_vocabulary(draft: str | None, target_config: dict) -> None:
    """Refuse a draft whose config names another vocabulary than the target's before
    either model's weights are loaded (they took 8-11 s on the default model first)."""
    from compress.model.loading import resolve

    if draft is None or draft == "ngram":
        return
    mine, theirs = resolve(draft).config.get("vocab_size"), target_config.get("vocab_size")
    if mine is not None and theirs is not None and mine != theirs:
        raise _vocabulary_error(draft, mine, theirs)


def _vocabulary_error(draft: str, mine: int, theirs: int) -> LlmpressError:
    return LlmpressError(
        f"--draft {draft}: its vocabulary has {mine} tokens, the target's {theirs}: give a "
        "draft made from the same model (same tokenizer)"
    )


def make_speculator(draft: str, target: ModelWeights, max_len: int) -> Speculator:
    """`--draft`: `ngram`, or an artifact (or checkpoint) whose vocabulary is the target's.
    Speculation checks each row as decode computes it (`Model.verify`), so its greedy
    output is plain decoding's on every KV-cache kind."""
    from compress.model.loading import resolve
    from compress.runtime.weights import load_weights

    if draft == "ngram":
        return Speculator(NgramProposer())
    weights = load_weights(resolve(draft), device=target.embed.device, kernels=target.kernels)
    kind = mixer_kind(weights.layers)
    if kind:  # its own cache is rolled back past refused drafts
        raise LlmpressError(
            f"--draft {draft}: a {kind} draft's state cannot be rolled back past refused "
            "drafts yet; give a draft of attention layers or --draft ngram"
        )
    if weights.shape.vocab != target.shape.vocab:
        raise _vocabulary_error(draft, weights.shape.vocab, target.shape.vocab)
    cost = weights.step_bytes / target.step_bytes  # decode is bound by the bytes it reads
    if not best_k(1.0, MAX_K, VERIFY_ROW_COST + cost):
        raise LlmpressError(
            f"--draft {draft}: a draft step reads {cost:.0%} of the target's bytes, so even "
            "drafts that are always kept would decode slower than no draft: give a smaller "
            "draft (examples/draft.yaml makes one) or --draft ngram"
        )
    return Speculator(DraftModelProposer(weights, max_len, cost))
