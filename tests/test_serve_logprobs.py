"""`serve`'s log-probabilities, as clients that score text use them (lm-eval's
local-completions sends token ids with `echo`, `logprobs` and `max_tokens` 0 or 1), checked
against transformers' own forward of the same model and through the openai client."""

import json
import threading
import urllib.request

import openai
import pytest
import torch

from compress.serve.app import build_app
from compress.serve.server import make_server


@pytest.fixture(scope="module")
def server():
    """The default model in fp32: what serve computes is then transformers' forward."""
    app = build_app("default", max_batch=2, max_len=256, max_queue=4)
    httpd = make_server(app, "127.0.0.1", 0)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield app, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()
    app.scheduler.stop()


def _post(url: str, route: str, body: dict) -> dict:
    req = urllib.request.Request(
        url + route, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


def _reference(base_model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(base_model(input_ids=torch.tensor([ids])).logits[0].float(), -1)


def test_echo_scores_every_prompt_token_as_transformers_does(server, base_model, tokenizer):
    """What lm-eval's loglikelihood asks: token ids, echo, logprobs 1, no new token."""
    _, url = server
    ids = tokenizer("The quick brown fox jumps over the lazy dog").input_ids
    out = _post(url, "/v1/completions",
                {"prompt": [ids], "echo": True, "logprobs": 1, "max_tokens": 0})  # fmt: skip
    choice = out["choices"][0]
    lp = choice["logprobs"]
    ref = _reference(base_model, ids)
    assert choice["text"] == tokenizer.decode(ids) and out["usage"]["completion_tokens"] == 0
    assert lp["tokens"] == [tokenizer.decode([i]) for i in ids]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    expected = ref[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    torch.testing.assert_close(torch.tensor(lp["token_logprobs"][1:]), expected, atol=2e-3, rtol=0)
    for pos, top in enumerate(lp["top_logprobs"][1:]):  # the model's argmax and its logprob
        ((token, value),) = top.items()
        assert token == tokenizer.decode([int(ref[pos].argmax())])
        assert abs(value - float(ref[pos].max())) < 2e-3
    assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] == len(choice["text"]) - len(
        lp["tokens"][-1]
    )


def test_generated_tokens_carry_their_logprobs_and_alternatives(server, base_model, tokenizer):
    _, url = server
    prompt = "The capital of France is"
    out = _post(url, "/v1/completions",
                {"prompt": prompt, "max_tokens": 5, "temperature": 0, "logprobs": 3})  # fmt: skip
    lp = out["choices"][0]["logprobs"]
    ids = tokenizer(prompt, add_special_tokens=False).input_ids
    new = tokenizer(out["choices"][0]["text"], add_special_tokens=False).input_ids
    ref = _reference(base_model, ids + new)
    assert len(lp["tokens"]) == 5 and all(len(t) == 3 for t in lp["top_logprobs"])
    for k, (value, top) in enumerate(zip(lp["token_logprobs"], lp["top_logprobs"], strict=True)):
        row = ref[len(ids) - 1 + k]
        assert abs(value - float(row.max())) < 2e-3  # greedy: the most likely token
        assert max(top.values()) == pytest.approx(value, abs=1e-6)
        assert sorted(top.values(), reverse=True) == pytest.approx(
            row.topk(3).values.tolist(), abs=2e-3
        )
    assert lp["text_offset"][0] == 0  # offsets into the returned text


def test_streamed_logprobs_are_the_whole_answers(server):
    _, url = server
    body = {"prompt": "Count: 1, 2, 3,", "max_tokens": 6, "temperature": 0, "logprobs": 2}
    whole = _post(url, "/v1/completions", body)["choices"][0]
    req = urllib.request.Request(
        url + "/v1/completions", data=json.dumps({**body, "stream": True}).encode()
    )
    events = [
        json.loads(line[6:])
        for line in urllib.request.urlopen(req, timeout=120).read().decode().splitlines()
        if line.startswith("data: {")
    ]
    parts = [e["choices"][0]["logprobs"] for e in events if e["choices"][0]["logprobs"]]
    joined = {k: [x for p in parts for x in p[k]] for k in ("tokens", "token_logprobs")}
    assert joined["tokens"] == whole["logprobs"]["tokens"]
    assert joined["token_logprobs"] == pytest.approx(whole["logprobs"]["token_logprobs"], abs=1e-5)


def test_openai_client_reads_completion_and_chat_logprobs(server):
    app, url = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    done = client.completions.create(
        model=app.model_name, prompt="Hello", max_tokens=0, echo=True, logprobs=0
    )
    assert done.choices[0].text == "Hello" and done.choices[0].logprobs.token_logprobs[0] is None
    chat = client.chat.completions.create(
        model=app.model_name,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens
    assert "".join(c.token for c in content) == chat.choices[0].message.content
    assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    assert all(c.top_logprobs[0].logprob == pytest.approx(c.logprob, abs=1e-6) for c in content)


@pytest.mark.parametrize(
    ("route", "body", "needle"),
    [
        ("/v1/completions", {"prompt": "x", "logprobs": 21}, "`logprobs` must be between 0 and 20"),
        ("/v1/completions", {"prompt": "x", "echo": "yes"}, "`echo` must be true or false"),
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "`max_tokens` must be between 1"),
        ("/v1/completions", {"prompt": [[1, 2], [3]]}, "one prompt a request"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2},
            "needs `logprobs: true`",
        ),
    ],
)
def test_logprob_requests_it_cannot_answer_get_400(server, route, body, needle):
    _, url = server
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(url, route, body)
    assert e.value.code == 400 and needle in json.loads(e.value.read())["error"]["message"]


def test_n_choices_are_the_requests_with_successive_seeds(server):
    """n = 3 with a seed: three choices, choice i what one request with seed + i gives;
    usage counts the prompt once and every choice's tokens."""
    _, url = server
    body = {"prompt": "Once upon a time", "max_tokens": 6, "temperature": 1.0, "seed": 11}
    out = _post(url, "/v1/completions", {**body, "n": 3, "logprobs": 1})
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    alone = [_post(url, "/v1/completions", {**body, "seed": 11 + i}) for i in range(3)]
    assert [c["text"] for c in out["choices"]] == [a["choices"][0]["text"] for a in alone]
    assert len({c["text"] for c in out["choices"]}) > 1  # sampled apart
    assert out["usage"]["completion_tokens"] == sum(a["usage"]["completion_tokens"] for a in alone)
    assert out["usage"]["prompt_tokens"] == alone[0]["usage"]["prompt_tokens"]
    assert all(len(c["logprobs"]["tokens"]) == 6 for c in out["choices"])


def test_n_choices_stream_with_their_index_and_the_openai_client_reads_them(server):
    app, url = server
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)
    args = {"model": app.model_name, "max_tokens": 5, "temperature": 0, "n": 2}
    whole = client.completions.create(prompt="The capital of France", **args)
    texts = {0: "", 1: ""}
    for chunk in client.completions.create(prompt="The capital of France", stream=True, **args):
        for c in chunk.choices:
            texts[c.index] += c.text
    assert [c.text for c in whole.choices] == [texts[0], texts[1]]  # greedy: equal choices
    assert texts[0] == texts[1] != ""
    chat = client.chat.completions.create(
        messages=[{"role": "user", "content": "Say hello."}], **args
    )
    assert [c.index for c in chat.choices] == [0, 1] and chat.choices[0].message.content


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        ({"n": 17}, 400, "`n` must be between 1 and 16"),
        ({"n": 0}, 400, "`n` must be between 1 and 16"),
        ({"n": 2, "best_of": 3}, 400, "`best_of` other than `n`"),
        ({"n": 7}, 429, "server busy"),  # 2 running + 4 queued: no room for all 7
    ],
)
def test_n_it_cannot_serve_whole_is_refused(server, body, code, needle):
    _, url = server
    with pytest.raises(urllib.error.HTTPError) as e:
        _post(url, "/v1/completions", {"prompt": "x", "max_tokens": 2, **body})
    assert e.value.code == code and needle in json.loads(e.value.read())["error"]["message"]
