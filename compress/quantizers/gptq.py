"""GPTQ: rounding that compensates its own error (Frantar et al., 2023).

Each linear's columns are rounded one at a time; the error a column's rounding makes on
the calibration inputs is pushed onto the columns not yet rounded, weighted by the
inverse Hessian of the layer's least-squares problem, H = 2 XᵀX over the calibration
tokens. Group scales and zero points are ordinary min-max ones, computed as each group of
columns is reached (from the weights as the earlier columns' errors left them), so the
stored layout is the plain uniform int groups RTN writes. With `act_order` the columns are
visited by decreasing H diagonal and the groups are static (computed from the original
weights before any update), which keeps the layout unchanged too.

Like AWQ it calibrates block by block on the hidden states the already-quantized blocks
produce, in the same bounded memory: one H per distinct linear input of the block.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from compress.distributed import all_sum, sum_floats
from compress.errors import LlmpressError
from compress.kernels import gptq_loop
from compress.model.moe import moe_modules
from compress.quantizers.preflight import check_layers
from compress.quantizers.rtn import RTNConfig, adjusted_groups
from compress.quantizers.scale_search import search_qparams
from compress.quantizers.scheme import (
    QuantizedWeight,
    QuantScheme,
    compute_qparams,
)
from compress.stage import BlockContext, Described, Workspace, register_stage

BLOCK = 128  # columns updated together (the lazy batch update of the paper)
# Rows of the in-place inverse's blocks and of the act-order permutation's slices.
ROWS = 2048
# Sub-blocks of the in-place inverse's products (_invert_lower_), which skip the zero half
# of the triangles they multiply: a 1B model's 8192-wide down_proj factor in 0.6 of the time.
SUB = 512
# H is summed a band of BAND rows at a time, each from its own first column on (slab i:
# rows and columns from i·BAND on), so about half the products and half the float64
# memory of the whole matrix: the default model's Hessians in 0.67-0.78 of the time at
# widths 576 to 4096 (256 beat 128 and 512 there). At a 7B model's down_proj (18,944
# inputs) the whole fp32 product and its float64 copy beside the float64 sum peaked
# compress at 8.6 GB; slabs of 2048 rows held every H of 2048 inputs or fewer whole (64
# experts of DeepSeek-V2-Lite's widths: 3.2 GB of float64).
BAND = 256

# FLOP-equivalents of the column solve (compress/estimate.py): its lazy-batch updates are
# skinny products, out·in² FLOPs at a fraction of the probe's rate; the scale search
# tries its grid on every weight (out·in); each column has steps of its own; H⁻¹'s factor
# costs in³. Fitted by benchmarks/gptq_rounding.py --fit on the default model's,
# Llama-3.2-1B's and a Qwen2.5-7B MLP's shapes (the column loop in C).
SOLVE_FACTOR = 4.0
SEARCH_FLOPS = 1.77e4
COLUMN_FLOPS = 2.7e6
FACTOR_FLOPS = 1.5


def solve_flops(out: int, inp: int) -> float:
    """FLOP-equivalents of rounding one [out, inp] linear (the estimate's model), H⁻¹'s
    factor included."""
    return _rounding_flops(out, inp) + FACTOR_FLOPS * inp**3


def _rounding_flops(out: int, inp: int) -> float:
    """solve_flops without the factor, which linears reading one input share (Factor)."""
    return SOLVE_FACTOR * out * inp * inp + SEARCH_FLOPS * out * inp + COLUMN_FLOPS * inp


@dataclass(frozen=True)
class GPTQConfig(RTNConfig):
    """RTN's scheme settings (bits, group_size, zero_point), plus how GPTQ rounds."""

    # visit columns by decreasing activation energy (static groups): on the default model
    # it cuts each linear's output error (tr ΔW H ΔWᵀ) by 10-50% against plain column
    # order with groups computed as they are reached
    act_order: bool = True
    dampening: float = 0.01  # added to H's diagonal, as a fraction of its mean
    # group scales searched against H's diagonal (scale_search.py) instead of min-max: on
    # the default model KL 0.348 → 0.175 (benchmarks/scale_search.py)
    scale_search: bool = True
    # what each linear's rounding fits: "reference", its own outputs on the compressed
    # inputs (GPTQ as published), or "original", the original model's outputs on its own
    # inputs (asymmetric calibration, as GPTAQ), each linear then measured once the ones
    # before it in the block are rounded; on the default model at w4g64 with 16 samples
    # KL 0.146 → 0.112 (benchmarks/quality.py --gptq-target original); "auto": original
    # where every linear sees every token, reference for routed experts (the manifest says
    # which ran)
    target: str = "reference"
    # the ridge on that least-squares fit, as a fraction of H's mean diagonal: fitted on
    # its own calibration tokens it overfits, and at GPTQ's own 0.01 the down_proj errs
    # more on held-out text than with no correction at all
    original_dampening: float = 0.3

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 < self.dampening < 1:
            raise LlmpressError(f"gptq: dampening must be in (0, 1), got {self.dampening}")
        if self.target not in ("reference", "original", "auto"):
            raise LlmpressError(
                f"gptq: target must be reference, original or auto, got {self.target!r}"
            )
        if not self.original_dampening > 0:
            raise LlmpressError(
                f"gptq: original_dampening must be > 0, got {self.original_dampening}"
            )


@dataclass
class Factor:
    """What GPTQ takes from one H, made once for all the linears that read the same input
    (q/k/v, gate/up): the visiting order (act_order) or None, H⁻¹'s upper Cholesky factor
    in it, and H's diagonal (zero: an input never seen; else its importance)."""

    hinv: torch.Tensor
    perm: torch.Tensor | None
    diagonal: torch.Tensor


def factor_of(
    h: torch.Tensor | list[torch.Tensor], dampening: float, act_order: bool, own: bool = False
) -> Factor:
    """The Factor of H (`own`: as gptq_quantize's)."""
    held = h if isinstance(h, list) else [h]
    diagonal = torch.diagonal(held[0]).clone()
    hinv, perm = _inverse_factor(held, dampening, act_order, own)
    return Factor(hinv, perm, diagonal)


def gptq_quantize(
    w: torch.Tensor,
    h: torch.Tensor | list[torch.Tensor] | None,
    scheme: QuantScheme,
    storage_dtype: torch.dtype,
    act_order: bool = False,
    dampening: float = 0.01,
    own: bool = False,
    scale_search: bool = False,
    factor: Factor | None = None,
) -> QuantizedWeight:
    """GPTQ of one weight [out, in] against the Hessian h [in, in] of its inputs (`own`:
    h is this call's to overwrite, its memory freed as the factorization proceeds; pass
    it as a one-element list, which this call empties, so that no caller's frame keeps
    it alive: at a 7B down_proj that is 1.4 GB), or against its `factor` (factor_of, with
    the same dampening and act_order; h then None), which several weights can share.

    With `scale_search`, group scales are searched against H's diagonal
    (scale_search.py) instead of min-max. On the default model (benchmarks/scale_search.py,
    w4g64, 16 windows): KL 0.348 → 0.175. Choosing per row whichever of the two leaves
    less GPTQ loss on the calibration inputs is worse, KL 0.224: the searched scales lose
    on that loss in most q/v rows and still win on the text."""
    if factor is None:
        factor = factor_of(h, dampening, act_order, own)
    del h
    w = w.detach().float().clone()
    rows, cols = w.shape
    group = scheme.group_for(cols)
    w[:, factor.diagonal == 0] = 0  # inputs never seen: their columns cannot matter
    importance = factor.diagonal if scale_search else None

    def qparams(span: torch.Tensor, first: int):
        if importance is None:
            return compute_qparams(span, scheme, group, storage_dtype)
        d = importance[first : first + span.shape[1]]
        return search_qparams(span, scheme, group, storage_dtype, d)

    static = None
    if act_order:  # groups fixed from the original weights, in stored column order
        static = qparams(w, 0)
    hinv, perm = factor.hinv, factor.perm
    if act_order:
        w = w[:, perm]
    order = (perm if act_order else torch.arange(cols)).tolist()  # read per column, on the host
    dev = w.device
    q = torch.zeros(rows, cols, dtype=torch.int8, device=dev)
    scale = torch.zeros(rows, cols // group, dtype=storage_dtype, device=dev)
    zp = None
    if scheme.zero_point:
        zp = torch.zeros(rows, cols // group, dtype=torch.int8, device=dev)
    block = group * max(1, BLOCK // group) if group < cols else BLOCK  # groups never straddle
    s = z = None
    # a block's working copies, made once per weight: at a 1B model's 8192 rows each is
    # 4 MB, at the allocator's mmap threshold, and was mapped and faulted in every block
    kept = _BlockBuffers(rows, block, dev, static)
    product = torch.empty(rows * max(cols - block, 0), device=dev)
    if static is not None:
        static_s = static[0].float()
        static_z = None if static[1] is None else static[1].float()
    for b0 in range(0, cols, block):
        b1 = min(b0 + block, cols)
        buffers = kept if b1 - b0 == block else _BlockBuffers(rows, b1 - b0, dev, static)
        wb, err, qb = buffers.wb.copy_(w[:, b0:b1]), buffers.err.zero_(), buffers.q
        hb = hinv[b0:b1, b0:b1]
        if static is not None:  # each column its stored column's group
            g = torch.tensor([c // group for c in order[b0:b1]], device=dev)
            s = torch.index_select(static_s, 1, g, out=buffers.s)
            z = None if static_z is None else torch.index_select(static_z, 1, g, out=buffers.z)
            _round_columns(wb, 0, b1 - b0, hb, s, z, scheme, qb, err)
        else:
            for j0 in range(0, b1 - b0, group):
                if group < cols or b0 == 0:  # a new group: its parameters from w as it is now
                    span = wb[:, j0 : j0 + group] if group < cols else w
                    s16, z8 = qparams(span, b0 + j0 if group < cols else 0)
                    g = (b0 + j0) // group
                    scale[:, g : g + 1] = s16
                    if zp is not None:
                        zp[:, g : g + 1] = z8
                    s, z = s16.float(), None if z8 is None else z8.float()
                wide = (rows, b1 - b0)  # one parameter per row, seen as one per column
                z_wide = None if z is None else z.expand(wide)
                _round_columns(
                    wb, j0, min(j0 + group, b1 - b0), hb, s.expand(wide), z_wide, scheme, qb, err
                )
        q[:, order[b0:b1]] = qb
        if b1 < cols:  # the product into one kept buffer, not a fresh [rows, cols - b1]
            w[:, b1:] -= torch.mm(
                err, hinv[b0:b1, b1:], out=product[: rows * (cols - b1)].view(rows, -1)
            )
    if static is not None:
        scale, zp = static
    return QuantizedWeight(q=q, scale=scale, zero_point=zp, scheme=scheme, group_size=group)


class _BlockBuffers:
    """One column block's working tensors [rows, width]: the weights being rounded, their
    errors, their integers and, with `static` groups (scale, zero point or None), each
    column's scale and zero point."""

    def __init__(self, rows: int, width: int, device, static: tuple | None):
        self.wb = torch.empty(rows, width, device=device)
        self.err = torch.empty(rows, width, device=device)
        self.q = torch.empty(rows, width, dtype=torch.int8, device=device)
        self.s = self.z = None
        if static is not None:
            self.s = torch.empty(rows, width, device=device)
            if static[1] is not None:
                self.z = torch.empty(rows, width, device=device)


def _round_columns(wb, j0: int, j1: int, hinv, s, z, scheme: QuantScheme, q, err) -> None:
    """Columns [j0, j1) of the block `wb` rounded in turn, in place: each column's integers
    into `q`, its error scaled by H⁻¹'s diagonal into `err`, and that error pushed onto the
    block's later columns. `s`, `z` (or None): [rows, block] float32, one per column (an
    expanded view where one per row). On the CPU the C loop (bit-identical; 1.2-3x faster
    per linear, benchmarks/gptq_rounding.py); elsewhere the same steps in torch."""
    if wb.is_cpu and gptq_loop.ready():
        gptq_loop.columns(wb, j0, j1, hinv, s, z, scheme.qmin, scheme.qmax, q, err)
        return
    for j in range(j0, j1):
        x, sj = wb[:, j : j + 1], s[:, j : j + 1]
        zj = None if z is None else z[:, j : j + 1]
        qc = torch.round(x / sj)  # as quantize_with rounds
        if zj is not None:
            qc = qc + zj
        qc = qc.clamp(scheme.qmin, scheme.qmax)
        q[:, j] = qc[:, 0].to(torch.int8)
        e = (x - (qc - (0 if zj is None else zj)) * sj) / hinv[j, j]
        wb[:, j + 1 :] -= e @ hinv[j : j + 1, j + 1 :]
        err[:, j : j + 1] = e


def _inverse_factor(held: list[torch.Tensor], dampening: float, act_order: bool, own: bool):
    """(the upper Cholesky factor of H⁻¹ [cols, cols], the column order or None), in fp32,
    computed in H's own memory.

    Memory is what bounds it: at a 7B model's down_proj (18,944 inputs) one such matrix is
    1.4 GB, and a factor beside its inverse was two. With J the reversal, the upper factor
    U of H_p⁻¹ (H_p: H in the visiting order) is J·L⁻¹·J, where L is the lower Cholesky
    factor of J·H_p·J: so H is permuted into the reversed order in place, factored in
    place, its factor inverted in place block by block and reversed in place, and only
    slabs of it are ever copied."""
    h = held.pop() if own else held[0].clone()
    diagonal = torch.diagonal(h)
    dead = diagonal == 0
    h[dead, dead] = 1
    perm = torch.argsort(diagonal, descending=True) if act_order else None
    n = h.shape[0]
    order = perm.flip(0).tolist() if perm is not None else list(range(n - 1, -1, -1))
    _permute_(h, order)
    torch.diagonal(h).add_(dampening * torch.diagonal(h).mean())
    info = torch.empty((), dtype=torch.int32, device=h.device)
    torch.linalg.cholesky_ex(h, out=(h, info))
    if int(info):
        raise torch.linalg.LinAlgError(
            f"gptq: the damped Hessian is not positive-definite (minor {int(info)}); "
            "raise gptq.dampening"
        )
    _invert_lower_(h)
    _reverse_(h)
    return h, perm


def _permute_(h: torch.Tensor, order: list[int]) -> None:
    """h ← h[order][:, order], in place: rows by following the permutation's cycles (one
    row held aside), columns a slab of rows at a time."""
    seen = [False] * len(order)
    for start in range(len(order)):
        if seen[start] or order[start] == start:
            continue
        held, j = h[start].clone(), start
        while True:
            seen[j] = True
            nxt = order[j]
            if nxt == start:
                h[j] = held
                break
            h[j] = h[nxt]
            j = nxt
    index = torch.tensor(order, device=h.device)
    for lo in range(0, h.shape[0], ROWS):
        h[lo : lo + ROWS] = h[lo : lo + ROWS].index_select(1, index)


def _invert_lower_(factor: torch.Tensor, block: int = ROWS) -> None:
    """A lower-triangular matrix (zeros above its diagonal) ← its inverse, in place, by
    blocks of `block` from the last: a block's panel below its diagonal block is taken to
    −(inverse of the trailing part) · panel · (inverse of the diagonal block). A diagonal
    block wider than SUB is inverted by the same steps in blocks of SUB (2048 wide: 42 ms
    against solve_triangular's 102 here), a narrower one by solve_triangular."""
    n = factor.shape[0]
    for lo in reversed(range(0, n, block)):
        hi = min(lo + block, n)
        if hi - lo > SUB:
            diag = factor[lo:hi, lo:hi].clone()
            _invert_lower_(diag, SUB)
        else:
            eye = torch.eye(hi - lo, dtype=factor.dtype, device=factor.device)
            diag = torch.linalg.solve_triangular(factor[lo:hi, lo:hi], eye, upper=False)
        if hi < n:  # both products skip the zeros above their triangles' diagonals
            panel = torch.empty(n - hi, hi - lo, dtype=factor.dtype, device=factor.device)
            for r0 in range(hi, n, SUB):  # a row of the trailing inverse: columns to its own
                r1 = min(r0 + SUB, n)
                torch.mm(factor[r0:r1, hi:r1], factor[hi:r1, lo:hi], out=panel[r0 - hi : r1 - hi])
            for c0 in range(0, hi - lo, SUB):  # a column of diag's inverse: rows from its own
                c1 = min(c0 + SUB, hi - lo)
                factor[hi:, lo + c0 : lo + c1] = (panel[:, c0:] @ diag[c0:, c0:c1]).neg_()
            del panel
        factor[lo:hi, lo:hi] = diag


def _reverse_(h: torch.Tensor) -> None:
    """h ← J·h·J (rows and columns reversed), in place: the flat buffer reversed."""
    flat = h.view(-1)
    size, chunk = flat.numel(), 1 << 22
    for lo in range(0, size // 2, chunk):
        hi = min(lo + chunk, size // 2)
        head = flat[lo:hi].clone()
        flat[lo:hi] = flat[size - hi : size - lo].flip(0)
        flat[size - hi : size - lo] = head.flip(0)


def _slabs(width: int, device) -> list[torch.Tensor]:
    """Zeroed float64 slabs of a [width, width] Hessian's upper triangle: slab i holds
    rows i·BAND on, from that column on."""
    return [
        torch.zeros(min(BAND, width - lo), width - lo, dtype=torch.float64, device=device)
        for lo in range(0, width, BAND)
    ]


def _slab_elements(width: int) -> int:
    return sum(min(BAND, width - lo) * (width - lo) for lo in range(0, width, BAND))


def _hessian_flops(width: int, tokens: int) -> int:
    """FLOPs of _accumulate over `tokens` inputs: each band's rows by its columns."""
    return sum(2 * tokens * min(BAND, width - lo) * (width - lo) for lo in range(0, width, BAND))


def _accumulate(slabs: list[torch.Tensor], x: torch.Tensor) -> None:
    """slabs += 2·xᵀx's upper triangle for inputs x [tokens, width]: fp32 products summed
    in float64 (exact in any order: distributed.py), by bands of rows so the fp32
    temporary stays small and little below the diagonal is computed (what a band puts
    there is dropped: _mean_fp32 mirrors the upper triangle)."""
    for i, slab in enumerate(slabs):
        lo = i * BAND
        slab.add_(x[:, lo : lo + BAND].T @ x[:, lo:], alpha=2)


class _Gram:
    """One input's sum of 2·xᵀx (_accumulate), and its token count. The inputs themselves
    are kept instead while they take fewer bytes than the float64 triangle, and summed
    when H is taken, chunk by chunk in the order they came: the same products added in
    the same order, so the same bits. A routed expert sees a few of the calibration tokens
    (8 × 256 tokens at DeepSeek-V2-Lite's 64 experts, 6 a token: about 190 an expert,
    1.5 MB of inputs against 19 MB of triangle)."""

    def __init__(self, width: int, device):
        self.width, self.device = width, device
        self.chunks: list[torch.Tensor] = []
        self.held = 0  # elements in chunks
        self.slabs: list[torch.Tensor] | None = None
        self.n = 0

    def add(self, x: torch.Tensor) -> None:
        """x [tokens, width], in any float dtype (summed in fp32 products)."""
        self.n += x.shape[0]
        if self.slabs is not None:
            _accumulate(self.slabs, x.float())
            return
        # a copy: x may be a view of a buffer the forward reuses
        self.chunks.append(x.clone() if x.dtype == torch.float32 else x.float())
        self.held += x.numel()
        if self.held * 4 > _slab_elements(self.width) * 8:
            self._fold()

    def _fold(self) -> None:
        if self.slabs is None:
            self.slabs = _slabs(self.width, self.device)
        while self.chunks:
            _accumulate(self.slabs, self.chunks.pop(0))
        self.held = 0

    def mean(self) -> torch.Tensor:
        """H over every token of every rank as one symmetric fp32 matrix; the sums are
        dropped."""
        self._fold()
        for slab in self.slabs:  # summed over the ranks under torchrun
            all_sum(slab)
        (self.n,) = sum_floats(self.n)
        return _mean_fp32(self.slabs, self.n)


def _mean_fp32(slabs: list[torch.Tensor], n: int) -> torch.Tensor:
    """The float64 sum over n as one symmetric fp32 matrix, from the slabs of its upper
    triangle (slab i: rows i·ROWS on, columns from the same index), each slab freed once
    copied and mirrored."""
    width = slabs[0].shape[1]
    out = torch.empty(width, width, dtype=torch.float32, device=slabs[0].device)
    lo = 0
    while slabs:
        slab = slabs.pop(0).div_(n).float()
        rows = slab.shape[0]
        diagonal = slab[:, :rows].triu()  # below it the bands left zeros or nothing summed
        out[lo : lo + rows, lo : lo + rows] = diagonal + diagonal.triu(1).T
        out[lo : lo + rows, lo + rows :] = slab[:, rows:]
        out[lo + rows :, lo : lo + rows] = slab[:, rows:].T
        lo += rows
        del slab, diagonal
    return out


def _toward_original(
    w: torch.Tensor, h: torch.Tensor, c: torch.Tensor, dampening: float
) -> torch.Tensor:
    """The weight whose outputs on the compressed inputs x best match the original's on
    the original inputs x_o: W + W·C·H⁻¹ (least squares, H = 2xᵀx, C = 2(x_o − x)ᵀx, H
    damped by `dampening` of its mean diagonal). Rounding it against H then minimises
    ‖W·x_o − Q·x‖, the error the original model would see."""
    w = w.detach().float()
    damped = h.clone()
    torch.diagonal(damped).add_(dampening * torch.diagonal(h).mean() + 1e-8)
    factor = torch.linalg.cholesky(damped)
    return w + torch.cholesky_solve((w @ c).T.contiguous(), factor).T


# the most memory target original keeps of the original's side of a block's inputs: the
# default model's four on 128 samples take 0.86 GB; a 7B's are measured again instead
KEEP_BYTES = 1 << 30


def _keep_deepest(sizes: list[int]) -> list[bool]:
    """Which of a block's later inputs (in block order, the bytes of their original side)
    the first pass keeps: the deepest first, since a deeper input's pass runs further
    into the block, as many as fit KEEP_BYTES together. The default model's three on 256
    samples take 1.4 GB: down_proj's 0.8 GB is kept, which spares the longest pass."""
    kept, room = [False] * len(sizes), KEEP_BYTES
    for i in reversed(range(len(sizes))):
        if sizes[i] <= room:
            kept[i], room = True, room - sizes[i]
    return kept


def _keepable(ctx: BlockContext, keys: list[str]) -> list[str]:
    """Of `keys` (in block order), the inputs whose original side the first measuring pass
    keeps for the later ones (each other pass runs both sides again)."""
    x = ctx.original_inputs
    tokens = x.shape[0] * x.shape[1]
    sizes = [tokens * x.element_size() * ctx.sub(k).in_features for k in keys]
    return [k for k, kept in zip(keys, _keep_deepest(sizes), strict=True) if kept]


def _shared_inputs(ctx: BlockContext) -> dict[str, str]:
    """Each target linear → the linear whose input H is measured on: linears that read the
    very same tensor (q/k/v, gate/up, one expert's gate/up: adapter.shared_inputs; the
    gate/up of every expert calibrated on every token) share one H."""
    targets = ctx.targets()
    key = {rel: rel for rel in targets}
    for group in [*ctx.adapter.shared_inputs, _every_token_inputs(ctx.module)]:
        members = [rel for rel in group if rel in key]
        for rel in members:
            key[rel] = key[members[0]]
    return key


def _every_token_inputs(block: torch.nn.Module) -> list[str]:
    """The gate and up linears of the experts calibrated on every token (model/moe.py)
    and of a shared expert: all read the MLP's whole input. One H for them all, not one
    each: every expert of DeepSeek-V2-Lite's widths is calibrated so on 2,048 tokens, and
    64 copies of its H took 1.1 GB."""
    chosen = set()
    for moe in moe_modules(block):
        if moe.all_tokens:
            chosen |= {id(moe.experts[e]) for e in moe.all_tokens}
            if moe.shared_names is not None:
                chosen.add(id(moe.get_submodule(moe.shared_names[0])))
    names = []
    for name, module in block.named_modules():
        if id(module) in chosen:
            gate, up, _ = module.names
            names += [f"{name}.{gate}", f"{name}.{up}"]
    return names


@register_stage("gptq", GPTQConfig)
class GPTQ(Described):
    per_layer_schemes = True
    activations = None
    needs_calibration = True

    def work(self, load) -> float:
        """The Hessians (x·xᵀ over the tokens each distinct input sums) and the column solve
        (out·in² for the lazy-batch updates, plus each column's own steps; H⁻¹'s factor
        once an input: the 64 experts' gate/up at DeepSeek-V2-Lite's widths share one).
        Target original adds the full (x_o − x)ᵀx product per input, each linear's fit,
        and the passes that measure each later input once those before it are rounded,
        each stopping at that input (about half a block): a pass over both streams for
        each input after the first, over one where the original's side is kept from the
        first."""
        hessians = sum(_hessian_flops(d, round(load.tokens * share)) for d, share in load.inputs)
        solve = sum(_rounding_flops(o, i) for o, i in load.linears)
        solve += sum(FACTOR_FLOPS * d**3 for d, _ in load.inputs)  # one factor an H
        if not self.needs_original:
            return load.layers * (hessians + solve)
        cross = sum(2 * load.tokens * share * d * d for d, share in load.inputs)
        fit = sum(4 * o * i * i + i**3 for o, i in load.linears)
        kept = _keep_deepest([load.tokens * 4 * d for d, _ in load.inputs[1:]])  # fp32
        passes = sum(0.5 if k else 1.0 for k in kept) * load.forward(load.tokens)
        return load.layers * (hessians + solve + cross + fit) + passes

    def __init__(self, config: GPTQConfig):
        self.config = config
        self.groups: dict[str, int] = {}
        self.seconds = {"hessians": 0.0, "rounding": 0.0}
        self._grams: dict[str, _Gram] = {}  # each input's H, taken when its linear is rounded
        self._key: dict[str, str] = {}
        self._c: dict[str, torch.Tensor] = {}  # target original: 2·(x_orig − x)ᵀx, float64
        self.target = config.target  # auto: resolved by preflight, which reads the model
        self.needs_original = config.target != "reference"

    @property
    def scheme(self) -> QuantScheme:
        return self.config.scheme

    @staticmethod
    def weight_bits(settings: dict) -> int | None:
        return settings.get("bits")

    def preflight(self, ws: Workspace) -> None:
        check_layers(ws, self.config.scheme)
        if self.config.target == "auto":
            self.target = "original" if ws.store.spec.mlp is None else "reference"
            self.needs_original = self.target == "original"
        if self.needs_original and ws.store.spec.mlp is not None:
            raise LlmpressError(
                "gptq: target original pairs every token's inputs on the two models, which "
                "routed experts do not see alike: use target reference for this model"
            )

    def calibrate(self, ctx: BlockContext) -> None:
        self._key = _shared_inputs(ctx)
        observed = sorted(set(self._key.values()))
        keep = ()
        if self.needs_original:  # the first input only: the others change as the linears
            first = self._key[ctx.targets()[0]]  # before them are rounded (the original's
            later = [k for k in dict.fromkeys(map(self._key.get, ctx.targets())) if k != first]
            keep = _keepable(ctx, later)  # side does not)
            observed = [first]
        self._measure(ctx, observed, keep)

    def _measure(self, ctx: BlockContext, observed: list[str], keep=()) -> None:
        """H (and, target original, C) of each `observed` input over the calibration samples,
        summed over the ranks under torchrun."""
        started = time.perf_counter()

        def observe(rel: str, x: torch.Tensor) -> None:
            self._grams[rel].add(x.reshape(-1, x.shape[-1]))

        def observe_pair(rel: str, x: torch.Tensor, x_orig: torch.Tensor) -> None:
            observe(rel, x)
            x = x.reshape(-1, x.shape[-1]).float()
            delta = x_orig.reshape(-1, x.shape[-1]).float() - x
            self._c[rel].add_((delta.T @ x).double(), alpha=2)

        for rel in observed:  # allocated before any chunk: a rank may hold no sample
            width = ctx.sub(rel).in_features
            device = ctx.sub(rel).weight.device
            self._grams[rel] = _Gram(width, device)
            if self.needs_original:
                self._c[rel] = torch.zeros(width, width, dtype=torch.float64, device=device)
        if self.needs_original:
            ctx.observe_original(observed, observe_pair, keep)
            for rel in observed:  # used: the original's side of it is not needed again
                ctx.original_kept.pop(rel, None)
        else:
            ctx.observe(observed, observe)
        self.seconds["hessians"] += time.perf_counter() - started

    def _take(self, key: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """H (and, target original, C) of input `key` as fp32 means over every rank's
        tokens, handed over (the sums are dropped). Taken one input at a time as its
        linears are rounded: every expert's H at once held 1.6 GB at DeepSeek-V2-Lite's
        widths."""
        started = time.perf_counter()
        gram = self._grams.pop(key)
        h = gram.mean()
        c = self._c.pop(key, None)
        if c is not None:
            c = all_sum(c).div_(max(gram.n, 1)).float()
        self.seconds["hessians"] += time.perf_counter() - started
        return h, c

    @torch.no_grad()
    def transform(self, ctx: BlockContext) -> None:
        cfg = self.config
        hessians, cross = {}, {}
        started = time.perf_counter()
        targets = ctx.targets()
        users = {key: sum(self._key[rel] == key for rel in targets) for key in self._key.values()}
        factors: dict[str, Factor] = {}  # one per H, for every linear that reads its input
        for rel in targets:
            key = self._key[rel]
            if key not in hessians and key not in factors:
                self.seconds["rounding"] += time.perf_counter() - started
                if key not in self._grams:  # target original: measured once the linears
                    self._measure(ctx, [key])  # before it are rounded (a factored H is
                hessians[key], c = self._take(key)  # not measured again)
                if c is not None:
                    cross[key] = c
                started = time.perf_counter()
            users[key] -= 1
            last = users[key] == 0
            w = ctx.sub(rel).weight
            if key in cross:
                w = _toward_original(w, hessians[key], cross[key], cfg.original_dampening)
            if key not in factors:  # H handed over (see own) unless a later fit needs it
                hand_over = last or key not in cross
                held = [hessians.pop(key)] if hand_over else hessians[key]
                factors[key] = factor_of(held, cfg.dampening, cfg.act_order, own=hand_over)
            scheme = ctx.scheme(rel, cfg.scheme)
            qw = gptq_quantize(
                w,
                None,
                scheme,
                ctx.ws.storage_dtype,
                cfg.act_order,
                cfg.dampening,
                scale_search=cfg.scale_search,
                factor=factors[key],
            )
            if last:
                factors.pop(key)
                hessians.pop(key, None)
            ctx.set_quantized(rel, qw)
            self.groups[f"{ctx.prefix}.{rel}"] = qw.group_size
        self.seconds["rounding"] += time.perf_counter() - started

    def export(self, ws: Workspace) -> dict:
        return {
            "stage": "gptq",
            "scheme": self.config.scheme.label(),
            "act_order": self.config.act_order,
            "dampening": self.config.dampening,
            "scale_search": self.config.scale_search,
            "target": self.target,
            "original_dampening": self.config.original_dampening,
            "layers": len(self.groups),
            "group_size_adjusted": adjusted_groups(self.groups, self.config.scheme, ws.schemes),
            "seconds": {k: round(v, 1) for k, v in self.seconds.items()},
        }
