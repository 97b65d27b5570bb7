"""`llmpress serve` checked with real clients (the openai package, curl, raw sockets) on
loopback: completions, chat, streaming, bad input, overload, and disconnects."""

import json
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import openai
import pytest

from compress.serve.app import build_app
from compress.serve.pump import Pump
from compress.serve.server import Handler, make_server


@pytest.fixture(scope="module")
def server(artifacts):
    """A server on an ephemeral port: batch 2, queue 1, context 256."""
    app = build_app(str(artifacts["rtn:w4g64"]), max_batch=2, max_len=256, max_queue=1)
    httpd = make_server(app, "127.0.0.1", 0)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield app, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    app.scheduler.stop()


def _client(url):
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _metric(url, name) -> float:
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def _wait_running(url, done, timeout=30.0) -> None:
    """Poll /metrics until the number of running requests satisfies `done`."""
    deadline = time.time() + timeout
    while not done(_metric(url, "llmpress_requests_running")):
        assert time.time() < deadline, "requests_running never reached the expected value"
        time.sleep(0.05)


def test_openai_client_completions_chat_and_streaming(server):
    app, url = server
    client = _client(url)
    assert [m.id for m in client.models.list().data] == [app.model_name]
    done = client.completions.create(
        model=app.model_name, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert done.choices[0].text.strip() and done.usage.completion_tokens == 8
    assert done.choices[0].finish_reason == "length"
    chat = client.chat.completions.create(
        model=app.model_name,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=6,
        temperature=0,
    )
    assert chat.choices[0].message.role == "assistant" and chat.choices[0].message.content
    parts = client.chat.completions.create(
        model=app.model_name,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=6,
        temperature=0,
        stream=True,
    )
    streamed = "".join(p.choices[0].delta.content or "" for p in parts if p.choices)
    assert streamed == chat.choices[0].message.content  # greedy: the same text either way


def test_seeded_sampling_and_stop_strings(server):
    app, url = server
    client = _client(url)
    kw = {"model": app.model_name, "prompt": "Once upon a time", "max_tokens": 12}
    a = client.completions.create(temperature=1.0, top_p=0.9, seed=3, **kw).choices[0].text
    b = client.completions.create(temperature=1.0, top_p=0.9, seed=3, **kw).choices[0].text
    assert a == b
    counted = client.completions.create(
        model=app.model_name, prompt="1, 2, 3, 4,", max_tokens=30, temperature=0, stop=[" 8"]
    )
    assert counted.choices[0].finish_reason == "stop"
    assert " 8" not in counted.choices[0].text and counted.choices[0].text.startswith(" 5")


def test_a_shared_prompt_start_is_computed_once_and_metrics_say_so(server):
    """Two requests whose prompts share 64+ tokens: the second takes them from the prefix
    cache (its reply equal to what it was without), and /metrics counts the hit."""
    app, url = server
    client = _client(url)
    shared = [(7 * i) % 4000 + 100 for i in range(70)]  # token ids: 2 full blocks and more
    hits = _metric(url, "llmpress_prefix_cache_hit_tokens_total")
    first = client.completions.create(
        model=app.model_name, prompt=shared + [11, 12], max_tokens=6, temperature=0
    )
    again = client.completions.create(
        model=app.model_name, prompt=shared + [11, 12], max_tokens=6, temperature=0
    )
    assert again.choices[0].text == first.choices[0].text
    assert _metric(url, "llmpress_prefix_cache_hit_tokens_total") - hits == 64
    assert 0 < _metric(url, "llmpress_prefix_cache_hit_rate") <= 1
    assert _metric(url, "llmpress_kv_cache_blocks_cached") >= 2  # kept, held by nobody


def test_a_prompt_prefilled_over_several_steps_counts_its_first_token(server):
    """A prompt cut into chunks of 16 tokens is cached four steps after it arrived; its
    request and its time to first token are still counted once each."""
    app, url = server
    engine = app.scheduler.engine
    budget = engine.prefill_tokens
    names = ("llmpress_time_to_first_token_seconds_count", "llmpress_requests_total")
    before = [_metric(url, n) for n in names]
    engine.prefill_tokens = 16
    try:
        _client(url).completions.create(
            model=app.model_name, prompt=[(5 * i) % 4000 + 100 for i in range(60)],
            max_tokens=3, temperature=0,
        )  # fmt: skip
    finally:
        engine.prefill_tokens = budget
    assert [_metric(url, n) - b for n, b in zip(names, before, strict=True)] == [1, 1]


def test_a_new_requests_first_token_is_sent_before_the_steps_decode(server, monkeypatch):
    """The scheduler publishes a step's prefill before it runs the step's decode half, so
    a request's time to first token does not include everyone else's next token."""
    app, url = server
    engine = app.scheduler.engine
    seen, real = [], engine.decode_step

    def spy():
        seen.extend(s.published for s in app.scheduler.streams.values())
        return real()

    monkeypatch.setattr(engine, "decode_step", spy)
    _client(url).completions.create(
        model=app.model_name, prompt="Hello", max_tokens=3, temperature=0
    )
    assert seen[:1] == [1]  # the first decode half: the first token already published


def test_ignore_eos_generates_max_tokens(server):
    """A load test's requests all run their length (vLLM's and llama.cpp's extension)."""
    app, url = server
    client = _client(url)
    ask = {
        "model": app.model_name,
        "messages": [{"role": "user", "content": "Answer with one word: is the sky blue?"}],
    }
    ask.update(max_tokens=120, temperature=0)
    short = client.chat.completions.create(**ask)
    assert short.choices[0].finish_reason == "stop" and short.usage.completion_tokens < 120
    full = client.chat.completions.create(**ask, extra_body={"ignore_eos": True})
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 120
    assert full.choices[0].message.content.startswith(short.choices[0].message.content)


def test_curl_streams_server_sent_events(server):
    _, url = server
    curl = shutil.which("curl")
    assert curl, "curl is needed for this test (apt install curl)"
    body = json.dumps({"prompt": "Hello", "max_tokens": 4, "stream": True, "temperature": 0})
    out = subprocess.run(
        [curl, "-sN", url + "/v1/completions", "-d", body],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    events = [ln[6:] for ln in out.splitlines() if ln.startswith("data: ")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"][0]["finish_reason"] == "length"


def _events_of(body: bytes) -> list:
    """A chunked server-sent-events body's events, without their id and time."""
    data, out = body, []
    while True:
        size, _, data = data.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            return out
        line, data = data[:n], data[n + 2 :]
        assert line.startswith(b"data: ")
        event = line[6:].strip()
        out.append(event.decode() if event == b"[DONE]" else json.loads(event))
        if isinstance(out[-1], dict):
            out[-1].pop("id"), out[-1].pop("created")


def test_the_engine_writes_streams_and_hands_a_slow_client_back(server, monkeypatch):
    """A stream's events are written by the engine's thread while the socket takes them;
    a client that does not read (a full socket) gets the rest from its handler thread,
    the same bytes as a client that reads at once."""
    _, url = server
    ends, real = [], Pump.run

    def spy(pump):
        again = real(pump)
        if not again:
            ends.append((pump.done, len(pump.left), pump.error))
        return again

    monkeypatch.setattr(Pump, "run", spy)
    setup = Handler.setup

    def small_buffer(handler):  # the socket holds a few kB, as with a client far away
        setup(handler)
        handler.connection.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)

    prompt = "The river crossing grew into a market town. " * 22  # ~220 tokens
    body = json.dumps(
        {
            "prompt": prompt,
            "max_tokens": 6,
            "stream": True,
            "temperature": 0,
            "echo": True,
            "logprobs": 20,
        }
    ).encode()
    request = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body
    host, port = url.removeprefix("http://").split(":")
    fetched = len(ends)

    def settled() -> None:  # the spy records after the pump's last write returns
        deadline = time.monotonic() + 10
        while len(ends) < fetched and time.monotonic() < deadline:
            time.sleep(0.01)

    def fetch(read_after: float) -> bytes:
        nonlocal fetched
        fetched += 1
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 2048)  # a small window
        sock.settimeout(60)
        sock.connect((host, int(port)))
        sock.sendall(request)
        time.sleep(read_after)
        data = b""
        while not data.endswith(b"\r\n0\r\n\r\n"):
            chunk = sock.recv(65536)
            assert chunk, "the server closed the stream before its last chunk"
            data += chunk
        sock.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200")
        settled()
        return rest

    fast = _events_of(fetch(0.0))
    assert ends[-1] == (True, 0, None)  # written whole by the engine's thread
    whole = json.loads(body)
    whole["stream"] = False
    req = urllib.request.Request(url + "/v1/completions", json.dumps(whole).encode())
    answer = json.loads(urllib.request.urlopen(req, timeout=60).read())
    fetched += 1
    settled()
    assert len(ends) == fetched and ends[-1] == (True, 0, None)  # gathered there too
    streamed = "".join(e["choices"][0]["text"] for e in fast if isinstance(e, dict))
    assert answer["choices"][0]["text"] == streamed
    monkeypatch.setattr(Handler, "setup", small_buffer)
    slow = _events_of(fetch(1.5))
    assert ends[-1][0] is False and ends[-1][1] > 0  # the socket filled: handed back
    assert slow == fast and fast[-1] == "[DONE]"
    assert len(fast[0]["choices"][0]["logprobs"]["tokens"]) > 150  # the echoed prompt


@pytest.mark.parametrize(
    ("body", "status", "needle"),
    [
        (b"{not json", 400, "not valid JSON"),
        (b'{"prompt": "x", "bogus": 1}', 400, "unknown field(s): bogus"),
        (b'{"prompt": "x", "temperature": -1}', 400, "`temperature` must be between"),
        (b'{"prompt": "' + b"word " * 300 + b'", "max_tokens": 10}', 400, "context of 256"),
        (b"[1, 2]", 400, "JSON object"),
        (b'{"prompt": "x", "seed": 18446744073709551616}', 400, "`seed` must be between"),
        (b'{"prompt": "x", "seed": -1}', 400, "`seed` must be between"),
        (b'{"prompt": "a\\ud800b"}', 400, "lone surrogate"),
        (b'{"prompt": "x", "ignore_eos": 1}', 400, "`ignore_eos` must be true or false"),
    ],
)
def test_bad_requests_get_400_and_the_server_lives_on(server, body, status, needle):
    _, url = server
    req = urllib.request.Request(url + "/v1/completions", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == status
    message = json.loads(e.value.read())["error"]["message"]
    assert needle in message
    if "context" in needle:  # both numbers: the prompt's tokens and the context
        assert ("tokens" in message and "301" in message) or "300" in message
    assert urllib.request.urlopen(url + "/health", timeout=10).status == 200


def _raw_stream(url, max_tokens):
    """A greedy stream (its length is known: sampled at the default temperature, it could
    end early on an end-of-text token, as one run of the SIGTERM test did)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    body = {"prompt": "Count: 1, 2, 3", "max_tokens": max_tokens, "stream": True}
    body = json.dumps({**body, "temperature": 0})
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    return sock


def test_overload_is_refused_with_429_and_nothing_is_lost(server):
    """Capacity: 2 running + 1 queued. Six concurrent requests: every one is answered,
    served (200) or refused (429 with Retry-After), none hangs."""
    _, url = server
    results = []

    def call():
        body = json.dumps({"prompt": "Tell me a story", "max_tokens": 40, "temperature": 0})
        req = urllib.request.Request(url + "/v1/completions", data=body.encode(), method="POST")
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                results.append((r.status, None))
        except urllib.error.HTTPError as e:
            results.append((e.code, e.headers.get("Retry-After")))

    threads = [threading.Thread(target=call) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert len(results) == 6
    served = [s for s, _ in results if s == 200]
    refused = [r for s, r in results if s == 429]
    assert len(served) + len(refused) == 6
    assert len(served) >= 3 and refused and all(r == "1" for r in refused)


def test_a_client_that_disconnects_frees_its_slot(server):
    _, url = server
    sock = _raw_stream(url, max_tokens=200)
    sock.recv(4096)  # headers and the first events arrive
    _wait_running(url, lambda n: n >= 1)
    sock.close()
    _wait_running(url, lambda n: n == 0)
    assert _metric(url, "llmpress_kv_cache_slots_in_use") == 0
    assert _metric(url, "llmpress_kv_cache_blocks_in_use") == 0
    generated = _metric(url, "llmpress_generated_tokens_total")
    time.sleep(0.5)
    assert _metric(url, "llmpress_generated_tokens_total") == generated  # nothing runs on


def test_short_requests_do_not_wait_for_long_ones(server):
    """Continuous batching: a short request that arrives while a long one runs finishes
    first (it is sent once the long one has streamed its first token, however fast the
    engine decodes)."""
    _, url = server
    finished = {}

    def call(name, max_tokens):
        body = json.dumps({"prompt": "Go on:", "max_tokens": max_tokens, "temperature": 0})
        req = urllib.request.Request(url + "/v1/completions", data=body.encode(), method="POST")
        urllib.request.urlopen(req, timeout=300).read()
        finished[name] = time.perf_counter()

    body = {"prompt": "Go on:", "max_tokens": 240, "temperature": 0, "stream": True}
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode())
    with urllib.request.urlopen(req, timeout=300) as long:
        events = [next(ln for ln in long if ln.startswith(b"data: "))]
        short = threading.Thread(target=call, args=("short", 5))
        short.start()
        events += [ln for ln in long if ln.startswith(b"data: ")]
        finished["long"] = time.perf_counter()
    short.join(timeout=300)
    assert len(events) > 20  # the long one ran on (it did not stop at once)
    assert finished["short"] < finished["long"]


def _raw(url, data: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("raw", "status"),
    [
        (b"GET /health HTTP/1.1\r\nX: " + b"a" * 70000 + b"\r\n\r\n", b" 431 "),
        (b"GET /health HTTP/2.0\r\n\r\n", b" 505 "),
        (b"GET /health HTTP/1.x\r\n\r\n", b" 400 "),
    ],
)
def test_malformed_http_is_answered_in_json(server, raw, status):
    _, url = server
    head, _, body = _raw(url, raw).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/") and status in head.split(b"\r\n")[0]
    assert b"application/json" in head and b"<html" not in body.lower()
    assert json.loads(body)["error"]["message"]


def test_a_stalled_request_times_out_and_frees_its_thread(server):
    _, url = server
    old = Handler.timeout
    Handler.timeout = 1  # read by each new connection's handler
    try:
        host, port = url.removeprefix("http://").split(":")
        start = time.monotonic()
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Length: 100\r\n\r\n{")
            assert sock.recv(65536) == b""  # closed by the server, not by us
        assert time.monotonic() - start < 10
    finally:
        Handler.timeout = old
    assert urllib.request.urlopen(url + "/health", timeout=10).status == 200


def test_a_non_streaming_client_that_disconnects_frees_its_slot(server):
    _, url = server
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=60)
    body = json.dumps({"prompt": "1, 2, 3, 4,", "max_tokens": 240, "temperature": 0})
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    _wait_running(url, lambda n: n >= 1)
    before = _metric(url, "llmpress_generated_tokens_total")
    sock.close()
    _wait_running(url, lambda n: n == 0)
    assert _metric(url, "llmpress_kv_cache_slots_in_use") == 0
    # cancelled long before its 200 tokens
    assert _metric(url, "llmpress_generated_tokens_total") - before < 150


def test_sigterm_lets_running_streams_finish_then_exits(artifacts):
    """`llmpress serve` stops on SIGTERM only after the streams it is writing end with
    [DONE], and exits 143 as a process ended by SIGTERM does (it exited 0)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cmd = [sys.executable, "-m", "compress", "serve", str(artifacts["rtn:w4g64"])]
    cmd += ["--port", str(port), "--max-batch", "2", "--max-len", "256", "--threads", "1"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.time() + 120
        while True:
            try:
                if urllib.request.urlopen(url + "/health", timeout=5).status == 200:
                    break
            except OSError:
                assert proc.poll() is None and time.time() < deadline, proc.stdout.read()
                time.sleep(0.2)
        sock = _raw_stream(url, max_tokens=60)
        received = sock.recv(65536)
        while b"data: " not in received:
            received += sock.recv(65536)
        proc.send_signal(signal.SIGTERM)
        while chunk := sock.recv(65536):
            received += chunk
        sock.close()
        assert proc.wait(timeout=120) == 143  # drained, then the exit status of SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
    assert b"data: [DONE]" in received
    events = [ln for ln in received.split(b"\r\n") if ln.startswith(b"data: {")]
    assert json.loads(events[-1][6:])["choices"][0]["finish_reason"] == "length"
    log = proc.stdout.read()
    assert "all requests finished" in log and "Traceback" not in log


def test_kv_tokens_sizes_the_pool_and_a_request_it_cannot_hold_is_refused(artifacts):
    """`--kv-tokens 64`: two blocks of 32 tokens. A request whose prompt and max_tokens
    need more is answered 400 naming the blocks; one that fits is served, and gives its
    blocks back."""
    app = build_app(str(artifacts["rtn:w4g64"]), max_batch=2, max_len=256, kv_tokens=64)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    try:
        assert _metric(url, "llmpress_kv_cache_blocks_total") == 2
        client = _client(url)
        with pytest.raises(openai.BadRequestError, match="KV-cache blocks"):
            client.completions.create(model=app.model_name, prompt=[5] * 60, max_tokens=8)
        done = client.completions.create(model=app.model_name, prompt=[5] * 20, max_tokens=8)
        assert 1 <= done.usage.completion_tokens <= 8
        assert _metric(url, "llmpress_kv_cache_blocks_in_use") == 0
    finally:
        httpd.shutdown()
        httpd.server_close()
        app.scheduler.stop()
