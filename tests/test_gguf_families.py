"""GGUF files of the newer families, written by the gguf package from tiny seeded models as
llama.cpp's converter names and lays them out, convert and run like the original."""

import json

import pytest
import torch
from family_models import GGUF_FAMILIES, GGUF_ROPE_CASES, build_family, write_gguf
from test_bad_input import error_lines, run_cli

from compress.model.default import convert_gguf, default_gguf
from compress.model.loading import resolve
from compress.runtime.lm import RuntimeLM
from compress.runtime.weights import load_weights


def _same_logits(model, folder) -> None:
    """The runtime on the converted folder computes the tiny model's logits."""
    ids = torch.randint(1024, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits[0]
    got = RuntimeLM(load_weights(resolve(str(folder)), device="cpu"), 32, exact=True)(ids)
    assert (got.logits[0] - want).abs().max() < 1e-4


def _refused(*args, **kwargs):
    raise AssertionError("the conversion loaded a whole model")


@pytest.mark.parametrize("name", list(GGUF_FAMILIES))
def test_a_gguf_of_each_family_converts_to_the_same_model(name, tmp_path, monkeypatch):
    """Tensor by tensor: no whole model is ever built (a 7B one would be 28 GB in fp32)."""
    import transformers

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    for cls in ("AutoModelForCausalLM", "PreTrainedModel"):
        monkeypatch.setattr(getattr(transformers, cls), "from_pretrained", _refused)
    model = build_family(name, vocab_size=1024, **GGUF_FAMILIES[name][1])
    path = write_gguf(model, tmp_path / f"{name}.gguf", default_gguf())
    folder = convert_gguf(path)
    monkeypatch.undo()
    # head_dim (16 here, transformers' qwen3 default is 128) and the experts' width come
    # from the file: built at transformers' defaults, these models would not even load
    _same_logits(model, folder)


@pytest.mark.parametrize("name", ["qwen3_moe", "mixtral"])
def test_quantized_stacked_experts_convert_to_what_the_file_holds(name, tmp_path, monkeypatch):
    """Published MoE GGUFs hold their stacked experts quantized: each expert's rows are
    cut from the stacked blocks and dequantized to exactly what the file holds (the
    gguf package's own round trip of that expert), and the runtime computes what
    transformers computes from the converted folder."""
    import numpy as np
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize, quantize
    from safetensors.torch import load_file

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family(name, vocab_size=1024, **GGUF_FAMILIES[name][1])
    folder = convert_gguf(write_gguf(model, tmp_path / "q.gguf", default_gguf(), qtype="Q8_0"))
    got = {}
    for f in folder.glob("*.safetensors"):
        got.update(load_file(f))
    q8 = GGMLQuantizationType.Q8_0
    stacked = model.state_dict()["model.layers.1.mlp.experts.gate_up_proj"].float().numpy()
    gate, up = (np.ascontiguousarray(x) for x in np.split(stacked, 2, axis=1))
    names = {"gate_proj": "w1", "up_proj": "w3"}  # mixtral's
    for e in range(stacked.shape[0]):
        for proj, want in (("gate_proj", gate), ("up_proj", up)):
            proj = proj if name != "mixtral" else names[proj]
            key = f"model.layers.1.mlp.experts.{e}.{proj}.weight"
            if name == "mixtral":
                key = key.replace(".mlp.", ".block_sparse_moe.")
            file_holds = dequantize(quantize(want, q8), q8)[e]
            assert np.array_equal(got[key].float().numpy(), file_holds), key
    ids = torch.randint(1024, (1, 24), generator=torch.Generator().manual_seed(0))
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        want = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)(ids).logits[0]
    runtime = RuntimeLM(load_weights(resolve(str(folder)), device="cpu"), 32, exact=True)
    assert (runtime(ids).logits[0] - want).abs().max() < 1e-4


def test_a_glm4moe_gguf_s_prediction_block_is_left_out(tmp_path, monkeypatch):
    """llama.cpp counts GLM-4.5's next-token-prediction block in the file's block count
    (46 + 1 for GLM-4.5-Air): the converted model has the model's own blocks and computes
    as transformers' does; the block, for speculative decoding, is not converted."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("glm4_moe", vocab_size=1024)
    path = write_gguf(model, tmp_path / "glm4moe.gguf", default_gguf(), nextn=1)
    folder = convert_gguf(path)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["first_k_dense_replace"] == 1
    _same_logits(model, folder)


def test_a_qwen3_5_gguf_s_prediction_block_and_an_older_qwen3_next_gguf(tmp_path, monkeypatch):
    """Newer llama.cpp converters append Qwen3.5's prediction block to the blocks (counted
    in the block count): the converted model has the model's own blocks, every fourth full
    attention. Older ones wrote Qwen3-Next's in_proj_qkvz whole (ssm_in), which converts as
    the cut attn_qkv and attn_gate do."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("qwen3_5_text", vocab_size=1024, **GGUF_FAMILIES["qwen3_5_text"][1])
    folder = convert_gguf(write_gguf(model, tmp_path / "q.gguf", default_gguf(), nextn=1))
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 4
    assert config["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]
    _same_logits(model, folder)
    model = build_family("qwen3_next", vocab_size=1024, **GGUF_FAMILIES["qwen3_next"][1])
    path = write_gguf(model, tmp_path / "n.gguf", default_gguf(), whole_qkvz=True)
    _same_logits(model, convert_gguf(path))


def test_granite_4_ggufs_convert_to_their_checkpoints_tensors(tmp_path, monkeypatch):
    """llama.cpp writes Granite 4.0 H as granitehybrid (its Mamba layers where the per-layer
    head_count_kv is 0, no rope where rope.scaling.finetuned is false, q/k in LlamaModel's
    layout all the same, the MLP's input_linear cut in two, A as -exp(A_log)), and Granite
    4.0 Micro, attention alone, as granite: each converts to tensors equal to the
    checkpoint's (q/k's order too, which no rope-less logit would show), computing its
    logits."""
    from safetensors.torch import load_file

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    for name, overrides, arch in (
        ("h", {"position_embedding_type": "rope"}, None),
        ("micro", {"layer_types": ["attention"] * 2, "num_hidden_layers": 2,
                   "position_embedding_type": "rope"}, "GRANITE"),
    ):  # fmt: skip
        model = build_family("granitemoehybrid", vocab_size=1024, **overrides)
        path = write_gguf(model, tmp_path / f"{name}.gguf", default_gguf(), arch=arch)
        folder = convert_gguf(path)
        _same_logits(model, folder)
        got = {}
        for f in folder.glob("*.safetensors"):
            got.update(load_file(f))
        want = {k: v for k, v in model.state_dict().items() if k in got}
        differ = [k for k, v in want.items() if not torch.allclose(got[k].float(), v, 1e-6, 1e-7)]
        assert len(want) > 4 and differ == []  # (A_log through -exp and back: to 1e-6)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "granite"


def test_a_k_exaone_gguf_converts_without_its_prediction_block(tmp_path, monkeypatch):
    """llama.cpp writes K-EXAONE as exaone-moe: exaone4's window keys (the full layer
    unrotated) in llama's pre-norm block, DeepSeek-V3's expert keys with shared experts
    stated by count and width, and its next-token-prediction block counted in the block
    count; the converted model has the model's own blocks and computes as transformers'
    does."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("exaone_moe", vocab_size=1024)
    path = write_gguf(model, tmp_path / "k.gguf", default_gguf(), arch="EXAONE_MOE", nextn=1)
    folder = convert_gguf(path)
    config = json.loads((folder / "config.json").read_text())
    assert config["num_hidden_layers"] == 2 and config["mlp_layer_types"] == ["dense", "sparse"]
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    _same_logits(model, folder)


def test_a_k_exaone_gguf_whose_shared_experts_are_wider_is_refused(tmp_path, monkeypatch):
    """Shared experts of another width than their count of experts: refused in one line."""
    from compress.errors import LlmpressError

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("exaone_moe", vocab_size=1024)
    extra = {"{arch}.expert_shared_feed_forward_length": 200}
    path = write_gguf(model, tmp_path / "k.gguf", default_gguf(), arch="EXAONE_MOE", extra=extra)
    with pytest.raises(LlmpressError, match=r"shared experts are 200 wide, not 1 × 128") as e:
        convert_gguf(path)
    assert "\n" not in str(e.value)


def test_a_sigmoid_routed_family_s_gguf_with_other_gating_is_refused(tmp_path, monkeypatch):
    """MiniMax-M2 routes by sigmoid scores: a file whose gating key says softmax is not
    converted into a model that routes otherwise than the file says."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("minimax_m2", vocab_size=1024)
    softmax = {"{arch}.expert_gating_func": 1}
    path = write_gguf(model, tmp_path / "mm.gguf", default_gguf(), extra=softmax)
    code, _, err = run_cli(["inspect", str(path)])
    assert code != 0 and error_lines(err) == [
        "error: the file's minimax-m2.expert_gating_func is not sigmoid, which this family "
        "routes by: compress the model's Hugging Face checkpoint instead"
    ], err


def test_a_hunyuan_moe_gguf_whose_shared_expert_is_wider_is_refused(tmp_path, monkeypatch):
    """The family's shared MLP is one expert wide (transformers gives both one key): a file
    whose shared expert is two is not converted into a model that computes another."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("hunyuan_v1_moe", vocab_size=1024)
    two = {"{arch}.expert_shared_count": 2}
    path = write_gguf(model, tmp_path / "hy.gguf", default_gguf(), extra=two)
    code, _, err = run_cli(["inspect", str(path)])
    assert code != 0 and error_lines(err) == [
        "error: the file's shared expert (2 of width 128) is not one as wide as each expert "
        "(128), which this family computes: compress the model's Hugging Face checkpoint instead"
    ], err


@pytest.mark.parametrize("name,layers", [("gemma2", 46), ("gemma3_text", 62)])
def test_a_27b_gemma_gguf_takes_its_attention_scale_from_its_depth(
    name, layers, tmp_path, monkeypatch
):
    """The 27B Gemmas scale attention by (hidden / heads) ** -0.5; their GGUF holds no
    query_pre_attn_scalar, and llama.cpp (so llmpress) tells them by their depth."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    settings = {**GGUF_FAMILIES[name][1], "query_pre_attn_scalar": 64 // 4}  # hidden / heads
    model = build_family(name, vocab_size=1024, num_hidden_layers=layers, **settings)
    folder = convert_gguf(write_gguf(model, tmp_path / f"{name}.gguf", default_gguf()))
    _same_logits(model, folder)


def test_a_64_layer_exaone4_gguf_without_window_keys_gets_llama_cpps_window(tmp_path, monkeypatch):
    """llama.cpp gives a 64-layer exaone4 (the 32B) a 4,096-token window on three layers
    of four when its file states none, and then no rope on the fourth; so does llmpress
    (the NoPE layers show at any length)."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    layer_types = ["full_attention" if i % 4 == 3 else "sliding_attention" for i in range(64)]
    model = build_family(
        "exaone4", vocab_size=1024, num_hidden_layers=64, sliding_window=4096,
        layer_types=layer_types,
    )  # fmt: skip
    path = write_gguf(model, tmp_path / "e.gguf", default_gguf(), window_keys=False)
    _same_logits(model, convert_gguf(path))


@pytest.mark.parametrize("name", ["glm", "llama3", "phi"])
def test_a_gguf_with_q_k_v_in_one_tensor_converts(name, tmp_path, monkeypatch):
    """GLM-4-9B-chat's files hold q, k and v as one attn_qkv (its checkpoint's
    query_key_value; Phi-2's original Wqkv, with its bias), as llama.cpp's `--fuse-qkv`
    writes any family's: each part is cut from it by rows, and a llama's q and k parts
    de-interleaved after the cut."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    default_rope = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    arch, settings = GGUF_FAMILIES.get(name, ("LLAMA", default_rope))
    model = build_family(name, vocab_size=1024, **settings)
    path = write_gguf(model, tmp_path / "f.gguf", default_gguf(), arch=arch, fuse_qkv=True)
    import gguf

    assert "blk.0.attn_qkv.weight" in {t.name for t in gguf.GGUFReader(str(path)).tensors}
    _same_logits(model, convert_gguf(path))


@pytest.mark.parametrize(
    "name,arch", [("qwen2", "QWEN2VL"), ("qwen3", "QWEN3VL"), ("qwen3_moe", "QWEN3VLMOE")]
)
def test_a_qwen_vl_language_model_gguf_converts_to_its_family(name, arch, tmp_path, monkeypatch):
    """llama.cpp writes the language model of Qwen2-VL, Qwen2.5-VL (qwen2vl), Qwen3-VL
    (qwen3vl) and Qwen3-VL-MoE (qwen3vlmoe: its experts stacked, as qwen3moe's) as a file
    of its own: its family's tensors, rotated by M-RoPE, which for text alone is the
    family's default rope."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    default = {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    model = build_family(name, vocab_size=1024, use_sliding_window=False, **default)
    path = write_gguf(model, tmp_path / "vl.gguf", default_gguf(), arch=arch)
    folder = convert_gguf(path)
    assert json.loads((folder / "config.json").read_text())["model_type"] == name
    _same_logits(model, folder)


@pytest.mark.parametrize("eps_key", ["rms", "layer"])
def test_an_exaone_3_gguf_converts_to_llama(eps_key, tmp_path, monkeypatch):
    """llama.cpp writes EXAONE 3.0 and 3.5 as exaone: llama's tensors with q/k as the
    checkpoint holds them (its converter is not LlamaModel's: no interleaving to undo),
    Llama 3 rope scaling as a rope_freqs tensor, and the RMS epsilon under
    layer_norm_rms_epsilon (LG's published files) or, from later converters,
    layer_norm_epsilon. Read as llama, the model transformers runs EXAONE 3 as."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    rope = GGUF_ROPE_CASES["llama3 scaling (rope_freqs tensor)"][2]  # observable, fitted
    model = build_family("llama3", vocab_size=1024, **rope)
    path = write_gguf(model, tmp_path / "e.gguf", default_gguf(), arch="EXAONE", eps_key=eps_key)
    folder = convert_gguf(path)
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "llama" and config["rms_norm_eps"] == pytest.approx(1e-5)
    assert config["rope_parameters"]["rope_type"] == "llama3"
    _same_logits(model, folder)


@pytest.mark.parametrize("name", ["stablelm", "gpt_neox"])
def test_a_sequential_block_s_gguf_converts_to_its_block(name, tmp_path, monkeypatch):
    """StableLM 2 1.6B and StableLM-3B run attention, then the MLP under its own norm:
    llama.cpp's graph does so where the file holds an ffn_norm, and so does llmpress (the
    family test's model is the parallel block, which holds none). gptneox files state
    the choice (`use_parallel_residual`), both norms held either way."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family(name, vocab_size=1024, use_parallel_residual=False)
    folder = convert_gguf(write_gguf(model, tmp_path / "s.gguf", default_gguf()))
    assert json.loads((folder / "config.json").read_text())["use_parallel_residual"] is False
    _same_logits(model, folder)


@pytest.mark.parametrize("name", ["deepseek_v3", "deepseek_v2"])
def test_a_deepseek2_gguf_converts_to_its_family(name, tmp_path, monkeypatch):
    """llama.cpp writes DeepSeek-V2 and V3 both as deepseek2: latent attention stated as one
    KV head of the latent's width, kv_b_proj split into attn_k_b (transposed per head) and
    attn_v_b, YaRN's mscale as 0.1 × itself; the experts' gating tells V3 from V2. The
    converted folder computes the tiny model's logits in transformers (the runtime refuses
    latent attention)."""
    from transformers import AutoModelForCausalLM

    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family(name, vocab_size=1024)
    folder = convert_gguf(write_gguf(model, tmp_path / "d.gguf", default_gguf(), arch="DEEPSEEK2"))
    assert json.loads((folder / "config.json").read_text())["model_type"] == name
    ids = torch.randint(1024, (1, 40), generator=torch.Generator().manual_seed(0))
    converted = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        assert (converted(ids).logits - model(ids).logits).abs().max() < 1e-4


def test_a_stablelm_2_12b_gguf_s_stacked_q_k_norms_convert(tmp_path, monkeypatch):
    """llama.cpp's converter stacks StableLM 2 12B's per-head q/k norm modules into one
    tensor per layer: each head's row goes back to its module."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("stablelm", vocab_size=1024, qk_layernorm=True)
    folder = convert_gguf(write_gguf(model, tmp_path / "s.gguf", default_gguf()))
    assert json.loads((folder / "config.json").read_text())["qk_layernorm"] is True
    _same_logits(model, folder)


@pytest.mark.parametrize(
    "pre,pieces",
    [
        ("glm4", ["year", "Ġ", "123", "45"]),
        ("stablelm2", ["year", "Ġ", "1", "2", "3", "4", "5"]),
        ("command-r", ["year", "Ġ", "1", "2", "3", "4", "5", "Ġ-", "word"]),
        ("exaone", ["year", "Ġ", "1", "2", "3", "4", "5", "Ġ-", "word"]),
    ],
)
def test_a_gguf_pre_tokenizer_transformers_lacks_splits_as_llama_cpp_does(
    pre, pieces, tmp_path, monkeypatch
):
    """llama.cpp names GLM-4's pre-tokenizer `glm4` and splits as llama 3 (digits in
    threes), StableLM 2's `stablelm2` and splits as qwen2 (digits one by one), Command R's
    `command-r` and EXAONE 3's `exaone` each digit alone, then as GPT-2; transformers has
    no split for these names, and would cut as GPT-2 does (digits in runs)."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("glm4", vocab_size=1024)
    extra = {"tokenizer.ggml.pre": pre}
    folder = convert_gguf(write_gguf(model, tmp_path / "g.gguf", default_gguf(), extra=extra))
    from transformers import AutoTokenizer

    split = AutoTokenizer.from_pretrained(folder).backend_tokenizer.pre_tokenizer
    text = "year 12345" + (" -word" if len(pieces) > 7 else "")
    assert [p for p, _ in split.pre_tokenize_str(text)] == pieces


def test_a_gguf_of_a_family_llmpress_cannot_run_is_refused_with_the_way_round(tmp_path):
    """A GGUF of an architecture neither transformers' reader nor llmpress's reads
    (Baichuan, whose tensors a llama's name map fills) is refused in one line that names
    the alternative, before any tensor is read."""
    from compress.errors import LlmpressError

    model = build_family("llama3", vocab_size=1024)
    path = write_gguf(model, tmp_path / "baichuan.gguf", default_gguf(), arch="BAICHUAN")
    with pytest.raises(LlmpressError, match=r"'baichuan'.*Hugging Face folder or hub id") as e:
        convert_gguf(path)
    assert "\n" not in str(e.value)


def test_an_early_mixtral_gguf_with_one_tensor_per_expert_converts(tmp_path, monkeypatch):
    """Mixtral GGUFs made before llama.cpp stacked the experts hold blk.N.ffn_gate.E
    tensors; they are still published and downloaded."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("mixtral", vocab_size=1024)
    path = write_gguf(model, tmp_path / "m.gguf", default_gguf(), stacked_experts=False)
    folder = convert_gguf(path)
    _same_logits(model, folder)


@pytest.mark.parametrize("case", list(GGUF_ROPE_CASES))
def test_rope_scaling_stored_in_a_gguf_is_read(case, tmp_path, monkeypatch):
    """llama.cpp stores rope scaling as keys (linear, YaRN) or tensors (Llama 3's
    rope_freqs, Phi-3's LongRoPE factors); transformers' GGUF reader drops all of it, so
    the converted model would rotate every position otherwise. Read back, the converted
    model equals the original over 48 positions; without it, it would not."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    name, arch, overrides = GGUF_ROPE_CASES[case]
    model = build_family(name, vocab_size=1024, **overrides)
    path = write_gguf(model, tmp_path / "m.gguf", default_gguf(), arch=arch)
    folder = convert_gguf(path)
    ids = torch.randint(1024, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = model(ids).logits[0]
    weights = load_weights(resolve(str(folder)), device="cpu")
    got = RuntimeLM(weights, 64, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    plain = build_family(name, vocab_size=1024, **{**overrides, "rope_parameters": None})
    plain.load_state_dict(model.state_dict())
    with torch.no_grad():  # the same weights without the scaling: visibly other logits
        assert (plain(ids).logits[0] - want).abs().max() > 1e-2


def test_rope_scaling_it_cannot_read_is_refused_in_one_line(tmp_path, monkeypatch):
    """A scaling type named in the header without what it needs (here LongRoPE without its
    factor tensors) is refused before any conversion, never dropped."""
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    model = build_family("qwen3", vocab_size=1024, **GGUF_FAMILIES["qwen3"][1])
    extra = {"{arch}.rope.scaling.type": "longrope"}
    path = write_gguf(model, tmp_path / "m.gguf", default_gguf(), extra=extra)
    code, _, err = run_cli(
        ["compress", str(path), "-o", str(tmp_path / "out"), "--quant", "rtn:w4g32"]
    )
    assert code == 2 and not (tmp_path / "out").exists()
    assert error_lines(err) == [
        "error: m.gguf uses rope scaling 'longrope', which llmpress cannot read from a GGUF "
        "file; compress the model's Hugging Face checkpoint instead"
    ]
