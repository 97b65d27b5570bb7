"""The scale search's grid in C for CPU tensors (cpu/scale_search.c).

Each (row, group) of weights is read once and every candidate scale's weighted error is
summed in registers, where torch makes eight passes over the slice per candidate. Devices
other than the CPU, and a CPU whose kernels could not be built, run the torch loop of
compress/quantizers/scale_search.py.
"""

from __future__ import annotations

import torch

from compress.kernels import build


def ready() -> bool:
    """Whether the C library is built; where it cannot be, the search runs its torch loop
    and says so once (the same candidates but for near-ties, slower)."""
    return build.ready("the scale search's grid")


def search(
    w: torch.Tensor,
    group: int,
    d: torch.Tensor,
    scales: torch.Tensor,
    zeros: torch.Tensor | None,
    qmin: int,
    qmax: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(least error [rows, groups], its candidate [rows, groups] int64: the first of equal
    ones) for weights w [rows, cols] float32, importance d [cols], and every candidate's
    scale and zero point (or None) as float32 [rows, groups, n]."""
    rows, cols = w.shape
    n = scales.shape[-1]
    if not 0 < n <= 128 or scales.shape != (rows, cols // group, n):
        raise ValueError(f"scale_grid.search: {n} candidates of shape {tuple(scales.shape)}")
    w, d = w.float().contiguous(), d.float().contiguous()
    scales = scales.float().contiguous()
    zeros = None if zeros is None else zeros.float().contiguous()
    err = torch.empty(rows, cols // group, device=w.device)
    best = torch.empty(rows, cols // group, dtype=torch.int32, device=w.device)
    build.library().llmp_scale_search(
        w.data_ptr(), rows, cols, group, d.data_ptr(), scales.data_ptr(),
        None if zeros is None else zeros.data_ptr(), n, float(qmin), float(qmax),
        err.data_ptr(), best.data_ptr(),
    )  # fmt: skip
    return err, best.long()
