"""Load an artifact (quantized, pruned or plain) into the runtime's layout.

Straight from safetensors: no transformers model is built. Quantized linears keep their
integer codes, repacked once into the CPU kernels' layout; dense tensors are computed in
fp32 whatever their storage dtype (16-bit matmuls on CPU are slow where the processor
lacks bf16 instructions, and fp32 keeps evaluation equal to transformers' fp32 one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from compress.artifact.reader import quantized_layers
from compress.errors import LlmpressError
from compress.kernels.cpu import PackedLinear
from compress.model.adapters import Adapter, ModelShape, adapter_for
from compress.model.loading import Checkpoint, read_tensors
from compress.runtime.linears import DenseLinear, QuantLinear, TritonQuantLinear, fuse

# What the runtime (torch ops, the C kernels, the Triton kernels) implements.
RUNS = {"norm": "rms", "activation": "silu", "rope": "rotate-half"}


def check_runnable(adapter: Adapter, shape: ModelShape) -> None:
    """Refuse, in one line, a model whose blocks compute what the runtime does not."""
    for kind, runs in RUNS.items():
        if getattr(adapter, kind) != runs:
            raise LlmpressError(
                f"{kind} {getattr(adapter, kind)!r} is not supported by the runtime yet (it "
                f"runs {runs}): evaluate this model with --engine transformers"
            )
    if shape.rope_type != "default":
        raise LlmpressError(
            f"rope type {shape.rope_type!r} is not supported by the runtime yet: evaluate "
            "this model with --engine transformers"
        )


@dataclass
class Layer:
    """One block; q/k/v and gate/up are fused into one linear each (one kernel call)."""

    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    qkv: object
    o: object
    gate_up: object
    down: object

    def linears(self):
        return (self.qkv, self.o, self.gate_up, self.down)


@dataclass
class ModelWeights:
    shape: ModelShape
    embed: torch.Tensor
    layers: list[Layer]
    norm: torch.Tensor
    lm_head: object
    dense_fallbacks: list[str] = field(default_factory=list)
    kernels: str = "c"  # the backend these linears are laid out for: "c" or "triton"

    def linears(self):
        for layer in self.layers:
            yield from layer.linears()
        yield self.lm_head

    @property
    def step_bytes(self) -> int:
        """Weight bytes one decode step reads: every linear as stored, norms, and the one
        embedding row per token (negligible) — the tied lm_head counts once, as a linear."""
        norms = sum(t.numel() * t.element_size() for t in self._norms())
        return sum(lin.nbytes for lin in self.linears()) + norms

    def _norms(self):
        for layer in self.layers:
            yield from (layer.attn_norm, layer.mlp_norm)
        yield self.norm


def _linear(prefix, tensors, codec, layers, fallbacks, device="cpu", kernels="c"):
    bias = tensors.get(f"{prefix}.bias")
    bias = None if bias is None else bias.float()
    if prefix not in layers:
        return DenseLinear(tensors[f"{prefix}.weight"].to(device, torch.float32), bias)
    if kernels == "triton":  # the stored layout itself, where the GPU kernels read it
        stored = codec.device_tensors(prefix, tensors, layers[prefix])
        if stored is not None:
            weight, scale, zp, group, bits, in_features = stored
            on = (weight, scale, zp, bias)
            weight, scale, zp, bias_d = (None if t is None else t.to(device) for t in on)
            return TritonQuantLinear(weight, scale, zp, group, bits, in_features, bias_d)
    s = codec.decode(prefix, tensors, layers[prefix])
    q, index, group, bits = s.q, s.outlier_index, s.group_size, s.scheme.bits
    if index is not None:  # those columns run in 16-bit: their int8 codes must add nothing
        q = q.clone()
        zp = s.zero_point
        q[:, index.long()] = 0 if zp is None else zp.repeat_interleave(group, 1)[:, index.long()]
    try:
        if bits not in (4, 8):
            raise ValueError(f"{bits}-bit")
        if kernels != "c":
            raise ValueError(f"no {kernels} kernel for this layout")
        packed = PackedLinear(q, s.scale, s.zero_point, group, bits)
    except ValueError as e:
        fallbacks.append(f"{prefix} ({e})")
        return DenseLinear(s.dequantize().to(device), None if bias is None else bias.to(device))
    return QuantLinear(packed, bias, index, s.outlier_weight)


def load_weights(
    ckpt: Checkpoint, device: str | None = None, kernels: str | None = None
) -> ModelWeights:
    """`device`: "cpu" or "cuda" (default: cuda when available). `kernels`: the backend,
    "c" (packed CPU kernels) or "triton"; default: triton on cuda, c on cpu (triton on cpu
    runs under TRITON_INTERPRET=1, for tests). The runtime's model, cache and engine follow
    the embedding's device."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    kernels = kernels or ("triton" if torch.device(device).type == "cuda" else "c")
    if kernels not in ("c", "triton") or (kernels == "c" and torch.device(device).type != "cpu"):
        raise LlmpressError(f"kernels {kernels!r} on {device}: use c on cpu, triton on cuda")
    adapter = adapter_for(ckpt.config)
    shape = adapter.shape(ckpt.config)
    check_runnable(adapter, shape)
    tensors = read_tensors(ckpt)
    codec, layers = quantized_layers(ckpt.config, tensors)
    fallbacks: list[str] = []
    blocks = []
    for i in range(shape.layers):
        p = adapter.block_prefix(i)

        def lin(name, p=p):
            return _linear(f"{p}.{name}", tensors, codec, layers, fallbacks, device, kernels)

        blocks.append(
            Layer(
                attn_norm=tensors[f"{p}.{adapter.attn_norm}.weight"].float().to(device),
                mlp_norm=tensors[f"{p}.{adapter.mlp_norm}.weight"].float().to(device),
                qkv=fuse([lin(adapter.q), lin(adapter.k), lin(adapter.v)]),
                o=lin(adapter.o),
                gate_up=fuse([lin(adapter.gate), lin(adapter.up)]),
                down=lin(adapter.down),
            )
        )
    embed = tensors[f"{adapter.embed}.weight"].to(device, torch.float32)
    head = adapter.lm_head
    if f"{head}.weight" in tensors or head in layers:
        lm_head = _linear(head, tensors, codec, layers, fallbacks, device, kernels)
    else:  # tied: the embedding matrix is the output projection
        lm_head = DenseLinear(embed)
    return ModelWeights(
        shape=shape,
        embed=embed,
        layers=blocks,
        norm=tensors[f"{adapter.final_norm}.weight"].float().to(device),
        lm_head=lm_head,
        dense_fallbacks=fallbacks,
        kernels=kernels,
    )
