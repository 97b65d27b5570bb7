"""Group scales chosen by the error they cause on the calibration inputs, not by min-max.

Min-max spends the whole integer range on each group's largest weight. A smaller scale
(clipping that weight) rounds the other 63 more finely, and which of the two wins depends
on how much each input column matters: the error a linear makes on its inputs x is
Σ_i E[x_i²] (w_i - ŵ_i)² to first order (the diagonal of GPTQ's Hessian; llama.cpp's
importance matrix). So each group tries a grid of clipped scales and keeps the one with
the least importance-weighted error, then refits that scale to its integers by weighted
least squares (s = Σ d w q / Σ d q², the scale those integers want), kept only if it
lowers the error again.

On the default model, w4g64 symmetric (benchmarks/scale_search.py, a 16-window screen;
benchmarks/quality.py has the pipeline's figures): RTN's min-max KL 0.452, this search
0.248; GPTQ 0.348, GPTQ on searched scales 0.175. Plain weight MSE (no importance) came
out worse than min-max in an earlier version of the screen (0.480), which is why the
search always takes an importance. Scales keep the storage dtype's rounding as
compute_qparams does, so the integers fit the stored scale exactly.
"""

from __future__ import annotations

import torch

from compress.kernels import scale_grid
from compress.quantizers.scheme import (
    QuantScheme,
    compute_qparams,
    group_range,
    qparams_from_range,
    storage_rounded,
)

# clip factors tried per group; above 1 lets a group's largest positive weight round to
# qmax instead of past it (at 4 bits max|w| / 7.5 puts it at 7.5)
GRID = torch.linspace(0.55, 1.07, 53).tolist()
ROWS = 1024  # rows searched at a time: each candidate holds a few copies of the slice


def search_qparams(
    w: torch.Tensor,
    scheme: QuantScheme,
    group: int,
    storage_dtype: torch.dtype,
    importance: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(scale, zero point) per group of `w` [out, in] minimising Σ importance·(w - ŵ)²,
    `importance` [in] ≥ 0. Same layout as compute_qparams."""
    d = importance.detach().float().to(w.device).clamp(min=0)
    if not bool((d > 0).any()):  # no input was ever seen: nothing to weigh by
        return compute_qparams(w, scheme, group, storage_dtype)
    scales, zps = [], []
    for lo in range(0, w.shape[0], ROWS):
        s, z = _search(w[lo : lo + ROWS].float(), scheme, group, storage_dtype, d)
        scales.append(s)
        zps.append(z)
    scale = torch.cat(scales)
    return scale, None if zps[0] is None else torch.cat(zps)


def _search(w, scheme: QuantScheme, group: int, dtype: torch.dtype, d: torch.Tensor):
    best: list[torch.Tensor | None] = [None, None, None]  # error, scale, zero point
    g, dg = w.reshape(w.shape[0], -1, group), d.reshape(-1, group)
    # every candidate's codes and errors in the same two buffers: allocated afresh, each
    # (8-32 MB at a 1B shape) was a new mapping whose pages all faulted in again
    codes, errors = torch.empty_like(g), torch.empty_like(g)

    def consider(scale: torch.Tensor, zp: torch.Tensor | None) -> None:
        # dequantize(quantize_with(...)) in place, the same float steps
        s = scale.float().unsqueeze(-1)
        q = torch.div(g, s, out=codes).round_()
        if zp is not None:
            z = zp.float().unsqueeze(-1)
            q = q.add_(z).clamp_(scheme.qmin, scheme.qmax).sub_(z)
        else:
            q = q.clamp_(scheme.qmin, scheme.qmax)
        err = torch.sub(g, q.mul_(s), out=errors).pow_(2).mul_(dg).sum(-1)
        if best[0] is None:
            best[:] = [err, scale, zp]
            return
        better = err < best[0]
        best[0] = torch.where(better, err, best[0])
        best[1] = torch.where(better, scale, best[1])
        if zp is not None:
            best[2] = torch.where(better, zp, best[2])

    extent = group_range(w, scheme, group)  # the same for every clip factor
    candidates = [qparams_from_range(extent, scheme, dtype, clip=c) for c in GRID]
    if w.is_cpu and scale_grid.ready():  # the grid in one pass over the slice, in C
        scales = torch.stack([s for s, _ in candidates], -1)
        zps = torch.stack([z for _, z in candidates], -1) if scheme.zero_point else None
        err, pick = scale_grid.search(w, group, d, scales, zps, scheme.qmin, scheme.qmax)
        index = pick.unsqueeze(-1)
        zp = None if zps is None else zps.gather(-1, index).squeeze(-1)
        best[:] = [err, scales.gather(-1, index).squeeze(-1), zp]
    else:
        for candidate in candidates:
            consider(*candidate)
    if not scheme.zero_point:  # least-squares refit of the winner's scale to its integers
        for _ in range(2):  # (quantize_with's integers, and d·w·q, d·q·q, in the buffers)
            s = best[1].float()
            q = torch.div(g, s.unsqueeze(-1), out=codes).round_().clamp_(scheme.qmin, scheme.qmax)
            num = torch.mul(g, dg, out=errors).mul_(q).sum(-1)
            den = torch.mul(q, dg, out=errors).mul_(q).sum(-1)
            refit = torch.where((num > 0) & (den > 0), num / den.clamp(min=1e-30), s)
            consider(storage_rounded(refit, dtype), None)
    return best[1], best[2]
