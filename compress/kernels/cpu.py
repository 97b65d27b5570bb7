"""Packed int4 / int8 linears on CPU, over the C kernels in cpu/ (interface: cpu/llmpress.h).

A layer's input is quantized once per block of 32 (int8 + one scale + the block's exact
sum) and shared by every linear that reads it (q/k/v, gate/up). Decode steps and served
prompts go this way at any size. An fp32 input of more than `EXACT_ABOVE` rows (the
evaluation's windows) takes the exact path instead: the weight is dequantized to fp32 in
one pass and multiplied by the fp32 activations, so evaluation through the runtime
measures the weights alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from compress.allocator import HEAP_MAX
from compress.kernels import hugepages
from compress.kernels.build import library
from compress.kernels.c_api import api

EXACT_ABOVE = 64  # rows of fp32 input; above this, evaluation's exact path
_EXACT = threading.local()  # exact_products(): fp32 inputs of any size take the exact path
EXACT_SLICE_BYTES = 64 << 20  # the exact path dequantizes a weight this much at a time
# 8-bit weights take two-term int8 activations (llmp_gemm_q8_split): with one int8 term
# the activations erred as much as the 8-bit weights did (served KL 0.0061 against 0.0036
# exact on the default model, benchmarks/served_drift.py)
SPLIT_W8 = True


def _ptr(t: torch.Tensor) -> int:
    """The address C reads: only of a dense CPU tensor (a strided view or a CUDA tensor
    would be read as garbage, silently). Dtypes are checked where the inputs enter."""
    if t.is_cpu and t.is_contiguous():  # (is_cpu: 5x cheaper than device.type, per call)
        return t.data_ptr()
    kind = "strided" if t.is_cpu else t.device.type
    raise TypeError(f"the C kernels take contiguous CPU tensors, got a {kind} {tuple(t.shape)}")


def set_threads(n: int | None = None) -> None:
    """Threads for torch and the C kernels alike (default: torch's current choice)."""
    if n:
        torch.set_num_threads(n)
    library().llmp_set_threads(torch.get_num_threads())


def int8_dot_rate(min_seconds: float = 0.02) -> float:
    """Integer dot-product operations (two per multiply-add) per second on the kernels'
    threads, as the packed GEMM runs them (peak.c): the compute ceiling of a prefill over
    packed weights. Rounds grow until one takes `min_seconds`; the median of three."""
    lib, reps = library(), 1 << 14
    lib.llmp_dot_peak(reps)  # the thread team up
    while True:
        t = time.perf_counter()
        macs = lib.llmp_dot_peak(reps)
        if time.perf_counter() - t >= min_seconds:
            break
        reps *= 4
    times = []
    for _ in range(3):
        t = time.perf_counter()
        lib.llmp_dot_peak(reps)
        times.append(time.perf_counter() - t)
    return 2 * macs / statistics.median(times)


def hand_over() -> Callable[[], None]:
    """For a thread that will run every kernel from now on (a server's engine thread):
    this thread's idle OpenMP workers exit now (see llmp_release_threads), and the
    function returned, called first on the new thread, gives it this thread's count (a
    count set with set_threads holds only for the thread that set it). Nothing is built or
    loaded for a process that has not run a kernel (a GPU server)."""
    if library.cache_info().currsize == 0:
        return lambda: None
    n = torch.get_num_threads()
    library().llmp_release_threads()
    return lambda: library().llmp_set_threads(n)


def use_amx(on: bool = True) -> bool:
    """Whether the packed GEMMs run on AMX tiles from now on: asked for (`on`), compiled in
    (a processor with AMX-INT8) and granted by the OS (Linux 5.16 or later). On by default
    where all hold, unless LLMPRESS_AMX=0; results are bit-identical either way (gemm.c),
    so this exists for measuring and testing the two paths against each other."""
    return bool(library().llmp_amx_enable(int(on)))


def gemm_dynamic_rows(rows: int = 0) -> int:
    """The packed GEMMs of at least `rows` rows hand their column chunks to threads as
    they come (prefill); smaller ones split them in fixed halves (decode). Returns the
    threshold before; 0 leaves it. For measuring (benchmarks/gemm_schedule.py)."""
    return library().llmp_gemm_dynamic_rows(rows)


@contextlib.contextmanager
def exact_products():
    """Within it, fp32 inputs of any size take the exact path (the weights dequantized):
    evaluation's weights-only pass, whose windows (or the last chunk of one over a
    quantized cache) may have EXACT_ABOVE rows or fewer."""
    was = getattr(_EXACT, "on", False)
    _EXACT.on = True
    try:
        yield
    finally:
        _EXACT.on = was


def amx_active() -> bool:
    """Whether the packed GEMMs of 16 rows or more run on AMX tiles now."""
    return bool(library().llmp_amx_state())


@dataclass
class QuantizedInput:
    """x [M, K] as int8 blocks of 32: x8 [M, Kp], dx [M, Kp/32], bsum [M, Kp/32]."""

    x: torch.Tensor
    x8: torch.Tensor
    dx: torch.Tensor
    bsum: torch.Tensor

    def rows(self, index: torch.Tensor) -> QuantizedInput:
        """The rows `index` (the tokens routed to one expert), still quantized."""
        return QuantizedInput(
            *(t[index].contiguous() for t in (self.x, self.x8, self.dx, self.bsum))
        )


def quantize_input(x: torch.Tensor, multiple: int = 32) -> QuantizedInput:
    x = x.float().contiguous()
    m, k = x.shape
    kp = math.ceil(k / multiple) * multiple
    xp = x if kp == k else torch.nn.functional.pad(x, (0, kp - k))
    x8 = torch.empty(m, kp, dtype=torch.int8)
    dx = torch.empty(m, kp // 32)
    bsum = torch.empty(m, kp // 32)
    library().llmp_quantize_rows(_ptr(xp), m, kp, _ptr(x8), _ptr(dx), _ptr(bsum))
    return QuantizedInput(x, x8, dx, bsum)


def _quantized_buffers(m: int, kp: int):
    return (
        torch.empty(m, kp),
        torch.empty(m, kp, dtype=torch.int8),
        torch.empty(m, kp // 32),
        torch.empty(m, kp // 32),
    )


def rms_norm_quantized(
    x: torch.Tensor, weight: torch.Tensor, eps: float, center: bool = False
) -> QuantizedInput:
    """rms_norm(x) * weight (`center`: of x less its mean, a LayerNorm), in fp32 and
    quantized for the packed linears, in one call."""
    x = x.contiguous()
    m, k = x.shape
    kp = math.ceil(k / 32) * 32
    out, x8, dx, bsum = _quantized_buffers(m, kp)
    library().llmp_rmsnorm_quant(
        _ptr(x), _ptr(weight), eps, int(center), m, k, kp, _ptr(out), _ptr(x8), _ptr(dx),
        _ptr(bsum),
    )  # fmt: skip
    return QuantizedInput(out[:, :k], x8, dx, bsum)


_C = api()  # cpu/llmpress.h: its structs and constants
_STRUCTS = ("KVC", "PChunk", "QLin", "QMoe", "QMla", "QDelta", "QMamba", "QConv", "QMamba1")
_KVC, _PChunk, _QLin, _QMoe, _QMla, _QDelta, _QMamba, _QConv, _QMamba1, _QLayer, _DecodeCtx = (
    _C.structs[n] for n in (*_STRUCTS, "QLayer", "DecodeCtx")
)
ACTIVATIONS = {
    "silu": _C.constants["ACT_SILU"],
    "gelu_pytorch_tanh": _C.constants["ACT_GELU_TANH"],
    "gelu_new": _C.constants["ACT_GELU_TANH"],  # the same tanh approximation (phi)
    "gelu": _C.constants["ACT_GELU"],  # the exact one, through erf (gpt_neox)
    "relu2": _C.constants["ACT_RELU2"],
    "xielu": _C.constants["ACT_XIELU"],
}


def act_mul_quantized(gate_up: torch.Tensor, act: str = "silu") -> QuantizedInput:
    """act(gate) * up from the fused [gate | up] output, quantized, in one call."""
    gate_up = gate_up.contiguous()
    m, two_i = gate_up.shape
    i = two_i // 2
    ip = math.ceil(i / 32) * 32
    out, x8, dx, bsum = _quantized_buffers(m, ip)
    library().llmp_act_mul_quant(
        _ptr(gate_up), m, i, ip, ACTIVATIONS[act], _ptr(out), _ptr(x8), _ptr(dx), _ptr(bsum)
    )
    return QuantizedInput(out[:, :i], x8, dx, bsum)


def act_quantized(up: torch.Tensor, act: str, params=None) -> QuantizedInput:
    """act(up) of an MLP without a gate, quantized, in one call; `params`: xIELU's
    (fp32 [4], llmpress.h)."""
    if act == "xielu" and (params is None or params.numel() != 4):
        raise ValueError("xIELU needs its 4 parameters")
    up = up.contiguous()
    m, i = up.shape
    ip = math.ceil(i / 32) * 32
    out, x8, dx, bsum = _quantized_buffers(m, ip)
    library().llmp_act_quant(
        _ptr(up), m, i, ip, ACTIVATIONS[act], _opt(params), _ptr(out), _ptr(x8), _ptr(dx),
        _ptr(bsum),
    )  # fmt: skip
    return QuantizedInput(out[:, :i], x8, dx, bsum)


def rope_(x: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
    """Rotary embedding of x [T, heads, D] (contiguous fp32) in place, over the first
    2 * cos.shape[1] values of each head (all of them unless partial rotary)."""
    t, heads, d = x.shape
    lib = library()
    lib.llmp_rope(_ptr(x), _ptr(positions), _ptr(cos), _ptr(sin), t, heads, d, 2 * cos.shape[1])
    return x


def argmax(x: torch.Tensor) -> int:
    """int(x.argmax()) of a 1-D tensor, in C for a contiguous fp32 CPU one (same ties and
    NaN rule); torch's own otherwise."""
    if x.dtype != torch.float32 or x.dim() != 1 or x.device.type != "cpu" or not x.is_contiguous():
        return int(x.argmax())
    return library().llmp_argmax(x.data_ptr(), x.numel())


def argmax_rows(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(-1) of a [rows, n] tensor (int64), rows in one C call for a contiguous
    fp32 CPU one, with torch's ties and NaN rule: torch's took 31 ms for 511 rows of a
    49k vocabulary here, three times an eval window."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.device.type != "cpu" or not x.is_contiguous():
        return x.argmax(-1)
    b = x.shape[0]
    return torch.tensor(choose_tokens(x, [0.0] * b, [0.0] * b), dtype=torch.int64)


def log_softmax_rows_(x: torch.Tensor) -> bool:
    """Each row of a contiguous fp32 CPU x [rows, vocab] less its log-sum-exp, in place, in
    C (llmp_log_softmax_rows: the normalization divergence_rows gives a candidate, so two
    equal models measure a KL of 0); False, x untouched, for any other tensor."""
    if x.dtype != torch.float32 or x.dim() != 2 or not x.is_cpu or not x.is_contiguous():
        return False
    library().llmp_log_softmax_rows(_ptr(x), x.shape[0], x.shape[1])
    return True


def _divergence_torch(ref: torch.Tensor, logits: torch.Tensor):
    lse = torch.logsumexp(logits.double(), -1)
    p = ref.double()
    kept = p > -87
    terms = torch.where(kept, p.exp() * (p - (logits.double() - lse[:, None])), 0.0)
    return terms.sum(-1), lse, logits.argmax(-1)


def divergence_rows(ref: torch.Tensor, logits: torch.Tensor):
    """Per row of the original's log-probs `ref` and a candidate's `logits` [rows, vocab]:
    (KL(original ‖ candidate), the candidate's log-sum-exp, its arg max), float64, float64
    and int64 [rows], in one C call (llmp_divergence_rows: each row read while it is in
    cache) for contiguous fp32 CPU tensors, torch's operations otherwise. Tokens whose
    original log-prob is under -87 add nothing to the KL."""
    rows, vocab = logits.shape
    if ref.shape != logits.shape:
        raise ValueError(f"log-probs {tuple(ref.shape)} and logits {tuple(logits.shape)} differ")
    native = all(
        t.dtype == torch.float32 and t.device.type == "cpu" and t.is_contiguous()
        for t in (ref, logits)
    )
    if not native:  # 64 rows at a time: float64 copies of whole windows were 0.6 GB
        parts = [_divergence_torch(ref[i : i + 64], logits[i : i + 64]) for i in range(0, rows, 64)]
        parts = parts or [_divergence_torch(ref, logits)]  # no rows: empty results
        return tuple(torch.cat(p) for p in zip(*parts, strict=True))
    kl = torch.empty(rows, dtype=torch.float64)
    lse = torch.empty(rows, dtype=torch.float64)
    top = torch.empty(rows, dtype=torch.int64)
    library().llmp_divergence_rows(
        _ptr(ref), _ptr(logits), rows, vocab, _ptr(kl), _ptr(lse), _ptr(top)
    )
    return kl, lse, top


def choose_tokens(logits: torch.Tensor, inverse_temperatures, uniforms, top_k=None, top_p=None):
    """A token for each row of logits [B, vocab] (contiguous fp32 on the CPU), in one call
    (llmp_choose_tokens): greedy where the inverse temperature is 0 (argmax's ties and NaN
    rule), else drawn from exp(logits / temperature), cut to each row's top-k (0: none)
    and top-p (1: none) as sampling.probabilities cuts it, at that row's uniform number in
    [0, 1); -1 where nothing can be drawn (NaN, +inf or every logit -inf)."""
    b, vocab = logits.shape
    _check_f32(logits, "logits")
    it = torch.tensor(inverse_temperatures, dtype=torch.float32)
    u = torch.tensor(uniforms, dtype=torch.float64)
    k = torch.tensor(top_k or [0] * b, dtype=torch.int64)
    p = torch.tensor(top_p or [1.0] * b, dtype=torch.float64)
    out = torch.empty(b, dtype=torch.int64)
    library().llmp_choose_tokens(
        _ptr(logits), b, vocab, _ptr(it), _ptr(k), _ptr(p), _ptr(u), _ptr(out)
    )
    tokens = out.tolist()
    if -2 in tokens:
        raise MemoryError("llmp_choose_tokens: out of memory")
    return tokens


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, center: bool = False):
    """RMSNorm over the last dimension (fp32; `center`: of x less its mean, a LayerNorm
    without a bias), the one-call decoder's own arithmetic, so the per-op path and the
    one-call path round alike. A weight of several rows of that width: row r of x takes
    weight row r % rows (x [T, heads, D] with one per head)."""
    out = x.float().contiguous().clone()
    _check_f32(weight, "norm weight")
    d = out.shape[-1]
    wrows = weight.numel() // d
    library().llmp_rms_rows(_ptr(out), out.numel() // d, d, _ptr(weight), wrows, eps, int(center))
    return out


# up to this many rows, a dense weight can take llmp_gemv_f32 / llmp_gemv_16 (one read);
# DenseLinear sends it there up to gemv_rows(its dtype)
GEMV_ROWS = 32
_KIND16 = {torch.bfloat16: 1, torch.float16: 2}


@functools.cache
def gemv_rows(dtype: torch.dtype) -> int:
    """The most rows DenseLinear sends a weight of `dtype` to the C tiles for, where they
    beat torch's products (benchmarks/dense_rows.py, the default model's shapes, MKL held
    to AVX2 for the AVX2 build): 16-bit weights, which torch multiplies only widened a
    slice at a time, up to 32 rows (at 32: 58.7 against 100.1 ms, AVX2 80.5 against
    100.6); fp32 up to 32 rows with AVX-512 (66.4 against 73.5 ms), up to 16 elsewhere
    (AVX2 at 32: 88.5 against 91.9, even)."""
    if dtype in _KIND16:
        return GEMV_ROWS
    if dtype == torch.float32:
        return GEMV_ROWS if library().llmp_dense_isa() == 2 else 16
    return 0


def gemv_f32(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """x [M, K] @ weight [N, K].T for M <= GEMV_ROWS, the weight (fp32, bf16 or fp16,
    contiguous) streamed once at memory speed in its stored width, where torch's
    matrix-vector product reads about half that; fp32 arithmetic throughout."""
    x = x.float().contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if not 0 < m <= GEMV_ROWS or weight.shape[1] != k:
        raise ValueError(f"gemv_f32 takes 1 to {GEMV_ROWS} rows of width {weight.shape[1]}")
    y = torch.empty(m, n)
    if weight.dtype in _KIND16:
        if weight.device.type != "cpu" or not weight.is_contiguous():
            raise ValueError("dense weight must be a contiguous CPU tensor")
        library().llmp_gemv_16(_ptr(x), m, k, _ptr(weight), _KIND16[weight.dtype], n, _ptr(y))
        return y
    _check_f32(weight, "dense weight")
    library().llmp_gemv_f32(_ptr(x), m, k, _ptr(weight), n, _ptr(y))
    return y


def route(
    x: torch.Tensor,
    router: torch.Tensor,
    top_k: int,
    renormalize: bool,
    sigmoid: bool = False,
    choice_bias: torch.Tensor | None = None,
    scale: float = 1.0,
    groups: tuple[int, int] = (1, 1),
    group_score: str = "top2",
    sparsemixer: float | None = None,
    logit_choice: bool = False,
    router_bias: torch.Tensor | None = None,
):
    """Routing of rows x [B, hidden] by an fp32 router [E, hidden] (plus `router_bias` [E]
    on its logits: a LayerNorm's bias folded in), as the one-call decoder
    routes (llmp_route: softmax or sigmoid scores, chosen with `choice_bias` added within
    the best `groups[1]` of `groups[0]` expert groups, weights renormalized and scaled; or
    with `sparsemixer`, PhiMoE's top 2 at that threshold; `logit_choice`: sigmoids chosen by
    logit plus bias): (weights [B, top_k] fp32, chosen [B, top_k] int64)."""
    x = x.float().contiguous()
    _check_f32(router, "router weight")
    if choice_bias is not None:
        _check_f32(choice_bias, "expert choice bias")
    if router_bias is not None:
        _check_f32(router_bias, "router bias")
    b, e = x.shape[0], router.shape[0]
    logits = torch.empty(b, e)
    chosen = torch.empty(b, top_k, dtype=torch.int32)
    weights = torch.empty(b, top_k)
    library().llmp_route(
        _ptr(x), b, x.shape[1], _ptr(router), _opt(router_bias), e, router.shape[1], top_k,
        int(renormalize),
        *_scoring(sigmoid, sparsemixer, top_k, logit_choice), _opt(choice_bias), float(scale),
        *_groups(groups, group_score, e), _ptr(logits), _ptr(chosen), _ptr(weights),
    )  # fmt: skip
    return weights, chosen.long()


def _scoring(
    sigmoid: bool, sparsemixer: float | None, top_k: int, logit_choice: bool = False
) -> tuple[int, float]:
    """llmp_route's (scoring, jitter)."""
    if logit_choice:
        return 3, 0.0
    if sparsemixer is None:
        return int(sigmoid), 0.0
    if top_k != 2:
        raise ValueError(f"sparsemixer routes 2 experts, not {top_k}")
    return 2, float(sparsemixer)


def _groups(groups: tuple[int, int], score: str, experts: int) -> tuple[int, int, int]:
    """llmp_route's (n_group, topk_group, group_max)."""
    n, top = groups
    if score not in ("top2", "max") or experts % n or not 1 <= top <= n:
        raise ValueError(f"expert groups {groups} ({score}) of {experts} experts")
    return n, top, int(score == "max")


def gate_rows(att: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """att [T, width] times sigmoid(gate [T, width]), in place (both contiguous fp32):
    attention's output gate, as the one-call decoder computes it."""
    _check_f32(att, "attention output")
    _check_f32(gate, "attention output gate")
    if att.shape != gate.shape:
        raise ValueError(f"gate {tuple(gate.shape)} for attention output {tuple(att.shape)}")
    t, width = att.shape
    library().llmp_gate_rows(_ptr(att), t, width, _ptr(gate), width)
    return att


def sigmoid_gate(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """sigmoid(weight · x_b) [B, 1] for rows x [B, hidden] and an fp32 weight [1, hidden]:
    a shared expert's gate, as the one-call decoder computes it."""
    x = x.float().contiguous()
    _check_f32(weight, "shared expert gate")
    gate = torch.empty(x.shape[0], 1)
    library().llmp_sigmoid_gate(
        _ptr(x), x.shape[0], x.shape[1], _ptr(weight), weight.shape[1], _ptr(gate)
    )
    return gate


def _rows_f32(t: torch.Tensor, what: str) -> tuple[int, int]:
    """The address and row stride of a 2-D fp32 CPU tensor whose rows are each contiguous
    (a column slice of a wider product)."""
    if t.dtype != torch.float32 or t.device.type != "cpu" or t.dim() != 2 or t.stride(1) != 1:
        raise ValueError(f"{what}: rows of contiguous fp32 on the CPU, not {t.dtype} {t.stride()}")
    return t.data_ptr(), t.stride(0)


def deltanet_rows(dn, mixed, z, x, tail, state, out) -> None:
    """A Gated DeltaNet's mixing (runtime/deltanet.py's DeltaNet `dn`) of one sequence's T
    rows: in_proj_qkv's rows `mixed` [T, channels], in_proj_z's `z` [T, width], the normed
    input `x` [T, hidden] (for b and a); the slot's convolution `tail` and `state` continue
    in place; what out_proj reads goes into `out` [T, width] (contiguous). Each row's
    arithmetic is the same whatever rows come with it; out of memory raises."""
    steps, hidden = x.shape
    (pm, lm), (pz, lz), (px, lx) = (
        _rows_f32(t, n) for t, n in ((mixed, "mixed"), (z, "z"), (x, "x"))
    )
    for t, name in ((tail, "tail"), (state, "state"), (out, "out"), (dn.ba_weight, "ba")):
        _check_f32(t, f"deltanet {name}")
    if out.shape != (steps, dn.width) or state.shape != (dn.v_heads, dn.k_dim, dn.v_dim):
        raise ValueError(f"deltanet state {tuple(state.shape)}, out {tuple(out.shape)}")
    status = library().llmp_deltanet(
        pm, lm, pz, lz, px, lx, hidden, _ptr(dn.ba_weight),
        _ptr(dn.conv), dn.conv.shape[1], _ptr(tail), _ptr(state), _ptr(dn.decay),
        _ptr(dn.dt_bias), _ptr(dn.norm), dn.eps, steps, dn.k_heads, dn.v_heads, dn.k_dim,
        dn.v_dim, _ptr(out),
    )  # fmt: skip
    _check_status(status)


def short_conv_rows(m, proj, tail, out) -> None:
    """LFM2's short convolution (runtime/short_conv.py's ShortConv `m`) of one sequence's T
    rows of in_proj's output `proj` [T, 3 · width]; the slot's `tail` continues in place;
    what out_proj reads goes into `out` [T, width] (contiguous)."""
    pp, lp = _rows_f32(proj, "proj")
    for t, name in ((tail, "tail"), (out, "out"), (m.conv, "conv")):
        _check_f32(t, f"short convolution {name}")
    if out.shape != (proj.shape[0], m.width) or tail.shape != (m.width, m.conv.shape[1] - 1):
        raise ValueError(f"short convolution tail {tuple(tail.shape)}, out {tuple(out.shape)}")
    library().llmp_short_conv(
        pp, lp, _ptr(m.conv), m.conv.shape[1], _ptr(tail), proj.shape[0], m.width, _ptr(out)
    )


def mamba1_rows(m, proj, tail, state, out) -> None:
    """Jamba's Mamba mixing (runtime/mamba.py's Mamba1 `m`) of one sequence's T rows of
    in_proj's output `proj` [T, 2 · width]; the slot's `tail` and `state` continue in place;
    what out_proj reads goes into `out` [T, width] (contiguous); out of memory raises."""
    pp, lp = _rows_f32(proj, "proj")
    held = (m.x_proj, m.dt_proj, m.dt_bias, m.conv, m.conv_bias, m.decay, m.d, *m.norms)
    for t, name in ((tail, "tail"), (state, "state"), (out, "out"), *((h, "weight") for h in held)):
        _check_f32(t, f"mamba {name}")
    if out.shape != (proj.shape[0], m.width) or state.shape != m.state_shape:
        raise ValueError(f"mamba state {tuple(state.shape)}, out {tuple(out.shape)}")
    status = library().llmp_mamba1(
        pp, lp, _ptr(m.conv), _ptr(m.conv_bias), m.conv.shape[1], _ptr(tail), _ptr(state),
        _ptr(m.x_proj), _ptr(m.dt_proj), _ptr(m.dt_bias), _ptr(m.decay), _ptr(m.d),
        *(_ptr(n) for n in m.norms), m.eps, proj.shape[0], m.width, m.state_size, m.rank,
        _ptr(out),
    )  # fmt: skip
    _check_status(status)


def mamba_rows(m, proj, tail, state, out) -> None:
    """A Mamba-2 layer's mixing (runtime/mamba.py's Mamba2 `m`) of one sequence's T rows of
    in_proj's output `proj` [T, width + channels + heads]; the slot's convolution `tail`
    and `state` continue in place; what out_proj reads goes into `out` [T, width]
    (contiguous). Each row's arithmetic is the same whatever rows come with it; out of
    memory raises."""
    steps = proj.shape[0]
    pp, lp = _rows_f32(proj, "proj")
    for t, name in ((tail, "tail"), (state, "state"), (out, "out")):
        _check_f32(t, f"mamba {name}")
    if out.shape != (steps, m.width) or state.shape != m.state_shape:
        raise ValueError(f"mamba state {tuple(state.shape)}, out {tuple(out.shape)}")
    status = library().llmp_mamba2(
        pp, lp, _ptr(m.conv), _ptr(m.conv_bias), m.conv.shape[1], _ptr(tail), _ptr(state),
        _ptr(m.decay), _ptr(m.dt_bias), _ptr(m.d), _ptr(m.norm), m.eps, steps, m.heads,
        m.head_dim, m.state_size, m.groups, _ptr(out),
    )  # fmt: skip
    _check_status(status)


MAX_HEAD_DIM = 576  # the scratch of decode_attention.c (HEAD_MAX) and kv_cache.c
MAX_KV_GROUP = 1024


def _check_f32(t: torch.Tensor, name: str) -> None:
    if t.dtype != torch.float32 or not t.is_contiguous() or t.device.type != "cpu":
        raise TypeError(f"{name}: the C kernels take contiguous fp32 CPU tensors, got {t.dtype}")


def kv_struct(cache) -> _KVC:
    """The C view of a runtime KVCache (built once; its arrays never move)."""
    if getattr(cache, "native", None) is not None:
        return cache.native
    bits = cache.scheme.bits or 0
    _, slots, kv_heads, d = cache.shape
    if bits:
        group = cache.scheme.group
        arrays = {
            "kq": cache.kq,
            "vq": cache.vq,
            "ks": cache.k_scale,
            "km": cache.k_min,
            "vs": cache.v_scale,
            "vm": cache.v_min,
            "kr": cache.k_res,
            "vr": cache.v_res,
        }
    else:
        group = 1
        arrays = {"k": cache.k, "v": cache.v}
    if d > MAX_HEAD_DIM or group > MAX_KV_GROUP:
        raise ValueError(f"head dim {d} / KV group {group}: the CPU attention takes at most "
                         f"{MAX_HEAD_DIM} / {MAX_KV_GROUP}")  # fmt: skip
    for name, t in [*arrays.items(), ("table", cache.table)]:
        if not t.is_contiguous() or t.device.type != "cpu":
            raise TypeError(f"KV cache array {name} must be a contiguous CPU tensor")
    pointers = {n: _ptr(t) for n, t in arrays.items()}
    cache.native = _KVC(
        bits, cache.block, group, slots, kv_heads, d, cache.max_blocks, cache.pool.n_blocks,
        table=cache.table.data_ptr(), **pointers,
    )  # fmt: skip
    return cache.native


def decode_attention(
    q,
    k,
    v,
    cache,
    layer: int,
    slots,
    positions,
    scale: float | None = None,
    window: int = 0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Write k/v [B, kv_heads, D] into `layer` of `cache` (fp32 or KIVI int8/int4) at
    `positions` (their blocks prepared: `KVCache.prepare_rows`), then attend q
    [B, heads, D] over the last `window` positions up to each sequence's own (0: all of
    them), scores times `scale` (default D**-0.5) and capped at `softcap` (softcap *
    tanh(score / softcap); None: not), each head's softmax with exp(sinks[h]) in its
    denominator where `sinks` (fp32 [heads]) is given, in C."""
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        _check_f32(t, name)
    slots, positions = slots.contiguous(), positions.contiguous()
    if slots.dtype != torch.int64 or positions.dtype != torch.int64:
        raise TypeError("slots and positions must be int64")
    b, heads, d = q.shape
    out = torch.empty_like(q)
    scale = d**-0.5 if scale is None else scale
    if library().llmp_decode_attention(
        ctypes.byref(kv_struct(cache)), layer, _ptr(q), _ptr(k), _ptr(v), _ptr(slots),
        _ptr(positions), b, heads, scale, window or 0, softcap or 0.0, _ptr(out),
        _sinks_ptr(sinks, heads),
    ):  # fmt: skip
        raise MemoryError("llmp_decode_attention: out of memory")
    return out


def _sinks_ptr(sinks: torch.Tensor | None, heads: int) -> int | None:
    """The address of a layer's attention sinks (fp32 [heads]), or None (no sinks)."""
    if sinks is None:
        return None
    _check_f32(sinks, "sinks")
    if sinks.shape != (heads,):
        raise TypeError(f"sinks: one per query head, [{heads}], got {tuple(sinks.shape)}")
    return _ptr(sinks)


def _rows_ptr(t: torch.Tensor, name: str) -> int:
    """The address of a float32 CPU view whose last dimension is dense (rows and heads may
    be strided: q/k/v are views into one projection's output)."""
    if t.dtype != torch.float32 or not t.is_cpu or t.stride(-1) != 1:
        raise TypeError(f"{name}: a float32 CPU view with a dense last dimension")
    return t.data_ptr()


def prefill_attention(
    q,
    out,
    chunks: list,
    scale: float,
    window: int = 0,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
) -> None:
    """Causal attention of every chunk of a prefill step in one C call. q [N, heads, D]
    holds the step's query rows and out [N, heads * D] receives theirs; each chunk is
    (a, b, keys, values, start): rows a..b-1 at positions start.. against keys/values
    [kv_heads, start + b - a, D], each row seeing the keys up to its own (the last
    `window` of them; 0: all), scores capped at `softcap` (None: not), sinks as
    decode_attention's. A row's result is
    the same bits however its prompt was split into chunks or batched with others (see
    prefill_attention.c)."""
    n, heads, d = q.shape
    qp, op = _rows_ptr(q, "q"), _rows_ptr(out, "out")
    if q.stride(1) != d or out.shape != (n, heads * d):
        raise TypeError("prefill_attention: q [N, heads, D] with dense heads, out [N, heads * D]")
    qs, os, kv_heads = q.stride(0), out.stride(0), chunks[0][2].shape[0]
    arr = (_PChunk * len(chunks))()
    for c, (a, b, k, v, start) in zip(arr, chunks, strict=True):
        if k.shape != (kv_heads, start + b - a, d) or v.shape != k.shape:
            raise TypeError(f"prefill_attention: keys/values [{kv_heads}, start + T, {d}]")
        c.q, c.out, c.qs, c.os = qp + 4 * a * qs, op + 4 * a * os, qs, os
        c.k, c.kg, c.kj = _rows_ptr(k, "keys"), k.stride(0), k.stride(1)
        c.v, c.vg, c.vj = _rows_ptr(v, "values"), v.stride(0), v.stride(1)
        c.T, c.start = b - a, start
    lib = library()
    if lib.llmp_prefill_attention(
        arr,
        len(chunks),
        heads,
        kv_heads,
        d,
        scale,
        window,
        softcap or 0.0,
        _sinks_ptr(sinks, heads),
    ):
        raise MemoryError("llmp_prefill_attention: out of memory")


TILE = 8  # output columns per panel tile (llmpress.h)


def to_panels(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Row-major codes [N, Kp] (int4: unsigned 0..15, int8: signed) → the kernels' panel
    layout (llmpress.h): tiles of 8 columns, each block of 32 inputs as 8 quads of
    [col 0: k0..k3 | ... | col 7: k0..k3]; int4 holds quads j and j+4 in one byte's low and
    high nibbles. N is padded to a multiple of 8 with zero codes."""
    n, kp = codes.shape
    npad = -n % TILE
    c = torch.nn.functional.pad(codes, (0, 0, 0, npad)).reshape(-1, TILE, kp // 32, 2, 4, 4)
    if bits == 4:  # [tile, col, block, half, quad, k] → [tile, block, quad, col, k, half]
        c = c.to(torch.uint8).permute(0, 2, 4, 1, 5, 3)
        return (c[..., 0] | (c[..., 1] << 4)).contiguous().reshape(-1)
    c = c.reshape(-1, TILE, kp // 32, 8, 4).permute(0, 2, 3, 1, 4)  # [tile, block, quad, col, k]
    return c.to(torch.int8).contiguous().reshape(-1)


def from_panels(panel: torch.Tensor, bits: int, n: int, kp: int) -> torch.Tensor:
    """The inverse of `to_panels`: row-major codes [n, kp]."""
    tiles = -(-n // TILE)
    if bits == 4:
        b = panel.reshape(tiles, kp // 32, 4, TILE, 4)
        c = torch.stack((b & 0x0F, b >> 4), dim=-1)  # [tile, block, quad, col, k, half]
        c = c.permute(0, 3, 1, 5, 2, 4)  # [tile, col, block, half, quad, k]
    else:
        c = panel.reshape(tiles, kp // 32, 8, TILE, 4).permute(0, 3, 1, 2, 4)
    return c.reshape(tiles * TILE, kp)[:n]


def panels_of(q: torch.Tensor, kp: int, offset: int, bits: int) -> torch.Tensor:
    """to_panels of the codes q [N, K] (+ offset, zero-padded to kp inputs), laid out in C
    (llmp_to_panels) with no temporaries: through torch, a 152k-word head's widened codes
    and their permuted copy were gigabytes beside a 7B artifact's weights as it loaded."""
    n, k = q.shape
    if q.dtype != torch.int8:  # every b-bit code (b <= 8) fits
        q = q.to(torch.int8)
    q = q.contiguous()
    dtype = torch.uint8 if bits == 4 else torch.int8
    out = torch.empty(-(-n // TILE) * TILE * (kp * bits // 8), dtype=dtype)
    library().llmp_to_panels(_ptr(q), n, k, kp, bits, offset, _ptr(out))
    return out


def _panel_params(p: torch.Tensor) -> torch.Tensor:
    """[N, groups] → [tiles, groups, 8], zero past N."""
    p = torch.nn.functional.pad(p, (0, 0, 0, -p.shape[0] % TILE))
    return p.reshape(-1, TILE, p.shape[1]).transpose(1, 2).contiguous()


def _row_params(p: torch.Tensor, n: int) -> torch.Tensor:
    return p.transpose(1, 2).reshape(-1, p.shape[1])[:n]


class PackedLinear:
    """A b-bit (4 or 8) weight kept packed in the kernels' panel layout: w = q * scale - zs
    per (row, group)."""

    def __init__(self, q, scale, zero_point, group_size: int, bits: int):
        n, k = q.shape
        self.bits, self.out_features, self.in_features = bits, n, k
        kp = math.ceil(k / 32) * 32
        g = kp if group_size >= k else group_size  # per channel: one group over the padding
        if g % 32 or kp % g:
            raise ValueError(f"group {group_size} on width {k} does not fit the CPU kernel")
        self.group, self.kp = g, kp
        scale = scale.float().reshape(n, -1)
        if scale.shape[1] != kp // g:
            scale = torch.nn.functional.pad(scale, (0, kp // g - scale.shape[1]))
        offset = self.offset
        zp = torch.zeros_like(scale) if zero_point is None else zero_point.float().reshape(n, -1)
        if zp.shape != scale.shape:
            zp = torch.nn.functional.pad(zp, (0, scale.shape[1] - zp.shape[1]))
        packed = panels_of(q, kp, offset, bits)
        self._set(packed, scale, None if zero_point is None else (zp + offset) * scale)

    def _set(self, packed: torch.Tensor, scale: torch.Tensor, zs: torch.Tensor | None) -> None:
        """zs None: symmetric codes, whose zs (offset x scale) the kernel derives from the
        scale instead of reading 4 more bytes per group."""
        self.packed = packed
        self.scale = _panel_params(scale)
        self.zs = None if zs is None else _panel_params(zs)

    def to_hugepages(self) -> None:
        """Move codes, scales and zero offsets into huge pages (hugepages.py): once the
        linear is final, as a fused q/k/v's parts would leave their copies behind."""
        self.packed, self.scale = hugepages.place(self.packed), hugepages.place(self.scale)
        self.zs = None if self.zs is None else hugepages.place(self.zs)

    @property
    def offset(self) -> int:
        """int4 codes are stored unsigned (q + 8)."""
        return 8 if self.bits == 4 else 0

    def _row_zs(self) -> torch.Tensor:
        scale = _row_params(self.scale, self.out_features)
        return scale * self.offset if self.zs is None else _row_params(self.zs, self.out_features)

    @classmethod
    def concat(cls, parts: list[PackedLinear]) -> PackedLinear:
        """One linear whose output rows are those of `parts` in order (same input width, bits
        and group): q/k/v, or gate/up, become one kernel call."""
        first = parts[0]
        if any((p.bits, p.group, p.kp) != (first.bits, first.group, first.kp) for p in parts):
            raise ValueError("only linears of one layout can be fused")
        fused = cls.__new__(cls)
        fused.bits, fused.in_features, fused.group, fused.kp = (
            first.bits,
            first.in_features,
            first.group,
            first.kp,
        )
        fused.out_features = sum(p.out_features for p in parts)
        symmetric = all(p.zs is None for p in parts)
        if all(p.out_features % TILE == 0 for p in parts[:-1]):  # whole tiles: laid end to end
            panels = torch.cat([p.packed for p in parts])
        else:
            codes = [from_panels(p.packed, p.bits, p.out_features, p.kp) for p in parts]
            panels = to_panels(torch.cat(codes), first.bits)
        fused._set(
            panels,
            torch.cat([_row_params(p.scale, p.out_features) for p in parts]),
            None if symmetric else torch.cat([p._row_zs() for p in parts]),
        )
        return fused

    @property
    def nbytes(self) -> int:
        """Bytes one multiply reads: codes, scales and zero offsets as held in memory."""
        held = (self.packed, self.scale, self.zs)
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def __call__(self, x: torch.Tensor | QuantizedInput, exact: bool | None = None) -> torch.Tensor:
        """int8 activations for a QuantizedInput of any size and for fp32 batches of up to
        EXACT_ABOVE rows; larger fp32 batches take the exact (dequantized) path, and so does
        an fp32 input of any size when `exact` is True (an expert's share of an exact
        batch)."""
        if not isinstance(x, QuantizedInput):
            if exact is None:
                exact = x.shape[0] > EXACT_ABOVE or getattr(_EXACT, "on", False)
            if exact:
                return self._exact(x.float())
            x = quantize_input(x)
        elif x.x8.shape[1] != self.kp:
            x = quantize_input(x.x)
        rows = x.x8.shape[0]
        y = torch.empty(rows, self.out_features)
        args = (_ptr(x.x8), _ptr(x.dx), _ptr(x.bsum), rows, self.kp, self.group)
        weights = (_ptr(self.packed), _ptr(self.scale), _opt(self.zs), self.out_features, _ptr(y))
        if self.split:
            xf = x.x.float().contiguous()
            head = (_ptr(x.x8), _ptr(x.dx), _ptr(x.bsum), _ptr(xf), xf.shape[1], xf.shape[1])
            if library().llmp_gemm_q8_split(*head, *args[3:], *weights):
                raise MemoryError("llmp_gemm_q8_split: out of memory")
            return y
        fn = library().llmp_gemm_q4 if self.bits == 4 else library().llmp_gemm_q8
        fn(*args, *weights)
        return y

    one_term = False  # int8 codes whose activations go in as one int8 term all the same

    @property
    def split(self) -> bool:
        """Whether this layer's activations go in as two int8 terms (SPLIT_W8)."""
        return self.bits == 8 and SPLIT_W8 and not self.one_term

    def _exact(self, x: torch.Tensor) -> torch.Tensor:
        """x @ W.T with W dequantized EXACT_SLICE_BYTES at a time (whole, a 152k-word
        8-bit head would be a 2.2 GB fp32 copy at a 7B width), into one buffer this thread
        keeps (slice_buffer)."""
        return sliced_product(x, self.out_features, self.kp, self.dense, TILE)

    def dense(self, lo: int = 0, hi: int | None = None, out=None) -> torch.Tensor:
        """The fp32 weight [N, in], or its output rows lo:hi (lo a multiple of 8); `out`:
        a contiguous fp32 [hi - lo, kp] to write it in."""
        hi = self.out_features if hi is None else hi
        if lo % TILE:
            raise ValueError(f"dense rows start at a tile of {TILE}, not {lo}")
        t0 = lo // TILE
        if out is None:
            out = torch.empty(hi - lo, self.kp)
        elif out.shape != (hi - lo, self.kp) or out.dtype != torch.float32:
            raise ValueError(f"out must be fp32 {(hi - lo, self.kp)}, not {tuple(out.shape)}")
        fn = library().llmp_dequant_q4 if self.bits == 4 else library().llmp_dequant_q8
        codes = self.packed[t0 * self.kp * self.bits :]  # a tile is 8 x kp x bits/8 bytes
        zs = None if self.zs is None else self.zs[t0:]
        kp, g = self.kp, self.group
        fn(_ptr(codes), _ptr(self.scale[t0:]), _opt(zs), hi - lo, kp, g, _ptr(out))
        return out[:, : self.in_features]


_buffers = threading.local()


def slice_buffer(elements: int) -> torch.Tensor:
    """fp32 scratch of at least `elements` for slices of weights widened to fp32 (the exact
    path's dequantized ones, DenseLinear's 16-bit ones), kept by this thread from call to
    call. Allocated afresh, each slice (up to 64 MB) was above the allocator's mmap
    threshold (compress/allocator.py), so every weight of every evaluation window was
    mapped and page-faulted in again: a Llama-3.2-1B-shaped eval of 2 windows took 9.1M
    page faults and 21 s of system time in 48 s. Made outside inference mode whatever
    the caller's: one made inside it could not be written outside it afterwards."""
    buf = getattr(_buffers, "fp32", None)
    if buf is None or buf.numel() < elements:
        with torch.inference_mode(False):
            buf = _buffers.fp32 = torch.empty(elements)
    return buf[:elements]


def sliced_product(
    x: torch.Tensor, n: int, k: int, widen, tile: int = 1, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W.T for a weight W [n, k] kept in another form: `widen(lo, hi, buf)` writes its
    rows lo:hi in fp32 into `buf` (a slice_buffer view) and returns what to multiply, at
    most EXACT_SLICE_BYTES at a time (slices start at multiples of `tile`), and each
    slice's product at most HEAP_MAX (a window's head product in one slice of a narrow
    model was 60 MB, mapped afresh; under it, eval's window loop takes it from the heap:
    allocator.heap_blocks). `out`: where to write the product (else a new tensor)."""
    rows = max(1, x.numel() // k)
    step = min(EXACT_SLICE_BYTES // (4 * k), HEAP_MAX // (4 * rows))
    step = min(n, max(tile, step // tile * tile))
    buf = slice_buffer(step * k).view(step, k)
    if step == n and out is None:
        return x @ widen(0, n, buf).T
    y = torch.empty(*x.shape[:-1], n) if out is None else out
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        y[..., lo:hi] = x @ widen(lo, hi, buf[: hi - lo]).T
    return y


def _opt(t):
    return None if t is None else _ptr(t)


def _qlin(lin: FusedLinear | None) -> _QLin:
    if lin is None:
        return _QLin()
    p = lin.packed
    idx, w = lin.outliers if lin.outliers is not None else (None, None)
    return _QLin(
        _ptr(p.packed), _ptr(p.scale), _opt(p.zs), p.out_features, p.kp, p.group, p.bits,
        _opt(idx), _opt(w), 0 if idx is None else idx.numel(), _opt(lin.bias), int(p.split),
    )  # fmt: skip


@dataclass
class FusedLinear:
    """A packed weight as the one-call decoder takes it: outlier columns as (int32
    indices, contiguous fp32 weights [n, k]) and a bias [n], each or None."""

    packed: PackedLinear
    outliers: tuple[torch.Tensor, torch.Tensor] | None = None
    bias: torch.Tensor | None = None


@dataclass
class FusedExperts:
    """A Mixture-of-Experts MLP for the one-call decoder: the fp32 router [E, hidden],
    each expert's (gate_up, down), and `reads` (int64 [E]), which the C step adds 1 to for
    each expert it reads; a shared expert's (gate_up, down) and its fp32 gate [1, hidden]
    (None: ungated); the routing's sigmoid scores or sparsemixer threshold, choice bias
    [E] and scale (route)."""

    router: torch.Tensor
    experts: list[tuple[FusedLinear, FusedLinear]]
    top_k: int
    renormalize: bool
    reads: torch.Tensor
    shared: tuple[FusedLinear, FusedLinear] | None = None
    shared_gate: torch.Tensor | None = None
    sigmoid: bool = False
    choice_bias: torch.Tensor | None = None
    scale: float = 1.0
    groups: tuple[int, int] = (1, 1)  # chosen within the best groups[1] of groups[0]
    group_score: str = "top2"  # a group's score: its best two summed, or its "max"
    sparsemixer: float | None = None  # PhiMoE's routing, at this threshold
    logit_choice: bool = False  # sigmoids chosen by logit plus choice_bias (Kolibri's)
    router_bias: torch.Tensor | None = None  # fp32 [E] on the logits (a norm's bias folded)
    shared_scale: float = 1.0  # the shared expert's output times this (cohere2_moe's 0.5)

    @property
    def inter(self) -> int:
        return self.experts[0][0].packed.out_features // 2

    @property
    def shared_inter(self) -> int:
        return 0 if self.shared is None else self.shared[0].packed.out_features // 2

    def native(self) -> tuple[_QMoe, object]:
        """The C struct, and the linears' table it points into (keep both alive)."""
        _check_f32(self.router, "router weight")
        if self.reads.dtype != torch.int64 or not self.reads.is_contiguous():
            raise TypeError("reads must be a contiguous int64 tensor")
        if any(g.packed.out_features != 2 * self.inter for g, _ in self.experts):
            raise ValueError("every expert must have the same width")
        table = (_QLin * (2 * len(self.experts)))(
            *(_qlin(x) for pair in self.experts for x in pair)
        )
        shared, gate = None, None
        if self.shared is not None:
            shared = (_QLin * 2)(*(_qlin(x) for x in self.shared))
            if self.shared_gate is not None:
                _check_f32(self.shared_gate, "shared expert gate")
                gate = _ptr(self.shared_gate)
        if self.choice_bias is not None:
            _check_f32(self.choice_bias, "expert choice bias")
        if self.router_bias is not None:
            _check_f32(self.router_bias, "router bias")
        moe = _QMoe(
            _ptr(self.router), _opt(self.router_bias), ctypes.addressof(table),
            len(self.experts), self.top_k, int(self.renormalize), self.inter, _ptr(self.reads),
            None if shared is None else ctypes.addressof(shared), gate, self.shared_inter,
            *_scoring(self.sigmoid, self.sparsemixer, self.top_k, self.logit_choice),
            _opt(self.choice_bias),
            float(self.scale), *_groups(self.groups, self.group_score, len(self.experts)),
            float(self.shared_scale),
        )  # fmt: skip
        return moe, (table, shared)


@dataclass
class FusedLatent:
    """Multi-head latent attention for the one-call decoder (QMla in cpu/llmpress.h), in
    the absorbed form (runtime/weights.Latent): the layer's qkv gives [q (q_width), latent
    (kv_rank), the rotated key part (rope)] a row; uk and uv are each head's linears."""

    q_width: int
    kv_rank: int
    nope: int
    rope: int
    v: int
    kv_norm: torch.Tensor
    uk: list[FusedLinear]
    uv: list[FusedLinear]
    q_norm: torch.Tensor | None = None
    q_b: FusedLinear | None = None
    eps: float = 1e-6

    @property
    def normed(self) -> int:
        """Floats a row of the norms' inputs."""
        return max(self.kv_rank, 0 if self.q_norm is None else self.q_width)

    def rows(self, heads: int) -> int:
        """Floats a row of the workspace's `mla` part: the norms' inputs, every head's
        product."""
        return self.normed + heads * max(self.kv_rank, self.v)

    def native(self) -> tuple[_QMla, object]:
        """The C struct, and the per-head linears' tables it points into (keep both)."""
        for t in (self.kv_norm, self.q_norm):
            if t is not None:
                _check_f32(t, "latent norm")
        if (self.q_norm is None) != (self.q_b is None):
            raise ValueError("q's norm and q_b come together")
        if len(self.uk) != len(self.uv):
            raise ValueError("every head has its key and value rows")
        uk = (_QLin * len(self.uk))(*(_qlin(x) for x in self.uk))
        uv = (_QLin * len(self.uv))(*(_qlin(x) for x in self.uv))
        mla = _QMla(
            self.q_width, self.kv_rank, self.nope, self.rope, self.v, _opt(self.q_norm),
            _qlin(self.q_b), _ptr(self.kv_norm), ctypes.addressof(uk), ctypes.addressof(uv),
            float(self.eps),
        )  # fmt: skip
        return mla, (uk, uv)


class _FusedMixer:
    """A recurrent mixer's struct, pointed at the cache's states before each step."""

    def bind(self, states) -> None:
        """Point the struct at `states` (runtime/states.py's MixerStates of the cache)."""
        tail, state = states.conv[self.index], states.state[self.index]
        n = self._native
        n.tail, n.state = _ptr(tail), _ptr(state)
        n.tail_stride, n.state_stride = tail[0].numel(), state[0].numel()


@dataclass
class FusedConv(_FusedMixer):
    """A short convolution for the one-call decoder: runtime/short_conv.py's ShortConv, the
    layer's index among the cache's recurrent states (its tail bound before each step)."""

    net: object
    index: int
    _native: object = None

    def native(self):
        _check_f32(self.net.conv, "short convolution")
        self._native = _QConv(self.net.width, self.net.conv.shape[1], _ptr(self.net.conv), None, 0)
        return self._native

    def bind(self, states) -> None:
        tail = states.conv[self.index]
        self._native.tail, self._native.tail_stride = _ptr(tail), tail[0].numel()


@dataclass
class FusedMamba1(_FusedMixer):
    """Jamba's Mamba for the one-call decoder: runtime/mamba.py's Mamba1, the layer's index
    among the cache's recurrent states (bound before each step)."""

    net: object
    index: int
    _native: object = None

    def native(self):
        m = self.net
        tensors = (m.conv, m.conv_bias, m.x_proj, m.dt_proj, m.dt_bias, m.decay, m.d, *m.norms)
        for t in tensors:
            _check_f32(t, "Mamba tensor")
        self._native = _QMamba1(
            m.width, m.state_size, m.rank, m.conv.shape[1], *(_ptr(t) for t in tensors), m.eps,
            None, None, 0, 0,
        )  # fmt: skip
        return self._native


@dataclass
class FusedMamba(_FusedMixer):
    """A Mamba-2 for the one-call decoder: runtime/mamba.py's Mamba2 (its fp32 tensors), the
    layer's index among the cache's recurrent states (bound before each step: `bind`)."""

    net: object  # runtime/mamba.py's Mamba2
    index: int
    _native: object = None

    def native(self):
        m = self.net
        tensors = (m.conv, m.conv_bias, m.decay, m.dt_bias, m.d, m.norm)
        for t in tensors:
            _check_f32(t, "Mamba tensor")
        self._native = _QMamba(
            m.heads, m.head_dim, m.state_size, m.groups, m.conv.shape[1],
            *(_ptr(t) for t in tensors), m.eps, None, None, 0, 0,
        )  # fmt: skip
        return self._native


@dataclass
class FusedDelta(_FusedMixer):
    """A Gated DeltaNet for the one-call decoder: runtime/deltanet.py's DeltaNet (its fp32
    tensors), the layer's index among the cache's recurrent states (bound before each step:
    `bind`)."""

    net: object  # runtime/deltanet.py's DeltaNet, with ba_weight
    index: int
    _native: object = None

    def native(self):
        dn = self.net
        tensors = (dn.ba_weight, dn.conv, dn.decay, dn.dt_bias, dn.norm)
        for t in tensors:
            _check_f32(t, "DeltaNet tensor")
        self._native = _QDelta(
            dn.k_heads, dn.v_heads, dn.k_dim, dn.v_dim, dn.conv.shape[1],
            *(_ptr(t) for t in tensors), dn.eps, None, None, 0, 0,
        )  # fmt: skip
        return self._native


@dataclass
class FusedLayer:
    """One block for the one-call decoder: effective norm weights (gemma's 1 + w already
    added), its linears, optional q/k and sandwich norms, rope tables, sliding window,
    attention softcap, residual multiplier; an expert MLP (`moe`) in place of gate_up/down
    where the block has one."""

    attn_norm: torch.Tensor | None  # None: the branch reads h as it is (olmo2)
    mlp_norm: torch.Tensor | None
    qkv: FusedLinear
    o: FusedLinear
    gate_up: FusedLinear | None
    down: FusedLinear | None
    cos: torch.Tensor
    sin: torch.Tensor
    window: int = 0
    softcap: float | None = None
    residual: float = 1.0  # the branches' outputs times this before the add (granite)
    qk_full: bool = False  # q_norm/k_norm over all of q's (k's) heads at once (olmo2)
    q_norm: torch.Tensor | None = None
    k_norm: torch.Tensor | None = None
    post_attn_norm: torch.Tensor | None = None
    post_mlp_norm: torch.Tensor | None = None
    moe: FusedExperts | None = None
    q_scale: torch.Tensor | None = None  # [max_len]: queries times this after rope (Llama 4)
    qk_after_rope: bool = False  # q_norm/k_norm (per head) follow rope (hunyuan)
    center: bool = False  # the layer's (and the final) norms are LayerNorms (cohere)
    parallel: bool = False  # the MLP reads the block's input, as attention does (cohere)
    qk_each: bool = False  # q_norm/k_norm hold a weight row per head (cohere)
    ungated: bool = False  # the MLP is down(act(up(x))), gate_up holding up alone (arcee)
    act_params: torch.Tensor | None = None  # fp32 [4]: xIELU's (apertus)
    mla: FusedLatent | None = None  # latent attention: qkv holds what reads the norm
    gated: bool = False  # qkv's last heads * D outputs gate attention's (afmoe)
    sinks: torch.Tensor | None = None  # fp32 [heads]: each head's attention sink
    delta: FusedDelta | None = None  # a Gated DeltaNet in place of attention
    kv_layer: int = 0  # its place among the KV cache's layers (an attention layer's)
    mamba: FusedMamba | None = None  # a Mamba-2 in place of attention
    conv: FusedConv | None = None  # a short convolution in place of attention
    mamba1: FusedMamba1 | None = None  # Jamba's Mamba in place of attention

    def native(self) -> tuple[_QLayer, list]:
        """The C struct, and the ctypes objects it points into (keep them alive)."""
        if (self.moe is None) == (self.gate_up is None or self.down is None):
            raise ValueError("a layer has either gate_up and down or experts")
        if self.act_params is not None and not self.ungated:
            raise ValueError("activation parameters belong to an MLP without a gate")
        lins = (_qlin(x) for x in (self.qkv, self.o, self.gate_up, self.down))
        norms = (self.q_norm, self.k_norm, self.post_attn_norm, self.post_mlp_norm)
        tensors = (self.attn_norm, self.mlp_norm, self.cos, self.sin, self.q_scale, *norms)
        for t in (*tensors, self.act_params, self.sinks):
            if t is not None:
                _check_f32(t, "decoder layer tensor")
        keep = [] if self.moe is None else list(self.moe.native())
        mla = delta = mamba = conv = mamba1 = None
        if self.mla is not None:
            mla, tables = self.mla.native()
            keep += [mla, tables]
        if self.delta is not None:
            delta = self.delta.native()
            keep.append(delta)
        if self.mamba is not None:
            mamba = self.mamba.native()
            keep.append(mamba)
        if self.conv is not None:
            conv = self.conv.native()
            keep.append(conv)
        if self.mamba1 is not None:
            mamba1 = self.mamba1.native()
            keep.append(mamba1)
        layer = _QLayer(
            _opt(self.attn_norm), _opt(self.mlp_norm), *lins, *(_opt(t) for t in norms),
            _ptr(self.cos), _ptr(self.sin), _opt(self.q_scale), int(self.qk_after_rope),
            self.window or 0, self.softcap or 0.0,
            self.residual, int(self.qk_full),
            ctypes.addressof(keep[0]) if self.moe is not None else None, int(self.center),
            int(self.qk_each), int(self.parallel), int(self.ungated), _opt(self.act_params),
            None if mla is None else ctypes.addressof(mla), int(self.gated),
            _opt(self.sinks), None if delta is None else ctypes.addressof(delta), self.kv_layer,
            None if mamba is None else ctypes.addressof(mamba),
            None if conv is None else ctypes.addressof(conv),
            None if mamba1 is None else ctypes.addressof(mamba1),
        )  # fmt: skip
        return layer, keep


class FusedDecoder:
    """Every block of a decode step in one C call (compress/kernels/cpu/layers.c,
    llmp_decode_layers), for stacks whose linears are all packed weights; with `head`
    (the final norm's weight, a packed lm_head), the logits too; and with `embed` (the
    embedding, fp32 or 16-bit, and its scale) as well, the whole step from token ids
    (`from_ids`)."""

    def __init__(self, layers: list[FusedLayer], hidden, heads, kv_heads, head_dim, inter,
                 eps, scale: float, act: str, head: tuple | None = None,
                 embed: tuple | None = None, mla_rows: int = 0):  # fmt: skip
        self.head = None
        if head is not None:
            _check_f32(head[0], "final norm")
            self.head = (head[0], head[1], _qlin(head[1]), head[1].packed.out_features)
        natives = [layer.native() for layer in layers]
        self.table = (_QLayer * len(layers))(*(n for n, _ in natives))
        mixers = [x.delta or x.mamba or x.conv or x.mamba1 for x in layers]
        self.deltas = [m for m in mixers if m is not None]
        self.bound = None  # the DeltaNet states the deltas point into
        self.keep = (layers, natives)  # the tensors and structs the table points into
        self.dims = (hidden, heads, kv_heads, head_dim, inter)
        self.mla_rows = mla_rows  # floats a row of latent attention's scratch (FusedLatent)
        if any(x.mla is not None for x in layers) and not mla_rows:
            raise ValueError("latent attention needs its scratch: pass mla_rows")
        kinds = {  # the scratch is as wide as the wider of an expert and a shared expert
            (len(x.moe.experts), x.moe.top_k, max(x.moe.inter, x.moe.shared_inter))
            for x in layers
            if x.moe
        }
        if len(kinds) > 1:
            raise ValueError("every expert layer must have the same experts, top_k and width")
        self.moe_dims = kinds.pop() if kinds else (0, 0, 0)
        self.rotary = 2 * layers[0].cos.shape[1]
        if any(2 * layer.cos.shape[1] != self.rotary for layer in layers):
            raise ValueError("every layer must rotate the same number of dimensions")
        if act == "xielu" and any(x.act_params is None for x in layers):
            raise ValueError("xIELU needs each layer's parameters")
        self.eps, self.scale, self.act = eps, scale, ACTIVATIONS[act]
        self.n = len(layers)
        # the layers the KV cache holds
        self.cached = sum(m is None for m in mixers)
        self.work: dict[int, tuple] = {}  # per batch size: workspace, experts' offset, rows
        self.prefill_work: torch.Tensor | None = None  # the largest prefill step's scratch
        self.ctx = None
        if self.head is not None and embed is not None:
            table, embed_scale = embed
            kind = 0 if table.dtype == torch.float32 else _KIND16.get(table.dtype)
            if kind is not None and table.is_contiguous() and table.device.type == "cpu":
                self.embed = table
                self.ctx = _DecodeCtx(
                    ctypes.addressof(self.table), self.n, *self.dims, eps, self.rotary, scale,
                    self.act, _ptr(head[0]), ctypes.addressof(self.head[2]), _ptr(table), kind,
                    embed_scale,
                )  # fmt: skip

    def _workspace(self, b: int) -> tuple:
        """The step's scratch at batch b (allocated once per batch size, not once per step:
        a fresh megabyte each step is an mmap and its page faults): the workspace, the
        experts' part of it, and rows of hidden states and positions for `from_ids`."""
        if b not in self.work:  # the dense part first, the experts' scratch after it
            lib, dims = library(), (b, *self.dims)
            dense = lib.llmp_decode_workspace(*dims, self.mla_rows, 0, 0, 0)
            floats = lib.llmp_decode_workspace(*dims, self.mla_rows, *self.moe_dims)
            work = torch.empty(floats, dtype=torch.float32)
            rows = torch.empty(b, self.dims[0]), torch.empty(b, dtype=torch.int64)
            self.work[b] = (work, _ptr(work), _ptr(work) + 4 * dense, rows, *map(_ptr, rows))
        return self.work[b]

    def _bind(self, cache) -> None:
        """The DeltaNet layers' structs at `cache`'s states (runtime/deltanet.py: made
        before the step), once per set of states."""
        states = getattr(cache, "recurrent", None) if self.deltas else None
        if self.deltas and states is None:
            raise ValueError("a DeltaNet step needs the cache's DeltaNet states")
        if states is not None and states is not self.bound:
            for d in self.deltas:
                d.bind(states)
            self.bound = states

    def __call__(self, h, cache, slots, positions) -> torch.Tensor:
        """h [B, hidden] → h after every block, in place; `cache` (a runtime KVCache, fp32
        or KIVI) receives this step's keys and values. Returns the logits [B, vocab] with
        a head, else h."""
        _check_f32(h, "hidden state")
        slots, positions = slots.contiguous(), positions.contiguous()
        if slots.dtype != torch.int64 or positions.dtype != torch.int64:
            raise TypeError("slots and positions must be int64")
        self._bind(cache)
        b = h.shape[0]
        hidden, heads, kv_heads, d, inter = self.dims
        _, work, moe_work, *_ = self._workspace(b)
        head = logits = None
        if self.head is not None:
            norm, _, native, vocab = self.head
            logits = torch.empty(b, vocab)
            head = (_ptr(norm), ctypes.byref(native), _ptr(logits))
        status = library().llmp_decode_layers(
            self.table, self.n, _ptr(h), b, hidden, heads, kv_heads, d, inter, self.eps,
            self.rotary, self.scale, self.act, ctypes.byref(kv_struct(cache)), _ptr(slots),
            _ptr(positions), work, moe_work, *(head or (None,) * 3),
        )  # fmt: skip
        _check_status(status)
        return h if logits is None else logits

    def prefill(
        self, h, cache, spans: list[tuple[int, int, int]], positions, full=None, decode=()
    ) -> None:
        """Every block of a prefill step in one C call (llmp_prefill_layers): h [N, hidden]
        holds the step's rows, chunk after chunk, each chunk (slot, start, T) the next T
        rows of the sequence in `slot` at positions start.. (their blocks prepared), and
        receives the last block's output in place; positions [N] (int64) are the rows'.
        full[i], when not None: chunk i's prompt k/v in full precision, [2, layers,
        kv_heads, start + T, D] with 0..start - 1 filled; the chunk's rows join them and it
        attends to them (a chunked prompt over a quantized cache). `decode`: the slots of
        decode rows that follow the chunks' rows, each at its sequence's position (its
        block prepared), computed as a decode step computes them."""
        _check_f32(h, "hidden state")
        self._bind(cache)
        positions = positions.contiguous()
        n, rows, nd = h.shape[0], [0], len(decode)
        for _, _, t in spans[:-1]:
            rows.append(rows[-1] + t)
        if (
            not spans
            or positions.dtype != torch.int64
            or positions.numel() != n
            or rows[-1] + spans[-1][2] + nd != n
        ):
            raise ValueError("prefill: positions must be int64, one per row of the chunks")
        full = full or [None] * len(spans)
        hidden, heads, kv_heads, d, inter = self.dims
        for (_, start, t), f in zip(spans, full, strict=True):
            if f is not None:
                _check_f32(f, "full-precision prompt k/v")
                if f.shape != (2, self.cached, kv_heads, start + t, d):
                    raise ValueError(f"prefill: prompt k/v [2, layers, kv_heads, {start + t}, D]")
        addresses = [0 if f is None else f.data_ptr() for f in full]
        columns = [list(c) for c in zip(*spans, strict=True)]  # slots, starts, sizes
        plan = torch.tensor([*columns, rows, addresses], dtype=torch.int64)
        slots = torch.tensor([*decode, 0], dtype=torch.int64)  # never empty
        work, moe_work = self._prefill_workspace(n)
        status = library().llmp_prefill_layers(
            self.table, self.n, _ptr(h), n, hidden, heads, kv_heads, d, inter, self.eps,
            self.rotary, self.scale, self.act, ctypes.byref(kv_struct(cache)), len(spans),
            *(_ptr(plan[i]) for i in range(5)), nd, _ptr(slots), _ptr(positions), work,
            moe_work,
        )  # fmt: skip
        _check_status(status)

    def _prefill_workspace(self, n: int) -> tuple[int, int]:
        """The scratch of an n-row prefill step: one buffer, grown to the largest step yet
        (prefill steps come in every size; a buffer per size would pile up)."""
        lib, dims = library(), (n, *self.dims)
        dense = lib.llmp_decode_workspace(*dims, self.mla_rows, 0, 0, 0)
        floats = lib.llmp_decode_workspace(*dims, self.mla_rows, *self.moe_dims)
        if self.prefill_work is None or self.prefill_work.numel() < floats:
            self.prefill_work = torch.empty(floats, dtype=torch.float32)
        work = _ptr(self.prefill_work)
        return work, work + 4 * dense

    def from_ids(self, tokens: list[int], slots: list[int], cache) -> torch.Tensor:
        """Logits [B, vocab] for the next token of the sequences in `slots`, whose last
        tokens are `tokens`, each at position cache.lengths[slot], which then grows by one:
        embedding, blocks and head in one C call (needs `head` and `embed`)."""
        self._bind(cache)
        b = len(tokens)
        lengths = cache.lengths
        if lengths.dtype != torch.int64 or not lengths.is_contiguous():
            raise TypeError("cache lengths must be a contiguous int64 tensor")
        rows, n_slots = self.embed.shape[0], lengths.numel()  # C would read past them
        if not all(0 <= t < rows for t in tokens) or not all(0 <= s < n_slots for s in slots):
            raise IndexError(f"token ids {tokens} or slots {slots} out of range")
        *_, work, moe_work, _, h, positions = self._workspace(b)
        ids = (ctypes.c_int64 * (2 * b))(*tokens, *slots)
        logits = torch.empty(b, self.head[3])
        status = library().llmp_decode_tokens(
            ctypes.byref(self.ctx), ctypes.byref(kv_struct(cache)), ids,
            ctypes.addressof(ids) + 8 * b, b, lengths.data_ptr(), h, positions, work, moe_work,
            logits.data_ptr(),
        )  # fmt: skip
        _check_status(status)
        return logits


def _check_status(status: int) -> None:
    if status != 0:
        raise MemoryError(
            "the CPU decoder could not allocate its scratch (a linear's outlier columns or "
            "two-term activations, or a prefill step's keys and values)"
        )
