"""OpenAI-style request validation and response shapes (completions and chat).

Everything a client sends is checked here, before it reaches the engine: unknown fields,
wrong types, out-of-range values and over-deep nesting become a 400 with a message naming
the field; a `model` other than the one served is a 404 `model_not_found`.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass

from compress.runtime.sampling import SamplingParams

COMMON = {
    "model", "max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "stream",
    "stream_options", "n", "user", "presence_penalty", "frequency_penalty", "logprobs",
    "ignore_eos",  # vLLM's and llama.cpp's extension: load tests generate max_tokens exactly
}  # fmt: skip
COMPLETION_FIELDS = COMMON | {"prompt", "echo", "suffix", "best_of"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs"}
MAX_DEPTH = 32  # a request needs 3 levels (body, messages, message); 100k crashed json
# Below this a temperature decodes greedily, its limit: the runtime divides float32 logits
# by it (1e-300 overflowed to inf, then NaN), and for t < 1e-30 sampling and argmax agree
# unless the top two logits lie within 1e-28 of each other.
GREEDY_BELOW = 1e-30
MAX_LOGPROBS = 20  # alternatives per token, as vLLM allows (OpenAI's completions: 5)
MAX_N = 16  # choices per request; each is a sequence of its own in the engine


class BadRequest(ValueError):
    """A client error: becomes an HTTP error (400 unless said) with this message."""

    def __init__(self, message: str, status: int = 400, code: str | None = None):
        super().__init__(message)
        self.status, self.code = status, code


@dataclass
class Parsed:
    prompt_ids: list[int]
    params: SamplingParams
    stop: list[str]
    stream: bool
    include_usage: bool
    chat: bool
    model: str
    logprobs: int | None = None  # alternatives per token; None: no logprobs asked
    echo: bool = False  # completions: the prompt's text (and logprobs) come first
    prompt_text: str = ""
    n: int = 1  # choices: sequences sampled from the same prompt


def _number(body, key, default, lo, hi, kind=float):
    value = body.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise BadRequest(f"`{key}` must be {'a number' if kind is float else 'an integer'}")
    if not lo <= value <= hi:
        raise BadRequest(f"`{key}` must be between {lo} and {hi}, got {value}")
    return kind(value)


def _no_constant(name: str):
    raise BadRequest(f"request body is not valid JSON: {name} is not a JSON number")


def parse_body(raw: bytes) -> dict:
    try:
        body = json.loads(raw or b"", parse_constant=_no_constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON: {e}") from None
    except RecursionError:
        raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    _check_strings(body)
    return body


def _check_strings(value, where: str = "body", depth: int = 0) -> None:
    """JSON may carry lone surrogates (\ud800) that no tokenizer can encode: refuse them.
    Walks the body, so it also bounds the nesting that later code would recurse into."""
    if depth > MAX_DEPTH:
        raise BadRequest(f"request body nests deeper than {MAX_DEPTH} levels")
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(f"{where} holds an invalid Unicode string (lone surrogate)") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _check_strings(k, where, depth + 1)
            _check_strings(v, f"`{k}`" if where == "body" else where, depth + 1)
    elif isinstance(value, list):
        for v in value:
            _check_strings(v, where, depth + 1)


def parse_request(body: dict, tokenizer, chat: bool, max_len: int, model: str) -> Parsed:
    allowed = CHAT_FIELDS if chat else COMPLETION_FIELDS
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    _check_model(body, model)
    n = _number(body, "n", 1, 1, MAX_N, int)
    if body.get("best_of") not in (None, n):
        raise BadRequest("`best_of` other than `n` is not supported (choices are not ranked)")
    if body.get("suffix"):
        raise BadRequest("`suffix` is not supported")
    logprobs, echo = _logprobs(body, chat)
    for key in ("presence_penalty", "frequency_penalty"):
        if body.get(key) not in (None, 0, 0.0):
            raise BadRequest(f"`{key}` is not supported (only 0)")
    prompt_ids = _chat_ids(body, tokenizer) if chat else _prompt_ids(body, tokenizer)
    key = "max_completion_tokens" if chat and "max_completion_tokens" in body else "max_tokens"
    max_tokens = _number(body, key, None, 0 if echo else 1, max_len, int)
    if max_tokens is None:
        max_tokens = max(1, min(256, max_len - len(prompt_ids)))
    if len(prompt_ids) + max_tokens > max_len:
        raise BadRequest(
            f"prompt is {len(prompt_ids)} tokens and max_tokens {max_tokens}: together more than "
            f"the context of {max_len} tokens; shorten the prompt or lower max_tokens"
        )
    stop = body.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise BadRequest("`stop` must be a string or a list of non-empty strings")
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise BadRequest("`seed` must be an integer")
    if seed is not None and not 0 <= seed < 1 << 63:
        raise BadRequest(f"`seed` must be between 0 and {(1 << 63) - 1}, got {seed}")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequest("`stream` must be true or false")
    ignore_eos = body.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise BadRequest("`ignore_eos` must be true or false")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("`stream_options` must be an object")
    params = SamplingParams(
        max_tokens=max_tokens,
        temperature=_temperature(body),
        top_p=_number(body, "top_p", 1.0, 1e-9, 1.0),
        top_k=_number(body, "top_k", 0, 0, 1 << 20, int),
        seed=seed,
        logprobs=logprobs,
        prompt_logprobs=echo and logprobs is not None,
        ignore_eos=ignore_eos,
    )
    prompt_text = _echoed(body, prompt_ids, tokenizer) if echo else ""
    include = bool(options.get("include_usage"))
    return Parsed(
        prompt_ids, params, stop, stream, include, chat, model, logprobs, echo, prompt_text, n
    )


def _echoed(body: dict, ids: list[int], tokenizer) -> str:
    """The prompt as `echo` returns it: the client's own text, or its token ids decoded."""
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return prompt if isinstance(prompt, str) else tokenizer.decode(ids)


def _logprobs(body: dict, chat: bool) -> tuple[int | None, bool]:
    """(alternatives per token or None, echo). Completions: `logprobs` N (0..20) and
    `echo`; chat: `logprobs` true and `top_logprobs` N."""
    if chat:
        asked = body.get("logprobs", False)
        if not isinstance(asked, bool):
            raise BadRequest("`logprobs` must be true or false")
        top = _number(body, "top_logprobs", None, 0, MAX_LOGPROBS, int)
        if top is not None and not asked:
            raise BadRequest("`top_logprobs` needs `logprobs: true`")
        return (top or 0) if asked else None, False
    echo = body.get("echo", False)
    if not isinstance(echo, bool):
        raise BadRequest("`echo` must be true or false")
    return _number(body, "logprobs", None, 0, MAX_LOGPROBS, int), echo


def _check_model(body: dict, served: str) -> None:
    """`model` may be left out (one model is served); any other name is OpenAI's 404."""
    name = body.get("model")
    if name is None or name == served:
        return
    if not isinstance(name, str):
        raise BadRequest("`model` must be a string")
    raise BadRequest(
        f"the model `{name}` does not exist: this server serves `{served}` (GET /v1/models)",
        404,
        "model_not_found",
    )


def _temperature(body: dict) -> float:
    """0 to 2 (OpenAI's range); a tiny positive value is served as greedy (GREEDY_BELOW)."""
    value = _number(body, "temperature", 1.0, 0.0, 2.0)
    return 0.0 if value < GREEDY_BELOW else value


def _prompt_ids(body: dict, tokenizer) -> list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one (lm-eval sends its token ids so)
    if isinstance(prompt, str):
        ids = tokenizer(prompt, add_special_tokens=False).input_ids
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        if not all(0 <= t < len(tokenizer) for t in prompt):
            raise BadRequest("`prompt` token ids must lie in the vocabulary")
        ids = list(prompt)
    else:
        raise BadRequest(
            "`prompt` must be a string, token ids, or a list of one of them (one prompt a request)"
        )
    if not ids:
        raise BadRequest("`prompt` is empty")
    return ids


def _chat_ids(body: dict, tokenizer) -> list[int]:
    messages = body.get("messages")
    ok = isinstance(messages, list) and messages
    ok = ok and all(
        isinstance(m, dict)
        and m.get("role") in ("system", "user", "assistant")
        and isinstance(m.get("content"), str)
        for m in messages
    )
    if not ok:
        raise BadRequest(
            "`messages` must be a non-empty list of {role: system|user|assistant, content: str}"
        )
    plain = [{"role": m["role"], "content": m["content"]} for m in messages]
    if not getattr(tokenizer, "chat_template", None):
        raise BadRequest("this model has no chat template: use /v1/completions")
    text = tokenizer.apply_chat_template(plain, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False).input_ids


def error_body(message: str, kind: str = "invalid_request_error", code: str | None = None) -> bytes:
    """OpenAI's error shape."""
    error = {"message": message, "type": kind, "param": None, "code": code}
    return json.dumps({"error": error}).encode()


def new_id(chat: bool) -> str:
    return ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]


def logprobs_body(p: Parsed, tokenizer, ids: list[int], records: list, offset: int = 0):
    """The `logprobs` of a choice for tokens `ids` and their TokenLogprob records (None for
    a prompt's first token): completions' parallel lists (tokens, token_logprobs,
    top_logprobs, text_offset from `offset` in the choice's text), or chat's `content`."""
    if p.logprobs is None:
        return None

    def text(i: int) -> str:
        return tokenizer.decode([i])

    if p.chat:

        def entry(i: int, lp: float) -> dict:
            t = text(i)
            return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}

        return {"content": [
            {**entry(i, r.logprob), "top_logprobs": [entry(j, lp) for j, lp in r.top]}
            for i, r in zip(ids, records, strict=True)
        ]}  # fmt: skip
    tokens = [text(i) for i in ids]
    offsets = []
    for t in tokens:
        offsets.append(offset)
        offset += len(t)
    return {
        "tokens": tokens,
        "token_logprobs": [None if r is None else r.logprob for r in records],
        "top_logprobs": [None if r is None else {text(j): lp for j, lp in r.top} for r in records],
        "text_offset": offsets,
    }


def choice_body(p: Parsed, index: int, text: str, finish: str, logprobs=None) -> dict:
    """One choice of a whole (non-streamed) response."""
    if p.chat:
        return {
            "index": index,
            "message": {"role": "assistant", "content": text},
            "logprobs": logprobs,
            "finish_reason": finish,
        }
    return {"index": index, "text": text, "finish_reason": finish, "logprobs": logprobs}


def response_body(p: Parsed, rid: str, choices: list[dict], prompt_n: int, out_n: int):
    """The whole response: its choices (choice_body), and usage with the prompt counted
    once and every choice's tokens."""
    usage = {
        "prompt_tokens": prompt_n,
        "completion_tokens": out_n,
        "total_tokens": prompt_n + out_n,
    }
    obj = "chat.completion" if p.chat else "text_completion"
    return {**envelope(p, rid, obj, choices), "usage": usage}


def chunk_body(
    p: Parsed,
    rid: str,
    text: str | None,
    finish: str | None,
    first: bool,
    logprobs=None,
    index: int = 0,
) -> dict:
    if p.chat:
        delta = {}
        if first:
            delta["role"] = "assistant"
        if text:
            delta["content"] = text
        choice = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {
            "index": index, "text": text or "", "finish_reason": finish, "logprobs": logprobs
        }  # fmt: skip
        obj = "text_completion"
    return envelope(p, rid, obj, [choice])


def envelope(p: Parsed, rid: str, obj: str, choices: list) -> dict:
    return {
        "id": rid,
        "object": obj,
        "created": int(time.time()),
        "model": p.model,
        "choices": choices,
    }
