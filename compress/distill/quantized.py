"""A quantized model as a trainable module: scales and zero points learned, codes optional.

Repairing a quantized model end to end (EfficientQAT's second phase) trains only what
the artifact stores in floating point beside the integers: each linear becomes a
`QuantLinear` whose weight is (q − ⌊z⌉)·s, with q an int8 buffer, s = s₀·exp(a) per
group (a learned; log-parametrized so one learning rate suits every layer's scale) and
z = z₀ + δ per group (learned, rounded straight through, since the artifact stores
integer zero points). Exported back, the integers are unchanged and the layout is the
same uniform groups.

With `codes=True` the integers train too, AutoRound's idea carried end to end: each code
gets a float offset v (starting at 0), the forward uses clamp(⌊q + v⌉), rounded straight
through. Adam moves v by at most about its lr a step, so a code changes only where the
gradient keeps one sign for many steps (half a level / lr of them); where it only
fluctuates, Adam's averaged steps are a fraction of lr and cancel. The integers come out
of the repair changed and the layout is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from compress.quantizers.scheme import QuantizedWeight


def _round(x: torch.Tensor) -> torch.Tensor:
    return x + (torch.round(x) - x).detach()


class QuantLinear(torch.nn.Module):
    def __init__(self, qw: QuantizedWeight, bias: torch.Tensor | None, codes: bool = False):
        super().__init__()
        self.scheme, self.group = qw.scheme, qw.group_size
        self.out_features, self.in_features = qw.shape
        self.register_buffer("q", qw.q.clone())
        self.register_buffer("scale0", qw.scale.float().clone())
        self.log_scale = torch.nn.Parameter(torch.zeros_like(self.scale0))
        if qw.zero_point is not None:
            self.register_buffer("zero0", qw.zero_point.float().clone())
            self.zero_offset = torch.nn.Parameter(torch.zeros_like(self.zero0))
        else:
            self.zero0 = self.zero_offset = None
        self.code_offset = torch.nn.Parameter(torch.zeros(qw.shape)) if codes else None
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), False)

    def scale(self) -> torch.Tensor:
        return self.scale0 * self.log_scale.exp()

    def zero(self) -> torch.Tensor | None:
        if self.zero0 is None:
            return None
        lo, hi = self.scheme.qmin, self.scheme.qmax
        return _round(torch.clamp(self.zero0 + self.zero_offset, lo, hi))

    def codes(self) -> torch.Tensor:
        if self.code_offset is None:
            return self.q.float()
        lo, hi = self.scheme.qmin, self.scheme.qmax
        return torch.clamp(_round(self.q.float() + self.code_offset), lo, hi)

    def weight_value(self) -> torch.Tensor:
        g = self.codes().reshape(self.out_features, -1, self.group)
        z = self.zero()
        if z is not None:
            g = g - z[..., None]
        return (g * self.scale()[..., None]).reshape(self.out_features, self.in_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight_value(), self.bias)

    @torch.no_grad()
    def result(self, storage_dtype: torch.dtype) -> QuantizedWeight:
        z = self.zero()
        cpu = torch.device("cpu")  # what the artifact writer reads
        return QuantizedWeight(
            q=self.codes().to(cpu, torch.int8),
            scale=self.scale().to(cpu, storage_dtype),
            zero_point=None if z is None else z.to(cpu, torch.int8),
            scheme=self.scheme,
            group_size=self.group,
        )


def wrap(
    model: torch.nn.Module, quantized: dict[str, QuantizedWeight], codes: bool = False
) -> dict[str, QuantLinear]:
    """Replace each named linear of `model` by its QuantLinear (only weight-only ones:
    16-bit outlier columns and int8 activations are left as they are); `codes`: the
    integers train too."""
    wrapped = {}
    for name, qw in quantized.items():
        if qw.outlier_index is not None or qw.activations:
            continue
        parent, _, child = name.rpartition(".")
        owner = model.get_submodule(parent) if parent else model
        linear = getattr(owner, child)
        if not isinstance(linear, torch.nn.Linear):
            continue
        wrapped[name] = QuantLinear(qw, linear.bias, codes).to(linear.weight.device)
        setattr(owner, child, wrapped[name])
    return wrapped


def param_groups(
    wrapped: dict[str, QuantLinear], lr: float, zero_lr: float, code_lr: float = 0.0
) -> list[dict]:
    """The optimizer's groups: log-scales at `lr`, zero-point offsets (in levels) at
    `zero_lr`, code offsets (in levels) at `code_lr`."""
    scales = [m.log_scale for m in wrapped.values()]
    zeros = [m.zero_offset for m in wrapped.values() if m.zero_offset is not None]
    codes = [m.code_offset for m in wrapped.values() if m.code_offset is not None]
    groups = [{"params": scales, "lr": lr}]
    if zeros:
        groups.append({"params": zeros, "lr": zero_lr})
    if codes:
        groups.append({"params": codes, "lr": code_lr})
    return groups


def dense_vectors(model: torch.nn.Module, adapter) -> dict[str, torch.nn.Parameter]:
    """The 1-D parameters of the blocks and the final norm (norm weights, biases): stored
    dense by the artifact, so a repair may train them at no cost in bits."""
    prefixes = (adapter.blocks + ".", adapter.final_norm + ".")
    return {
        name: p for name, p in model.named_parameters() if p.ndim == 1 and name.startswith(prefixes)
    }
