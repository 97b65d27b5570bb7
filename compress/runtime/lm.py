"""The runtime behind the drift evaluation: logits for whole windows, like a causal LM."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from compress.runtime.kv_cache import FP32, KVScheme, cache_for
from compress.runtime.model import Model
from compress.runtime.weights import ModelWeights


class LogitsBuffer:
    """A window's logits [T, vocab], kept from window to window (made afresh, a window's
    100 MB at a 49k vocabulary were mapped and page-faulted every window). Models a loop
    runs one after another share one (eval's served and exact passes: a window's logits
    of one are consumed before the other runs; one each held 155 MB more at a 7B shape)."""

    def __init__(self):
        self._t: torch.Tensor | None = None

    def rows(self, n: int, vocab: int, device) -> torch.Tensor:
        t = self._t
        if t is None or t.shape[0] < n or t.shape[1] != vocab or t.device != torch.device(device):
            del t  # the old one freed before the new one is made
            self._t = None
            self._t = t = torch.empty(n, vocab, device=device)
        return t[:n]


class RuntimeLM:
    """`lm(input_ids=[1, T]).logits` through the runtime. With a quantized KV cache the
    window is fed in chunks of `chunk` tokens, so each chunk attends to the cache as stored
    (what a served sequence sees) and not only to its own full-precision keys.

    `exact=False` runs every chunk through the kernels `serve` runs (int8 activations on
    CPU): the model as served. `exact=True` multiplies fp32 activations by the dequantized
    weights: the weights' own drift, what transformers computes."""

    def __init__(
        self,
        weights: ModelWeights,
        max_len: int,
        kv: KVScheme = FP32,
        chunk=None,
        exact: bool = True,
        logits: LogitsBuffer | None = None,
    ):
        self.model = Model(weights, max_len + 1, exact=exact)
        int8 = self.model.backend.int8_activations and not exact
        self.activations = "int8 per block of 32 (as served)" if int8 else "fp32"
        self.kv_cache = "" if kv.bits is None else f"int{kv.bits}"  # "": fp32
        self.cache = cache_for(weights, 1, max_len, kv)
        self.chunk = chunk or (max_len if kv.bits is None else 128)
        self.logits = logits or LogitsBuffer()

    def __call__(self, input_ids: torch.Tensor):
        """The window's logits [1, T, vocab], in `logits`, which the next call reuses."""
        tokens = input_ids[0]
        self.cache.lengths[0] = 0
        vocab = self.model.w.lm_head.out_features
        out = self.logits.rows(tokens.shape[0], vocab, self.model.device)
        for i in range(0, tokens.shape[0], self.chunk):
            part = self.model.prefill(tokens[i : i + self.chunk], self.cache, 0, start=i)
            out[i : i + part.shape[0]].copy_(part)
        return SimpleNamespace(logits=out[None])
