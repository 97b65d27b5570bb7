"""Continuous batching over the runtime model.

Requests wait in a queue; every `step()` first admits waiting requests and prefills their
prompts (long ones in chunks, over steps, under a token budget), then decodes one token for
every running request whose prompt is cached (on the CPU in the prefill's own pass). A
request is admitted when a batch slot is free and the KV-cache pool has the blocks it may
come to need (its prompt and max_tokens, less the blocks of a cached prefix it shares); it
takes them only as it grows. A request that finishes gives its slot and blocks back at
once, and the next step reuses them: short requests never wait for the longest one in
their batch.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from compress.errors import LlmpressError
from compress.runtime.kv_blocks import block_keys
from compress.runtime.kv_cache import FP32, KVScheme, cache_for
from compress.runtime.model import Chunk, Model
from compress.runtime.prefix_cache import PrefixCache
from compress.runtime.sampling import (
    SamplingParams,
    TokenLogprob,
    accept_drafts,
    sample,
    sample_rows,
    token_logprobs,
)
from compress.runtime.speculative import Speculator, measure_row_cost
from compress.runtime.states import mixer_kind
from compress.runtime.weights import ModelWeights

_ids = itertools.count()

# Prompt tokens one step prefills at most; a longer prompt is prefilled in chunks over
# several steps, between which the running sequences keep decoding. Measured with
# benchmarks/prefill_budget.py (default model w4, 8 streams, a 1,500-token prompt; 32 short
# prompts arriving together): 192 keeps the long prompt's first token within 10% of a whole
# prefill's on both hosts measured (AVX-512 Xeon 7%, AVX2 EPYC 4%). 128 cuts the streams'
# worst gap by a quarter (Xeon 0.13 s against 0.17; EPYC 0.25 against 0.34) but delays the
# long prompt (10% and 8% later), the median first token of 32 arrivals (10% and 6%) and
# a burst's admission (one step more); 256 gives the streams 22% longer gaps for a long
# prompt 6% sooner, and a later median for the arrivals. The budget is per running stream
# held back: where k times as many prompts wait as streams decode, a step takes k budgets
# (Engine.prefill_step), so a burst at an idle or nearly idle engine is prefilled in one
# pass, as `bench` prefills its batch; 32 streams arriving together were served at
# 0.93-0.95x `bench`'s batch-32 decode rate with it, 0.80-0.83x with one budget a step
# (benchmarks/serve_load.py --capacities 32, two runs of each, interleaved).
PREFILL_TOKENS = 192

# Bytes of prompt-prefix k/v kept in fp32 beside an int8/int4 cache's shared blocks, for the
# rest of a prompt to attend to in full precision (47 KB a token for the default model, 20k
# tokens; 128 KB a token at a Llama-3-8B shape, 8k tokens). An fp32 cache's shared blocks
# need no copy. 0 turns the prefix cache off.
PREFIX_CACHE_BYTES = 1 << 30


@dataclass(eq=False)  # identity: the engine looks requests up in its lists every step
class Request:
    prompt: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    id: int = field(default_factory=lambda: next(_ids))
    output: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length", "cancelled"
    slot: int | None = None
    submitted: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    generator: torch.Generator | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)  # one per output token
    prompt_logprobs: list[TokenLogprob | None] = field(default_factory=list)  # first: None
    prefilled: int = 0  # prompt tokens in the cache (a long prompt fills it over steps)
    prompt_logits: list[torch.Tensor] = field(default_factory=list, repr=False)  # its chunks'
    prompt_kv: list | None = field(default=None, repr=False)  # Chunk.prefix, while chunked
    # choice 1 of the same request (`n` > 1): this one starts from its cached prompt
    fork_of: Request | None = field(default=None, repr=False)
    keys: list[bytes] | None = field(default=None, repr=False)  # its prompt's block keys

    @property
    def done(self) -> bool:
        return self.finish_reason is not None


class Engine:
    def __init__(
        self,
        weights: ModelWeights,
        max_batch: int = 8,
        max_len: int = 2048,
        kv: KVScheme = FP32,
        eos_token_ids: tuple[int, ...] = (),
        speculator: Speculator | None = None,
        prefill_tokens: int = PREFILL_TOKENS,
        prefix_cache_bytes: int = PREFIX_CACHE_BYTES,
        kv_blocks: int | None = None,
    ):
        self.speculator, self.prefill_tokens = speculator, prefill_tokens
        self.max_len, self.max_batch = max_len, max_batch
        self.model = Model(weights, max_len + 1)
        self.cache = cache_for(weights, max_batch, max_len, kv, blocks=kv_blocks)
        kind = mixer_kind(weights.layers)
        if kind and speculator is not None:
            raise LlmpressError(
                f"--draft: a {kind} layer's state cannot be rolled back past refused draft "
                "tokens yet; run this model without --draft"
            )
        # a cached prefix's blocks hold attention's k/v, not the recurrent layers' state
        shared = prefix_cache_bytes and not self.model.nets
        self.prefix = PrefixCache(self.cache, prefix_cache_bytes) if shared else None
        if speculator is not None and speculator.adapt:  # what a check's row costs here
            speculator.row_cost = measure_row_cost(self.model, kv)
        self.free = list(range(max_batch))[::-1]
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # slot -> request
        self.eos = tuple(eos_token_ids)
        self._prefilling: set[int] = set()  # requests in this step's prefill

    def submit(self, request: Request) -> Request:
        if not request.prompt:
            raise ValueError("empty prompt")
        vocab = self.model.w.shape.vocab
        if not all(isinstance(t, int) and 0 <= t < vocab for t in request.prompt):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(request.prompt) + request.params.max_tokens > self.max_len:
            raise ValueError(
                f"prompt ({len(request.prompt)} tokens) + max_tokens "
                f"({request.params.max_tokens}) exceeds the context of {self.max_len} tokens"
            )
        if self._blocks_needed(request) > self.cache.pool.n_blocks:
            raise ValueError(
                f"prompt + max_tokens need {self._blocks_needed(request)} KV-cache blocks, "
                f"more than the pool's {self.cache.pool.n_blocks}; lower max_tokens or "
                "give the cache more blocks"
            )
        if request.params.seed is not None:
            request.generator = torch.Generator().manual_seed(request.params.seed)
        self.waiting.append(request)
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request now (a client went away); its slot is free for the next step."""
        if request.done:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        self._finish(request, "cancelled")

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    def step(self) -> list[Request]:
        """Prefill, then decode once. Returns the requests that received a token."""
        return self.prefill_step() + self.decode_step()

    def prefill_step(self) -> list[Request]:
        """A step's first half: prefill. Returns the requests whose prompts it finished,
        each with its first token (a server sends those before the decode half runs, so
        a new request's first token does not wait for everyone else's next one). Where the
        one-call CPU prefill runs, the running sequences' decode rows join its pass (the
        weights read once a step, not twice) and receive their tokens here too, leaving
        the decode half nothing to do; speculation's single sequence still takes the
        decode half.

        Prefill takes at most `prefill_tokens` prompt tokens a step, in one pass (the
        weights read once for every chunk): first the prompts already being prefilled, then
        waiting ones admitted into free slots. The budget bounds what each running stream
        waits for; where k times as many prompts wait as streams decode, the step takes k
        budgets, since it then holds back fewer streams than it starts (a burst arriving at
        an idle engine is prefilled in one pass, and its streams then decode together). A
        prompt longer than what is left of the budget is cut there and continued next step
        (chunked prefill), so the running sequences' next tokens are never held up behind a
        long prompt, or a long queue.
        A chunk attends to the prompt's earlier chunks exactly as one whole prefill would:
        the fp32 cache holds their k/v; with an int8/int4 cache the request keeps them in
        full precision (Chunk.prefix) until its prompt is cached."""
        streams = sum(1 for r in self.running.values() if r.output)  # decoding
        starts = min(len(self.waiting), len(self.free))  # prompts it could admit
        budget, work = self.prefill_tokens * max(1, starts // max(1, streams)), []
        for req in self.running.values():
            if req.prefilled < len(req.prompt) and budget > 0:
                budget -= self._chunk(req, budget, work)
        for req in list(self.waiting):  # in order; forks wait for their first choice
            if not self.free or budget <= 0:
                break
            if self._awaits_fork(req) or self._awaits_prefix(req):
                continue
            if not self._admit(req):
                break
            self.waiting.remove(req)
            budget -= self._chunk(req, budget, work)
        touched, decoding = [], []
        if work:
            decoding = self._decoding({id(r) for r, _ in work})
            if len(decoding) == 1 and self.speculator is not None:
                decoding = []  # the decode half speculates for it
            chunks = [c for _, c in work]
            last, slots = [r.output[-1] for r in decoding], [r.slot for r in decoding]
            prefilled, decoded = self.model.step(chunks, self.cache, last, slots)
            for (req, chunk), logits in zip(work, prefilled, strict=True):
                req.prefilled += chunk.tokens.shape[0]
                if self.prefix is not None:
                    self._remember(req)
                if req.params.prompt_logprobs:
                    req.prompt_logits.append(logits)
                if req.prefilled == len(req.prompt):
                    forks = self._fork(req)  # before req may finish and free its blocks
                    for r in (req, *forks):
                        self._prefilled(r, logits[-1])
                    touched += [req, *forks]
            if decoded is not None:
                self._emit_rows(decoding, decoded)
        self._prefilling = {id(r) for r, _ in work} | {id(r) for r in decoding}
        return touched + decoding

    def _decoding(self, busy: set[int]) -> list[Request]:
        """The running sequences that take a decode row this step: those whose prompt is
        cached, less the ones in this step's prefill (`busy`: their ids)."""
        return [r for r in self.running.values() if id(r) not in busy and r.output]

    def decode_step(self) -> list[Request]:
        """A step's second half: the next token of every running sequence that did not
        take part in this step's prefill (or one verified speculative step when only one
        runs). Returns the requests that received tokens."""
        busy, self._prefilling = self._prefilling, set()
        decoding = self._decoding(busy)
        if len(decoding) == 1 and self.speculator is not None and self._speculate(decoding[0]):
            return [decoding[0]]
        if decoding:
            last, slots = [r.output[-1] for r in decoding], [r.slot for r in decoding]
            self._emit_rows(decoding, self.model.decode_ids(last, self.cache, slots))
        return decoding

    def _blocks_needed(self, req: Request) -> int:
        """KV-cache blocks a request may come to hold: its prompt and every token it may
        generate (speculation's drafts stay within them)."""
        return self.cache.blocks_for(len(req.prompt) + req.params.max_tokens)

    def _owed(self) -> int:
        """Blocks the running requests may still take: up to their whole length, plus a
        copy of a partly written block they share with a fork (copied on write)."""
        pool, held, bs = self.cache.pool, self.cache.held, self.cache.block
        owed = 0
        for slot, r in self.running.items():
            h = held[slot]
            owed += max(0, self._blocks_needed(r) - len(h))
            owed += bool(h and pool.refs[h[-1]] > 1 and int(self.cache.lengths[slot]) % bs)
        return owed

    def _awaits_fork(self, req: Request) -> bool:
        """Whether req is a later choice whose first choice's prompt is still on its way
        (it will start from that one's cache instead of computing the prompt again)."""
        first = req.fork_of
        return first is not None and not first.done and first.prefilled < len(first.prompt)

    def _awaits_prefix(self, req: Request) -> bool:
        """Whether a running request is still prefilling blocks that req's prompt starts
        with, past those already cached: req then waits for them rather than compute them
        a second time. Requests sharing a system prompt that arrive together compute it
        once, wherever the token budget happens to cut its chunks."""
        if self.prefix is None or req.params.prompt_logprobs:  # echo takes nothing cached
            return False
        prefilling = [r for r in self.running.values() if r.prefilled < len(r.prompt)]
        if not prefilling:  # most steps: no prompt needs hashing
            return False
        mine = self._keys(req)[: (len(req.prompt) - 1) // self.cache.block]  # as _lookup
        for r in prefilling:
            done = r.prefilled // self.cache.block  # its blocks indexed so far
            if len(mine) <= done:
                continue
            theirs = self._keys(r)
            if len(theirs) > done and theirs[done] == mine[done]:  # chained: all before too
                return True
        return False

    def _keys(self, req: Request) -> list[bytes]:
        if req.keys is None:
            req.keys = block_keys(req.prompt, self.cache.block)
        return req.keys

    def _fork(self, first: Request) -> list[Request]:
        """The waiting later choices of `first` (same prompt), now that its prompt is
        cached: each takes a slot holding every one of its blocks, the partly written last
        one copied when first written, and samples its own first token from the same
        logits. A choice with no room now waits, and is admitted as any prompt is."""
        forks, bs = [], self.cache.block
        for req in [r for r in self.waiting if r.fork_of is first]:
            held = len(self.cache.held[first.slot])
            copies = 2 if len(req.prompt) % bs else 0  # its own copy, and first's
            if not self.free or (
                self._blocks_needed(req) - held + copies > self.cache.pool.available - self._owed()
            ):
                break
            self.waiting.remove(req)
            req.slot = self.free.pop()
            self.running[req.slot] = req
            self.cache.fork(first.slot, req.slot)
            req.prefilled = len(req.prompt)
            if self.prefix is not None:  # its prompt supplied whole, none computed
                self.prefix.count(len(req.prompt), len(req.prompt))
            forks.append(req)
        return forks

    def _admit(self, req: Request) -> bool:
        """Give the next waiting request a slot and its cached prefix when the pool can
        hold everything it and the running requests may still need (nobody then ever runs
        out of blocks mid-sequence); False: it waits."""
        pool = self.cache.pool
        owed = self._owed()
        blocks, kv = self._lookup(req)
        unheld = sum(1 for b in blocks if pool.refs[b] == 0)  # taken from the evictable ones
        if self._blocks_needed(req) - len(blocks) + unheld > pool.available - owed:
            return False
        req.slot = self.free.pop()
        self.running[req.slot] = req
        if self.prefix is not None:  # counted once, when admitted, however long it waited
            self.prefix.count(len(req.prompt), len(blocks) * self.cache.block)
        if blocks:
            self.cache.share(req.slot, blocks)
            req.prefilled = len(blocks) * self.cache.block
            req.prompt_kv = kv  # a quantized cache: the rest attends in full precision
        elif self.prefix is not None and self.prefix.needs_copies:
            req.prompt_kv = [] if len(req.prompt) >= self.cache.block else None
        return True

    def _lookup(self, req: Request) -> tuple[list[int], list | None]:
        """The cached blocks a newly admitted prompt may start from (at least its last
        token is computed: it gives the first reply token's logits). Nothing for a prompt
        scored token by token (echo): every one of its tokens' logits is asked for."""
        if self.prefix is None:
            return [], None
        limit = 0 if req.params.prompt_logprobs else len(req.prompt) - 1
        return self.prefix.lookup(req.prompt, limit)

    def _remember(self, req: Request) -> None:
        """Index the full blocks prefilled so far: after every chunk, so that a request
        admitted while a long shared prompt is still being prefilled finds the part
        already done."""
        n = req.prefilled // self.cache.block * self.cache.block
        if n:
            self.prefix.insert(req.slot, req.prompt[:n], req.prompt_kv)

    def _chunk(self, req: Request, budget: int, work: list) -> int:
        """Queue the next chunk of req's prompt (at most `budget` tokens); its size."""
        n = min(budget, len(req.prompt) - req.prefilled)
        tokens = torch.tensor(req.prompt[req.prefilled : req.prefilled + n])
        if n < len(req.prompt) and not self.cache.exact and req.prompt_kv is None:
            req.prompt_kv = []  # a quantized cache: the chunks keep the prompt's own k/v
        chunk = Chunk(tokens, req.slot, req.prefilled, req.params.prompt_logprobs, req.prompt_kv)
        work.append((req, chunk))
        return n

    def _prefilled(self, req: Request, last: torch.Tensor) -> None:
        """The whole prompt is cached: score it where asked, then the first token."""
        p, req.prompt_kv = req.params, None
        if p.prompt_logprobs and req.fork_of is not None and req.fork_of.prompt_logprobs:
            req.prompt_logprobs = list(req.fork_of.prompt_logprobs)  # forked: the same
        elif p.prompt_logprobs:
            logits = torch.cat(req.prompt_logits)
            req.prompt_logits = []
            req.prompt_logprobs = [
                None,
                *token_logprobs(logits[:-1], torch.tensor(req.prompt[1:]), p.logprobs or 0),
            ]
        if p.max_tokens == 0:  # scored, nothing to generate
            self._finish(req, "length")
        else:
            self._emit(req, last)

    def _speculate(self, req: Request) -> bool:
        """One verified step for the only running sequence: the proposer's drafts, the
        target's logits for all of them in one pass, the kept ones and the next token
        emitted. False (nothing done) when there is nothing to propose."""
        spec, p = self.speculator, req.params
        spec.begin(req.id)
        length = int(self.cache.lengths[req.slot])
        room = self.cache.rollback_room(req.slot)  # a KIVI group's end, or the context's
        k = min(spec.length(), p.max_tokens - len(req.output) - 1, room - 1)
        if k < 1:
            return False
        context = req.prompt + req.output
        drafts, q = spec.proposer.propose(context, k, p, req.generator)
        if not drafts:
            return False
        tokens = torch.tensor([req.output[-1], *drafts])
        logits = self.model.verify(tokens, self.cache, req.slot)
        kept, token = accept_drafts(logits, drafts, q, p, req.generator)
        spec.record(len(drafts), kept)
        self.cache.lengths[req.slot] = length + 1 + kept  # refused drafts' k/v are dropped
        for i, t in enumerate([*drafts[:kept], token]):
            self._append(req, t, logits[i])
            if req.done:
                break
        return True

    def _emit(self, req: Request, logits: torch.Tensor) -> None:
        self._append(req, sample(logits, req.params, req.generator), logits)

    def _emit_rows(self, reqs: list[Request], logits: torch.Tensor) -> None:
        """_emit of each request's row of logits [B, vocab], the tokens chosen in one call
        where sample_rows can (greedy and temperature-only rows on the CPU); any other row
        through _emit alone (where a failure is its own: ServingEngine)."""
        tokens = sample_rows(logits, [r.params for r in reqs], [r.generator for r in reqs])
        for req, row, token in zip(reqs, logits, tokens, strict=True):
            if token is None:
                self._emit(req, row)
            else:
                self._append(req, token, row)

    def _append(self, req: Request, token: int, logits: torch.Tensor) -> None:
        """`token` joins the output (`logits`: the row it was chosen from)."""
        if req.params.logprobs is not None:
            (record,) = token_logprobs(logits[None], torch.tensor([token]), req.params.logprobs)
            req.logprobs.append(record)
        if req.first_token_at is None:
            req.first_token_at = time.perf_counter()
        req.output.append(token)
        p = req.params
        if not p.ignore_eos and (token in self.eos or token in p.stop_token_ids):
            self._finish(req, "stop")
        elif len(req.output) >= p.max_tokens:
            self._finish(req, "length")

    def _finish(self, req: Request, reason: str) -> None:
        req.finish_reason, req.prompt_kv = reason, None
        req.finished_at = time.perf_counter()
        if req.slot is not None and self.running.get(req.slot) is req:
            del self.running[req.slot]
            self.cache.release(req.slot)
            self.free.append(req.slot)

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[Request]:
        """Run prompts to completion (batched as slots allow)."""
        reqs = [self.submit(Request(list(p), params)) for p in prompts]
        while not self.idle:
            self.step()
        return reqs
