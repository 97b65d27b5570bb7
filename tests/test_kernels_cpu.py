"""The C kernels against a plain-torch reference: every layout, ragged widths, batches."""

from pathlib import Path

import pytest
import torch

from compress.kernels.cpu import (
    EXACT_ABOVE,
    GEMV_ROWS,
    PackedLinear,
    QuantizedInput,
    gemm_dynamic_rows,
    panels_of,
    quantize_input,
    to_panels,
    use_amx,
)
from compress.quantizers.scheme import QuantScheme, quantize_weight

CASES = [
    (4, 64, True),
    (4, 32, False),
    (4, 96, True),  # the group g128 becomes on 576-wide layers
    (4, None, True),  # per channel
    (8, None, False),
    (8, 64, True),
]


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((ln for ln in text.splitlines() if ln.startswith("flags")), "").split())


def _reference(x: torch.Tensor) -> torch.Tensor:
    """What the kernel computes: x rounded per block of 32 to int8 with scale absmax/127."""
    blocks = x.reshape(x.shape[0], -1, 32)
    d = blocks.abs().amax(-1, keepdim=True) / 127
    q = torch.where(d > 0, torch.round(blocks / d), torch.zeros_like(blocks))
    return (q * d).reshape(x.shape)


def _served(x: torch.Tensor, bits: int) -> torch.Tensor:
    """The activations a b-bit layer reads: one int8 term, or for 8-bit weights two (the
    codes and the rounded residual), which carry about 15 bits."""
    first = _reference(x)
    return first if bits == 4 else first + _reference(x - first)


@pytest.mark.parametrize(("bits", "group", "zp"), CASES)
@pytest.mark.parametrize("k", [576, 1536, 96])
@pytest.mark.parametrize("rows", [1, 3, 8, 37])  # 37: row blocks of 8, then 4 + 1
def test_packed_matmul_matches_reference(bits, group, zp, k, rows):
    torch.manual_seed(k + rows)  # a group that does not divide k is adjusted (scheme.py)
    n = 67  # not a multiple of the kernels' 4-row tiles nor of the 16-row chunks
    qw = quantize_weight(torch.randn(n, k), QuantScheme(bits=bits, group_size=group, zero_point=zp))
    dense = qw.dequantize()
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits)
    assert torch.allclose(lin.dense(), dense, atol=1e-5)
    x = torch.randn(rows, k) * torch.rand(1, k) * 4  # uneven channel magnitudes
    y = lin(x)
    expected = _served(x, bits) @ dense.T
    assert y.shape == (rows, n) and torch.isfinite(y).all()
    torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-3)
    # against the exact product the error is the activation rounding alone: well under 1%,
    # and for 8-bit weights (two terms) under 0.01%
    exact = x @ dense.T
    assert (y - exact).norm() / exact.norm() < (0.01 if bits == 4 else 1e-4)


# one tile, a pair, a pair and one, ragged, a ragged pair
@pytest.mark.parametrize("n", [8, 16, 24, 67, 76])
@pytest.mark.parametrize(("bits", "zp"), [(4, True), (4, False), (8, False)])
def test_a_single_row_computes_exactly_what_it_does_in_a_batch(n, bits, zp):
    """Batch-1 decode runs int4 tiles through an unrolled one-row loop, and batches run
    pairs of tiles in 512-bit vectors where the CPU has them (int8 codes shifted to
    unsigned); the arithmetic per column is the same everywhere, so a row's outputs are
    the same bits alone as among any other rows (what lets decode steps, chunked and
    cached prefills agree)."""
    torch.manual_seed(n)
    qw = quantize_weight(torch.randn(n, 576), QuantScheme(bits=bits, group_size=64, zero_point=zp))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits)
    x = torch.randn(13, 576)  # row blocks of 8, then 4 + 1
    together = lin(x)
    for i in range(13):
        assert torch.equal(lin(x[i : i + 1]), together[i : i + 1])
    for a, b in [(0, 2), (3, 6), (5, 12)]:
        assert torch.equal(lin(x[a:b]), together[a:b])


@pytest.mark.parametrize(("bits", "zp"), [(4, True), (4, False), (8, False)])
def test_chunks_handed_out_as_threads_come_compute_what_fixed_halves_do(bits, zp):
    """Prefill-sized products hand their column chunks to threads as they come; each chunk
    computes the same columns either way, so the outputs are the same bits as with fixed
    halves, and as each row computes alone."""
    torch.manual_seed(bits)
    qw = quantize_weight(
        torch.randn(200, 576), QuantScheme(bits=bits, group_size=64, zero_point=zp)
    )
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits)
    x = quantize_input(torch.randn(70, 576))
    assert gemm_dynamic_rows() <= 70  # the default hands out chunks at 70 rows
    handed = lin(x)
    old = gemm_dynamic_rows(1 << 30)
    try:
        halves = lin(x)
    finally:
        gemm_dynamic_rows(old)
    assert torch.equal(handed, halves)
    alone = lin(QuantizedInput(x.x[5:6], x.x8[5:6], x.dx[5:6], x.bsum[5:6]))
    assert torch.equal(alone, handed[5:6])


@pytest.mark.parametrize(("bits", "group", "zp"), CASES)
def test_tile_instructions_compute_the_bits_the_vector_path_does(bits, group, zp):
    """On a processor with AMX, products of 16 rows or more run on tiles: the same exact
    integer sums per block, then the vector path's float steps in its order, so every
    output is the same bits as without tiles, and as the row alone computes it. Widths
    cover a ragged last tile, an odd tile left to the vector path and work items of
    different sizes; rows cover a partial last block of 16."""
    if not use_amx(True):
        pytest.skip("no AMX tiles on this processor (or the OS does not grant them)")
    try:
        for n, k, rows in [
            (8, 576, 16),
            (40, 576, 17),
            (67, 1536, 40),
            (576, 96, 33),
            (200, 576, 64),
        ]:
            torch.manual_seed(n + rows)
            scheme = QuantScheme(bits=bits, group_size=group, zero_point=zp)
            qw = quantize_weight(torch.randn(n, k), scheme)
            lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits)
            x = quantize_input(torch.randn(rows, k) * torch.rand(1, k) * 4)
            tiles = lin(x)
            use_amx(False)
            vectors = lin(x)
            use_amx(True)
            assert torch.equal(tiles, vectors), (n, k, rows)
            alone = lin(QuantizedInput(x.x[5:6], x.x8[5:6], x.dx[5:6], x.bsum[5:6]))
            assert torch.equal(alone, tiles[5:6])
    finally:
        use_amx(True)


def test_a_shared_quantized_input_gives_the_same_result():
    torch.manual_seed(0)
    qw = quantize_weight(torch.randn(40, 576), QuantScheme(bits=4, group_size=64))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 4)
    x = torch.randn(2, 576)
    assert torch.equal(lin(x), lin(quantize_input(x)))


def test_quantized_prompts_of_any_length_take_the_packed_matmul():
    """Served prompts hand the kernels a QuantizedInput of hundreds of rows: int8 dot
    products (row blocks of 8 past EXACT_ABOVE), not the exact path."""
    torch.manual_seed(2)
    qw = quantize_weight(torch.randn(67, 576), QuantScheme(bits=4, group_size=64))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 4)
    x = torch.randn(3 * EXACT_ABOVE + 5, 576)
    xq = quantize_input(x)
    y = lin(xq)
    rounded = (xq.x8.float().view(len(x), -1, 32) * xq.dx[..., None]).view(len(x), -1)
    torch.testing.assert_close(y, rounded @ qw.dequantize().T, rtol=1e-4, atol=1e-3)
    assert not torch.equal(y, lin(x))  # the fp32 input of that size: the exact path


@pytest.mark.parametrize("bits", [4, 8])
def test_symmetric_weights_read_no_zero_offsets_and_fuse_with_asymmetric_ones(bits):
    """A symmetric weight's zs is derived from its scale (4 bytes per group fewer read);
    q/k/v of mixed kinds still fuse into one weight that computes each part."""
    torch.manual_seed(bits)
    parts = []
    for zp in (False, True, False):
        qw = quantize_weight(
            torch.randn(24, 576), QuantScheme(bits=bits, group_size=64, zero_point=zp)
        )
        parts.append((PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits), qw))
    sym, asym = parts[0][0], parts[1][0]
    assert sym.zs is None and asym.zs is not None and sym.nbytes < asym.nbytes
    x = torch.randn(3, 576)
    fused = PackedLinear.concat([p for p, _ in parts])
    assert fused.zs is not None
    torch.testing.assert_close(fused(x), torch.cat([p(x) for p, _ in parts], 1))
    for lin, qw in parts:
        torch.testing.assert_close(lin.dense(), qw.dequantize(), atol=1e-5, rtol=0)
        torch.testing.assert_close(
            lin(x), _served(x, bits) @ qw.dequantize().T, rtol=1e-4, atol=1e-3
        )
    both = PackedLinear.concat([parts[0][0], parts[2][0]])
    assert both.zs is None


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [(16, 24), (20, 16, 12)])
def test_fused_panels_are_the_panels_of_the_joined_codes(bits, rows):
    """Parts of whole 8-row tiles are laid end to end; a part that ends inside a tile
    makes the joined codes be laid out anew. Either way: the panels of all the rows."""
    torch.manual_seed(bits)
    scheme = QuantScheme(bits=bits, group_size=32)
    qws = [quantize_weight(torch.randn(n, 96), scheme) for n in rows]
    parts = [PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits) for qw in qws]
    fused = PackedLinear.concat(parts)
    joined = torch.cat([qw.q for qw in qws])
    offset = parts[0].offset
    assert torch.equal(fused.packed, panels_of(joined, 96, offset, bits))
    ragged = torch.randint(-8, 8, (37, 100), dtype=torch.int8)  # rows and inputs padded
    codes = torch.nn.functional.pad(ragged.to(torch.int16), (0, 28)) + offset
    want = to_panels(codes, bits)  # the layout through torch's pads and permutes
    assert torch.equal(panels_of(ragged, 128, offset, bits), want)  # the C layout
    assert torch.equal(fused.packed, to_panels(joined.to(torch.int16) + offset, bits))


def test_large_batches_take_the_exact_path():
    torch.manual_seed(0)
    qw = quantize_weight(torch.randn(40, 576), QuantScheme(bits=4, group_size=64))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 4)
    x = torch.randn(EXACT_ABOVE + 1, 576)
    torch.testing.assert_close(lin(x), x @ qw.dequantize().T, rtol=1e-5, atol=1e-4)


def test_8bit_layers_split_prompts_of_any_length_in_bounded_chunks():
    """Served prompts of more rows than the two-term kernel's scratch (64) run in chunks
    and compute what the reference does, row for row."""
    torch.manual_seed(1)
    qw = quantize_weight(torch.randn(40, 576), QuantScheme(bits=8, group_size=None))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 8)
    x = torch.randn(150, 576) * torch.rand(1, 576) * 4
    y = lin(quantize_input(x))  # quantized: the packed kernels at any size
    torch.testing.assert_close(y, _served(x, 8) @ qw.dequantize().T, rtol=1e-4, atol=1e-3)
    exact = x @ qw.dequantize().T
    assert (y - exact).norm() / exact.norm() < 1e-4


@pytest.mark.parametrize("bits", [4, 8])
def test_the_exact_path_dequantizes_a_large_weight_a_slice_at_a_time(bits, monkeypatch):
    """A 7B model's 8-bit head whole in fp32 is 2.2 GB: the exact path takes
    EXACT_SLICE_BYTES of output rows at a time, ragged last slice included, and computes
    the same product."""
    from compress.kernels import cpu

    torch.manual_seed(bits)
    qw = quantize_weight(torch.randn(203, 576), QuantScheme(bits=bits, group_size=64))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, bits)
    x = torch.randn(EXACT_ABOVE + 1, 576)
    whole = lin(x)
    monkeypatch.setattr(cpu, "EXACT_SLICE_BYTES", 48 * 576 * 4)  # 48 rows a slice
    torch.testing.assert_close(lin(x), whole, rtol=1e-5, atol=1e-4)  # BLAS blocks by width
    torch.testing.assert_close(lin.dense(48, 203), qw.dequantize()[48:], rtol=0, atol=1e-5)
    with pytest.raises(ValueError, match="tile"):
        lin.dense(3, 9)


def test_zero_input_and_zero_rows():
    qw = quantize_weight(torch.randn(8, 64), QuantScheme(bits=8, group_size=None))
    lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 8)
    assert torch.equal(lin(torch.zeros(1, 64)), torch.zeros(1, 8))


def test_groups_the_kernel_cannot_take_are_refused():
    qw = quantize_weight(torch.randn(8, 48), QuantScheme(bits=4, group_size=24))
    with pytest.raises(ValueError, match="does not fit"):
        PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 4)


@pytest.mark.parametrize(
    "flags",
    [
        "-O3 -mavx2 -mfma -mf16c -fopenmp",  # AVX2 without VNNI: maddubs + madd dot products
        "-O3 -fopenmp",  # no AVX2: the portable C loops
        pytest.param(  # 256-bit VNNI without AVX-512 (the native build takes 512-bit paths)
            "-O3 -mavx2 -mfma -mf16c -mavxvnni -fopenmp",
            marks=pytest.mark.skipif(
                not ({"avx_vnni", "avx512f"} <= _cpu_flags()),
                reason="only a CPU with AVX-VNNI and AVX-512 has a path the native build skips",
            ),
        ),
    ],
)
def test_other_instruction_sets_compute_the_same(flags):
    """This machine builds with -march=native (VNNI); CI and users' machines may take the
    other code paths, so build them here and run the matmul tests against each."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "LLMPRESS_KERNEL_FLAGS": flags}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            __file__,
            str(Path(__file__).with_name("test_runtime.py")),
            "-k",
            "packed_matmul or shared or exact or zero_input or attention or dense or scale_grid "
            "or argmax or activation or one_call_draws or divergence",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-2000:]
    assert " passed" in run.stdout


@pytest.mark.parametrize(
    "heads,kvh,d,softcap,sinks",
    [
        (9, 3, 64, None, False),
        (16, 4, 128, None, False),
        (8, 2, 96, None, False),
        (9, 3, 64, 2.0, False),
        (20, 1, 576, None, False),
        (8, 2, 64, None, True),
        (9, 3, 96, 2.0, True),
    ],
)
@pytest.mark.parametrize("kv", ["none", "int8", "int4", "int8:g16", "int4:g64"])
def test_c_decode_attention_matches_the_torch_reference(kv, heads, kvh, d, softcap, sinks):
    """The C attention stores each new token (quantizing a KIVI group as it completes,
    exactly as kv_cache.py does) and attends over quantized prefix + fp32 residual: same
    cache contents and the same output as kv_cache.read + plain softmax attention. Head
    sizes 64 and 128 take the 16-lane code loops on AVX-512 (sizes compiled in), 96 the
    8-lane ones; 4 query heads a KV head leave one over after a group of three. With a
    softcap (gemma2) the scores are capped as transformers caps them. 576: latent
    attention's one cached head (HEAD_MAX), which 20 query heads read in two passes. With
    sinks (gpt-oss, granite_swa) each head's denominator holds exp(its sink) besides."""
    import copy

    from compress.kernels.cpu import decode_attention
    from compress.runtime.kv_cache import KVCache, parse_kv
    from compress.runtime.model import _decode_attention

    torch.manual_seed(1)
    layers, slots, cap = 2, 4, 160
    ref = KVCache(layers, slots, kvh, cap, d, parse_kv(kv))
    starts = [5, 31, 64, 90]  # just past, just before and on group boundaries
    for s, n in enumerate(starts):
        for layer in range(layers):
            ref.write(layer, s, 0, torch.randn(kvh, n, d), torch.randn(kvh, n, d) * 3)
        ref.lengths[s] = n
    fast = copy.deepcopy(ref)
    sinks = 2 * torch.randn(heads) if sinks else None
    use = torch.tensor([3, 0, 1])  # ragged, out of slot order
    for _ in range(40):  # crosses several group boundaries per sequence
        positions = ref.lengths[use].clone()
        for cache in (ref, fast):  # the step's blocks, as the runtime takes them
            cache.prepare_rows(use.tolist(), positions.tolist())
        q, k, v = torch.randn(3, heads, d), torch.randn(3, kvh, d), torch.randn(3, kvh, d)
        for layer in range(layers):
            got = decode_attention(
                q, k, v, fast, layer, use, positions, softcap=softcap, sinks=sinks
            )
            ref.write_tokens(layer, use, positions, k, v)
            lengths = positions + 1
            keys, values = ref.read(layer, use, int(lengths.max()), lengths)
            mask = (torch.arange(int(lengths.max()))[None] < lengths[:, None])[:, None, None, :]
            want = _decode_attention(q, keys, values, mask, softcap=softcap, sinks=sinks)
            torch.testing.assert_close(got, want.reshape(3, heads, d), rtol=1e-4, atol=1e-4)
        ref.lengths[use] += 1
        fast.lengths[use] += 1
    names = ["k", "v"] if kv == "none" else ["kq", "vq", "k_scale", "k_min", "v_scale", "v_min"]
    for name in names:
        torch.testing.assert_close(getattr(fast, name), getattr(ref, name), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("kv", ["none", "int8", "int4:g64"])
@pytest.mark.parametrize(
    "window,kvh,heads,softcap,sinks",
    [
        (0, 3, 9, None, False),
        (300, 3, 9, None, False),
        (0, 1, 20, None, False),
        (0, 3, 9, 2.0, False),
        (0, 2, 8, None, True),
        (300, 3, 9, None, True),
    ],
)
def test_long_rows_are_attended_span_by_span_with_the_bits_of_the_row_alone(
    kv, window, kvh, heads, softcap, sinks
):
    """A decode row past 512 positions is attended in spans of 512 positions and the spans'
    softmaxes merged, a lone sequence's spans split over the threads: it matches the torch
    reference, and its bits do not depend on the rows beside it or on the thread count
    (speculation's check compares a verify pass's rows with decode steps' bit for bit).
    20 query heads on one KV head take two passes of up to 16; capped scores (gemma2) merge
    as any others; sinks join the merged denominator once."""
    import copy

    from compress.kernels.cpu import decode_attention, set_threads
    from compress.runtime.kv_cache import KVCache, parse_kv
    from compress.runtime.model import _decode_attention

    torch.manual_seed(3)
    d, lengths = 64, [700, 100, 1030, 512]
    before = KVCache(1, len(lengths), kvh, 1100, d, parse_kv(kv))
    for s, n in enumerate(lengths):
        before.write(0, s, 0, torch.randn(kvh, n, d), torch.randn(kvh, n, d) * 3)
        before.lengths[s] = n
    q, k, v = torch.randn(4, heads, d), torch.randn(4, kvh, d), torch.randn(4, kvh, d)
    slots, positions = torch.arange(4), torch.tensor(lengths)
    sinks = 2 * torch.randn(heads) if sinks else None

    def step(rows, n_threads=None):
        cache = copy.deepcopy(before)
        cache.prepare_rows(rows.tolist(), positions[rows].tolist())
        saved = torch.get_num_threads()
        set_threads(n_threads or saved)
        try:
            return decode_attention(q[rows], k[rows], v[rows], cache, 0, slots[rows],
                                    positions[rows], window=window, softcap=softcap,
                                    sinks=sinks)  # fmt: skip
        finally:
            set_threads(saved)

    got = step(slots)
    ref = copy.deepcopy(before)
    ref.prepare_rows(slots.tolist(), lengths)
    ref.write_tokens(0, slots, positions, k, v)
    n = positions + 1
    keys, values = ref.read(0, slots, int(n.max()), n)
    at = torch.arange(int(n.max()))[None]
    mask = (at < n[:, None]) & (at >= (n[:, None] - window if window else 0))
    want = _decode_attention(q, keys, values, mask[:, None, None, :], softcap=softcap, sinks=sinks)
    torch.testing.assert_close(got, want.reshape(4, heads, d), rtol=1e-4, atol=1e-4)
    for b in range(4):
        assert torch.equal(step(torch.tensor([b]))[0], got[b])
    assert torch.equal(step(torch.tensor([2, 0])), got[[2, 0]])
    assert torch.equal(step(slots, n_threads=1), got)


def test_the_c_boundary_refuses_views_it_would_misread():
    """ctypes passes a bare address: a strided view would be read as if dense (wrong
    numbers, no error), so the boundary refuses it in one line."""
    from compress.kernels.cpu import rope_

    x = torch.randn(4, 9, 128)[:, :, ::2]  # [4, 9, 64], every other channel
    cos, sin = torch.randn(16, 32), torch.randn(16, 32)
    with pytest.raises(TypeError, match="contiguous CPU tensors, got a strided"):
        rope_(x, torch.arange(4), cos, sin)


@pytest.mark.parametrize(("n", "k"), [(67, 576), (40, 37), (3, 16), (21, 1536)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 13, 16, 31, 32])
def test_dense_fp32_decode_product_matches_torch(n, k, rows):
    """Dense weights at decode batches (a tied head, a router, a batch of self-generated
    calibration text) stream through C in tiles of rows by outputs; ragged widths take the
    scalar tail, ragged row and output counts the smaller tiles."""
    from compress.kernels.cpu import gemv_f32
    from compress.runtime.linears import DenseLinear

    torch.manual_seed(n + k + rows)
    w, x = torch.randn(n, k), torch.randn(rows, k)
    want = (x.double() @ w.double().T).float()
    torch.testing.assert_close(gemv_f32(x, w), want, rtol=1e-5, atol=1e-4)
    bias = torch.randn(n)
    torch.testing.assert_close(DenseLinear(w, bias)(x), want + bias, rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="rows"):
        gemv_f32(torch.randn(GEMV_ROWS + 1, k), w)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("n", "k"), [(67, 576), (40, 37)])
@pytest.mark.parametrize("rows", [1, 3, 7, 9, 18, 32, 33])
def test_dense_16bit_weights_are_read_as_stored(dtype, n, k, rows):
    """A bf16/fp16 head or embedding is widened as it streams, never upcast into a copy:
    the products equal fp32 arithmetic on the stored values (decode batches through C,
    longer inputs a slice at a time), fp16 subnormals and ragged widths included."""
    from compress.kernels.cpu import gemv_f32
    from compress.runtime.linears import DenseLinear

    torch.manual_seed(n + k + rows)
    w = torch.randn(n, k).to(dtype)
    w[0, :5] = torch.tensor([1e-6, -3e-7, 6e-8, 0.0, -0.0]).to(dtype)  # fp16: subnormals
    x = torch.randn(rows, k)
    want = (x.double() @ w.double().T).float()
    lin = DenseLinear(w)
    assert lin.weight.dtype == dtype and lin.nbytes == n * k * 2
    torch.testing.assert_close(lin(x), want, rtol=1e-5, atol=1e-4)
    if rows <= GEMV_ROWS:
        torch.testing.assert_close(gemv_f32(x, w), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("past", [0, 1])
def test_dense_linear_takes_the_c_tiles_up_to_the_measured_rows(dtype, past, monkeypatch):
    """Where the C tiles beat torch's products (gemv_rows: 16-bit weights, which torch
    multiplies only widened a slice at a time, to 32 rows; fp32 to 32 with AVX-512, to 16
    on the other builds), DenseLinear sends its batch there, and to torch beyond."""
    import compress.runtime.linears as linears
    from compress.kernels.cpu import gemv_rows, library

    wide = library().llmp_dense_isa() == 2
    assert gemv_rows(dtype) == (32 if dtype == torch.bfloat16 or wide else 16)
    rows = gemv_rows(dtype) + past
    calls = []
    real = linears.gemv_f32
    monkeypatch.setattr(linears, "gemv_f32", lambda x, w: calls.append(x.shape) or real(x, w))
    w, x = torch.randn(24, 64).to(dtype), torch.randn(rows, 64)
    want = (x.double() @ w.double().T).float()
    torch.testing.assert_close(linears.DenseLinear(w)(x), want, rtol=1e-5, atol=1e-4)
    assert calls == ([] if past else [(rows, 64)])


@pytest.mark.parametrize("kind", ["packed", "bf16"])
def test_widened_slices_go_into_one_kept_buffer(kind, monkeypatch):
    """The exact path's dequantized slices and DenseLinear's widened 16-bit ones are
    written into one fp32 buffer the thread keeps (slice_buffer): a fresh one each call
    was mapped and page-faulted in again every time. Ragged last slice included, the
    product is the one whole weight gives, and a second call reuses the buffer."""
    from compress.kernels import cpu
    from compress.runtime import linears

    torch.manual_seed(3)
    w = torch.randn(203, 576)
    if kind == "packed":
        qw = quantize_weight(w, QuantScheme(bits=4, group_size=64))
        lin, ref = PackedLinear(qw.q, qw.scale, qw.zero_point, 64, 4), qw.dequantize()
    else:
        lin = linears.DenseLinear(w.bfloat16())
        ref = lin.weight.float()
    x = torch.randn(EXACT_ABOVE + 1, 576)
    want = x @ ref.T
    for rows in (48, 1 << 20):  # slices of 48 rows; the whole weight in one
        monkeypatch.setattr(cpu, "EXACT_SLICE_BYTES", rows * 576 * 4)
        first = lin(x)
        kept = cpu.slice_buffer(1).data_ptr()
        torch.testing.assert_close(first, want, rtol=1e-5, atol=1e-4)
        assert torch.equal(lin(x), first) and cpu.slice_buffer(1).data_ptr() == kept


def test_argmax_is_torchs_choice_ties_and_nan_included():
    """Greedy decoding's argmax in C: the first of tied maxima and the first NaN, as
    torch.argmax, at lengths that end inside and outside a vector."""
    from compress.kernels.cpu import argmax, argmax_rows

    g = torch.Generator().manual_seed(0)
    cases = [torch.randn(n, generator=g) for n in (1, 7, 8, 9, 64, 49152, 49157)]
    tied = torch.zeros(37)
    tied[[5, 20, 33]] = 2.0
    nan = torch.randn(50, generator=g)
    nan[[11, 40]] = float("nan")
    inf = torch.full((19,), float("-inf"))
    late = torch.randn(1000, generator=g)
    late[997] = 50.0  # the maximum in the scalar tail
    for x in [*cases, tied, nan, inf, late, torch.tensor([float("inf"), 1.0, float("inf")])]:
        assert argmax(x) == int(x.argmax()), x
    strided = torch.randn(64, generator=g)[::2]  # not contiguous: torch's own
    assert argmax(strided) == int(strided.argmax())
    rows = torch.randn(5, 49157, generator=g)  # eval's rows in one call: the same choices
    rows[1, [7, 900]] = 9.0
    rows[2, [3, 40000]] = float("nan")
    rows[3] = float("-inf")
    assert torch.equal(argmax_rows(rows), rows.argmax(-1))


def test_divergence_rows_are_the_float64_figures():
    """eval's per-token KL, log-sum-exp and arg max in one C pass: within float rounding of
    the same figures in float64, at widths ending inside and outside a vector and a block;
    tokens the original gives -inf add nothing; a candidate row with a NaN is NaN."""
    from compress.kernels.cpu import divergence_rows

    g = torch.Generator().manual_seed(0)
    for vocab in (5, 8, 263, 49157):
        raw = 3 * torch.randn(7, vocab, generator=g)
        raw[2, 1] = float("-inf")  # a token the original never predicts
        ref = torch.log_softmax(raw, -1)
        logits = 3 * torch.randn(7, vocab, generator=g)
        logits[4, -1] = 40.0  # the maximum in the scalar tail
        kl, lse, top = divergence_rows(ref, logits)
        p, c = ref.double(), logits.double()
        want_lse = torch.logsumexp(c, -1)
        terms = p.exp() * (p - (c - want_lse[:, None]))
        want_kl = torch.where(torch.isfinite(p), terms, 0.0).sum(-1)
        torch.testing.assert_close(lse, want_lse, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(kl, want_kl, rtol=1e-5, atol=1e-5)
        assert torch.equal(top, logits.argmax(-1))
        assert (kl >= -1e-5).all()
        same = divergence_rows(ref, ref.clone())[0]  # a model against itself: 0
        assert same.abs().max() < 1e-5
    logits[3, 2] = float("nan")
    kl, lse, top = divergence_rows(ref, logits)
    assert kl[3].isnan() and lse[3].isnan() and top[3] == 2 and not kl[:3].isnan().any()
    strided = divergence_rows(ref[:, ::2], logits[:, ::2])  # torch's operations: the same
    want = divergence_rows(ref[:, ::2].contiguous(), logits[:, ::2].contiguous())
    torch.testing.assert_close(strided[0], want[0], rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.equal(strided[2], want[2])


@pytest.mark.parametrize("act", ["silu", "gelu_pytorch_tanh", "gelu"])
@pytest.mark.parametrize("width", [7, 96, 1541])  # all tail; whole vectors; both
def test_the_activation_times_up_is_torchs_and_quantized_as_any_row(act, width):
    """llmp_act_mul_quant: act(gate) * up as transformers' activation computes it in
    float64 (the vector exp within 1e-6 relative; torch's own fp32 exact gelu is off by
    4e-4 where 1 + erf cancels), zero padded to a block, quantized as quantize_input
    quantizes that same row."""
    from transformers.activations import ACT2FN

    from compress.kernels.cpu import act_mul_quantized, quantize_input

    g = torch.Generator().manual_seed(3)
    gate_up = torch.randn(5, 2 * width, generator=g) * 4
    got = act_mul_quantized(gate_up, act)
    wide = gate_up.double()
    want = ACT2FN[act](wide[:, :width]) * wide[:, width:]
    torch.testing.assert_close(got.x.double(), want, rtol=1e-5, atol=1e-6)
    again = quantize_input(got.x.contiguous())
    assert torch.equal(got.x8[:, :width], again.x8[:, :width])
    assert torch.equal(got.dx, again.dx) and torch.equal(got.bsum, again.bsum)


@pytest.mark.parametrize("act", ["relu2", "xielu", "gelu"])
@pytest.mark.parametrize("width", [7, 96, 1541])  # all tail; whole vectors; both
def test_the_activation_without_a_gate_is_transformers_and_quantized_as_any_row(act, width):
    """llmp_act_quant: relu² (arcee, nemotron) exactly, the exact gelu (gpt_neox) within
    5e-7 of float64's relative to its size and conditioning, its negative tail included
    (torch's fp32 is off by 4e-4 there), and xIELU
    (apertus) within 1e-6 of transformers' in float64 where its value is not a
    cancellation's remainder (torch's own fp32 is off by 8e-4 there), on inputs spanning
    its branches: large, tiny, between eps and 0, and past its series' bound; zero
    padded, quantized as quantize_input would."""
    from transformers.activations import ACT2FN

    from compress.kernels.cpu import act_quantized, quantize_input

    g = torch.Generator().manual_seed(4)
    scales = torch.tensor([4.0, 1e-3, 1e-7, 0.6])[torch.arange(width) % 4]
    up = torch.randn(5, width, generator=g) * scales
    if act == "relu2":
        got = act_quantized(up, act)
        assert torch.equal(got.x, torch.relu(up) ** 2)
    elif act == "gelu":  # float64 through erfc (its 1 + erf cancels too, past -8)
        got = act_quantized(up, act)
        u = up.double()
        want = 0.5 * u * torch.special.erfc(-u / 2**0.5)
        # erfc's relative slope is 2x = g^2 / x: x = g / sqrt 2 rounded to fp32 moves it so
        bound = 5e-7 * want.abs() * (1 + u * u) + 1e-37  # fp32's normals end at 1.2e-38
        assert ((got.x.double() - want).abs() <= bound).all()
    else:
        module = ACT2FN["xielu"]  # transformers' defaults: alpha_p 0.8, alpha_n 0.8, beta 0.5
        with torch.no_grad():
            alpha_p = torch.nn.functional.softplus(module.alpha_p).item()
            alpha_n = module.beta + torch.nn.functional.softplus(module.alpha_n).item()
            params = torch.tensor([alpha_p, alpha_n, float(module.beta), float(module.eps)])
            want = module._xielu_python(up.double())
        got = act_quantized(up, act, params)
        scale = want.abs() + up.abs() * (1 + up.abs())  # the size of the terms it sums
        assert ((got.x.double() - want).abs() / scale).max() < 1e-6
    again = quantize_input(got.x.contiguous())
    assert torch.equal(got.x8[:, :width], again.x8[:, :width])
    assert torch.equal(got.dx, again.dx) and torch.equal(got.bsum, again.bsum)


@pytest.mark.parametrize(
    ("heads", "kv_heads", "d"),
    # GQA; a group wider than 8 with 40 dims; MHA, 36; latent attention's one head of 576
    [(9, 3, 64), (18, 1, 40), (4, 4, 36), (20, 1, 576)],
)
@pytest.mark.parametrize(
    "window,softcap,sinks", [(0, None, False), (16, None, False), (0, 1.0, False), (16, None, True)]
)
@pytest.mark.parametrize("n", [45, 150])  # 150: the weighted values in more than one pass
def test_c_prefill_attention_matches_torch_and_ignores_how_a_prompt_was_split(
    heads, kv_heads, d, window, softcap, sinks, n
):
    """Every chunk of a step in one C call: the same output as the torch reference, and a
    prompt's rows the same bits whether it was attended whole, in chunks (the later ones
    over the earlier ones' keys) or beside other prompts in the call; with a softcap, and
    with each head's sink in its denominator, too."""
    from compress.kernels.cpu import prefill_attention
    from compress.runtime.model import _prefill_attention

    torch.manual_seed(heads + d + window + n)
    q, k, v = torch.randn(n, heads, d), torch.randn(kv_heads, n, d), torch.randn(kv_heads, n, d)
    sinks = 2 * torch.randn(heads) if sinks else None
    whole = torch.empty(n, heads * d)
    prefill_attention(q, whole, [(0, n, k, v, 0)], 0.2, window, softcap, sinks)
    ref = _prefill_attention(q.transpose(0, 1), k, v, 0, 0.2, window or None, softcap, sinks)
    tol = 1e-5 * max(1.0, (d / 64) ** 0.5)  # sums of d products, in another order
    torch.testing.assert_close(whole, ref.transpose(0, 1).reshape(n, -1), rtol=tol, atol=tol)

    other_q = torch.randn(7, heads, d)
    other_k, other_v = torch.randn(kv_heads, 7, d), torch.randn(kv_heads, 7, d)
    both_q = torch.cat([other_q, q])
    split = torch.empty(7 + n, heads * d)
    chunks = [(0, 7, other_k, other_v, 0)]
    for a, b in [(0, 1), (1, 17), (17, 18), (18, n)]:  # one row, a span, one row, the rest
        chunks.append((7 + a, 7 + b, k[:, :b].contiguous(), v[:, :b].contiguous(), a))
    prefill_attention(both_q, split, chunks[::-1], 0.2, window, softcap, sinks)
    assert torch.equal(split[7:], whole)


def test_c_prefill_attention_refuses_keys_of_the_wrong_length():
    from compress.kernels.cpu import prefill_attention

    q, out = torch.randn(4, 2, 8), torch.empty(4, 16)
    with pytest.raises(TypeError, match="keys/values"):
        prefill_attention(q, out, [(0, 4, torch.randn(1, 3, 8), torch.randn(1, 3, 8), 0)], 1.0)


def test_hand_over_gives_the_engine_thread_the_count_and_frees_the_callers_workers():
    """A count set on one thread holds only there; hand_over carries it to the thread that
    runs the kernels from then on, and ends the caller's idle workers (libgomp's workers
    sleep at every barrier once the process's teams outnumber the CPUs)."""
    import os
    import threading
    import time

    from compress.kernels.build import library
    from compress.kernels.cpu import hand_over, set_threads

    lib, before = library(), torch.get_num_threads()
    n = (os.cpu_count() or 1) + 1  # no process default: more threads than CPUs

    def tasks() -> int:
        return len(os.listdir("/proc/self/task"))

    def on_a_thread(fn) -> int:
        out = []
        t = threading.Thread(target=lambda: (fn(), out.append(lib.llmp_get_threads())))
        t.start()
        t.join()
        return out[0]

    try:
        set_threads(n)
        assert lib.llmp_get_threads() == n
        quantize_input(torch.randn(64, 256))  # a team of n on this thread: n - 1 workers
        with_workers = tasks()
        adopt = hand_over()
        deadline = time.monotonic() + 10
        while tasks() > with_workers - (n - 1) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert tasks() == with_workers - (n - 1)
        assert on_a_thread(lambda: None) != n  # a new thread: the process default
        assert on_a_thread(adopt) == n
    finally:
        set_threads(before)


def test_a_build_without_openmp_says_so_in_one_line_and_still_computes(tmp_path):
    """A compiler that cannot build with -fopenmp gets the one-thread build, and every
    process that loads it says so on stderr (what it costs and the fix), never quietly."""
    import os
    import shutil
    import subprocess
    import sys

    real = shutil.which("cc") or shutil.which("gcc")
    cc = tmp_path / "cc"
    cc.write_text(
        "#!/bin/sh\n"
        'case "$*" in *-fopenmp*) echo "cc: error: unsupported option -fopenmp" >&2; exit 1;; '
        "esac\n"
        f'exec {real} "$@"\n'
    )
    cc.chmod(0o755)
    env = {**os.environ, "CC": str(cc), "LLMPRESS_CACHE": str(tmp_path / "cache")}
    env.pop("LLMPRESS_KERNEL_FLAGS", None)
    code = (
        "import torch\n"
        "from compress.kernels.cpu import PackedLinear\n"
        "from compress.quantizers.scheme import QuantScheme, quantize_weight\n"
        "qw = quantize_weight(torch.randn(16, 64), QuantScheme(bits=4, group_size=32))\n"
        "lin = PackedLinear(qw.q, qw.scale, qw.zero_point, qw.group_size, 4)\n"
        "x = torch.randn(3, 64)\n"
        "err = (lin(x) - x @ qw.dequantize().T).norm() / (x @ qw.dequantize().T).norm()\n"
        "assert err < 0.02, err\n"
    )
    for _ in range(2):  # built, then loaded from the cache: it says so both times
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr[-2000:]
        lines = [ln for ln in run.stderr.splitlines() if ln.startswith("llmpress:")]
        assert len(lines) == 1, run.stderr
        assert "one thread" in lines[0] and "-fopenmp" in lines[0]
        assert "LLMPRESS_KERNEL_FLAGS" in lines[0]


def test_llmpress_amx_0_turns_the_tiles_off():
    """LLMPRESS_AMX=0 leaves every product to the vector path (a VM whose tiles fault);
    otherwise the tiles are on wherever this process could turn them on."""
    import os
    import subprocess
    import sys

    code = "from compress.kernels.cpu import amx_active\nprint(amx_active())"
    for value, expect in (("0", "False"), ("1", str(use_amx(True)))):
        env = {**os.environ, "LLMPRESS_AMX": value}
        run = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert run.returncode == 0, run.stderr
        assert run.stdout.strip() == expect


@pytest.mark.parametrize("zero_point", [False, True])
def test_the_scale_grid_in_c_is_the_torch_grid(zero_point):
    """scale_grid.search (the CPU kernel) against the same candidates in torch: the least
    error of each group and its candidate, the first of equal ones, also for a group of
    zeros (every scale the smallest) and one with an outlier."""
    from compress.kernels import scale_grid
    from compress.quantizers.scale_search import GRID
    from compress.quantizers.scheme import group_range, qparams_from_range, quantize_with

    g = torch.Generator().manual_seed(3)
    w = torch.randn(33, 320, generator=g) * torch.rand(320, generator=g) * 0.05
    w[5, 64:128] = 0
    w[7, 200] = 50.0  # an outlier its group's scales are made for
    d = torch.rand(320, generator=g)
    scheme = QuantScheme(4, 64, zero_point)
    extent = group_range(w, scheme, 64)
    candidates = [qparams_from_range(extent, scheme, torch.float16, clip=c) for c in GRID]
    scales = torch.stack([c[0] for c in candidates], -1)
    zps = torch.stack([c[1] for c in candidates], -1) if zero_point else None
    err, pick = scale_grid.search(w, 64, d, scales, zps, scheme.qmin, scheme.qmax)

    def error(scale, zp):
        q = quantize_with(w, scale, zp, scheme, 64).float()
        wq = (
            q - (0 if zp is None else zp.float().repeat_interleave(64, 1))
        ) * scale.float().repeat_interleave(64, 1)
        return (d * (w - wq) ** 2).reshape(33, -1, 64).sum(-1)

    errors = torch.stack([error(*c) for c in candidates], -1)
    torch.testing.assert_close(err, errors.min(-1).values, rtol=1e-5, atol=1e-12)
    gap = errors.sort(-1).values
    clear = gap[..., 1] - gap[..., 0] > 1e-4 * gap[..., 0]  # no near-tie to decide
    assert torch.equal(pick[clear], errors.argmin(-1)[clear])
    assert torch.equal(pick[5, 1:2], errors[5, 1:2].argmin(-1))  # zeros: every error 0, first


def test_the_kept_slice_buffer_is_written_inside_and_outside_inference_mode():
    """The thread's one buffer may first be made under torch.inference_mode (a runtime
    step) and then written outside it (an eval under no_grad): an inference tensor would
    refuse that write."""
    import threading

    from compress.kernels import cpu

    errors = []

    def fresh_thread():  # its own, empty, kept buffer
        try:
            with torch.inference_mode():
                cpu.slice_buffer(4096).fill_(1.0)
            cpu.slice_buffer(1024).fill_(2.0)
            assert cpu.slice_buffer(4096)[1024:].eq(1.0).all()
        except Exception as e:  # reported in the main thread
            errors.append(e)

    t = threading.Thread(target=fresh_thread)
    t.start()
    t.join()
    assert not errors, errors


@pytest.mark.parametrize("sigmoid", [False, True])
@pytest.mark.parametrize("biased", [False, True])
def test_routing_in_c_equals_the_families_routing_in_torch(sigmoid, biased):
    """The one-call decoder's routing (softmax or sigmoid scores, the choice steered by a
    per-expert bias, weights renormalized or not, then scaled) chooses the experts and
    weights compression's torch routing does."""
    from compress.kernels.cpu import route
    from compress.model.moe import route_scores

    g = torch.Generator().manual_seed(3)
    x, router = torch.randn(64, 96, generator=g), torch.randn(16, 96, generator=g) * 0.1
    bias = torch.randn(16, generator=g) * 0.3 if biased else None
    for renormalize, scale in ((False, 1.0), (True, 2.5)):
        args = (4, renormalize, sigmoid, bias, scale)
        weights, chosen = route(x, router, *args)
        want_w, want_c = route_scores((x @ router.T).float(), *args)
        # the same experts (the order aside), each with its weight
        order, want_order = chosen.sort(-1), want_c.sort(-1)
        assert torch.equal(order.values, want_order.values)
        got = weights.gather(1, order.indices)
        assert torch.allclose(got, want_w.gather(1, want_order.indices), atol=1e-6)
        if biased:  # the bias changed the choice somewhere: a check that can fail
            plain = route(x, router, 4, renormalize, sigmoid, None, scale)[1]
            assert not torch.equal(plain.sort(-1).values, order.values)


@pytest.mark.parametrize("jitter", [0.01, 0.3, 5.0])
@pytest.mark.parametrize("shift", [0.0, -3.0])
def test_sparsemixer_routing_in_torch_and_c_equals_transformers(jitter, shift):
    """PhiMoE's router at inference, from transformers' own sparsemixer: the top 2, each
    weighted by a softmax over the experts within the relative threshold of it. Wide
    thresholds mask some experts and keep others; `shift`, a bias on every logit (the
    router's folded norm bias in C), makes them all negative, where the divisor is |s|."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer

    from compress.kernels.cpu import route
    from compress.model.moe import route_scores

    g = torch.Generator().manual_seed(11)
    x, router = torch.randn(96, 64, generator=g), torch.randn(8, 64, generator=g) * 0.2
    bias = torch.full((8,), shift)
    logits = (x @ router.T).float() + bias
    want_w, want_c = sparsemixer(logits, jitter, training=False)
    torch_route = route_scores(logits, 2, False, sparsemixer=jitter)
    c_route = route(x, router, 2, False, sparsemixer=jitter, router_bias=bias)
    for w, c in (torch_route, c_route):
        assert torch.equal(c, want_c)
        torch.testing.assert_close(w, want_w, rtol=2e-6, atol=1e-7)
    kinds = (want_w > 0.999).sum().item(), (want_w < 0.999).sum().item()
    assert kinds[1] > 0 and (jitter > 1 or kinds[0] > 0), kinds  # both kinds drawn


def test_expert_groups_limit_the_choice_to_the_best_groups():
    """DeepSeek-style group-limited routing (compression's; the runtime refuses it): the
    chosen experts lie in the topk_group groups whose best two scores sum highest."""
    from compress.model.moe import route_scores

    logits = torch.randn(256, 16, generator=torch.Generator().manual_seed(5))
    weights, chosen = route_scores(logits, 3, True, True, None, 1.0, groups=(4, 2))
    scores = torch.sigmoid(logits).view(256, 4, 4)
    best = scores.topk(2, -1).values.sum(-1).topk(2, -1).indices.sort(-1).values
    assert all(set((chosen[t] // 4).tolist()) <= set(best[t].tolist()) for t in range(256))
    free = route_scores(logits, 3, True, True)[1]  # ungrouped, some choice lies elsewhere
    assert any(not set((free[t] // 4).tolist()) <= set(best[t].tolist()) for t in range(256))
    assert torch.allclose(weights.sum(-1), torch.ones(256))
