"""Triton GEMM/GEMV that dequantize int4 / int8 weights inside the matrix multiply (GPU).

Weights are read as the artifact stores them (compressed-tensors): int4 packed eight to an
int32 word along the input dimension (element i in bits 4i..4i+3, offset by 8), int8 as
is; scales [N, K/G]; zero points (signed, optional) [N, K/G]. Each program owns a
BLOCK_M × BLOCK_N tile of the output and walks K in BLOCK_K steps: load the codes, turn
them into weights with their group's scale and zero point in registers, multiply, and
accumulate in fp32; masked loads handle ragged M, N, K and a group that does not divide
BLOCK_K. Per output tile it moves K·BLOCK_N·bits/8 weight bytes (+ scales) once, so at
batch 1 the kernel is bound by those bytes, as a decode step should be.

Batch > 1 uses tl.dot (BLOCK_M >= 16, tensor cores on GPU); batch 1 and other small
batches use a broadcast multiply and a reduction (GEMV), which needs no 16-row padding.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl


@triton.jit
def _dequant_matmul(
    x_ptr,
    w_ptr,
    s_ptr,
    z_ptr,
    y_ptr,
    M,
    N,
    K,
    G,
    stride_xm,
    stride_wn,
    stride_sn,
    stride_zn,
    stride_ym,
    BITS: tl.constexpr,
    HAS_ZP: tl.constexpr,
    USE_DOT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        x_mask = (rm[:, None] < M) & (rk[None, :] < K)
        x = tl.load(x_ptr + rm[:, None] * stride_xm + rk[None, :], mask=x_mask, other=0.0)
        w_mask = (rk[:, None] < K) & (rn[None, :] < N)
        if BITS == 4:
            words = tl.load(
                w_ptr + rn[None, :] * stride_wn + rk[:, None] // 8, mask=w_mask, other=0
            )
            q = ((words >> ((rk[:, None] % 8) * 4)) & 0xF) - 8
        else:
            q = tl.load(w_ptr + rn[None, :] * stride_wn + rk[:, None], mask=w_mask, other=0)
        group = rk[:, None] // G
        scale = tl.load(s_ptr + rn[None, :] * stride_sn + group, mask=w_mask, other=0.0)
        w = q.to(tl.float32)
        if HAS_ZP:
            zp = tl.load(z_ptr + rn[None, :] * stride_zn + group, mask=w_mask, other=0)
            w = w - zp.to(tl.float32)
        w = w * scale.to(tl.float32)  # [BLOCK_K, BLOCK_N]
        if USE_DOT:
            acc += tl.dot(x.to(tl.float32), w)
        else:
            acc += tl.sum(x.to(tl.float32)[:, :, None] * w[None, :, :], axis=1)
    y_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc, mask=y_mask)


def dequant_matmul(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    zero_point: torch.Tensor | None,
    group_size: int,
    bits: int,
    in_features: int,
) -> torch.Tensor:
    """y [M, N] = x [M, K] @ dequant(weight).T. `weight`: int32 [N, ceil(K/8)] for 4 bits
    (compressed-tensors packing), int8 [N, K] for 8 bits; `zero_point` int [N, K/G] or None."""
    if bits not in (4, 8):
        raise ValueError(f"triton kernels take 4 or 8 bits, got {bits}")
    x = x.contiguous()
    m, k = x.shape
    if k != in_features:
        raise ValueError(f"input width {k} != weight width {in_features}")
    n = weight.shape[0]
    y = torch.empty(m, n, device=x.device, dtype=torch.float32)
    use_dot = m >= 16
    block_m = 16 if use_dot else triton.next_power_of_2(m)
    block_n, block_k = (64, 64) if use_dot else (64, 32)
    if os.environ.get("TRITON_INTERPRET") == "1":  # numpy runs a block in one op: fewer,
        # larger programs (the same masked code) cut the interpreter's per-op cost
        rows = 1 if use_dot else block_m  # the GEMV product is [BLOCK_M, BLOCK_K, BLOCK_N]
        block_k = min(triton.next_power_of_2(k), 1024)
        block_n = max(16, min(triton.next_power_of_2(n), 2**20 // (block_k * rows)))
    zp = zero_point if zero_point is not None else scale  # unused pointer when no zero point
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _dequant_matmul[grid](
        x,
        weight,
        scale,
        zp,
        y,
        m,
        n,
        k,
        group_size,
        x.stride(0),
        weight.stride(0),
        scale.stride(0),
        zp.stride(0),
        y.stride(0),
        BITS=bits,
        HAS_ZP=zero_point is not None,
        USE_DOT=use_dot,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_K=block_k,
    )
    return y
