"""GGUF files of the newer families, written by the gguf package from tiny seeded models as
llama.cpp's converter names and lays them out, convert and run like the original."""

import pytest
import torch
from family_models import GGUF_FAMILIES, build_family, write_gguf

from compress.model.default import convert_gguf, default_gguf
from compress.model.loading import resolve
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights


@pytest.mark.parametrize("name", list(GGUF_FAMILIES))
def test_a_gguf_of_each_family_converts_to_the_same_model(name, tmp_path, monkeypatch):
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family(name, vocab_size=1024, **GGUF_FAMILIES[name][1])
    path = write_gguf(model, tmp_path / f"{name}.gguf", default_gguf())
    folder = convert_gguf(path)
    ids = torch.randint(
        model.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0)
    )
    with torch.no_grad():
        want = model(ids).logits[0]
    weights = load_weights(resolve(str(folder)), device="cpu")
    got = RuntimeLM(weights, 32, exact=True)(ids).logits[0]
    # head_dim (16 here, transformers' qwen3 default is 128) and the experts' width come
    # from the file: built at transformers' defaults, these models would not even load
    assert (got - want).abs().max() < 1e-4
