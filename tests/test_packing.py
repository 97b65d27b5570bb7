import pytest
import torch
from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32, unpack_from_int32

from compress.quantizers.packing import pack, unpack


def _random_ints(bits: int, shape: tuple[int, int], seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-(1 << (bits - 1)), 1 << (bits - 1), shape, generator=g).to(torch.int8)


@pytest.mark.parametrize("bits", range(2, 9))
@pytest.mark.parametrize("shape", [(5, 37), (576, 9), (3, 32), (1, 1)])
@pytest.mark.parametrize("dim", [0, 1])
def test_round_trip(bits, shape, dim):
    q = _random_ints(bits, shape)
    packed = pack(q, bits, dim)
    assert packed.dtype == torch.int32
    n = shape[dim]
    expected_words = -(-n * bits // 32)
    assert packed.shape[dim] == expected_words and packed.shape[1 - dim] == shape[1 - dim]
    assert torch.equal(unpack(packed, bits, shape, dim), q)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 8])
@pytest.mark.parametrize("dim", [0, 1])
def test_same_bits_as_compressed_tensors(bits, dim):
    """The stored layout is exactly what compressed-tensors (and so transformers/vLLM) reads."""
    q = _random_ints(bits, (24, 70), seed=bits)
    ours = pack(q, bits, dim)
    assert torch.equal(ours, pack_to_int32(q, bits, packed_dim=dim))
    assert torch.equal(unpack_from_int32(ours, bits, q.shape, packed_dim=dim), q)


def test_documented_nibble_order():
    q = torch.arange(-8, 0, dtype=torch.int8).reshape(1, 8)  # stored unsigned as 0..7
    assert pack(q, 4).item() == 0x76543210


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (5, 33), (4097, 18)])
def test_byte_path_packs_what_the_word_path_packs(bits, shape, monkeypatch):
    """4 and 8 bits pack byte-wise (17x faster at a 7B layer); the general per-position
    path is the reference, across odd columns, a partial word and a slice of ROWS."""
    from compress.quantizers import packing

    monkeypatch.setattr(packing, "ROWS", 4096)
    wide = _random_ints(bits, (shape[0], shape[1] + 3), seed=shape[1])
    q = wide[:, : shape[1]]  # not contiguous
    assert torch.equal(pack(q, bits, 1), packing._pack(q.contiguous(), bits, 1))
