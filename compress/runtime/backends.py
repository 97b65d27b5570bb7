"""One backend per device, chosen at load: what a decode step runs on.

- CPU ("c"): the C kernels. Layer inputs are quantized to int8 once and shared by the
  packed linears; when every block linear is packed, a whole decode step is one C call
  (attention included, for every KV-cache class), otherwise each op runs on its own with
  the C attention.
- CUDA ("triton"): the stored weights dequantized inside Triton matmuls, and a Triton
  attention that reads the fp32 or KIVI cache as stored. Under TRITON_INTERPRET=1 the same
  kernels run on CPU tensors, which is how the tests run this backend without a GPU.
"""

from __future__ import annotations

import torch

from compress.kernels.cpu import FusedDecoder, decode_attention
from compress.runtime.kv_cache import KVCache
from compress.runtime.linears import QuantLinear
from compress.runtime.weights import ModelWeights


class CpuBackend:
    name = "c"
    int8_activations = True  # the packed linears read QuantizedInput

    def __init__(self, weights: ModelWeights, cos: torch.Tensor, sin: torch.Tensor):
        self.fused = _fused_decoder(weights, cos, sin)

    def decode_layers(self, h, cache: KVCache, slots, positions) -> bool:
        """Run every block on h [B, hidden] in place, in one C call, when it can."""
        if self.fused is None:
            return False
        self.fused(h, cache, slots, positions)
        return True

    def attend(self, q, k, v, cache: KVCache, layer: int, slots, positions) -> torch.Tensor:
        """Store this step's k/v, then attend over 0..position (one C call)."""
        return decode_attention(q, k, v, cache, layer, slots, positions)


class TritonBackend:
    name = "triton"
    int8_activations = False

    def __init__(self, weights: ModelWeights, cos: torch.Tensor, sin: torch.Tensor):
        pass

    def decode_layers(self, h, cache, slots, positions) -> bool:
        return False

    def attend(self, q, k, v, cache: KVCache, layer: int, slots, positions) -> torch.Tensor:
        from compress.kernels.triton_attention import decode_attention as triton_attention

        cache.write_tokens(layer, slots, positions, k, v)
        return triton_attention(q, cache, layer, slots, positions + 1)


BACKENDS = {b.name: b for b in (CpuBackend, TritonBackend)}


def backend_for(weights: ModelWeights, cos, sin):
    return BACKENDS[weights.kernels](weights, cos, sin)


def _fused_decoder(w: ModelWeights, cos, sin):
    """The one-call CPU decoder, when every block linear is a packed weight (outlier
    columns allowed)."""
    rows = []
    for layer in w.layers:
        lins = layer.linears()
        if not all(isinstance(x, QuantLinear) and x.bias is None for x in lins):
            return None
        rows.append((layer.attn_norm, layer.mlp_norm, *(x.fused_form() for x in lins)))
    s = w.shape
    inter = w.layers[0].gate_up.out_features // 2
    return FusedDecoder(rows, s.hidden, s.heads, s.kv_heads, s.head_dim, inter, s.eps, cos, sin)
