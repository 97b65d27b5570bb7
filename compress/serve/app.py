"""Build the serving stack for an artifact: weights → engine → scheduler → HTTP server."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

from compress.errors import LlmpressError
from compress.kernels.cpu import set_threads
from compress.model.loading import load_tokenizer, resolve
from compress.runtime.engine import Engine
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.weights import load_weights
from compress.serve.metrics import Metrics
from compress.serve.scheduler import Scheduler
from compress.serve.server import App, bind_app, make_server

DRAIN_TIMEOUT_S = 120.0
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def build_app(artifact: str, max_batch=8, max_len=2048, max_queue=64, kv=None, model_name=None):
    ckpt = resolve(artifact)
    tokenizer = load_tokenizer(ckpt)
    weights = load_weights(ckpt)
    scheme = kv_scheme(kv, ckpt.config)
    eos = tuple(i for i in (tokenizer.eos_token_id,) if i is not None)
    engine = Engine(weights, max_batch=max_batch, max_len=max_len, kv=scheme, eos_token_ids=eos)
    scheduler = Scheduler(engine, Metrics(max_batch), max_queue).start()
    name = model_name or Path(str(ckpt.path)).name
    return App(scheduler, tokenizer, name, max_len)


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
):
    """Bind first (a taken port fails in a second, not after loading the model), then load
    and serve. SIGTERM or Ctrl-C stops accepting, lets every running request finish (up to
    `drain_timeout` seconds), then exits."""
    set_threads(threads)
    try:
        server = make_server(None, host, port)
    except OSError as e:
        raise LlmpressError(f"cannot listen on {host}:{port}: {e.strerror}; pick --port") from e
    try:
        app = build_app(artifact, max_batch, max_len, max_queue, kv, model_name)
    except BaseException:
        server.server_close()
        raise
    bind_app(server, app)
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    thread = threading.Thread(target=server.serve_forever, name="llmpress-http", daemon=True)
    thread.start()
    log(f"serving {app.model_name} on http://{host}:{server.server_address[1]}/v1 "
        f"(batch {max_batch}, context {max_len}, queue {max_queue})")  # fmt: skip
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
