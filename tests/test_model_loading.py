import json
import shutil
import time

import pytest
import torch
from safetensors.torch import load_file, save_file

from compress.artifact.dense import load_model
from compress.errors import LlmpressError
from compress.model import adapter_for, load_tokenizer, resolve
from compress.model.adapters import ADAPTERS
from compress.model.loading import _all_finite
from tests.conftest import write_tiny_llama


def test_default_model(default_ckpt):
    cfg = default_ckpt.config
    assert (cfg["model_type"], cfg["hidden_size"], cfg["num_attention_heads"]) == ("llama", 576, 9)
    assert default_ckpt.adapter.families == ("llama",)
    assert len(default_ckpt.sha256) == 64
    names = default_ckpt.adapter.linear_names(default_ckpt.num_layers)
    assert len(names) == 30 * 7 and names[0] == "model.layers.0.self_attn.q_proj"


def test_default_model_matches_transformers_gguf_loading(base_model, tokenizer):
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = base_model(ids).logits[0, -1]
    assert tokenizer.decode(logits.argmax()).strip() == "Paris"


def test_local_folder_and_adapter_groups(tmp_path):
    """Each input group's producer feeds its linears (v → o needs as many KV heads as
    query heads; with grouped-query attention methods must check, as the adapter says)."""
    ckpt = resolve(str(write_tiny_llama(tmp_path / "tiny", num_key_value_heads=4)))
    model = load_model(ckpt)
    for group in ckpt.adapter.input_groups:
        producer = model.get_submodule(f"model.layers.0.{group.producer}")
        width = producer.weight.shape[0]
        for linear in group.linears:  # the producer's output is the linears' input
            assert model.get_submodule(f"model.layers.0.{linear}").in_features == width


@pytest.mark.parametrize("model_type", ["gpt2", "bert", None])
def test_unknown_architecture_refused(tmp_path, model_type):
    folder = write_tiny_llama(tmp_path / "m")
    config = json.loads((folder / "config.json").read_text())
    config["model_type"] = model_type
    (folder / "config.json").write_text(json.dumps(config))
    every = ", ".join(sorted(ADAPTERS))  # the refusal names every supported family
    assert "olmo2, olmo3" in every and "granite" in every
    with pytest.raises(
        LlmpressError, match=rf"unsupported architecture .*: llmpress supports {every};"
    ):
        resolve(str(folder))
    with pytest.raises(LlmpressError):
        adapter_for({"model_type": model_type})


def test_corrupt_safetensors(tmp_path):
    folder = write_tiny_llama(tmp_path / "m")
    (folder / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......")
    with pytest.raises(LlmpressError, match=r"corrupt safetensors file .*model.safetensors"):
        resolve(str(folder))


def test_truncated_safetensors(tmp_path):
    folder = write_tiny_llama(tmp_path / "m")
    data = (folder / "model.safetensors").read_bytes()
    (folder / "model.safetensors").write_bytes(data[: len(data) - 1000])
    with pytest.raises(LlmpressError, match=r"truncated safetensors file .*re-download"):
        resolve(str(folder))


def test_nan_weights(tmp_path):
    folder = write_tiny_llama(tmp_path / "m")
    tensors = load_file(str(folder / "model.safetensors"))
    tensors["model.layers.1.mlp.up_proj.weight"][3, 5] = float("nan")
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(LlmpressError, match=r"model.layers.1.mlp.up_proj.weight .* 1 NaN/Inf"):
        load_model(resolve(str(folder)))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32, torch.float64])
def test_finite_check_finds_every_nan_and_infinity_and_passes_overflowing_sums(dtype):
    """The check sums each slice; a sum that overflows on finite values is no damage."""
    big = torch.finfo(dtype).max
    t = torch.zeros(3 << 20, dtype=dtype)  # three slices of the check
    assert _all_finite(t)
    t[(1 << 20) + 7 :: 1 << 16] = big  # finite, but their sum is not
    assert _all_finite(t)
    for bad in (float("nan"), float("inf"), -float("inf")):
        damaged = t.clone()
        damaged[(2 << 20) + 3] = bad
        assert not _all_finite(damaged), bad
    both = t.clone()
    both[5], both[9] = float("inf"), -float("inf")  # their sum is NaN
    assert not _all_finite(both)


def test_missing_tokenizer(tmp_path):
    ckpt = resolve(str(write_tiny_llama(tmp_path / "m")))
    with pytest.raises(LlmpressError, match=r"no usable tokenizer .*tokenizer.json"):
        load_tokenizer(ckpt)


def test_missing_shard(tmp_path):
    folder = write_tiny_llama(tmp_path / "m")
    shutil.move(folder / "model.safetensors", folder / "model-00001-of-00002.safetensors")
    index = {
        "weight_map": {
            "a": "model-00001-of-00002.safetensors",
            "b": "model-00002-of-00002.safetensors",
        }
    }
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(LlmpressError, match=r"missing shard.*00002"):
        resolve(str(folder))


def test_hub_id_offline_fails_at_once(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    t0 = time.monotonic()
    with pytest.raises(LlmpressError, match=r"cannot be reached .*path of a local model folder"):
        resolve("someorg/some-model")
    assert time.monotonic() - t0 < 10


def test_a_hub_download_takes_the_hugging_face_weights_alone(monkeypatch, tmp_path):
    """Of a Mistral repository's files (Mistral Small 3.1's, by name), the download keeps
    the config, the shards and the tokenizer, and leaves out the weights' second copy in
    Mistral's own format: the selection huggingface_hub applies to the patterns given."""
    import huggingface_hub
    from huggingface_hub.utils import filter_repo_objects

    from compress.model import loading

    repo = ["config.json", "consolidated.safetensors", "generation_config.json", "params.json",
            "model-00001-of-00010.safetensors", "model.safetensors.index.json",
            "tekken.json", "tokenizer.json", "tokenizer_config.json", "README.md"]  # fmt: skip
    asked = {}

    def snapshot(repo_id, allow_patterns=None, ignore_patterns=None, **kwargs):
        asked[repo_id] = list(filter_repo_objects(repo, allow_patterns=allow_patterns,
                                                  ignore_patterns=ignore_patterns))  # fmt: skip
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    assert loading._download("mistralai/Mistral-Small-3.1-24B-Instruct-2503") == tmp_path
    kept = asked["mistralai/Mistral-Small-3.1-24B-Instruct-2503"]
    assert "consolidated.safetensors" not in kept
    assert {"config.json", "model-00001-of-00010.safetensors", "tokenizer.json"} <= set(kept)


def test_not_a_model(tmp_path):
    with pytest.raises(LlmpressError, match="no such model folder or file"):
        resolve(str(tmp_path / "nothing-here"))
    with pytest.raises(LlmpressError, match=r"has no config.json"):
        resolve(str(tmp_path))


def test_stored_tensors_are_read_as_safetensors_reads_them(tmp_path):
    """Tensors come from plain reads of the file (no mapping whose touched pages count in
    the process's memory): every stored dtype, a scalar and an empty tensor, bit for bit
    as the safetensors library loads them."""
    from compress.model.loading import _stored

    g = torch.Generator().manual_seed(0)
    made = {
        "bool": torch.rand(3, 5, generator=g) > 0.5,
        "u8": torch.randint(0, 255, (7,), dtype=torch.uint8, generator=g),
        "i8": torch.randint(-128, 127, (2, 3), dtype=torch.int8, generator=g),
        "e4m3": torch.randn(4, 4, generator=g).to(torch.float8_e4m3fn),
        "e5m2": torch.randn(4, 4, generator=g).to(torch.float8_e5m2),
        "i16": torch.randint(-9, 9, (5,), dtype=torch.int16, generator=g),
        "u16": torch.arange(6).to(torch.uint16),
        "f16": torch.randn(3, 2, generator=g).half(),
        "bf16": torch.randn(2, 3, 4, generator=g).bfloat16(),
        "i32": torch.arange(9, dtype=torch.int32),
        "u32": torch.arange(4).to(torch.uint32),
        "f32": torch.randn(5, 7, generator=g),
        "i64": torch.arange(3),
        "u64": torch.arange(2).to(torch.uint64),
        "f64": torch.randn(3, generator=g).double(),
        "scalar": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty": torch.zeros(0, 4),
    }
    path = tmp_path / "all.safetensors"
    save_file(made, str(path))
    want = load_file(str(path))
    got = dict(_stored(path, None))
    assert sorted(got) == sorted(want) == sorted(made)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        raw = (t.reshape(-1).view(torch.uint8) for t in (got[name], tensor))
        assert torch.equal(*raw), name
    assert sorted(n for n, _ in _stored(path, {"f16", "i8"})) == ["f16", "i8"]
