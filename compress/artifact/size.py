"""How much disk an artifact needs, known before any work from the checkpoint's headers
and the planned scheme of each linear, so a run that cannot fit is refused at the start
rather than after hours of calibration, and one that fits is never refused."""

from __future__ import annotations

from dataclasses import dataclass

from compress.quantizers.scheme import QuantScheme

_INTEGER_BYTES = {"I8": 1, "U8": 1, "I16": 2, "I32": 4, "I64": 8, "BOOL": 1}
_MARGIN = 16 << 20  # config, tokenizer, manifest, card, headers


@dataclass(frozen=True)
class PlannedLinear:
    """A linear's planned storage: its scheme, and the share of input columns kept in
    16-bit beside the integers (LLM.int8() outliers)."""

    scheme: QuantScheme
    outliers: float = 0.0


def quantized_bytes(shape: tuple[int, ...], plan: PlannedLinear, itemsize: int) -> int:
    """Packed integers, a scale (and an 8-bit zero point) per group, outlier columns."""
    out, width = shape[0], shape[1]
    group = plan.scheme.group_for(width) or width
    groups = out * -(-width // group)
    total = out * width * plan.scheme.bits // 8 + groups * itemsize
    if plan.scheme.zero_point:
        total += groups
    cols = int(plan.outliers * width + 0.999)
    return total + cols * (out * itemsize + 8)


def needed_bytes(
    tensors: dict[str, tuple[object, tuple[int, ...], str]],
    plan: dict[str, PlannedLinear],
    itemsize: int,
    block_of,
    added: dict[str, tuple[int, ...]] | None = None,
) -> int:
    """Free disk the writer needs: the artifact, plus its largest part file, which the
    merge holds beside the merged file until it has been copied.

    tensors: the checkpoint's (file, shape, dtype) per name; plan: linear name → planned
    storage (the rest keep their size at `itemsize`, integers at their own); block_of:
    name → the part it is written in; added: tensors the artifact adds (a tied lm_head
    that is quantized), name → shape."""
    parts: dict[object, int] = {}
    entries = [(n, shape, dtype) for n, (_, shape, dtype) in tensors.items()]
    entries += [(n, shape, "F32") for n, shape in (added or {}).items()]
    for name, shape, dtype in entries:
        linear = name.removesuffix(".weight")
        if name.endswith(".weight") and linear in plan:
            size = quantized_bytes(shape, plan[linear], itemsize)
        else:
            numel = 1
            for d in shape:
                numel *= int(d)
            size = numel * _INTEGER_BYTES.get(dtype, itemsize)
        key = block_of(name)
        parts[key] = parts.get(key, 0) + size
    total = sum(parts.values())
    return total + max(parts.values(), default=0) + _MARGIN
