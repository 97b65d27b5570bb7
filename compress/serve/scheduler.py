"""The one thread that drives the engine; request handlers talk to it through queues.

Handlers `submit` (refused with QueueFull beyond the bound) and read tokens from their
Stream; the loop admits new requests at the next step (continuous batching), pushes each
new token to its stream, and applies cancellations (a client gone) before stepping, so a
slot is free again within one step. A response may be `attach`ed as a Pump: the loop then
runs it after each step (on a Writer's thread while the next step runs), writing a
stream's events or gathering a whole completion's text (compress/serve/pump.py).

A failure is confined to the requests it touches: a request whose token choice raises
fails alone (ServingEngine), a step that raises fails the requests of that step; the
loop, and every other request, go on.
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
import time
from collections import deque

from compress.kernels.cpu import hand_over
from compress.runtime.engine import Engine, Request
from compress.serve.metrics import Metrics
from compress.serve.pump import Pump, Writer

DONE = object()
_NOTHING = object()


class QueueFull(RuntimeError):
    pass


class EngineStopped(RuntimeError):
    pass


class GenerationFailed(RuntimeError):
    """This request could not be generated; `status` is the HTTP answer for it."""

    def __init__(self, message: str, status: int = 500):
        super().__init__(message)
        self.status = status


class ServingEngine(Engine):
    """An Engine whose per-request token choice cannot take the batch down: a request
    whose sampling raises is finished as failed (its slot freed) and the others go on."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failures: dict[int, str] = {}  # request id -> why, until the scheduler reads it

    def fail(self, req: Request, why: str) -> None:
        """End `req` now, freeing its slot, and remember why for its handler."""
        self.failures[req.id] = why
        if req in self.waiting:
            self.waiting.remove(req)
        self._finish(req, "error")

    def _emit(self, req: Request, logits) -> None:
        try:
            super()._emit(req, logits)
        except Exception as e:
            self.fail(req, f"{type(e).__name__}: {e}")


class Stream:
    """What a handler holds: its request and the tokens arriving for it."""

    def __init__(self, request: Request):
        self.request = request
        self.tokens: queue.Queue = queue.Queue()
        self.stopped = False  # ended by one of the client's stop strings
        self.consumed = 0  # output tokens read so far (an EOS included; it has no text)
        self.published = 0  # output tokens put on `tokens` (a verified step adds several)
        self.started = False  # its prompt is cached (counted, its TTFT observed)
        self.failure: GenerationFailed | None = None  # set before DONE when it failed
        self.pump: Pump | None = None  # its response, while the engine's thread writes it
        self._held = _NOTHING  # a token `wait` took off the queue

    def take(self):
        """The next token (or DONE), or None when there is none yet. Never blocks."""
        if self._held is not _NOTHING:
            token, self._held = self._held, _NOTHING
            return token
        try:
            return self.tokens.get_nowait()
        except queue.Empty:
            return None

    def wait(self, timeout: float) -> None:
        """Block until `take` has something to give, or for `timeout` seconds."""
        if self._held is _NOTHING:
            with contextlib.suppress(queue.Empty):
                self._held = self.tokens.get(timeout=timeout)


class Scheduler:
    def __init__(self, engine: ServingEngine, metrics: Metrics, max_queue: int = 64):
        self.engine, self.metrics, self.max_queue = engine, metrics, max_queue
        self.inbox: queue.Queue = queue.Queue()
        self.lock = threading.Lock()
        self.active = 0  # accepted and not yet finished: running, queued, or in the inbox
        self.capacity = len(engine.free) + max_queue
        self.streams: dict[int, Stream] = {}
        self.recent: deque[tuple[float, int]] = deque()  # (time, tokens) for tokens/s
        self.error: BaseException | None = None
        self.pumps: set[Pump] = set()  # attached and not finished
        self._due: set[Pump] = set()  # pumps whose streams got tokens (or ended) since run
        self.writer = Writer(self.pumps)
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="llmpress-engine", daemon=True)

    def start(self) -> Scheduler:
        self._gauges()  # every gauge and counter in /metrics from the start, zeros included
        self._adopt = hand_over()  # the CPU kernels' threads go with the engine
        self.writer.start()
        self.thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        self.thread.join(timeout=10)

    def submit(self, request: Request) -> Stream:
        (stream,) = self.submit_all([request])
        return stream

    def submit_all(self, requests: list[Request]) -> list[Stream]:
        """Queue every request (a request's `n` choices) or none: with fewer places than
        requests left, refuse now, never hang and never serve a part."""
        if self.error is not None or not self.thread.is_alive():
            raise EngineStopped(f"the engine stopped: {self.error!r}")
        with self.lock:  # every slot busy and the queue full: refuse now, never hang
            if self.active + len(requests) > self.capacity:
                with self.metrics.lock:
                    self.metrics.counters["rejected_total"] += 1
                raise QueueFull(f"{self.active} requests running or queued")
            self.active += len(requests)
        streams = [Stream(r) for r in requests]
        for stream in streams:
            self.inbox.put(("submit", stream))
        return streams

    def cancel(self, stream: Stream) -> None:
        self.inbox.put(("cancel", stream))

    def attach(self, pump: Pump) -> bool:
        """Have the loop write `pump`'s response; False when the loop is not running."""
        if self.error is not None or not self.thread.is_alive():
            return False
        self.inbox.put(("pump", pump))
        return True

    def _drain(self, block: bool) -> None:
        while True:
            try:
                op, stream = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
            except queue.Empty:
                return
            block = False
            if op == "submit":
                self.streams[stream.request.id] = stream
                try:
                    self.engine.submit(stream.request)
                except ValueError as e:  # validated by the handler; never let one stop all
                    self._retire(stream, GenerationFailed(f"refused by the engine: {e}", 400))
            elif op == "cancel" and stream.request.id in self.streams:
                self.engine.cancel(stream.request)
                self._retire(stream)
            elif op == "pump":  # `stream` is a Pump: run it now, tokens may be waiting
                self.pumps.add(stream)
                self._due.add(stream)
                for s in stream.streams:
                    s.pump = stream
            self._run_pumps()

    def _retire(self, stream: Stream, failure: GenerationFailed | None = None) -> None:
        """The request is over (finished, cancelled, refused or failed): once."""
        if self.streams.pop(stream.request.id, None) is not None:
            with self.lock:
                self.active -= 1
        stream.failure = failure
        stream.tokens.put(DONE)
        if stream.pump is not None:
            self._due.add(stream.pump)

    def _run_pumps(self) -> None:
        """Write the attached responses' new events (never blocks this thread)."""
        due, self._due = self._due, set()
        self.writer.run(due)

    def _step(self) -> None:
        """One engine step, its prefill's first tokens (and the tokens of the decode rows
        that shared its pass) sent before its decode half runs; if a half raises, its
        requests fail and the loop lives on."""
        for half in (self.engine.prefill_step, self.engine.decode_step):
            try:
                touched = half()
            except Exception as e:
                why = f"{type(e).__name__}: {e}"
                waiting = set(map(id, self.engine.waiting))  # the step never reached these
                failed = [s.request for s in self.streams.values() if id(s.request) not in waiting]
                print(
                    f"llmpress serve: a step failed, failing its requests: {why}", file=sys.stderr
                )
                for req in failed:
                    self.engine.fail(req, why)
                self._publish(failed)
                return
            self._publish(touched)

    def _run(self) -> None:
        try:
            self._adopt()
            while not self._stop.is_set():
                self._drain(block=self.engine.idle)
                if self.engine.idle:
                    self._gauges()  # cancellations may have emptied the engine
                    continue
                self._step()
        except BaseException as e:  # surface to handlers instead of hanging them
            self.error = e
            for stream in list(self.streams.values()):
                stream.tokens.put(DONE)
            raise
        finally:  # the handlers write what is left of their responses
            self.writer.stop()
            for pump in list(self.pumps):
                pump.release()

    def _publish(self, touched: list[Request]) -> None:
        now = time.perf_counter()
        m = self.metrics
        published = 0
        with m.lock:
            for req in touched:
                stream = self.streams.get(req.id)
                why = self.engine.failures.pop(req.id, None)
                if stream is None:
                    continue
                if why is not None:
                    print(f"llmpress serve: request {req.id} failed: {why}", file=sys.stderr)
                    self._retire(stream, GenerationFailed(f"generation failed: {why}"))
                    continue
                if not stream.started:  # its prompt is cached: the first token, if any
                    stream.started = True  # (a long prompt is prefilled over several steps)
                    if req.output:  # a prompt scored with max_tokens 0 has none
                        m.ttft.observe(req.first_token_at - req.submitted)
                    m.counters["requests_total"] += 1
                for token in req.output[stream.published :]:
                    stream.tokens.put(token)
                    stream.published += 1
                    published += 1
                    m.counters["generated_tokens_total"] += 1
                if stream.pump is not None:
                    self._due.add(stream.pump)
                if req.done:
                    if len(req.output) > 1:
                        per = (req.finished_at - req.first_token_at) / (len(req.output) - 1)
                        m.tpot.observe(per)
                    self._retire(stream)
            self.recent.append((now, published))
            while self.recent and now - self.recent[0][0] > 5:
                self.recent.popleft()
            span = max(now - self.recent[0][0], 1e-3) if len(self.recent) > 1 else 5.0
            m.tokens_per_s = sum(n for _, n in self.recent) / span
        self._gauges()
        self._run_pumps()

    def _gauges(self) -> None:
        m = self.metrics
        with m.lock:
            m.gauges["requests_running"] = len(self.engine.running)
            m.gauges["requests_queued"] = len(self.engine.waiting) + self.inbox.qsize()
            m.gauges["kv_cache_slots_in_use"] = self.engine.max_batch - len(self.engine.free)
            pool = self.engine.cache.pool  # blocks held by sequences; indexed, held by none
            m.gauges["kv_cache_blocks_in_use"] = pool.used
            m.gauges["kv_cache_blocks_cached"] = len(pool.cached)
            m.gauges["kv_cache_blocks_total"] = pool.n_blocks
            prefix = self.engine.prefix
            if prefix is not None:  # prompt tokens looked up, and found (not computed)
                m.counters["prompt_tokens_total"] = prefix.prompt_tokens
                m.counters["prefix_cache_hit_tokens_total"] = prefix.hit_tokens
                m.gauges["prefix_cache_hit_rate"] = round(prefix.hit_rate, 4)
                m.gauges["prefix_cache_fp32_bytes"] = prefix.bytes
            spec = self.engine.speculator
            if spec is not None:  # drafted and kept tokens, and the draft length now
                m.counters["speculative_draft_tokens_total"] = spec.proposed
                m.counters["speculative_accepted_tokens_total"] = spec.accepted
                m.gauges["speculative_draft_length"] = spec.k
