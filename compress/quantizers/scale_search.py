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

from compress.quantizers.scheme import QuantScheme, compute_qparams

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
    d = d.reshape(1, -1, group)
    scales, zps = [], []
    for lo in range(0, w.shape[0], ROWS):
        part = w[lo : lo + ROWS].float()
        s, z = _search(part.reshape(part.shape[0], -1, group), scheme, storage_dtype, d)
        scales.append(s)
        zps.append(z)
    scale = torch.cat(scales)
    return scale, None if zps[0] is None else torch.cat(zps)


def _search(g: torch.Tensor, scheme: QuantScheme, dtype: torch.dtype, d: torch.Tensor):
    tiny = torch.finfo(dtype).tiny
    best_err = best_s = best_z = None
    if scheme.zero_point:
        lo0 = g.amin(-1, keepdim=True).clamp(max=0)
        hi0 = g.amax(-1, keepdim=True).clamp(min=0)
    else:
        amax = g.abs().amax(-1, keepdim=True)

    def rounded(s: torch.Tensor) -> torch.Tensor:
        return s.clamp(min=tiny).to(dtype).float().clamp(min=tiny)

    def consider(s: torch.Tensor, z: torch.Tensor | None) -> torch.Tensor:
        nonlocal best_err, best_s, best_z
        q = torch.round(g / s) + (0 if z is None else z)
        q = q.clamp(scheme.qmin, scheme.qmax)
        err = (d * (g - (q - (0 if z is None else z)) * s) ** 2).sum(-1, keepdim=True)
        if best_err is None:
            best_err, best_s, best_z = err, s, z
        else:
            better = err < best_err
            best_err = torch.where(better, err, best_err)
            best_s = torch.where(better, s, best_s)
            if z is not None:
                best_z = torch.where(better, z, best_z)
        return q

    for c in GRID:
        if scheme.zero_point:
            lo, hi = lo0 * c, hi0 * c
            s = rounded((hi - lo) / (scheme.qmax - scheme.qmin))
            z = torch.round(scheme.qmin - lo / s).clamp(scheme.qmin, scheme.qmax)
            consider(s, z)
        else:
            consider(rounded(amax * c / ((scheme.qmax - scheme.qmin) / 2)), None)
    if not scheme.zero_point:  # least-squares refit of the winner's scale to its integers
        for _ in range(2):
            q = (torch.round(g / best_s)).clamp(scheme.qmin, scheme.qmax)
            num = (d * g * q).sum(-1, keepdim=True)
            den = (d * q * q).sum(-1, keepdim=True)
            refit = torch.where((num > 0) & (den > 0), num / den.clamp(min=tiny), best_s)
            consider(rounded(refit), None)
    scale = best_s[..., 0].to(dtype)
    return scale, None if best_z is None else best_z[..., 0].to(torch.int8)
