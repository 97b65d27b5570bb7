"""HTTP front end: OpenAI-compatible routes over the scheduler (standard library only).

One thread per connection (ThreadingHTTPServer); each handler validates its request,
submits it, and either waits for the whole completion or streams server-sent events as
tokens arrive. A client that goes away (a failed write while streaming, a closed socket
while waiting for a whole completion) has its request cancelled at once. Sockets time
out, so a slow or half-sent request cannot hold a thread; every error is JSON.
"""

from __future__ import annotations

import json
import queue
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from compress.runtime.engine import Request
from compress.serve.protocol import (
    BadRequest,
    Parsed,
    chunk_body,
    envelope,
    error_body,
    new_id,
    parse_body,
    parse_request,
    response_body,
)
from compress.serve.scheduler import DONE, EngineStopped, QueueFull, Scheduler

MAX_BODY = 1 << 20
SOCKET_TIMEOUT_S = 30  # a request must arrive, and a client read, within this
CHECK_GONE_S = 0.25  # how often a waiting non-streaming request checks its client is there
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError, OSError)


class App:
    """What every handler shares."""

    def __init__(self, scheduler: Scheduler, tokenizer, model_name: str, max_len: int):
        self.scheduler, self.tokenizer = scheduler, tokenizer
        self.model_name, self.max_len = model_name, max_len
        self.eos = tokenizer.eos_token_id
        self.in_flight = 0  # generation requests being answered (drained before exit)
        self.draining = False
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmpress"
    timeout = SOCKET_TIMEOUT_S
    app: App  # set on the subclass made by make_server

    def log_message(self, format, *args):  # quiet by default
        pass

    def send_error(self, code, message=None, explain=None):
        """The base class answers malformed requests with an HTML page: answer JSON."""
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # unparsed request line: still send a status
            self.request_version = self.protocol_version
        try:
            kind = "not_found_error" if code == 404 else "invalid_request_error"
            self._send(code, error_body(message or self.responses.get(code, ("",))[0], kind))
        except _GONE:
            pass

    def handle(self):
        try:
            super().handle()
        except _GONE:  # the client left or stalled: nothing to answer, nothing to log
            self.close_connection = True

    # -- plumbing ---------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(self, status: int, message: str, kind="invalid_request_error", headers=()):
        self._send(status, error_body(message, kind), headers=headers)

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):X}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    # -- routes -----------------------------------------------------------------------
    def do_GET(self):
        app = self.app
        if self.path == "/health":
            ok = app.scheduler.error is None and app.scheduler.thread.is_alive()
            self._json(200 if ok else 503, {"status": "ok" if ok else "engine stopped"})
        elif self.path == "/v1/models":
            model = {"id": app.model_name, "object": "model", "owned_by": "llmpress"}
            self._json(200, {"object": "list", "data": [model]})
        elif self.path == "/metrics":
            body = app.scheduler.metrics.render().encode()
            self._send(200, body, "text/plain; version=0.0.4")
        else:
            self._error(404, f"no route {self.path}", "not_found_error")

    def do_POST(self):
        app = self.app
        with app.lock:
            if app.draining:
                self._error(503, "server shutting down", "server_error")
                return
            app.in_flight += 1
        try:
            self._post()
        except _GONE:
            raise
        except Exception as e:  # a bug must answer 500 as JSON, not drop the connection
            print(f"llmpress serve: {type(e).__name__}: {e}", file=sys.stderr)
            self._error(500, f"internal error: {type(e).__name__}", "server_error")
        finally:
            with app.lock:
                app.in_flight -= 1

    def _post(self):
        chat = self.path == "/v1/chat/completions"
        if not chat and self.path != "/v1/completions":
            self._error(404, f"no route {self.path}", "not_found_error")
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY:
            self._error(400, f"Content-Length must be between 0 and {MAX_BODY}")
            return
        app = self.app
        try:
            body = parse_body(self.rfile.read(length))
            parsed = parse_request(body, app.tokenizer, chat, app.max_len, app.model_name)
        except BadRequest as e:
            self._error(400, str(e))
            return
        request = Request(parsed.prompt_ids, parsed.params)
        try:
            stream = app.scheduler.submit(request)
        except EngineStopped as e:
            self._error(503, str(e), "server_error")
            return
        except QueueFull as e:
            self._error(
                429, f"server busy: {e}; retry later", "rate_limit_error", [("Retry-After", "1")]
            )
            return
        if parsed.stream:
            self._stream(parsed, stream)
        else:
            self._complete(parsed, stream)

    # -- generation -------------------------------------------------------------------
    def _pieces(self, parsed: Parsed, stream):
        """Yield text pieces as tokens arrive; stop strings end the request early."""
        tok, app = self.app.tokenizer, self.app
        ids: list[int] = []
        sent = ""
        checked = time.monotonic()
        while True:
            # A non-streaming client writes nothing that could fail: look for a closed
            # socket every quarter second, whether or not tokens are arriving.
            if not parsed.stream and time.monotonic() - checked >= CHECK_GONE_S:
                checked = time.monotonic()
                if self._client_gone():
                    app.scheduler.cancel(stream)
                    raise ConnectionResetError("client closed the connection")
            try:
                token = stream.tokens.get(timeout=CHECK_GONE_S)
            except queue.Empty:
                continue
            if token is DONE:
                break
            if token == app.eos and not stream.request.params.ignore_eos:
                continue
            ids.append(token)
            text = tok.decode(ids, skip_special_tokens=True)
            cut = min((i for s in parsed.stop if (i := text.find(s)) >= 0), default=-1)
            if cut >= 0:
                app.scheduler.cancel(stream)  # frees the slot; the reason is "stop"
                stream.stopped = True
                if cut > len(sent):
                    yield text[len(sent) : cut]
                return
            if text.endswith("\ufffd"):  # a character split across tokens: wait for the rest
                continue
            if len(text) > len(sent):
                yield text[len(sent) :]
                sent = text
        if app.scheduler.error is not None:
            raise RuntimeError(f"engine failed: {app.scheduler.error}")

    def _client_gone(self) -> bool:
        """The client closed its socket (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _finish_reason(self, stream) -> str:
        if stream.stopped:
            return "stop"
        return "length" if stream.request.finish_reason == "length" else "stop"

    def _complete(self, parsed: Parsed, stream) -> None:
        try:
            text = "".join(self._pieces(parsed, stream))
        except RuntimeError as e:
            self._error(500, str(e), "server_error")
            return
        req = stream.request
        rid = new_id(parsed.chat)
        out = response_body(
            parsed, rid, text, self._finish_reason(stream), len(req.prompt), len(req.output)
        )
        self._json(200, out)

    def _stream(self, parsed: Parsed, stream) -> None:
        rid = new_id(parsed.chat)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()

        def event(obj) -> None:
            self._chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

        try:
            first = True
            if parsed.chat:
                event(chunk_body(parsed, rid, None, None, first=True))
                first = False
            for piece in self._pieces(parsed, stream):
                event(chunk_body(parsed, rid, piece, None, first))
                first = False
            event(chunk_body(parsed, rid, None, self._finish_reason(stream), first))
            if parsed.include_usage:
                req = stream.request
                n, p = len(req.output), len(req.prompt)
                usage = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
                obj = "chat.completion.chunk" if parsed.chat else "text_completion"
                event({**envelope(parsed, rid, obj, []), "usage": usage})
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        except _GONE:
            self.app.scheduler.cancel(stream)  # the client left: free its slot now
            self.close_connection = True
        except RuntimeError:
            self.close_connection = True


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when many clients connect at
    # once (seen in the load test): every request must be answered, served or 429.
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        """One line, not a traceback, for what escapes a handler."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, _GONE):
            print(f"llmpress serve: {client_address[0]}: {exc!r}", file=sys.stderr)


def make_server(app: App | None, host: str, port: int) -> Server:
    """Bind now (a taken port fails before the model loads); `bind_app` attaches the app."""
    handler = type("BoundHandler", (Handler,), {"app": app})
    return Server((host, port), handler)


def bind_app(server: Server, app: App) -> None:
    server.RequestHandlerClass.app = app
