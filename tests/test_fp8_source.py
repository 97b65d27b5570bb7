"""FP8 checkpoints (config.json `quant_method: fp8`, float8 weights beside their
`weight_scale_inv`), as MiniMax-M2, Qwen3's -FP8 releases and Ministral 3 are published:
every command reads them as the dense model they stand for."""

import json

import pytest
import torch
from family_models import build_family
from safetensors import safe_open
from safetensors.torch import save_file
from test_bad_input import error_lines, run_cli

from compress.errors import LlmpressError
from compress.model.default import convert_gguf, default_gguf
from compress.model.fp8_source import dequantize
from compress.model.loading import resolve, weights_sha256
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
E4M3_MAX = 448.0


def _quantize(w: torch.Tensor, block: list[int] | None):
    """float8 e4m3 codes and their scales: per block of `block`, or per tensor (None);
    edge blocks partial, as DeepSeek-V3's and Qwen3's converters leave them."""
    if block is None:
        scale = w.abs().max() / E4M3_MAX
        return (w / scale).to(torch.float8_e4m3fn), scale.reshape(())
    if block == "row":
        scale = w.abs().amax(1, keepdim=True) / E4M3_MAX
        return (w / scale).to(torch.float8_e4m3fn), scale
    (n, k), (bn, bk) = w.shape, block
    rows, cols = -(-n // bn), -(-k // bk)
    scale = torch.empty(rows, cols)
    codes = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    for i in range(rows):
        for j in range(cols):
            part = w[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk]
            scale[i, j] = part.abs().max() / E4M3_MAX
            codes[i * bn : (i + 1) * bn, j * bk : (j + 1) * bk] = (part / scale[i, j]).to(
                torch.float8_e4m3fn
            )
    return codes, scale


def _write_fp8(
    model,
    folder,
    tokenizer,
    block,
    dtype="float32",
    activation_scales=False,
    scale_name="_scale_inv",
):
    """The tiny model as an FP8 checkpoint: every block linear float8 with its scales (the
    embedding, norms and head stay as they are, as published FP8 checkpoints keep them);
    returns the dense state dict those codes stand for (each code times its scale)."""
    folder.mkdir()
    tensors, dense = {}, {}
    for name, t in model.state_dict().items():
        t = t.float().contiguous()
        if name.endswith(tuple(f"{p}.weight" for p in LINEARS)):
            codes, scale = _quantize(t, block)
            tensors[name], tensors[f"{name}{scale_name}"] = codes, scale
            if activation_scales:  # static FP8 activations' scales: unused when dense
                which = ".input_scale" if scale_name == "_scale" else ".activation_scale"
                tensors[name.replace(".weight", which)] = torch.tensor(0.5)
            if block is None or block == "row":
                dense[name] = codes.float() * scale
            else:  # each code times its own block's scale, element by element
                bn, bk = block
                rows = torch.arange(t.shape[0])[:, None] // bn
                cols = torch.arange(t.shape[1])[None, :] // bk
                dense[name] = codes.float() * scale[rows, cols]
        else:
            tensors[name] = dense[name] = t
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    config["dtype"] = dtype
    config["quantization_config"] = {
        "quant_method": "fp8",
        "fmt": "e4m3",
        "activation_scheme": "static" if activation_scales else "dynamic",
        "weight_block_size": block,
    }
    if block == "row":  # compressed-tensors' float-quantized form (RedHat's FP8-dynamic)
        config["quantization_config"] = {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
                "num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True}}},
            "ignore": ["lm_head"],
        }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    for f in tokenizer.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            (folder / f.name).write_bytes(f.read_bytes())
    return dense


@pytest.fixture(scope="module")
def tokenizer():
    """The default model's converted folder, from the user's cache (before a test points
    LLMPRESS_CACHE at its own)."""
    return convert_gguf(default_gguf())


@pytest.fixture
def ids():
    return torch.randint(0, 49152, (1, 40), generator=torch.Generator().manual_seed(0))


def test_a_block_scaled_fp8_checkpoint_runs_as_transformers_dequantizes_it(
    tmp_path, ids, monkeypatch, tokenizer
):
    """DeepSeek-V3's format (Qwen3-FP8, MiniMax-M2): block scales; plain transformers on a
    CPU dequantizes such a checkpoint as it loads it, and the runtime computes the same."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "fp8"
    _write_fp8(build_family("qwen3"), src, tokenizer, [32, 32])
    reference = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        want = reference(ids).logits[0]
    ckpt = resolve(str(src))
    assert "quantization_config" not in ckpt.config and not ckpt.is_quantized
    assert ckpt.sha256 == weights_sha256([src / "model.safetensors"])
    assert not any(n.endswith("scale_inv") for n in ckpt.tensors)
    got = RuntimeLM(load_weights(ckpt, device="cpu"), 48, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    assert resolve(str(src)).path == ckpt.path  # written once, then reused

    out = tmp_path / "w4"
    code, stdout, stderr = run_cli(["compress", str(src), "-o", str(out), "--quant", "rtn:w4g32"])
    assert code == 0, stderr
    assert "FP8" in stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["sha256"] == ckpt.sha256
    assert "| read as | its FP8 weights, dequantized first |" in (out / "README.md").read_text()


@pytest.mark.parametrize(
    ("block", "scale_name"),
    [(None, "_scale_inv"), (None, "_scale"), ([48, 48], "_scale_inv"), ("row", "_scale")],
)
def test_per_tensor_and_partial_block_scales_give_each_code_times_its_scale(
    tmp_path, ids, monkeypatch, block, scale_name, tokenizer
):
    """Per-tensor scales with static activation scales, which the dense model drops
    (Mistral's `weight_scale_inv` and `activation_scale`; AutoFP8's `weight_scale` and
    `input_scale`), blocks that do not divide the weight (64 and 128 wide, blocks of 48),
    and compressed-tensors' float-quantized rows: the model read equals transformers'
    forward of each code times its own scale."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("llama3")
    static = block is None
    dense = _write_fp8(model, tmp_path / "fp8", tokenizer, block, "float32", static, scale_name)
    model.load_state_dict(dense)
    with torch.no_grad():
        want = model(ids).logits[0]
    ckpt = resolve(str(tmp_path / "fp8"))
    assert not any(n.endswith(("scale_inv", "_scale")) for n in ckpt.tensors)
    got = RuntimeLM(load_weights(ckpt, device="cpu"), 48, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    assert isinstance(AutoModelForCausalLM.from_pretrained(ckpt.path), torch.nn.Module)


def test_the_dense_copy_keeps_the_checkpoint_s_16_bit_dtype(tmp_path, monkeypatch, tokenizer):
    """A bfloat16 checkpoint's dense weights are written in bfloat16 (half of fp32's disk),
    as transformers and vLLM dequantize it; the rest keeps its own dtype."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    _write_fp8(build_family("llama3"), tmp_path / "fp8", tokenizer, [32, 32], dtype="bfloat16")
    ckpt = resolve(str(tmp_path / "fp8"))
    dtypes = {name: dtype for name, (_, _, dtype) in ckpt.tensors.items()}
    assert dtypes["model.layers.0.self_attn.q_proj.weight"] == "BF16"
    assert dtypes["model.embed_tokens.weight"] == "F32"


def test_inspect_json_of_an_fp8_checkpoint_prints_only_json(tmp_path, monkeypatch, tokenizer):
    """The one-time conversion reports its progress on stderr: `inspect --json`'s stdout
    stays one JSON document even on the first read."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    _write_fp8(build_family("llama3"), tmp_path / "fp8", tokenizer, [32, 32])
    code, out, err = run_cli(["inspect", str(tmp_path / "fp8"), "--json"])
    assert code == 0, err
    assert "FP8" in err and "FP8" not in out
    json.loads(out)  # the manifest (none for a source checkpoint: null), and nothing else


def test_a_float8_weight_without_its_scale_is_refused_in_one_line(tmp_path, monkeypatch, tokenizer):
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    src = tmp_path / "fp8"
    _write_fp8(build_family("llama3"), src, tokenizer, [32, 32])
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        kept = {n: f.get_tensor(n) for n in f.keys() if not n.endswith("q_proj.weight_scale_inv")}  # noqa: SIM118
    save_file(kept, str(src / "model.safetensors"), metadata={"format": "pt"})
    code, _, err = run_cli(["inspect", str(src)])
    assert code != 0
    lines = error_lines(err)
    assert len(lines) == 1 and "q_proj.weight is stored in F8_E4M3 without" in lines[0], err
    with pytest.raises(LlmpressError, match="re-download the checkpoint"):
        resolve(str(src))


def test_dequantize_takes_the_block_size_and_refuses_scales_that_do_not_fit():
    """A grid alone is ambiguous (64 rows make 2 blocks of 32 or of 48): the config's
    weight_block_size decides, and without it the grid must divide the weight."""
    w = torch.ones(64, 128, dtype=torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    by48 = dequantize(w, scale, [48, 48])
    assert by48[47, 47] == 1 and by48[48, 48] == 5 and by48[63, 127] == 6
    assert dequantize(w, torch.ones(2, 4)).shape == (64, 128)
    with pytest.raises(ValueError, match="do not fit"):
        dequantize(w, scale)  # 3 columns do not divide 128
    with pytest.raises(ValueError, match="do not fit"):
        dequantize(w, scale, [32, 32])


def test_an_fp8_multimodal_checkpoint_is_read_as_its_dense_language_model(
    tmp_path, ids, monkeypatch, tokenizer
):
    """Ministral 3 as published: a Mistral3ForConditionalGeneration whose language model's
    linears are FP8. Its dense weights, then its language model, each made once; the
    source hash is the FP8 files', and plain transformers (which dequantizes it on a CPU)
    computes what the runtime does."""
    from family_models import write_multimodal
    from transformers import Mistral3ForConditionalGeneration

    src = write_multimodal(tmp_path / "mm", "mistral3", tokenizer, text="ministral3", tied=False)
    with safe_open(str(src / "model.safetensors"), "pt") as f:
        tensors = {n: f.get_tensor(n) for n in f.keys()}  # noqa: SIM118
    for name in [n for n in tensors if n.startswith("language_model.")]:
        if name.endswith(tuple(f"{p}.weight" for p in LINEARS)):
            tensors[name], tensors[f"{name}_scale_inv"] = _quantize(tensors[name], [32, 32])
    save_file(tensors, str(src / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "weight_block_size": [32, 32],
        "modules_to_not_convert": ["vision_tower", "multi_modal_projector", "lm_head"],
    }
    (src / "config.json").write_text(json.dumps(config))

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    reference = Mistral3ForConditionalGeneration.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        want = reference.eval()(input_ids=ids).logits[0]
    ckpt = resolve(str(src))
    assert ckpt.config["model_type"] == "ministral3" and ckpt.text_part_of
    assert ckpt.dequantized_from == "fp8"
    assert ckpt.sha256 == weights_sha256([src / "model.safetensors"])
    got = RuntimeLM(load_weights(ckpt, device="cpu"), 48, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
