"""The runtime keeps streamed weights and its KV cache in huge pages: same values, madvised
memory, and nothing silently kept alive."""

import gc
import os
from pathlib import Path

import pytest
import torch

from compress.kernels import hugepages


def _vma_flags(ptr: int) -> dict[str, str]:
    """The /proc/self/smaps fields of the mapping that holds address `ptr`."""
    fields, inside = {}, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= ptr < hi
        elif inside:
            fields[head.rstrip(":")] = " ".join(line.split()[1:])
    return fields


def test_place_keeps_values_dtype_and_shape():
    for t in (
        torch.randn(300, 7),
        torch.randint(0, 255, (33, 64), dtype=torch.uint8),
        torch.randn(5, 6).to(torch.bfloat16),
    ):
        out = hugepages.place(t)
        assert out.dtype == t.dtype and out.shape == t.shape and out.is_contiguous()
        assert torch.equal(out, t)
        if hugepages.available():
            assert out.data_ptr() != t.data_ptr() and out.data_ptr() % hugepages.ALIGN == 0


@pytest.mark.skipif(not hugepages.available(), reason="needs transparent huge pages")
def test_placed_memory_is_madvised_for_huge_pages():
    small = hugepages.place(torch.ones(1000))  # in the shared chunk
    large = hugepages.place(torch.ones(hugepages.CHUNK // 4 + 10))  # a mapping of its own
    for t in (small, large):
        flags = _vma_flags(t.data_ptr())
        assert flags.get("THPeligible") == "1"
        assert "hg" in flags["VmFlags"].split()  # madvised by us, whatever the system default
    # Whether torch's own memory is eligible depends on the host (mTHP sizes set to
    # `always`, glibc's hugetlb tunable), so it is not asserted here.


@pytest.mark.skipif(not hugepages.available(), reason="needs transparent huge pages")
def test_a_large_tensor_frees_its_mapping():
    t = hugepages.place(torch.ones(hugepages.CHUNK // 4 + 10))
    ptr = t.data_ptr()
    del t
    gc.collect()
    assert "hg" not in _vma_flags(ptr).get("VmFlags", "").split()  # unmapped, or not ours


@pytest.mark.skipif(not hugepages.available(), reason="needs transparent huge pages")
@pytest.mark.parametrize("kv", ["none", "int4"])
def test_a_cpu_kv_cache_is_zeroed_in_huge_pages(kv):
    """Decode's attention reads every cached block each step: the pool's arrays sit in
    madvised memory, zeroed, and read back what a cache made with LLMPRESS_HUGEPAGES=0
    does."""
    from compress.runtime.kv_cache import KVCache, parse_kv

    cache = KVCache(2, 3, 2, 100, 16, parse_kv(kv))
    for t in cache._arrays():
        assert not t.any()
        assert "hg" in _vma_flags(t.data_ptr())["VmFlags"].split()
    torch.manual_seed(0)
    k, v = torch.randn(2, 70, 16), torch.randn(2, 70, 16)
    cache.write(1, 2, 0, k, v)
    cache.lengths[2] = 70
    os.environ["LLMPRESS_HUGEPAGES"] = "0"
    hugepages.available.cache_clear()
    try:
        plain = KVCache(2, 3, 2, 100, 16, parse_kv(kv))
    finally:
        os.environ.pop("LLMPRESS_HUGEPAGES")
        hugepages.available.cache_clear()
    plain.write(1, 2, 0, k, v)
    plain.lengths[2] = 70
    got, want = cache.read(1, torch.tensor([2]), 70), plain.read(1, torch.tensor([2]), 70)
    assert got[0].abs().sum() > 0
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
