"""`llmpress serve` under the fault battery of issue 32: a request that breaks sampling,
request smuggling, slow clients, a connection flood, authentication, hostile JSON, a
model it does not serve, and contexts past the model's. Real servers on 127.0.0.1, real
clients (the openai package, raw sockets); every wait is bounded to seconds."""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from compress.runtime.engine import Request
from compress.runtime.sampling import SamplingParams
from compress.serve.app import build_app
from compress.serve.scheduler import DONE, GenerationFailed
from compress.serve.server import App, make_server

DEADLINE_S = 1.5  # the request deadline of these servers (the default is 10 s)


def _start(app: App, **kwargs):
    httpd = make_server(app, "127.0.0.1", 0, request_deadline=DEADLINE_S, **kwargs)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


@pytest.fixture(scope="module")
def served():
    """The default model: batch 2, queue 4, context 256."""
    app = build_app("default", max_batch=2, max_len=256, max_queue=4)
    httpd, url = _start(app)
    yield app, url
    httpd.shutdown()
    httpd.server_close()
    app.scheduler.stop()


def _post(url: str, body, path="/v1/completions", headers=None) -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method="POST", headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def _healthy(url: str) -> bool:
    return urllib.request.urlopen(url + "/health", timeout=10).status == 200


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def _exchange(url: str, data: bytes, timeout=10.0) -> bytes:
    """Send raw bytes, read until the server closes the connection."""
    with socket.create_connection(_address(url), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


# -- defect 4: one request stopped the server for everyone ------------------------------


def test_a_tiny_temperature_decodes_greedily_and_the_server_lives(served):
    _, url = served
    greedy = _post(url, {"prompt": "The capital of France is", "max_tokens": 5, "temperature": 0})
    assert greedy[0] == 200
    for t in (1e-300, 5e-324, 1e-20):  # 1e-300 answered 500, then /health was 503 for good
        status, out = _post(
            url, {"prompt": "The capital of France is", "max_tokens": 5, "temperature": t}
        )
        assert status == 200, out
        assert out["choices"][0]["text"] == greedy[1]["choices"][0]["text"]
    assert _healthy(url)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b'{"prompt": "x", "temperature": NaN}', "NaN is not a JSON number"),
        (b'{"prompt": "x", "temperature": 1e400}', "`temperature` must be between"),
        (b'{"prompt": "x", "temperature": -1e-300}', "`temperature` must be between"),
        (b'{"prompt": "x", "top_p": 0}', "`top_p` must be between"),
        (b'{"prompt": "x", "top_p": Infinity}', "Infinity is not a JSON number"),
        (b'{"prompt": "x", "max_tokens": 0}', "`max_tokens` must be between"),
        (b'{"prompt": "x", "max_tokens": 2.5}', "`max_tokens` must be an integer"),
        (b'{"prompt": "x", "top_k": -1}', "`top_k` must be between"),
    ],
)
def test_sampling_parameters_are_checked_up_front(served, body, needle):
    _, url = served
    status, out = _post(url, body)
    assert status == 400 and needle in out["error"]["message"]
    assert _healthy(url)


def test_a_request_whose_sampling_raises_fails_alone(served):
    """The engine's failure for one request (here its random generator is broken, as a
    NaN temperature once broke sampling) fails that request, not its batch neighbour nor
    the server."""
    app, url = served
    ids = app.tokenizer("Once upon a time", add_special_tokens=False).input_ids
    bad = Request(ids, SamplingParams(max_tokens=20, temperature=1.0), generator=object())
    neighbour = {}

    def normal():
        neighbour["answer"] = _post(url, {"prompt": "1, 2, 3,", "max_tokens": 30})

    thread = threading.Thread(target=normal)
    thread.start()
    stream = app.scheduler.submit(bad)
    tokens = []
    while (token := stream.tokens.get(timeout=60)) is not DONE:
        tokens.append(token)
    thread.join(timeout=120)
    assert isinstance(stream.failure, GenerationFailed) and stream.failure.status == 500
    assert "generation failed" in str(stream.failure) and tokens == []
    status, out = neighbour["answer"]
    # the neighbour finishes normally (once, in a loaded full-suite run, its greedy text
    # stopped on EOS after 7 tokens instead of running to 30: not yet explained)
    assert status == 200 and out["choices"][0]["finish_reason"] in ("stop", "length")
    assert out["usage"]["completion_tokens"] >= 1
    assert app.scheduler.thread.is_alive() and _healthy(url)
    assert app.scheduler.engine.free and not app.scheduler.engine.running


def test_a_failing_step_fails_its_requests_and_the_server_goes_on(served, monkeypatch):
    app, url = served
    engine = app.scheduler.engine
    real = engine.model.decode
    calls = []

    def fails_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("injected decode fault")
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.model, "decode", fails_once)
    status, out = _post(url, {"prompt": "Hello", "max_tokens": 5})
    assert status == 500 and out["error"]["type"] == "server_error"
    assert "generation failed: RuntimeError: injected decode fault" in out["error"]["message"]
    status, out = _post(url, {"prompt": "Hello", "max_tokens": 5})
    assert status == 200 and out["usage"]["completion_tokens"] == 5
    assert _healthy(url)


def test_a_stream_that_fails_says_so_in_the_stream(served, monkeypatch):
    app, url = served
    engine = app.scheduler.engine

    def broken(*args, **kwargs):
        raise RuntimeError("injected decode fault")

    monkeypatch.setattr(engine.model, "decode", broken)
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.APIError, match="injected decode fault"):
        for _ in client.completions.create(
            model=app.model_name, prompt="Hello", max_tokens=5, stream=True
        ):
            pass
    monkeypatch.undo()
    assert _post(url, {"prompt": "Hello", "max_tokens": 3})[0] == 200


# -- defect 7: request smuggling --------------------------------------------------------

SMUGGLED = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


@pytest.mark.parametrize(
    ("head", "status"),
    [
        (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2000000\r\n\r\n", b"413"),
        (b"POST /v1/completions HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n", b"400"),
        (
            b"POST /v1/completions HTTP/1.1\r\nContent-Length: 0\r\nContent-Length: 5\r\n\r\n",
            b"400",
        ),
        (b"POST /v1/completions HTTP/1.1\r\nContent-Length: +5\r\n\r\n", b"400"),
        (b"POST /nowhere HTTP/1.1\r\nContent-Length: 4\r\n\r\n", b"404"),
        (b"GET /health HTTP/1.1\r\nContent-Length: 4\r\n\r\n", b"200"),
    ],
)
def test_bytes_after_an_unread_body_are_never_a_request(served, head, status):
    _, url = served
    got = _exchange(url, head + SMUGGLED)
    assert got.count(b"HTTP/1.1 ") == 1, got  # the smuggled POST was answered too
    first = got.split(b"\r\n\r\n")[0]
    assert status in first.split(b"\r\n")[0] and b"Connection: close" in first


def test_keep_alive_still_serves_requests_in_turn(served):
    _, url = served
    body = b'{"prompt": "Hi", "max_tokens": 2, "temperature": 0}'
    one = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    last = b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    got = _exchange(url, one + one + last, timeout=60)
    assert got.count(b"HTTP/1.1 200 ") == 3


# -- defect 8: slow clients held threads -----------------------------------------------


def _trickle(url: str, data: bytes, every: float, out: list) -> None:
    """Send a byte every `every` seconds until the server answers; keep the answer and
    how long the connection lasted."""
    start = time.monotonic()
    got = b""
    with socket.create_connection(_address(url), timeout=10) as sock:
        for byte in data:
            if select.select([sock], [], [], every)[0]:  # answered (or closed): stop
                break
            sock.sendall(bytes([byte]))
        while chunk := sock.recv(65536):
            got += chunk
    out.append((time.monotonic() - start, got))


def test_slow_clients_are_cut_off_while_others_are_served(served):
    _, url = served
    slow = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 50\r\n\r\n" + b" " * 50
    results: list = []
    threads = [threading.Thread(target=_trickle, args=(url, slow, 0.25, results)) for _ in range(4)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    start = time.monotonic()
    status, _ = _post(url, {"prompt": "Hi", "max_tokens": 2})  # served meanwhile
    assert status == 200 and time.monotonic() - start < DEADLINE_S + 20
    for t in threads:
        t.join(timeout=30)
    assert len(results) == 4
    for seconds, got in results:  # cut at the deadline (+ up to 1 s dropping their bytes)
        assert seconds < DEADLINE_S + 3, seconds
        assert got.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 1.5 s" in got


def test_past_the_connection_cap_new_connections_get_503_until_one_ends(served):
    app, _ = served
    httpd, url = _start(app, max_connections=3)
    try:
        holders = [socket.create_connection(_address(url), timeout=10) for _ in range(3)]
        for sock in holders:
            sock.sendall(b"G")  # starts each request's deadline
        time.sleep(0.3)
        refused = _exchange(url, b"")  # what it says before any request
        assert refused.startswith(b"HTTP/1.1 503 ") and b"3 connections open" in refused
        for sock in holders:
            assert sock.recv(65536).startswith(b"HTTP/1.1 408 ")  # cut at the deadline
            sock.close()
        deadline = time.monotonic() + 10
        while httpd.connections and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _healthy(url)
    finally:
        httpd.shutdown()
        httpd.server_close()


# -- defect 9: authentication ----------------------------------------------------------


@pytest.fixture(scope="module")
def keyed(served):
    app, _ = served
    keyed_app = App(app.scheduler, app.tokenizer, app.model_name, app.max_len, api_key="s3cret")
    httpd, url = _start(keyed_app)
    yield keyed_app, url
    httpd.shutdown()
    httpd.server_close()


def test_an_api_key_is_required_on_every_v1_route(keyed):
    app, url = keyed
    good = openai.OpenAI(base_url=url + "/v1", api_key="s3cret", max_retries=0, timeout=60)
    assert [m.id for m in good.models.list().data] == [app.model_name]
    done = good.completions.create(model=app.model_name, prompt="Hi", max_tokens=2)
    assert done.usage.completion_tokens == 2
    bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(
            model=app.model_name, messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        )
    assert e.value.status_code == 401 and e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    status, out = _post(url, {"prompt": "Hi", "max_tokens": 2})  # no header at all
    assert status == 401 and out["error"]["code"] == "invalid_api_key"
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(url + "/metrics", timeout=10)
    assert e.value.code == 401
    assert _healthy(url)  # /health stays open for load balancers


# -- defect 22: hostile JSON, SIGTERM, another model -----------------------------------


def test_deeply_nested_json_is_400(served):
    _, url = served
    status, out = _post(url, b"[" * 100_000 + b"]" * 100_000)
    assert status == 400 and "nests deeper than 32" in out["error"]["message"]
    status, out = _post(
        url, b'{"prompt": "x", "stream_options": {"a": ' + b"[" * 40 + b"]" * 40 + b"}}"
    )
    assert status == 400 and "nests deeper" in out["error"]["message"]
    assert _healthy(url)


def test_another_model_is_404_model_not_found(served):
    app, url = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2)
    assert e.value.code == "model_not_found" and app.model_name in e.value.message
    assert client.completions.create(model=app.model_name, prompt="Hi", max_tokens=2)
    status, _ = _post(url, {"prompt": "Hi", "max_tokens": 2})  # no `model`: the one served
    assert status == 200


# -- defect 21: contexts past the model's ----------------------------------------------


def test_a_prompt_past_the_context_is_400_naming_both_numbers(served):
    _, url = served
    status, out = _post(url, {"prompt": [5] * 300})
    message = out["error"]["message"]
    assert status == 400 and "300 tokens" in message and "context of 256" in message
    status, out = _post(url, {"prompt": [5] * 200, "max_tokens": 100})
    assert status == 400 and "200 tokens and max_tokens 100" in out["error"]["message"]


# -- the command line: --host warning, --api-key, --max-len, SIGTERM ---------------------


def _cli(*args: str, env_key: str | None = None, monkeypatch=None) -> tuple[int, str, str]:
    from test_bad_input import run_cli

    if monkeypatch is not None:
        if env_key is None:
            monkeypatch.delenv("LLMPRESS_API_KEY", raising=False)
        else:
            monkeypatch.setenv("LLMPRESS_API_KEY", env_key)
    return run_cli(["serve", "default", *args])


@pytest.fixture
def busy_port():
    """A port already listened on (127.0.0.1): serve fails right after its warning,
    before anything listens on a public address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield str(sock.getsockname()[1])


def test_a_public_host_without_a_key_warns(busy_port, monkeypatch):
    code, _, err = _cli("--host", "0.0.0.0", "--port", busy_port, monkeypatch=monkeypatch)
    warnings = [ln for ln in err.splitlines() if ln.startswith("warning:")]
    assert len(warnings) == 1 and "--host 0.0.0.0 without --api-key" in warnings[0]
    assert code == 2 and "cannot listen on 0.0.0.0" in err
    for args, key in ((["--api-key", "k1"], None), ([], "k2")):  # a key (flag or env): quiet
        code, _, err = _cli(
            "--host", "0.0.0.0", "--port", busy_port, *args, env_key=key, monkeypatch=monkeypatch
        )
        assert code == 2 and "warning" not in err
    code, _, err = _cli("--port", busy_port, monkeypatch=monkeypatch)  # loopback: quiet
    assert code == 2 and "warning" not in err


@pytest.mark.parametrize("key", ["", "has space", "naïve"])
def test_an_unusable_api_key_is_one_line(key, monkeypatch):
    code, _, err = _cli("--api-key", key, monkeypatch=monkeypatch)
    assert code == 2 and err.startswith("error: --api-key") and len(err.splitlines()) == 1


def test_max_len_past_the_models_context_is_one_line(monkeypatch):
    code, _, err = _cli("--port", "0", "--max-len", "100000000", monkeypatch=monkeypatch)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "--max-len 100000000 is longer than this model's context of 8192 tokens" in err
