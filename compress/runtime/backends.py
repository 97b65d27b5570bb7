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

from compress.kernels.cpu import FusedDecoder, FusedLayer, decode_attention
from compress.runtime.kv_cache import KVCache
from compress.runtime.linears import QuantLinear
from compress.runtime.weights import ModelWeights


class CpuBackend:
    name = "c"
    int8_activations = True  # the packed linears read QuantizedInput

    def __init__(self, weights: ModelWeights, ropes):
        self.fused = _fused_decoder(weights, ropes)

    def decode_layers(self, h, cache: KVCache, slots, positions) -> bool:
        """Run every block on h [B, hidden] in place, in one C call, when it can."""
        if self.fused is None:
            return False
        self.fused(h, cache, slots, positions)
        return True

    def attend(self, q, k, v, cache: KVCache, layer, slots, positions, scale, window):
        """Store this step's k/v, then attend over 0..position (one C call)."""
        return decode_attention(q, k, v, cache, layer, slots, positions, scale, window)


class TritonBackend:
    name = "triton"
    int8_activations = False

    def __init__(self, weights: ModelWeights, ropes):
        pass

    def decode_layers(self, h, cache, slots, positions) -> bool:
        return False

    def attend(self, q, k, v, cache: KVCache, layer, slots, positions, scale, window):
        from compress.kernels.triton_attention import decode_attention as triton_attention

        cache.write_tokens(layer, slots, positions, k, v)
        return triton_attention(q, cache, layer, slots, positions + 1, scale, window)


BACKENDS = {b.name: b for b in (CpuBackend, TritonBackend)}


def backend_for(weights: ModelWeights, ropes):
    """`ropes`: the runtime's Rope of each layer (its cos/sin tables)."""
    return BACKENDS[weights.kernels](weights, ropes)


def _fused_decoder(w: ModelWeights, ropes):
    """The one-call CPU decoder, when every block linear is a packed weight (outlier
    columns and biases allowed)."""
    rows = []
    for i, layer in enumerate(w.layers):
        lins = layer.linears()
        if layer.moe is not None or not all(isinstance(x, QuantLinear) for x in lins):
            return None
        lins = [x.fused_form() for x in lins]
        r = ropes[i]
        norms = {
            "q_norm": layer.q_norm,
            "k_norm": layer.k_norm,
            "post_attn_norm": layer.post_attn_norm,
            "post_mlp_norm": layer.post_mlp_norm,
        }
        window = w.spec.windows[i] or 0
        rows.append(
            FusedLayer(layer.attn_norm, layer.mlp_norm, *lins, r.cos, r.sin, window, **norms)
        )
    s = w.shape
    inter = w.layers[0].gate_up.out_features // 2
    spec = w.spec
    return FusedDecoder(
        rows, s.hidden, s.heads, s.kv_heads, s.head_dim, inter, spec.eps, spec.attn_scale,
        spec.activation,
    )  # fmt: skip
