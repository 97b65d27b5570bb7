"""Build the serving stack for an artifact: weights → engine → scheduler → HTTP server."""

from __future__ import annotations

from pathlib import Path

from compress.errors import LlmpressError
from compress.kernels.cpu import set_threads
from compress.model.loading import load_tokenizer, resolve
from compress.runtime.engine import Engine
from compress.runtime.kv_cache import kv_scheme
from compress.runtime.weights import load_weights
from compress.serve.metrics import Metrics
from compress.serve.scheduler import Scheduler
from compress.serve.server import App, make_server


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


def run_server(artifact, host, port, max_batch, max_len, max_queue, kv, threads, model_name, log):
    set_threads(threads)
    app = build_app(artifact, max_batch, max_len, max_queue, kv, model_name)
    try:
        server = make_server(app, host, port)
    except OSError as e:
        app.scheduler.stop()
        raise LlmpressError(f"cannot listen on {host}:{port}: {e.strerror}; pick --port") from e
    log(f"serving {app.model_name} on http://{host}:{server.server_address[1]}/v1 "
        f"(batch {max_batch}, context {max_len}, queue {max_queue})")  # fmt: skip
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        log("shutting down")
    finally:
        server.server_close()
        app.scheduler.stop()
