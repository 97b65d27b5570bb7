"""Calibration text the original model writes itself, decoded by the runtime.

The runtime decodes many samples together with its own kernels: on the default model
on 2 cores it wrote 32 × 128 tokens at 170-205 tokens/s against 137 for transformers'
forward with a KV cache, interleaved. calib_data/generated.py caches what it writes and
falls back to transformers for a model the runtime refuses.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from compress.calib_data.cost import whole_model_bytes
from compress.calib_data.generated import RUNTIME_BATCH
from compress.errors import LlmpressError
from compress.model.workload import peak_rate
from compress.runtime.engine import Engine, Request
from compress.runtime.linears import DenseLinear
from compress.runtime.sampling import SamplingParams
from compress.runtime.weights import load_weights

_STORED_16 = {"BF16": torch.bfloat16, "F16": torch.float16}
PROBE_BYTES = (64 * 2**20, 2**30)  # the probe's weight: the model's bytes, within these


def held_dtype(ckpt) -> torch.dtype:
    """The dtype the runtime holds the original's dense weights in: a 16-bit checkpoint's
    as stored (DenseLinear widens them as it streams), any other in fp32."""
    stored = {dtype for _, _, dtype in ckpt.tensors.values()}
    return next((_STORED_16[d] for d in _STORED_16 if d in stored), torch.float32)


def held_bytes(ckpt) -> int:
    """Bytes of the original as the runtime holds it to write the text (held_dtype)."""
    size = torch.tensor([], dtype=held_dtype(ckpt)).element_size()
    return whole_model_bytes(ckpt) // 4 * size


def generation_probe(ckpt) -> Callable[[int], float]:
    """`rate(rows)`: FLOP/s of the product that writes the text, measured now: DenseLinear
    at that many rows on a weight of held_dtype, as many bytes as the model holds (within
    PROBE_BYTES), so it is read from where the model's weights will be (a 64 MB probe
    fits some CPUs' last-level cache, a 1B model does not)."""

    def rate(rows: int, width: int = 4096) -> float:
        dtype = held_dtype(ckpt)
        size = torch.tensor([], dtype=dtype).element_size()
        nbytes = min(max(held_bytes(ckpt), PROBE_BYTES[0]), PROBE_BYTES[1])
        n = nbytes // (size * width)
        linear = DenseLinear(torch.empty(n, width, dtype=dtype).fill_(0.01))
        x = torch.randn(rows, width)
        linear(x)  # warm-up: threads started
        return peak_rate(lambda: linear(x), 2 * rows * n * width, 0.2)

    return rate


def runtime_writer(
    ckpt, tokenizer, log: Callable[[str], None] = print, what: str = "calibration text"
):
    """A `writer(n, length, seed)` for generated.self_generated: the runtime's samples,
    or None (said in one line) when the runtime cannot run `ckpt`."""

    def write(n: int, length: int, seed: int) -> torch.Tensor | None:
        try:
            weights = load_weights(ckpt)
        except LlmpressError as e:
            log(f"generating {what} with transformers (slower): {e}")
            return None
        return runtime_samples(weights, tokenizer, n, length, seed, what)

    return write


@torch.no_grad()
def runtime_samples(
    weights, tokenizer, n: int, length: int, seed: int, what: str = "calibration text"
) -> torch.Tensor:
    """[n, length] token ids sampled at temperature 1 by the runtime, sample i from its
    own generator seeded (seed, i): the same ids whatever the batch."""
    engine = Engine(weights, max_batch=min(RUNTIME_BATCH, n), max_len=length)
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    out = torch.empty(n, length, dtype=torch.long)
    bar = tqdm(total=n * (length - 1), desc=f"generating {what}", unit="tok")
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
