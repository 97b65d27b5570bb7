"""`eval`: drift of an artifact against its original on a text source, recorded in its manifest."""

from __future__ import annotations

import torch

from compress.artifact.dense import load_model
from compress.artifact.manifest import read_manifest, write_manifest
from compress.calib_data.cost import refuse_if_too_big, whole_model_bytes
from compress.calib_data.generated import self_generated
from compress.calib_data.samples import eval_windows
from compress.calib_data.sources import SELF
from compress.calib_data.token_cache import source_stream
from compress.errors import LlmpressError, first_line
from compress.eval.drift import Drift, measure_drift
from compress.eval.reference import BlockwiseOriginal, Cached, cache_key, load_cached, save_cached
from compress.model.loading import load_tokenizer, resolve
from compress.runtime.calib_text import held_bytes, runtime_writer

EVAL_SEED = 20240601  # differs from the calibration default so `self` never reuses its text


def windows_for(
    data: str,
    base,
    tokenizer,
    ctx: int,
    limit: int | None,
    text_field: str,
    cache_key: str | None = None,
    log=print,
) -> torch.Tensor:
    """Token windows [n, ctx] of `data`; for `self`, text the original `base` (a
    Checkpoint, loaded only when its cached text is missing) writes: through the runtime,
    holding it as stored, as compress's calibration text is written (runtime/calib_text.py;
    transformers' forward in fp32, where the runtime cannot run it)."""
    if data == SELF:

        def whole():
            refuse_if_too_big(whole_model_bytes(base), "--data self", "--data FILE.txt")
            return load_model(base)

        def runtime(n: int, length: int, seed: int):
            held = held_bytes(base)
            fp32 = held >= whole_model_bytes(base)
            refuse_if_too_big(held, "--data self", "--data FILE.txt", fp32)
            return runtime_writer(base, tokenizer, log, "eval text")(n, length, seed)

        n = limit or 16
        return self_generated(whole, tokenizer, n, ctx, EVAL_SEED, cache_key, runtime)
    return eval_windows(source_stream(tokenizer, data, text_field), ctx, limit)


def _candidates(ckpt, engine: str, kv: str | None, ctx: int, exact: bool) -> dict:
    """{name: model} to measure: "served" (the kernels and KV cache serve runs) and, where
    that is not already exact, "exact" (the weights alone) beside it; or the one
    `exact`/transformers asks for."""
    if engine == "transformers":
        if kv not in (None, "none"):
            raise LlmpressError("--kv needs the runtime engine: drop --engine transformers")
        return {"transformers": load_with_transformers(ckpt)}
    if engine != "runtime":
        raise LlmpressError(f"unknown engine {engine!r}: use runtime or transformers")
    from compress.runtime.kv_cache import FP32, kv_scheme
    from compress.runtime.lm import LogitsBuffer, RuntimeLM
    from compress.runtime.weights import load_weights

    scheme = kv_scheme(kv, ckpt.config)
    weights = load_weights(ckpt)
    # the weights alone: an fp32 cache unless --kv names one, as transformers would compute
    exact_kv = scheme if kv is not None else FP32
    logits = LogitsBuffer()  # one window's of one pass at a time
    exact_lm = RuntimeLM(weights, max_len=ctx, kv=exact_kv, exact=True, logits=logits)
    if exact:
        return {"exact": exact_lm}
    served = RuntimeLM(weights, max_len=ctx, kv=scheme, exact=False, logits=logits)
    if served.activations == exact_lm.activations and scheme == exact_kv:  # e.g. on a GPU
        return {"served": served}
    return {"served": served, "exact": exact_lm}


def load_with_transformers(ckpt):
    """The artifact as transformers itself loads it: `from_pretrained` and nothing else,
    except the documented `dequantize=True` for zero-point weights (engines.py)."""
    from transformers import AutoModelForCausalLM

    from compress.artifact.formats import reading_codec

    codec = reading_codec(ckpt.config)
    route = {} if codec is None else codec.transformers_route(ckpt.config)
    if route is None:
        problem = codec.transformers_problems(ckpt.config)[0]
        raise LlmpressError(
            f"--engine transformers cannot load {ckpt.path}: {problem}; use --engine runtime"
        )
    try:
        kwargs = {} if codec is None else codec.transformers_kwargs(route)
    except ModuleNotFoundError as e:
        raise LlmpressError(
            f"--engine transformers needs the {e.name} package to open a quantized "
            "artifact: pip install 'llmpress[transformers]' (or use --engine runtime)"
        ) from e
    try:
        model = AutoModelForCausalLM.from_pretrained(str(ckpt.path), dtype=torch.float32, **kwargs)
    except Exception as e:
        first = first_line(e)
        raise LlmpressError(
            f"transformers failed to load {ckpt.path} ({type(e).__name__}: {first}); "
            "use --engine runtime"
        ) from e
    return model.eval()


def evaluate(
    artifact: str,
    base: str | None = None,
    data: str = SELF,
    ctx: int = 512,
    windows: int | None = 64,
    text_field: str = "text",
    record: bool = True,
    log=print,
    engine: str = "runtime",
    kv: str | None = None,
    token_kl: dict | None = None,
    exact: bool = False,
) -> Drift:
    """Drift of `artifact` against its original, as served: `engine` "runtime" runs it
    through the kernels `bench` and `serve` run (int8 activations on CPU) and measures the
    weights alone (`exact`) beside it; `exact=True` measures only that. "transformers"
    loads it as a transformers model. `kv`: KV-cache scheme for the runtime ("int8",
    "int4", "none"; default: the artifact's own, see kv_cache.py, for the served pass and
    fp32 for the weights alone; given, it is used by both). The figure returned (and
    gated) is the served one unless `exact`; `weights_only` holds the other."""
    cand_ckpt = resolve(artifact)
    manifest = read_manifest(cand_ckpt.path)
    if base is None:
        if not manifest:
            raise LlmpressError(
                f"{artifact} has no manifest naming its original: pass --base MODEL"
            )
        base = manifest["source"]["source"]
        try:
            base_ckpt = resolve(base)
        except LlmpressError as e:
            raise LlmpressError(
                f"the artifact's original {base!r} (as its manifest records it, relative to "
                f"where `compress` ran) cannot be opened here ({e}): run from that folder or "
                "pass --base MODEL"
            ) from None
    else:
        base_ckpt = resolve(base)
    if engine == "runtime":  # refused before the original's pass, not after it
        from compress.runtime.weights import check_runnable

        check_runnable(cand_ckpt.adapter.spec(cand_ckpt.config), cand_ckpt.adapter.families[0])
    log(f"eval {artifact} against {base} on {data} (ctx {ctx}, windows {windows or 'all'})")
    tokenizer = load_tokenizer(base_ckpt)
    wins = windows_for(
        data, base_ckpt, tokenizer, ctx, windows, text_field, base_ckpt.sha256, log=log
    )
    key = cache_key(base_ckpt.sha256, wins)
    cached = load_cached(key)
    if cached is not None:
        log(f"the original's figures on these windows come from the cache ({key})")
        original = Cached(base_ckpt, cached)
    else:
        original = BlockwiseOriginal(base_ckpt, wins, log)
        original.prepare()  # before the artifact is loaded: the two peaks one after another
    candidates = _candidates(cand_ckpt, engine, kv, ctx, exact)
    kl_of = {} if token_kl is not None else None
    drift = measure_drift(original, candidates, wins, data=data, token_kl=kl_of)
    if cached is None:
        save_cached(key, original.states)
    name = next(iter(drift))
    result = drift[name]
    result.reference = "computed" if cached is None else "cached"
    result.kernels = name
    result.activations = getattr(candidates[name], "activations", "as transformers computes")
    result.kv_cache = getattr(candidates[name], "kv_cache", "")
    if "exact" in drift and name != "exact":
        other = drift["exact"].to_dict()
        result.weights_only = {k: other[k] for k in ("ppl", "ppl_ratio", "kl", "top1")}
        result.weights_only["kv_cache"] = candidates["exact"].kv_cache
    if token_kl is not None:
        token_kl["artifact"] = kl_of[name]
    if record and manifest is not None:
        record_drift(cand_ckpt.path, manifest, result, base, engine, kv)
    return result


def record_drift(folder, manifest: dict, result: Drift, base: str, engine: str, kv) -> None:
    """Write the drift into the artifact's manifest (and so its card)."""
    manifest["drift"] = {**result.to_dict(), "base": base, "engine": engine}
    if kv:
        manifest["drift"]["kv_cache"] = kv
    write_manifest(folder, manifest)
