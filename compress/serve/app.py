"""Build the serving stack for an artifact: weights → engine → scheduler → HTTP server."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from compress.errors import LlmpressError
from compress.kernels.cpu import set_threads
from compress.model.loading import load_tokenizer, resolve
from compress.runtime.engine import PREFILL_TOKENS, PREFIX_CACHE_BYTES
from compress.runtime.kv_blocks import block_size
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.speculative import check_draft_vocabulary, make_speculator
from compress.runtime.states import mixer_kind
from compress.runtime.weights import load_weights
from compress.serve.metrics import Metrics
from compress.serve.scheduler import Scheduler, ServingEngine
from compress.serve.server import MAX_CONNECTIONS, App, bind_app, make_server

DRAIN_TIMEOUT_S = 120.0
DEFAULT_MAX_LEN = 2048
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def context_len(config: dict, max_len: int | None) -> int:
    """--max-len, checked against the positions the model was trained for
    (max_position_embeddings); when not given, 2048 or the model's context if shorter."""
    limit = config.get("max_position_embeddings")
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 2:
        limit = None  # not stated: nothing to check against
    if max_len is None:
        return min(DEFAULT_MAX_LEN, limit or DEFAULT_MAX_LEN)
    if limit is not None and max_len > limit:
        raise LlmpressError(
            f"--max-len {max_len} is longer than this model's context of {limit} tokens "
            f"(max_position_embeddings in config.json): pass --max-len {limit} or less"
        )
    return max_len


def build_app(
    artifact: str,
    max_batch=8,
    max_len: int | None = None,
    max_queue=64,
    kv=None,
    model_name=None,
    api_key: str | None = None,
    draft: str | None = None,
    prefill_tokens: int | None = None,
    prefix_cache_mb: int | None = None,
    kv_tokens: int | None = None,
) -> App:
    ckpt = resolve(artifact)
    max_len = context_len(ckpt.config, max_len)  # before the weights: fail in a second
    check_draft_vocabulary(draft, ckpt.config)
    tokenizer = load_tokenizer(ckpt)
    weights = load_weights(ckpt)
    kind = mixer_kind(weights.layers)
    if kind and prefix_cache_mb:
        raise LlmpressError(
            "--prefix-cache-mb: cached prompt blocks hold attention's keys and values, not a "
            f"{kind} layer's state, so the prefix cache is off for this model; drop it"
        )
    scheme = kv_scheme(kv, ckpt.config)
    eos = tuple(i for i in (tokenizer.eos_token_id,) if i is not None)
    speculator = None if draft is None else make_speculator(draft, weights, max_len)
    engine = ServingEngine(
        weights,
        max_batch=max_batch,
        max_len=max_len,
        kv=scheme,
        eos_token_ids=eos,
        speculator=speculator,
        prefill_tokens=prefill_tokens or PREFILL_TOKENS,
        prefix_cache_bytes=(
            PREFIX_CACHE_BYTES if prefix_cache_mb is None else prefix_cache_mb * 2**20
        ),
        kv_blocks=None if kv_tokens is None else -(-kv_tokens // block_size(scheme.group)),
    )
    scheduler = Scheduler(engine, Metrics(max_batch), max_queue).start()
    name = model_name or Path(str(ckpt.path)).name
    return App(scheduler, tokenizer, name, max_len, api_key)


def run_server(
    artifact,
    host,
    port,
    max_batch,
    max_len,
    max_queue,
    kv,
    threads,
    model_name,
    log,
    drain_timeout=DRAIN_TIMEOUT_S,
    api_key: str | None = None,
    max_connections: int = MAX_CONNECTIONS,
    draft: str | None = None,
    prefill_tokens: int | None = None,
    prefix_cache_mb: int | None = None,
    kv_tokens: int | None = None,
) -> int | None:
    """Bind first (a taken port fails in a second, not after loading the model), then load
    and serve. SIGTERM or Ctrl-C stops accepting, lets every running request finish (up to
    `drain_timeout` seconds), then returns the signal's number (the CLI exits 128 + it,
    as a process killed by it would)."""
    set_threads(threads)
    try:
        server = make_server(None, host, port, max_connections)
    except OSError as e:
        raise LlmpressError(f"cannot listen on {host}:{port}: {e.strerror}; pick --port") from e
    try:
        app = build_app(
            artifact, max_batch, max_len, max_queue, kv, model_name, api_key, draft,
            prefill_tokens, prefix_cache_mb, kv_tokens,
        )  # fmt: skip
    except BaseException:
        server.server_close()
        raise
    bind_app(server, app)
    stop = threading.Event()
    received: list[int] = []

    def on_signal(signum, _frame) -> None:
        received.append(signum)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in STOP_SIGNALS}
    thread = threading.Thread(target=server.serve_forever, name="llmpress-http", daemon=True)
    thread.start()
    log(f"serving {app.model_name} on http://{host}:{server.server_address[1]}/v1 "
        f"(batch {max_batch}, context {app.max_len}, queue {max_queue}, "
        f"{'API key required' if api_key else 'no API key'})")  # fmt: skip
    try:
        while not stop.wait(0.5):
            if not thread.is_alive():
                break
        log("shutting down: no new requests; finishing the running ones")
        drain(server, app, drain_timeout, log)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        server.server_close()
        app.scheduler.stop()
    return received[0] if received else None


def drain(server, app: App, timeout: float, log) -> None:
    """Stop accepting, then wait until every answered request has been written out."""
    with app.lock:
        app.draining = True
    server.shutdown()  # the accept loop ends; handler threads go on
    server.socket.close()
    deadline = time.monotonic() + timeout
    while app.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    if app.in_flight:
        log(f"{app.in_flight} request(s) still running after {timeout:.0f} s: stopping them")
    else:
        log("all requests finished")
