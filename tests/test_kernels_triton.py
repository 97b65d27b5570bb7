"""Triton kernels checked against plain-torch references: compiled, on CUDA tensors, where
a GPU is present; else on CPU under TRITON_INTERPRET=1 (set in conftest). Ragged shapes,
masked tails, batch 1 and > 1, every output element written."""

import pytest
import torch

from compress.kernels.triton_attention import decode_attention
from compress.kernels.triton_matmul import dequant_matmul
from compress.quantizers.packing import pack
from compress.quantizers.scheme import QuantScheme, quantize_weight
from compress.runtime.kv_cache import KVCache, KVScheme
from compress.runtime.linears import TritonQuantLinear
from compress.runtime.model import _decode_attention

# On a GPU the kernels run compiled, on CUDA tensors; tl.dot (batch >= 16) then multiplies
# fp32 in TF32 on the tensor cores (10-bit mantissas), so its products get a looser bound.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DOT_TOLERANCE = 2e-2 if DEVICE == "cuda" else 1e-4

MATMUL_CASES = [
    # bits, group, zero point, K, N
    (4, 64, True, 576, 70),
    (4, 96, False, 576, 33),  # a group that does not divide BLOCK_K
    (4, 32, True, 104, 17),  # 104 takes group 8 (scheme.py's rule)
    (4, None, True, 100, 64),  # per channel, K not a multiple of 8: a partly filled last word
    (8, None, False, 576, 70),
    (8, 32, True, 96, 5),
]


@pytest.mark.parametrize(("bits", "group", "zp", "k", "n"), MATMUL_CASES)
@pytest.mark.parametrize("m", [1, 3, 17])  # GEMV, small batch, tl.dot with a masked tail
def test_dequant_matmul_matches_reference(bits, group, zp, k, n, m):
    torch.manual_seed(m * 1000 + k + n)
    qw = quantize_weight(torch.randn(n, k), QuantScheme(bits=bits, group_size=group, zero_point=zp))
    stored = pack(qw.q, 4, dim=1) if bits == 4 else qw.q
    x = torch.randn(m, k)
    zp = None if qw.zero_point is None else qw.zero_point.to(DEVICE)
    args = (stored.to(DEVICE), qw.scale.float().to(DEVICE), zp, qw.group_size, bits, k)
    y = dequant_matmul(x.to(DEVICE), *args).cpu()
    assert y.shape == (m, n)
    assert torch.isfinite(y).all()  # torch.empty output: an unwritten element would show
    tol = DOT_TOLERANCE if m >= 16 else 1e-4
    torch.testing.assert_close(y, x @ qw.dequantize().T, rtol=tol, atol=tol)


def test_triton_linear_reads_the_artifact_tensors(artifacts):
    from compress.artifact.formats import CODECS
    from compress.model.loading import read_tensors, resolve

    ckpt = resolve(str(artifacts["rtn:w4g64zp"]))
    prefix = "model.layers.3.mlp.down_proj"
    names = [n for n in ckpt.tensors if n.startswith(prefix + ".")]
    t = read_tensors(ckpt, names)
    args = ckpt.config["quantization_config"]["config_groups"]["group_0"]["weights"]
    from compress.quantizers.packing import unpack

    zp = unpack(t[f"{prefix}.weight_zero_point"], 4, (576, t[f"{prefix}.weight_scale"].shape[1]), 0)
    lin = TritonQuantLinear(
        t[f"{prefix}.weight_packed"], t[f"{prefix}.weight_scale"], zp, 64, 4, 1536
    )
    x = torch.randn(2, 1536)
    dense = CODECS["auto"].decode(prefix, t, {**args, "format": "pack-quantized"}).dequantize()
    torch.testing.assert_close(lin(x), x @ dense.T, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bits", [None, 8, 4])
# gemma2's capped scores; a sink in each head's softmax (gpt-oss, granite_swa)
@pytest.mark.parametrize("softcap,sinks", [(None, False), (2.0, False), (None, True)])
@pytest.mark.parametrize("dim", [64, 96])  # 96: no power of two (a latent of 64, rope 32)
def test_decode_attention_matches_reference(bits, softcap, sinks, dim):
    torch.manual_seed(0)
    sinks = (2 * torch.randn(9)).to(DEVICE) if sinks else None
    cache = KVCache(2, 4, 3, 128, dim, KVScheme(bits, group=32), device=DEVICE)
    lengths = {0: 70, 1: 5, 2: 32, 3: 1}  # a residual only, a group boundary, one token
    for slot, n in lengths.items():
        for layer in range(2):
            k, v = torch.randn(3, n, dim), torch.randn(3, n, dim)
            cache.write(layer, slot, 0, k.to(DEVICE), v.to(DEVICE))
        cache.lengths[slot] = n
    slots = torch.tensor([2, 0, 3, 1], device=DEVICE)
    lens = cache.lengths[slots]
    q = torch.randn(4, 9, dim).to(DEVICE)
    out = decode_attention(q, cache, 1, slots, lens, softcap=softcap, sinks=sinks)
    keys, values = cache.read(1, slots, int(lens.max()))
    mask = (torch.arange(int(lens.max()), device=DEVICE)[None] < lens[:, None])[:, None, None, :]
    ref = _decode_attention(q, keys, values, mask, softcap=softcap, sinks=sinks)
    ref = ref.reshape(4, 9, dim)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


SPAN_CASES = [(b, w, 64, False) for b in (None, 8, 4) for w in (0, 300)]
SPAN_CASES += [(8, 0, 96, False), (8, 300, 64, True)]


@pytest.mark.parametrize(("bits", "window", "dim", "sinks"), SPAN_CASES)
def test_decode_attention_in_spans_matches_reference_with_the_bits_of_a_row_alone(
    bits, window, dim, sinks
):
    """A cache whose rows may pass 512 positions is attended in spans of 512 (a program
    each), merged in order: the reference's output, and each row's bits the same alone as
    in the batch. Two query heads a key head (the interpreter's time goes with the heads:
    the grouping itself is tested with three above). Sinks join the merged denominator."""
    torch.manual_seed(1)
    sinks = (2 * torch.randn(4)).to(DEVICE) if sinks else None
    cache = KVCache(1, 4, 2, 1200, dim, KVScheme(bits, group=32), device=DEVICE)
    lengths = {0: 700, 1: 5, 2: 1100, 3: 512}  # one span, spans with and without a residual
    for slot, n in lengths.items():
        k, v = torch.randn(2, n, dim), torch.randn(2, n, dim)
        cache.write(0, slot, 0, k.to(DEVICE), v.to(DEVICE))
        cache.lengths[slot] = n
    slots = torch.tensor([2, 0, 3, 1], device=DEVICE)
    lens = cache.lengths[slots]
    q = torch.randn(4, 4, dim).to(DEVICE)
    out = decode_attention(q, cache, 0, slots, lens, window=window, sinks=sinks)
    keys, values = cache.read(0, slots, int(lens.max()))
    at = torch.arange(int(lens.max()), device=DEVICE)[None]
    mask = (at < lens[:, None]) & (at >= (lens[:, None] - window if window else 0))
    ref = _decode_attention(q, keys, values, mask[:, None, None, :], sinks=sinks)
    torch.testing.assert_close(out, ref.reshape(4, 4, dim), rtol=1e-5, atol=1e-5)
    for j in range(4):
        alone = decode_attention(q[j : j + 1], cache, 0, slots[j : j + 1], lens[j : j + 1],
                                 window=window, sinks=sinks)  # fmt: skip
        assert torch.equal(alone[0], out[j])


def test_triton_backend_decodes_the_default_model_like_the_cpu_backend(
    tokenizer, tmp_path, wikitext
):
    """The CUDA backend end to end on CPU tensors (TRITON_INTERPRET=1): Triton dequant
    matmuls for every block linear, Triton attention over an int8 KIVI cache whose prompt
    filled one quantized group and part of the residual. Its greedy tokens equal the C
    backend's, and its prompt logits equal transformers' on the same artifact (fp32
    activations, where the C kernels quantize them to int8). Four of the default model's
    30 blocks (the others pruned away): every block runs the same kernels, and the
    interpreter took two minutes for all 30."""
    from compress.artifact.dense import load_model
    from compress.model.loading import resolve
    from compress.pipeline import compress
    from compress.recipe import parse_quant, parse_recipe
    from compress.runtime import Engine, load_weights
    from compress.runtime.kv_cache import parse_kv

    calib = {"source": str(wikitext / "valid.txt"), "samples": 2, "length": 64}
    stages = [{"prune": {"layers": 26, "layer_metric": "bi"}}, parse_quant("rtn:w4g64")]
    recipe = parse_recipe({"stages": stages, "calib": calib})
    ckpt = resolve(str(compress("default", recipe, tmp_path / "four", log=lambda _: None)))
    assert ckpt.config["num_hidden_layers"] == 4
    text = "one, two, three, four, five, six, seven, eight, nine,"
    prompt = tokenizer(text)["input_ids"]
    assert 16 < len(prompt) < 32  # past one KV group of 16, tl.dot for the prompt's rows
    tokens, first_logits = {}, {}
    for kernels in ("c", "triton"):
        weights = load_weights(ckpt, "cpu", kernels)
        engine = Engine(weights, max_batch=1, max_len=64, kv=parse_kv("int8:g16"))
        assert engine.model.backend.name == kernels
        if kernels == "triton":
            assert all(type(x).__name__ == "TritonQuantLinear" for x in weights.layers[0].qkv.parts)
        logits = engine.model.prefill(torch.tensor(prompt), engine.cache, 0)
        first_logits[kernels] = logits
        nxt = int(logits[-1].argmax())
        step = engine.model.decode(torch.tensor([nxt]), engine.cache, torch.tensor([0]))
        tokens[kernels] = [nxt, int(step[0].argmax())]
    assert tokens["triton"] == tokens["c"], tokenizer.decode(tokens["c"])
    with torch.no_grad():
        ref = load_model(ckpt)(input_ids=torch.tensor([prompt])).logits[0]
    torch.testing.assert_close(first_logits["triton"], ref, rtol=1e-4, atol=5e-4)
