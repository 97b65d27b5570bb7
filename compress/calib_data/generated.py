"""Calibration text the model writes itself: the default, and the one that works offline.

Sampling from the model's own distribution (temperature 1, from the start token) gives
activations typical of the model without any dataset. Results are cached by model
hash and settings, since generating 128 × 512 tokens takes minutes on a CPU.

compress has llmpress's own decode runtime write the text (runtime/calib_text.py:
batched, its C or Triton kernels, the original as stored); where the runtime cannot run a
model, transformers writes it, said in one line.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from compress.draw import draw
from compress.model.default import cache_dir

BATCH = 16  # samples generated together (transformers)
RUNTIME_BATCH = 32  # samples the runtime decodes together (runtime/calib_text.py)


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
    writer: Callable[[int, int, int], torch.Tensor | None] | None = None,
) -> torch.Tensor:
    """Cached samples; the model is loaded only when the cache misses. `writer(n, length,
    seed)`, when given, writes them first (the runtime: runtime/calib_text.py), and
    returns None for a model it cannot run."""
    path = cache_path(cache_key, n, length, seed) if cache_key else None
    if path is not None and path.is_file():
        return torch.load(path, weights_only=True)
    out = writer(n, length, seed) if writer is not None else None
    if out is None:
        out = generate_samples(load_model(), tokenizer, n, length, seed)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(out, tmp)
        tmp.replace(path)
    return out


@torch.no_grad()
def generate_samples(
    model, tokenizer, n: int, length: int, seed: int, batch_size: int = BATCH
) -> torch.Tensor:
    """[n, length] token ids sampled from `model` (temperature 1), seeded; drawn in host
    memory, so a model on a GPU samples from the same generator."""
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    out = torch.empty(n, length, dtype=torch.long, device="cpu")
    bar = tqdm(total=n * (length - 1), desc="generating calibration text", unit="tok")
    for lo in range(0, n, batch_size):
        rows = min(batch_size, n - lo)
        ids = torch.full((rows, 1), start, dtype=torch.long, device=device)
        out[lo : lo + rows, 0] = start
        past = None
        for t in range(1, length):
            result = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = result.past_key_values
            probs = torch.softmax(result.logits[:, -1].float(), dim=-1).cpu()
            drawn = draw(probs, gen)
            out[lo : lo + rows, t] = drawn
            ids = drawn[:, None].to(device)
            bar.update(rows)
    bar.close()
    return out
