"""GPTQ's column loop in C for CPU tensors (cpu/gptq.c).

The loop rounds one column at a time; in torch each column is a dozen small ops, which
on a 135M model cost more than the Hessians. The C loop gives bit-identical integers and
errors (tests/test_gptq.py checks it against the torch loop, which devices other than the
CPU run).
"""

from __future__ import annotations

import torch

from compress.kernels import build


def ready() -> bool:
    """Whether the C library is built; where it cannot be, GPTQ runs its torch loop and
    says so once (the same integers, slower)."""
    return build.ready("GPTQ's column loop")


def columns(wb, j0: int, j1: int, hinv, scale, zero, qmin: int, qmax: int, q, err) -> None:
    """Columns [j0, j1) of the block `wb` [rows, nb] (float32, rows contiguous), in place:
    their integers into `q` [rows, nb] int8, their scaled errors into `err` [rows, nb],
    and each column's error pushed onto the block's later columns. `hinv` [nb, nb]: the
    block's part of H⁻¹'s upper factor; `scale`, `zero` (or None): [rows, nb] float32,
    possibly expanded (stride 0 along the columns: one per row)."""
    floats = (wb, hinv, err, scale) if zero is None else (wb, hinv, err, scale, zero)
    layout_ok = (
        all(t.is_cpu and t.dtype == torch.float32 for t in floats)
        and q.is_cpu
        and q.dtype == torch.int8
        and all(t.stride(1) == 1 for t in (wb, hinv, q, err))
        and scale.stride(1) in (0, 1)
        and (zero is None or zero.stride() == scale.stride())
    )
    if not layout_ok:
        raise TypeError("gptq_loop.columns: CPU float32 rows (int8 q) with unit column stride")
    rows, nb = wb.shape
    build.library().llmp_gptq_columns(
        wb.data_ptr(),
        rows,
        wb.stride(0),
        j0,
        j1,
        nb,
        hinv.data_ptr(),
        hinv.stride(0),
        scale.data_ptr(),
        None if zero is None else zero.data_ptr(),
        scale.stride(0),
        scale.stride(1),
        float(qmin),
        float(qmax),
        q.data_ptr(),
        q.stride(0),
        err.data_ptr(),
        err.stride(0),
    )
