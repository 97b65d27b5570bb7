"""Calibration text the model writes itself: the default, and the one that works offline.

Sampling from the model's own distribution (temperature 1, from the start token) gives
activations typical of the model without any dataset. Results are cached by model
hash and settings, since generating 128 × 512 tokens takes minutes on a CPU.

The text is written by llmpress's own decode runtime (batched, its C or Triton kernels),
which runs the original as stored; where the runtime cannot run a model, by transformers,
said in one line. Measured side by side on the default model: see runtime_rate below.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from compress.model.default import cache_dir

BATCH = 16  # samples generated together


def cache_path(cache_key: str, n: int, length: int, seed: int) -> Path:
    return cache_dir() / "calib" / f"self-{cache_key[:16]}-{n}x{length}-s{seed}.pt"


def cached_samples(cache_key: str | None, n: int, length: int, seed: int) -> Path | None:
    """The cached samples' file, if these were generated before (nothing to generate)."""
    path = cache_path(cache_key, n, length, seed) if cache_key else None
    return path if path is not None and path.is_file() else None


def self_generated(
    load_model: Callable,
    tokenizer,
    n: int,
    length: int,
    seed: int,
    cache_key: str | None,
    ckpt=None,
    log: Callable[[str], None] = print,
) -> torch.Tensor:
    """Cached samples; the model is loaded only when the cache misses. With `ckpt` (the
    original as a checkpoint), the runtime writes them unless it cannot run that model."""
    path = cache_path(cache_key, n, length, seed) if cache_key else None
    if path is not None and path.is_file():
        return torch.load(path, weights_only=True)
    weights = _runtime_weights(ckpt, log) if ckpt is not None else None
    if weights is not None:
        out = runtime_samples(weights, tokenizer, n, length, seed)
    else:
        out = generate_samples(load_model(), tokenizer, n, length, seed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(out, tmp)
        tmp.replace(path)
    return out


def _runtime_weights(ckpt, log):
    from compress.errors import LlmpressError
    from compress.runtime.weights import load_weights

    try:
        return load_weights(ckpt)
    except LlmpressError as e:  # a model the runtime refuses: transformers writes it
        log(f"generating calibration text with transformers (slower): {e}")
        return None


RUNTIME_BATCH = 32  # sequences decoded together by the runtime


@torch.no_grad()
def runtime_samples(weights, tokenizer, n: int, length: int, seed: int) -> torch.Tensor:
    """[n, length] token ids sampled at temperature 1 by the runtime, sample i from its
    own generator seeded (seed, i): the same ids whatever the batch."""
    from compress.runtime.engine import Engine, Request
    from compress.runtime.sampling import SamplingParams

    engine = Engine(weights, max_batch=min(RUNTIME_BATCH, n), max_len=length)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    out = torch.empty(n, length, dtype=torch.long)
    bar = tqdm(total=n * (length - 1), desc="generating calibration text", unit="tok")
    reqs = []
    for i in range(n):
        params = SamplingParams(
            max_tokens=length - 1, temperature=1.0, seed=seed * 1_000_003 + i, ignore_eos=True
        )
        reqs.append(engine.submit(Request([start], params)))
    while not engine.idle:
        bar.update(len(engine.step()))
    bar.close()
    for i, req in enumerate(reqs):
        out[i, 0] = start
        out[i, 1:] = torch.tensor(req.output)
    return out


@torch.no_grad()
def generate_samples(
    model, tokenizer, n: int, length: int, seed: int, batch_size: int = BATCH
) -> torch.Tensor:
    """[n, length] token ids sampled from `model` (temperature 1), seeded."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    out = torch.empty(n, length, dtype=torch.long)
    bar = tqdm(total=n * (length - 1), desc="generating calibration text", unit="tok")
    for lo in range(0, n, batch_size):
        rows = min(batch_size, n - lo)
        ids = torch.full((rows, 1), start, dtype=torch.long)
        out[lo : lo + rows, 0] = start
        past = None
        for t in range(1, length):
            result = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            probs = torch.softmax(result.logits[:, -1].float(), dim=-1)
            ids = torch.multinomial(probs, 1, generator=gen)
            out[lo : lo + rows, t] = ids[:, 0]
            bar.update(rows)
    bar.close()
    return out
