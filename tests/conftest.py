"""Shared fixtures: the real default model, the wikitext data beside the checkout, and
artifacts compressed once per session."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # Triton kernels run in its interpreter, on CPU tensors
    os.environ["TRITON_INTERPRET"] = "1"

if os.environ.get("PYTEST_XDIST_WORKER"):  # pytest -n N: the cores shared among the workers
    _threads = len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ["OMP_NUM_THREADS"] = str(max(1, _threads))  # the CLI runs the tests start
    torch.set_num_threads(max(1, _threads))

from compress.artifact.dense import load_model
from compress.model.loading import load_tokenizer, resolve
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2-raw"


def pytest_collection_modifyitems(items) -> None:
    """The README's tests first: its fresh clone (2.5 minutes) and Python example (1.5) then
    start as the run does, instead of ending a parallel run on one worker while the other
    waits (the order within the file is kept: its quick-start tests share one fixture)."""
    first = [item for item in items if item.nodeid.startswith("tests/test_readme.py")]
    items[:] = first + [item for item in items if item not in first]


@pytest.fixture(scope="session")
def wikitext() -> Path:
    """The shared WikiText-2 folder; its absence is a failure, never a skip."""
    if not (WIKITEXT / "test.txt").is_file() or not (WIKITEXT / "valid.txt").is_file():
        pytest.fail(f"../shared/data/wikitext-2-raw is missing (looked in {WIKITEXT})")
    return WIKITEXT


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """A tokenizer for tiny checkpoints: the default model's, or the folder named by
    LLMPRESS_TEST_TOKENIZER where the default model is not at hand (a GPU machine)."""
    named = os.environ.get("LLMPRESS_TEST_TOKENIZER")
    return Path(named) if named else resolve("default").path


@pytest.fixture(scope="session")
def default_ckpt():
    return resolve("default")


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch, default_ckpt) -> Path:
    """An empty LLMPRESS_CACHE (no text generated, no eval reference kept) that holds the
    default model's conversion already: converting the GGUF again took 20 s a test."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / default_ckpt.path.name).symlink_to(default_ckpt.path, target_is_directory=True)
    monkeypatch.setenv("LLMPRESS_CACHE", str(cache))
    return cache


@pytest.fixture(scope="session")
def base_model(default_ckpt):
    return load_model(default_ckpt)


@pytest.fixture(scope="session")
def tokenizer(default_ckpt):
    return load_tokenizer(default_ckpt)


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> dict[str, Path]:
    """The default model compressed with the schemes that exercise every storage path:
    the default 4-bit (symmetric, groups of 64), mixed group sizes (96 and 128), 8-bit
    per-channel, and 4-bit with zero points."""
    root = tmp_path_factory.mktemp("artifacts")
    out = {}
    for spec in ("rtn:w4g64", "rtn:w4g128sym", "rtn:w8", "rtn:w4g64zp"):
        path = root / spec.replace(":", "-")
        compress("default", parse_recipe({"stages": [parse_quant(spec)]}), path, log=lambda _: None)
        out[spec] = path
    return out


@pytest.fixture(scope="session")
def w4_runtime(artifacts):
    """The default 4-bit artifact loaded into the CPU runtime."""
    from compress.runtime.weights import load_weights

    return load_weights(resolve(str(artifacts["rtn:w4g64"])), device="cpu")


def wikitext_passages(tokenizer, wikitext: Path, spans: list[tuple[int, int]]) -> list:
    """Token ids of character spans of WikiText-2's test split (its first 300 lines)."""
    from compress.calib_data.sources import read_texts

    text = "\n".join(read_texts(str(wikitext / "test.txt"))[:300])
    return [tokenizer.encode(text[a:b]) for a, b in spans]


@pytest.fixture(scope="session")
def awq_gemm_artifact(tmp_path_factory) -> Path:
    """RTN 4-bit, groups of 64 with zero points, written in AutoAWQ's GEMM layout
    (--export awq-gemm): the export's round trip and the runtime's reader share it."""
    out = tmp_path_factory.mktemp("awq-gemm") / "rtn-w4g64zp"
    recipe = parse_recipe({"stages": [parse_quant("rtn:w4g64zp")], "export": "awq-gemm"})
    return compress("default", recipe, out, log=lambda _: None)


@pytest.fixture(scope="session")
def head_w8_artifact(tmp_path_factory) -> Path:
    """The default 4-bit with its lm_head in int8 and an int8 KV cache in config.json: the
    runtime's reader and the interop checks share it (the KV key changes no weight)."""
    out = tmp_path_factory.mktemp("head-w8") / "rtn-w4g64-head-w8"
    recipe = parse_recipe(
        {"stages": [parse_quant("rtn:w4g64")], "lm_head": "w8", "kv_cache": "int8"}
    )
    return compress("default", recipe, out, log=lambda _: None)


def write_tiny_llama(folder: Path, **overrides) -> Path:
    """A small random llama checkpoint (config.json + model.safetensors) for bad-input tests."""
    from safetensors.torch import save_file
    from transformers import LlamaConfig, LlamaForCausalLM

    settings = {
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 128,
        "tie_word_embeddings": False,
    }
    config = LlamaConfig(**{**settings, **overrides})
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()},
        str(folder / "model.safetensors"),
    )
    (folder / "config.json").write_text(json.dumps(config.to_dict()))
    return folder
