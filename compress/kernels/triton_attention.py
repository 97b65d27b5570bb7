"""Triton decode attention over the runtime's KV cache, reading int8 / int4 keys and values
as stored (KIVI layout, see compress/runtime/kv_cache.py) or fp32.

One program per (sequence, query head, span of SPAN positions). It walks its span's
quantized groups of GROUP tokens — keys dequantized with their group's per-channel scale
and minimum, values with their per-token scale and minimum — then, in the span that holds
them, the fp32 residual of the latest tokens, with an online softmax (running max and
sum), so no score vector is ever materialized. Bytes read per step and head: L·D·bits/8
for each of k and v, plus the scales.

Spans keep a GPU busy at batch 1: one program per query head is 9 to 64 programs, a few of
a GPU's hundred-odd multiprocessors, each walking thousands of keys alone. A cache whose
sequences may pass SPAN positions is attended in spans, their (max, sum, weighted sum)
merged in order by a second kernel; one that cannot, in one pass. The cut depends on the
positions alone, so a row gets the same bits in any batch (as on the CPU, whose spans are
512 positions too). No speed is claimed: no GPU has run these kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

SPAN = 512  # positions a program attends over when a cache is attended in spans


@triton.jit
def _load_codes(ptr, rows, cols, row_stride, mask, BITS: tl.constexpr):
    if BITS == 4:  # two codes per byte along the head dimension, even one in the low nibble
        byte = tl.load(ptr + rows[:, None] * row_stride + cols[None, :] // 2, mask=mask, other=0)
        return ((byte >> ((cols[None, :] % 2) * 4)) & 0xF).to(tl.float32)
    return tl.load(ptr + rows[:, None] * row_stride + cols[None, :], mask=mask, other=0).to(
        tl.float32
    )


@triton.jit
def _online_softmax(s, v, m_i, l_i, acc):
    """Fold one block of scores s [L] and values v [L, D] into the running max, sum and
    weighted sum. A block with every key masked (outside a sliding window) adds nothing."""
    m_new = tl.maximum(m_i, tl.max(s, axis=0))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp(s - m_safe)
    alpha = tl.exp(m_i - m_safe)
    return m_new, l_i * alpha + tl.sum(p, axis=0), acc * alpha + tl.sum(p[:, None] * v, axis=0)


@triton.jit
def _capped(x, softcap, CAP: tl.constexpr):
    """softcap * tanh(x / softcap) (gemma2's attention scores), tanh(y) as
    1 - 2 / (exp(2y) + 1); x itself without CAP."""
    if CAP:
        x = softcap * (1.0 - 2.0 / (tl.exp(2.0 * x / softcap) + 1.0))
    return x


@triton.jit
def _decode_attention(
    q_ptr,
    o_ptr,
    slot_ptr,
    len_ptr,
    table_ptr,  # [slots, max_blocks] int32: the pool block of each slot's BLOCK positions
    kq_ptr,
    vq_ptr,
    ks_ptr,
    km_ptr,
    vs_ptr,
    vm_ptr,
    kr_ptr,
    vr_ptr,
    max_blocks,
    s_blk_q,  # strides of the pooled rows [kv_heads, blocks, BLOCK, row] (codes, or fp32)
    s_head_q,
    s_row_q,
    s_blk_ks,  # key scales [kv_heads, blocks, BLOCK / GROUP, 1, D]
    s_head_ks,
    s_blk_vs,  # value scales [kv_heads, blocks, BLOCK, 1]
    s_head_vs,
    s_slot_r,  # residual [slots, kv_heads, GROUP, D]
    s_head_r,
    H,
    REP,
    sm_scale,
    window,  # keys within the last `window` positions (0: all)
    softcap,  # scores softcap * tanh(score / softcap) where CAP
    sink_ptr,  # [H]: each head's sink, in its softmax's denominator where SINK
    m_ptr,  # with SPLIT: each span's running max [B, H, NS], its sum, its weighted sum [.., D]
    l_ptr,
    acc_ptr,
    NS,
    D: tl.constexpr,
    DP: tl.constexpr,  # D rounded up to a power of two (tl.arange's), the rest masked
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK: tl.constexpr,
    SPAN_T: tl.constexpr,  # positions per program (with SPLIT) or every position
    SPLIT: tl.constexpr,
    CAP: tl.constexpr,
    SINK: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s_lo = tl.program_id(2) * SPAN_T  # this program's positions: s_lo .. s_lo + SPAN_T - 1
    g = h // REP
    slot = tl.load(slot_ptr + b)
    length = tl.load(len_ptr + b)  # tokens to attend to, the current one included
    lo = tl.where(window > 0, tl.maximum(length - window, 0), 0)  # the first visible key
    d = tl.arange(0, DP)
    q = tl.load(q_ptr + (b * H + h) * D + d, mask=d < D, other=0.0).to(tl.float32)
    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros((DP,), dtype=tl.float32)
    rows = tl.arange(0, GROUP)
    table = table_ptr + slot * max_blocks
    if BITS != 0:
        done = (length // GROUP) * GROUP
        for start in range(s_lo, tl.minimum(done, s_lo + SPAN_T), GROUP):
            blk = tl.load(table + start // BLOCK).to(tl.int64)
            off = start % BLOCK
            r = start + rows
            mask = (r[:, None] < done) & (d[None, :] < D)
            kq = kq_ptr + blk * s_blk_q + g * s_head_q + off * s_row_q
            vq = vq_ptr + blk * s_blk_q + g * s_head_q + off * s_row_q
            ks_base = blk * s_blk_ks + g * s_head_ks + (off // GROUP) * D
            kscale = tl.load(ks_ptr + ks_base + d, mask=d < D, other=0.0)
            kmin = tl.load(km_ptr + ks_base + d, mask=d < D, other=0.0)
            k = _load_codes(kq, rows, d, s_row_q, mask, BITS) * kscale[None, :] + kmin[None, :]
            vs_base = blk * s_blk_vs + g * s_head_vs + off
            vscale = tl.load(vs_ptr + vs_base + rows, mask=r < done, other=0.0)
            vmin = tl.load(vm_ptr + vs_base + rows, mask=r < done, other=0.0)
            v = _load_codes(vq, rows, d, s_row_q, mask, BITS) * vscale[:, None] + vmin[:, None]
            seen = (r < done) & (r >= lo)
            s = tl.where(
                seen,
                _capped(tl.sum(k * q[None, :], axis=1) * sm_scale, softcap, CAP),
                float("-inf"),
            )
            m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc)
        kr = kr_ptr + slot * s_slot_r + g * s_head_r
        vr = vr_ptr + slot * s_slot_r + g * s_head_r
        r = rows  # the residual: full-precision tokens done..length-1 (fewer than GROUP)
        # in the span that holds it (none elsewhere)
        held = tl.where((done >= s_lo) & (done < s_lo + SPAN_T), length - done, 0)
        valid = (r < held) & (done + r >= lo)
        mask = valid[:, None] & (d[None, :] < D)
        k = tl.load(kr + r[:, None] * D + d[None, :], mask=mask, other=0.0)
        v = tl.load(vr + r[:, None] * D + d[None, :], mask=mask, other=0.0)
        s = tl.where(
            valid, _capped(tl.sum(k * q[None, :], axis=1) * sm_scale, softcap, CAP), float("-inf")
        )
        m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc)
    else:  # fp32 blocks
        for start in range(s_lo, tl.minimum(length, s_lo + SPAN_T), GROUP):
            blk = tl.load(table + start // BLOCK).to(tl.int64)
            base = blk * s_blk_q + g * s_head_q + (start % BLOCK) * D
            r = start + rows
            valid = (r < length) & (r >= lo)
            mask = valid[:, None] & (d[None, :] < D)
            k = tl.load(kr_ptr + base + rows[:, None] * D + d[None, :], mask=mask, other=0.0)
            v = tl.load(vr_ptr + base + rows[:, None] * D + d[None, :], mask=mask, other=0.0)
            s = tl.where(
                valid,
                _capped(tl.sum(k * q[None, :], axis=1) * sm_scale, softcap, CAP),
                float("-inf"),
            )
            m_i, l_i, acc = _online_softmax(s, v, m_i, l_i, acc)
    if SPLIT:
        at = (b * H + h) * NS + tl.program_id(2)
        tl.store(m_ptr + at, m_i)
        tl.store(l_ptr + at, l_i)
        tl.store(acc_ptr + at * D + d, acc, mask=d < D)
    else:
        if SINK:
            l_i += tl.exp(tl.load(sink_ptr + h) - m_i)
        tl.store(o_ptr + (b * H + h) * D + d, acc / l_i, mask=d < D)


@triton.jit
def _merge_spans(
    m_ptr,
    l_ptr,
    acc_ptr,
    o_ptr,
    len_ptr,
    sink_ptr,
    H,
    NS,
    D: tl.constexpr,
    DP: tl.constexpr,
    SPAN_T: tl.constexpr,
    SINK: tl.constexpr,
):
    """o = the spans' weighted sums over their sums, each rescaled to the largest max, span
    by span in order over the spans the row reaches (one span: the one-pass bits)."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    n = (tl.load(len_ptr + b) + SPAN_T - 1) // SPAN_T
    base = (b * H + h) * NS
    d = tl.arange(0, DP)
    top = float("-inf")
    for i in range(0, n):
        top = tl.maximum(top, tl.load(m_ptr + base + i))
    den = 0.0
    acc = tl.zeros((DP,), dtype=tl.float32)
    for i in range(0, n):
        w = tl.exp(tl.load(m_ptr + base + i) - top)
        den += tl.load(l_ptr + base + i) * w
        acc += tl.load(acc_ptr + (base + i) * D + d, mask=d < D, other=0.0) * w
    if SINK:
        den += tl.exp(tl.load(sink_ptr + h) - top)
    tl.store(o_ptr + (b * H + h) * D + d, acc / den, mask=d < D)


def decode_attention(
    q: torch.Tensor,
    cache,
    layer: int,
    slots: torch.Tensor,
    lengths: torch.Tensor,
    scale: float | None = None,
    window: int = 0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
):
    """o [B, H, D] for queries q [B, H, D] of sequences in cache `slots`, each attending to
    its first `lengths[b]` cached tokens (its current token already written), only the
    last `window` of them when given; scores times `scale` (default D**-0.5), capped at
    `softcap` when given; each head's softmax with exp(sinks[h]) in its denominator
    where `sinks` [H] is given."""
    b, heads, dim = q.shape
    q = q.contiguous().float()
    out = torch.empty_like(q)
    slots = slots.to(torch.int32).contiguous()
    lengths = lengths.to(torch.int32).contiguous()
    bits = cache.scheme.bits or 0
    if bits:
        kq, vq = cache.kq[layer], cache.vq[layer]
        ks, km = cache.k_scale[layer], cache.k_min[layer]
        vs, vm = cache.v_scale[layer], cache.v_min[layer]
        kr, vr = cache.k_res[layer], cache.v_res[layer]
        group = cache.scheme.group
    else:  # fp32: rows of blocks; the code, scale and residual pointers are never read
        kr, vr = cache.k[layer], cache.v[layer]
        kq = vq = ks = km = vs = vm = kr
        group = 32
    kv_heads = cache.shape[2]
    span = -(-SPAN // group) * group  # whole key groups
    ns = -(-cache.max_len // span) if cache.max_len > span else 1  # spans a row may reach
    if ns > 1:
        m = torch.empty(b, heads, ns, device=q.device)
        l_sum = torch.empty(b, heads, ns, device=q.device)
        acc = torch.empty(b, heads, ns, dim, device=q.device)
    else:
        m = l_sum = acc = out  # never written
    sink = q if sinks is None else sinks.float().contiguous()  # q: never read without sinks
    _decode_attention[(b, heads, ns)](
        q,
        out,
        slots,
        lengths,
        cache.table,
        kq,
        vq,
        ks,
        km,
        vs,
        vm,
        kr,
        vr,
        cache.max_blocks,
        kq.stride(1),
        kq.stride(0),
        kq.stride(2),
        ks.stride(1),
        ks.stride(0),
        vs.stride(1),
        vs.stride(0),
        kr.stride(0),
        kr.stride(1),
        heads,
        heads // kv_heads,
        dim**-0.5 if scale is None else scale,
        window or 0,
        float(softcap or 0.0),
        sink,
        m,
        l_sum,
        acc,
        ns,
        D=dim,
        DP=triton.next_power_of_2(dim),
        BITS=bits,
        GROUP=group,
        BLOCK=cache.block,
        SPAN_T=span if ns > 1 else 1 << 30,
        SPLIT=ns > 1,
        CAP=bool(softcap),
        SINK=sinks is not None,
    )
    if ns > 1:
        dp = triton.next_power_of_2(dim)
        _merge_spans[(b, heads)](
            m, l_sum, acc, out, lengths, sink, heads, ns, D=dim, DP=dp, SPAN_T=span,
            SINK=sinks is not None,
        )  # fmt: skip
    return out
