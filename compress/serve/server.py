"""HTTP front end: OpenAI-compatible routes over the scheduler (standard library only).

One thread per connection (ThreadingHTTPServer), at most `max_connections` at once; each
handler validates its request, submits it, and either waits for the whole completion or
streams server-sent events as tokens arrive. A client that goes away (a failed write
while streaming, a closed socket while waiting for a whole completion) has its request
cancelled at once. A request must arrive whole within REQUEST_DEADLINE_S of its first
byte, so a client trickling bytes cannot hold a thread. A response to a request whose
body was not read closes the connection: leftover bytes are never parsed as a request.
Every error is JSON.
"""

from __future__ import annotations

import hmac
import io
import ipaddress
import itertools
import json
import select
import socket
import sys
import threading
import time
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from compress.errors import LlmpressError
from compress.runtime.engine import Request
from compress.serve.detokenize import Detokenizer
from compress.serve.protocol import (
    BadRequest,
    Parsed,
    choice_body,
    chunk_body,
    envelope,
    error_body,
    logprobs_body,
    new_id,
    parse_body,
    parse_request,
    response_body,
)
from compress.serve.pump import Pump
from compress.serve.scheduler import (
    DONE,
    EngineStopped,
    GenerationFailed,
    QueueFull,
    Scheduler,
    Stream,
)

MAX_BODY = 1 << 20
SOCKET_TIMEOUT_S = 30  # the longest wait for a request's first byte, or for a client's read
# From a request's first byte to its last. The largest body (MAX_BODY) arrives in 8 s at
# 1 Mbit/s; a client that sends a byte every few seconds (slowloris) is cut off here.
REQUEST_DEADLINE_S = 10.0
# Threads one server may spend on connections. Requests beyond --max-batch + --max-queue
# get 429 anyway; the cap bounds idle keep-alive and slow connections.
MAX_CONNECTIONS = 256
LINGER_S = 1.0  # after an early error, drop what the client still sends for this long
LINGER_BYTES = 4 * MAX_BODY
CHECK_GONE_S = 0.25  # how often a waiting non-streaming request checks its client is there
_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError, OSError)


class RequestTooSlow(Exception):
    """The request did not arrive whole within its deadline: answered 408, then closed.
    Not an OSError, so that handlers do not mistake it for a client that left."""


class App:
    """What every handler shares."""

    def __init__(
        self, scheduler: Scheduler, tokenizer, model_name: str, max_len: int, api_key=None
    ):
        self.scheduler, self.tokenizer = scheduler, tokenizer
        self.model_name, self.max_len = model_name, max_len
        self.api_key: str | None = api_key
        self.eos = tokenizer.eos_token_id
        self.in_flight = 0  # generation requests being answered (drained before exit)
        self.draining = False
        self.lock = threading.Lock()


class _DeadlineReader(io.RawIOBase):
    """The socket as a handler reads it. Each read waits at most `idle` seconds; from a
    request's first byte, every byte of it must come before `deadline`."""

    def __init__(self, sock: socket.socket, idle: float, limit: float):
        self.sock, self.idle, self.limit = sock, idle, limit
        self.deadline: float | None = None  # None: between requests

    def readable(self) -> bool:
        return True

    def readinto(self, buf) -> int:
        wait = self.idle
        if self.deadline is not None:
            wait = min(wait, self.deadline - time.monotonic())
            if wait <= 0:
                raise RequestTooSlow(f"the request did not arrive within {self.limit:g} s")
        self.sock.settimeout(wait)
        try:
            n = self.sock.recv_into(buf)
        except TimeoutError:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                raise RequestTooSlow(
                    f"the request did not arrive within {self.limit:g} s"
                ) from None
            raise
        finally:
            self.sock.settimeout(self.idle)  # writes keep the idle timeout
        if n and self.deadline is None:
            self.deadline = time.monotonic() + self.limit
        return n

    def request_read(self) -> None:
        """The whole request is in: the next one's clock starts at its first byte."""
        self.deadline = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "llmpress"
    timeout = SOCKET_TIMEOUT_S
    request_deadline = REQUEST_DEADLINE_S
    app: App  # set on the subclass made by make_server

    def log_message(self, format, *args):  # quiet by default
        pass

    def setup(self):
        super().setup()
        self.rfile.close()
        self._reader = _DeadlineReader(self.connection, self.timeout, self.request_deadline)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self):
        # What send_error needs when a request dies before its request line is parsed.
        self.requestline, self.command = "", ""
        self.request_version = self.default_request_version
        self._unread = True  # the body (if any) is not read: an answer now closes
        super().handle_one_request()

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        lengths = [v.strip() for v in self.headers.get_all("Content-Length") or ["0"]]
        self._unread = "Transfer-Encoding" in self.headers or lengths != ["0"]
        return True

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
        except RequestTooSlow as e:
            self.send_error(408, f"{e}: send the request at once")
        except _GONE:  # the client left or stalled: nothing to answer, nothing to log
            self.close_connection = True

    def finish(self):
        super().finish()
        if self._unread:
            _linger(self.connection)

    # -- plumbing ---------------------------------------------------------------------
    def _send(self, status: int, body: bytes, ctype="application/json", headers=()):
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        if self._unread:  # what follows on this connection cannot be framed: close it
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def _json(self, status: int, obj) -> None:
        self._send(status, json.dumps(obj).encode())

    def _error(
        self, status: int, message: str, kind="invalid_request_error", headers=(), code=None
    ):
        self._send(status, error_body(message, kind, code), headers=headers)

    def _authorized(self) -> bool:
        """With --api-key, /v1 routes and /metrics need `Authorization: Bearer KEY`;
        answers 401 (OpenAI's shape) when it is missing or wrong."""
        key = self.app.api_key
        if key is None or not (self.path.startswith("/v1") or self.path == "/metrics"):
            return True
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(
            given.strip().encode("latin-1", "replace"), key.encode()
        ):
            return True
        message = "missing or incorrect API key: send `Authorization: Bearer <--api-key>`"
        headers = [("WWW-Authenticate", "Bearer")]
        self._error(401, message, "invalid_request_error", headers, code="invalid_api_key")
        return False

    def _body_length(self) -> int:
        """Content-Length, when it alone frames the body; anything ambiguous is refused."""
        if "Transfer-Encoding" in self.headers:
            raise BadRequest("Transfer-Encoding is not supported: send a Content-Length")
        values = self.headers.get_all("Content-Length") or ["0"]
        if len(values) > 1 or not values[0].strip().isdigit():
            raise BadRequest("send exactly one Content-Length, a plain number of bytes")
        length = int(values[0])
        if length > MAX_BODY:
            raise BadRequest(f"Content-Length {length} is over the limit of {MAX_BODY} bytes", 413)
        return length

    # -- routes -----------------------------------------------------------------------
    def do_GET(self):
        app = self.app
        if not self._unread:
            self._reader.request_read()
        if not self._authorized():
            return
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
        except (*_GONE, RequestTooSlow):
            raise
        except Exception as e:  # a bug must answer 500 as JSON, not drop the connection
            print(f"llmpress serve: {type(e).__name__}: {e}", file=sys.stderr)
            self._error(500, f"internal error: {type(e).__name__}", "server_error")
        finally:
            with app.lock:
                app.in_flight -= 1

    def _post(self):
        chat = self.path == "/v1/chat/completions"
        if not self._authorized():
            return
        if not chat and self.path != "/v1/completions":
            self._error(404, f"no route {self.path}", "not_found_error")
            return
        app = self.app
        try:
            raw = self.rfile.read(self._body_length())
            self._unread = False
            self._reader.request_read()
            body = parse_body(raw)
            parsed = parse_request(body, app.tokenizer, chat, app.max_len, app.model_name)
        except BadRequest as e:
            self._error(e.status, str(e), code=e.code)
            return
        seed = parsed.params.seed  # choice i samples with seed + i: distinct, reproducible
        seeds = [None if seed is None else seed + i for i in range(parsed.n)]
        requests = [Request(parsed.prompt_ids, replace(parsed.params, seed=s)) for s in seeds]
        for later in requests[1:]:  # computed once: the others fork its cached prompt
            later.fork_of = requests[0]
        try:
            streams = app.scheduler.submit_all(requests)
        except EngineStopped as e:
            self._error(503, str(e), "server_error")
            return
        except QueueFull as e:
            self._error(
                429, f"server busy: {e}; retry later", "rate_limit_error", [("Retry-After", "1")]
            )
            return
        try:
            if parsed.stream:
                self._stream(parsed, streams)
            else:
                self._complete(parsed, streams)
        finally:  # a failed or abandoned choice frees the others' slots too
            for stream in streams:
                if not stream.request.done:
                    app.scheduler.cancel(stream)

    # -- generation -------------------------------------------------------------------
    def _pieces(self, parsed: Parsed, stream: Stream):
        """Yield text pieces as tokens arrive, or `stream` itself when its next token is
        not there yet (the thread running this waits, or runs it again later); stop
        strings end the request early."""
        app = self.app
        detok = Detokenizer(app.tokenizer)
        text, sent = "", 0  # text so far; characters of it yielded
        longest = max(map(len, parsed.stop), default=0)
        while True:
            token = stream.take()
            if token is None:
                yield stream
                continue
            if token is DONE:
                break
            stream.consumed += 1  # EOS too: its logprob is reported, its text is not
            if token == app.eos and not stream.request.params.ignore_eos:
                continue
            piece = detok.push(token)
            if not piece:  # a character split across tokens: wait for the rest
                continue
            start = max(len(text) - longest + 1, 0)  # a stop may begin in earlier text
            text += piece
            cut = min((i for s in parsed.stop if (i := text.find(s, start)) >= 0), default=-1)
            if cut >= 0:
                app.scheduler.cancel(stream)  # frees the slot; the reason is "stop"
                stream.stopped = True
                if cut > sent:
                    yield text[sent:cut]
                return
            yield text[sent:]
            sent = len(text)
        if stream.failure is not None:
            raise stream.failure
        if app.scheduler.error is not None:
            raise GenerationFailed(f"engine failed: {app.scheduler.error}")

    def _run_body(self, body, streams: list[Stream]) -> None:
        """Run a response body (a generator of bytes to write, or the Stream whose next
        token it needs): on the engine's thread while the socket takes every write at
        once, then (a slow client, or no engine to attach to) on this one."""
        pump = Pump(body, self.connection, streams)
        if Pump.usable(self.connection) and self.app.scheduler.attach(pump):
            while not pump.handed.wait(1.0):  # the engine's thread runs it; wait for it
                if not self.app.scheduler.thread.is_alive():
                    break  # (it released every pump as it stopped; never hang here)
            if pump.done:
                return
            if pump.error is not None:
                raise pump.error
            self.wfile.write(pump.left)  # the client was slow: write the rest here
        for item in body:
            if isinstance(item, Stream):
                item.wait(CHECK_GONE_S)
            else:
                self.wfile.write(item)

    def _client_gone(self) -> bool:
        """The client closed its socket (readable with nothing to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    def _finish_reason(self, stream: Stream) -> str:
        if stream.stopped:
            return "stop"
        return "length" if stream.request.finish_reason == "length" else "stop"

    def _texts(self, parsed: Parsed, streams: list[Stream], texts: list[str]):
        """A whole completion's body: each choice's text into `texts`, nothing written.
        Such a client writes nothing that could fail, so whether it is still there is
        looked at every quarter second: gone, its requests are cancelled."""
        checked = time.monotonic()
        for stream in streams:
            parts = []
            for piece in self._pieces(parsed, stream):
                if not isinstance(piece, Stream):
                    parts.append(piece)
                    continue
                if time.monotonic() - checked >= CHECK_GONE_S:
                    checked = time.monotonic()
                    if self._client_gone():
                        raise ConnectionResetError("client closed the connection")
                yield piece
            texts.append("".join(parts))

    def _complete(self, parsed: Parsed, streams: list[Stream]) -> None:
        texts: list[str] = []
        try:
            self._run_body(self._texts(parsed, streams, texts), streams)
        except GenerationFailed as e:
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            self._error(e.status, str(e), kind)
            return
        choices, generated = [], 0
        for index, (stream, text) in enumerate(zip(streams, texts, strict=True)):
            req = stream.request
            ids, records = req.output[: stream.consumed], req.logprobs[: stream.consumed]
            if parsed.echo:
                text = parsed.prompt_text + text
                scored = req.prompt_logprobs or [None] * len(req.prompt)
                ids, records = req.prompt + ids, scored + records
            logprobs = logprobs_body(parsed, self.app.tokenizer, ids, records)
            choices.append(choice_body(parsed, index, text, self._finish_reason(stream), logprobs))
            generated += len(req.output)
        out = response_body(parsed, new_id(parsed.chat), choices, len(parsed.prompt_ids), generated)
        self._json(200, out)

    def _stream(self, parsed: Parsed, streams: list[Stream]) -> None:
        """Server-sent events, one choice after another (each event names its choice's
        index; the others keep generating meanwhile), then usage over all of them."""
        rid = new_id(parsed.chat)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            self._run_body(self._events(parsed, rid, streams), streams)
        except _GONE:
            self.close_connection = True  # the client left: _post frees every slot

    def _events(self, parsed: Parsed, rid: str, streams: list[Stream]):
        """The streamed body after the headers: chunk bytes (or a Stream to wait for)."""

        def event(obj) -> bytes:
            return _chunk(b"data: " + json.dumps(obj).encode() + b"\n\n")

        try:
            for index, stream in enumerate(streams):
                yield from self._choice_events(parsed, rid, stream, index, event)
            if parsed.include_usage:
                n = sum(len(s.request.output) for s in streams)
                p = len(parsed.prompt_ids)
                usage = {"prompt_tokens": p, "completion_tokens": n, "total_tokens": p + n}
                obj = "chat.completion.chunk" if parsed.chat else "text_completion"
                yield event({**envelope(parsed, rid, obj, []), "usage": usage})
        except GenerationFailed as e:  # the status line is sent: say so in the stream
            self.close_connection = True
            yield event(json.loads(error_body(str(e), "server_error")))
        yield _chunk(b"data: [DONE]\n\n") + _chunk(b"")

    def _choice_events(self, parsed: Parsed, rid: str, stream: Stream, index: int, event):
        req, tok = stream.request, self.app.tokenizer
        first = True
        if parsed.chat:
            yield event(chunk_body(parsed, rid, None, None, first=True, index=index))
            first = False
        sent = offset = 0  # output tokens whose logprobs went out; text sent
        pieces = self._pieces(parsed, stream)
        if parsed.echo:  # the prompt first, with its logprobs once the prefill made them
            piece = next(pieces, None)
            while isinstance(piece, Stream):
                yield piece
                piece = next(pieces, None)
            scored = req.prompt_logprobs or [None] * len(req.prompt)
            lp = logprobs_body(parsed, tok, req.prompt, scored)
            yield event(chunk_body(parsed, rid, parsed.prompt_text, None, first, lp, index))
            offset, first = len(parsed.prompt_text), False
            pieces = itertools.chain([] if piece is None else [piece], pieces)
        for piece in pieces:
            if isinstance(piece, Stream):
                yield piece
                continue
            ids = req.output[sent : stream.consumed]
            lp = logprobs_body(parsed, tok, ids, req.logprobs[sent : stream.consumed], offset)
            sent, offset = stream.consumed, offset + len(piece)
            yield event(chunk_body(parsed, rid, piece, None, first, lp, index))
            first = False
        rest = req.output[sent : stream.consumed]  # an EOS has no text, only its logprob
        lp = logprobs_body(parsed, tok, rest, req.logprobs[sent : stream.consumed], offset)
        finish = self._finish_reason(stream)
        yield event(chunk_body(parsed, rid, None, finish, first, lp if rest else None, index))


def _chunk(data: bytes) -> bytes:
    """`data` as one chunk of a chunked body (empty: the last chunk)."""
    return f"{len(data):X}\r\n".encode() + data + b"\r\n"


def _linger(sock: socket.socket) -> None:
    """Stop writing, then drop (never parse) what the client still sends, for at most
    LINGER_S: closing with unread bytes would reset the connection and could destroy
    the error answer before the client reads it."""
    end = time.monotonic() + LINGER_S
    dropped = 0
    try:
        sock.shutdown(socket.SHUT_WR)
        while dropped < LINGER_BYTES and (left := end - time.monotonic()) > 0:
            sock.settimeout(left)
            chunk = sock.recv(65536)
            if not chunk:
                return
            dropped += len(chunk)
    except OSError:
        pass


_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Retry-After: 1\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s"
)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog of 5 resets connections when many clients connect at
    # once (seen in the load test): every request must be answered, served or 429.
    request_queue_size = 1024
    max_connections = MAX_CONNECTIONS

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.connections = 0
        self._count_lock = threading.Lock()

    def process_request(self, request, client_address):
        """A thread per connection, up to max_connections; past it, 503 with no thread."""
        with self._count_lock:
            full = self.connections >= self.max_connections
            if not full:
                self.connections += 1
        if not full:
            super().process_request(request, client_address)
            return
        body = error_body(
            f"server busy: {self.max_connections} connections open; retry later", "server_error"
        )
        try:
            request.setblocking(False)
            request.send(_BUSY % (len(body), body))
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self.connections -= 1

    def handle_error(self, request, client_address):
        """One line, not a traceback, for what escapes a handler."""
        exc = sys.exc_info()[1]
        if not isinstance(exc, _GONE):
            print(f"llmpress serve: {client_address[0]}: {exc!r}", file=sys.stderr)


def make_server(
    app: App | None,
    host: str,
    port: int,
    max_connections: int = MAX_CONNECTIONS,
    request_deadline: float = REQUEST_DEADLINE_S,
) -> Server:
    """Bind now (a taken port fails before the model loads); `bind_app` attaches the app."""
    handler = type("BoundHandler", (Handler,), {"app": app, "request_deadline": request_deadline})
    server = Server((host, port), handler)
    server.max_connections = max_connections
    return server


def bind_app(server: Server, app: App) -> None:
    server.RequestHandlerClass.app = app


def check_api_key(key: str | None) -> None:
    """A key a client can send in a header as given: printable ASCII, no spaces."""
    if key is not None and not (key and key.isascii() and key.isprintable() and " " not in key):
        raise LlmpressError(
            "--api-key (or LLMPRESS_API_KEY) must be a non-empty key of printable ASCII "
            "without spaces"
        )


def is_loopback(host: str) -> bool:
    """Only this machine can reach `host` (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
