import pytest
import torch

from compress.errors import LlmpressError
from compress.quantizers.scheme import QuantScheme, effective_group_size, quantize_weight


@pytest.mark.parametrize(
    ("in_features", "requested", "expected"),
    [
        (576, 128, 96),
        (576, 64, 64),
        (1536, 128, 128),
        (576, None, 576),
        (576, 1024, 576),
        (100, 64, None),
        (577, 128, None),
        (200, 64, 40),
    ],
)
def test_group_rule(in_features, requested, expected):
    g = effective_group_size(in_features, requested)
    assert g == expected and (g is None or in_features % g == 0)


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("zero_point", [True, False])
@pytest.mark.parametrize("group", [32, 128, None])
def test_rtn_error_is_within_half_a_step(bits, zero_point, group):
    torch.manual_seed(bits)
    w = torch.randn(48, 576) * 0.05
    w[3, 7] = 0.9  # an outlier inside one group
    qw = quantize_weight(w, QuantScheme(bits, group, zero_point))
    assert qw.q.min() >= qw.scheme.qmin and qw.q.max() <= qw.scheme.qmax
    step = qw.scale.float().repeat_interleave(qw.group_size, dim=1)
    err = (qw.dequantize() - w).abs()
    assert (err <= step / 2 + 1e-6).all()
    if zero_point:  # zero stays exactly representable
        zero = torch.zeros(48, 576)
        assert torch.equal(quantize_weight(zero, QuantScheme(bits, group, True)).dequantize(), zero)


def test_more_bits_less_error():
    w = torch.randn(64, 576)
    errs = [
        (quantize_weight(w, QuantScheme(b, 64)).dequantize() - w).pow(2).mean()
        for b in (2, 3, 4, 8)
    ]
    assert errs == sorted(errs, reverse=True)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_weights_do_not_overflow(dtype):
    w = (torch.randn(16, 128) * 3e4).clamp(-6e4, 6e4).to(dtype)
    qw = quantize_weight(w, QuantScheme(4, 32, True), storage_dtype=dtype)
    assert qw.scale.dtype == dtype
    deq = qw.dequantize()
    assert torch.isfinite(deq).all()
    step = qw.scale.float().repeat_interleave(32, dim=1)
    # integers fit the stored (rounded) scale: half a step, plus clamping at the range ends
    assert ((deq - w.float()).abs() <= step * 0.6).all()


@pytest.mark.parametrize("kwargs", [{"bits": 1}, {"bits": 9}, {"group_size": 0}])
def test_invalid_schemes(kwargs):
    with pytest.raises(LlmpressError):
        QuantScheme(**kwargs)


@pytest.mark.parametrize("zero_point", [True, False])
def test_cpu_slices_give_the_integers_of_one_whole_pass(zero_point, monkeypatch):
    """Rows are independent: RTN and dequantization in cache-sized slices (CPU_SLICE
    elements, a last slice cut short) give what one pass over the whole weight gives."""
    from compress.quantizers import scheme as module

    torch.manual_seed(0)
    w = (torch.randn(1003, 192) * 0.02).bfloat16()
    s = QuantScheme(4, 64, zero_point)
    monkeypatch.setattr(module, "CPU_SLICE", 1 << 30)
    whole = quantize_weight(w, s, torch.bfloat16)
    monkeypatch.setattr(module, "CPU_SLICE", 100 * 192)
    sliced = quantize_weight(w, s, torch.bfloat16)
    assert torch.equal(sliced.q, whole.q) and torch.equal(sliced.scale, whole.scale)
    assert (whole.zero_point is None) == (not zero_point)
    assert whole.zero_point is None or torch.equal(sliced.zero_point, whole.zero_point)
    sliced_values = whole.dequantize()
    monkeypatch.setattr(module, "CPU_SLICE", 1 << 30)
    assert torch.equal(sliced_values, whole.dequantize())


def test_dequantize_leaves_float_codes_as_they_were():
    """Slices are worked in place: codes already in fp32 must be copied first."""
    from compress.quantizers.scheme import dequantize

    q = torch.tensor([[1.0, -2.0, 3.0, 0.0]])
    kept = q.clone()
    out = dequantize(q, torch.tensor([[0.5, 2.0]]), torch.tensor([[1, -1]]), 2)
    assert torch.equal(q, kept)
    assert torch.equal(out, torch.tensor([[0.0, -1.5, 8.0, 2.0]]))
