"""Every supported family, on tiny seeded models built from transformers' own config
classes (tests/family_models.py): the runtime against transformers' forward, every
quantizer, the artifact in plain transformers, the one-call C decoder and the CLI."""

import dataclasses
import json
import os
import shutil
from operator import attrgetter
from pathlib import Path

import pytest
import torch
from family_models import (
    FAMILIES,
    HYBRID_FAMILIES,
    LATENT_FAMILIES,
    MOE_FAMILIES,
    build_family,
    family_config,
    serve_greedy_twice,
    triton_steps_match_reference,
    write_family,
)
from safetensors import safe_open
from test_bad_input import run_cli
from transformers import AutoModelForCausalLM

from compress.artifact.engines import engine_problems
from compress.errors import LlmpressError
from compress.eval.reference import BlockwiseOriginal
from compress.model.adapters import ADAPTERS, Widths, adapter_for
from compress.model.default import convert_gguf, default_gguf
from compress.model.loading import resolve
from compress.model.spec import BlockSpec
from compress.model.text_part import text_name
from compress.pipeline import compress
from compress.recipe import parse_quant, parse_recipe
from compress.runtime.kv_cache import KVCache, parse_kv
from compress.runtime.linears import QuantLinear
from compress.runtime.lm import RuntimeLM
from compress.runtime.model import Chunk, Model
from compress.runtime.weights import RUNS, load_weights

NAMES = list(FAMILIES)


def _adapter(name: str):
    """The bound adapter of the tiny `name` model (llama3 is llama's)."""
    return adapter_for(family_config(name).to_dict())


def _mixed(name: str) -> bool:
    """The tiny model keeps dense MLPs beside its experts (glm4_moe's first layer)."""
    return _adapter(name).mixed


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # the Triton backend's
LENGTH = 72  # past sliding windows (8), phi3's original context (32) and EXACT_ABOVE (64)


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 49152, (1, LENGTH), generator=torch.Generator().manual_seed(0))


class _Shared(dict):
    """{family: folder}, each folder made on first use, once per test run: the xdist
    workers share the run's temporary root and take a lock per family, so a model or
    artifact one worker made the other reads instead of making it again (made eagerly
    by every worker, the two fixtures below took 27 s of each worker's time)."""

    def __init__(self, root, make):
        super().__init__()
        self.root, self.make = root, make
        root.mkdir(parents=True, exist_ok=True)

    def __missing__(self, name: str):
        from filelock import FileLock

        folder, done = self.root / name, self.root / f"{name}.done"
        with FileLock(str(self.root / f"{name}.lock")):
            if not done.exists():
                shutil.rmtree(folder, ignore_errors=True)
                self.make(name, folder)
                done.touch()
        self[name] = folder
        return folder


def _run_root(tmp_path_factory):
    """A folder every xdist worker of this run shares (its own basetemp's parent, which
    the controller made for this run), or this process's basetemp without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="module")
def models(tmp_path_factory, tokenizer_dir):
    root = _run_root(tmp_path_factory) / "families-shared"
    return _Shared(root, lambda n, f: write_family(f, n, tokenizer_from=tokenizer_dir))


def _transformers_logits(path, ids):
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        return model.eval()(ids).logits[0]


def _wikitext_calib(wikitext):
    return {"source": str(wikitext / "valid.txt"), "samples": 8, "length": 64}


def _compress(src, out, stages, wikitext):
    recipe = parse_recipe({"stages": stages, "calib": _wikitext_calib(wikitext)})
    return compress(str(src), recipe, out, log=lambda _: None)


def test_every_blockspec_field_has_a_runtime_check():
    assert set(RUNS) == {f.name for f in dataclasses.fields(BlockSpec)}


def test_every_supported_family_has_a_tiny_model_here():
    """A family the adapters accept is one these tests run: its model_type among the tiny
    models' (llama3 is llama's; the latent-attention ones in test_latent_attention.py, the
    linear-attention ones in test_hybrid_attention.py)."""
    import transformers

    every = [*FAMILIES.values(), *LATENT_FAMILIES.values(), *HYBRID_FAMILIES.values()]
    tested = {getattr(transformers, cls)().model_type for cls, _ in every}
    assert tested == set(ADAPTERS)


@pytest.mark.parametrize("name", NAMES)
def test_runtime_logits_equal_transformers(models, ids, name):
    want = _transformers_logits(models[name], ids)
    weights = load_weights(resolve(str(models[name])), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4


@pytest.mark.parametrize("name", NAMES)
def test_the_block_walk_equals_transformers(models, ids, name):
    """What compression calibrates on and eval scores the original with: the checkpoint
    read block by block (the embedding scaled as the family scales it, the blocks, the
    final norm and head) gives transformers' own log-probs."""
    want = torch.log_softmax(_transformers_logits(models[name], ids)[:-1], -1)
    walk = BlockwiseOriginal(resolve(str(models[name])), ids, log=lambda _: None)
    assert (walk.reference(0, ids[0]) - want).abs().max() < 1e-4


# What the tolerance above catches: each fact of gemma3's description, dropped in turn.
MUTATIONS = {
    "attn_scale": lambda s: {"attn_scale": 16**-0.5},
    "embed_scale": lambda s: {"embed_scale": 1.0},
    "logit_softcap": lambda s: {"logit_softcap": None},
    "windows": lambda s: {"windows": (None,) * s.layers},
    "rope": lambda s: {"rope": (s.rope[0],) * s.layers},
}


@pytest.mark.parametrize("fact", [*MUTATIONS, "norm (1+w)", "sandwich", "qk_norm"])
def test_dropping_any_fact_of_the_description_shows(models, ids, fact):
    want = _transformers_logits(models["gemma3_text"], ids)
    weights = load_weights(resolve(str(models["gemma3_text"])), device="cpu")
    if fact in MUTATIONS:
        weights.spec = dataclasses.replace(weights.spec, **MUTATIONS[fact](weights.spec))
    for layer in weights.layers:
        if fact == "norm (1+w)":
            layer.attn_norm = layer.attn_norm - 1
        if fact == "sandwich":
            layer.post_attn_norm = layer.post_mlp_norm = None
        if fact == "qk_norm":
            layer.q_norm = layer.k_norm = None
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() > 1e-2


# The one fact a family adds to another's description, dropped: gemma2's capped attention
# scores (else gemma3's block without q/k norms), smollm3's and exaone4's layers without
# rope (llama's and olmo2's), granite's residual and logit multipliers (its embedding and
# attention ones replace facts llama has), cohere's parallel block, LayerNorm and logit
# scale, cohere2's full layer without rope, arcee's relu² MLP without a gate.
OWN_FACTS = {
    "gemma2": lambda s: {"attn_softcap": None},
    "smollm3": lambda s: {"rope": (s.rope[0],) * s.layers},
    "exaone4": lambda s: {"rope": (s.rope[0],) * s.layers},  # its full layer rotated
    "granite residual": lambda s: {"residual_scale": 1.0},
    "granite logits": lambda s: {"logit_scale": 1.0},
    "granite embedding": lambda s: {"embed_scale": 1.0},
    "granite attention": lambda s: {"attn_scale": 16**-0.5},
    "cohere parallel": lambda s: {"parallel": False},
    "cohere layernorm": lambda s: {"norm": "rms"},
    "cohere logits": lambda s: {"logit_scale": 1.0},
    "cohere2": lambda s: {"rope": (s.rope[0],) * s.layers},  # its full layer rotated
    "arcee": lambda s: {"activation": "silu"},  # its relu² (an MLP without a gate)
    "phi parallel": lambda s: {"parallel": False},
    "gpt_neox parallel": lambda s: {"parallel": False},
    "granite_swa rope": lambda s: {"rope": (s.rope[1],) * s.layers},  # one base, none NoPE
}


@pytest.mark.parametrize("fact", OWN_FACTS)
def test_dropping_a_familys_own_fact_shows(models, ids, fact):
    name = fact.split()[0]
    want = _transformers_logits(models[name], ids)
    weights = load_weights(resolve(str(models[name])), device="cpu")
    assert weights.spec != dataclasses.replace(weights.spec, **OWN_FACTS[fact](weights.spec))
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    weights.spec = dataclasses.replace(weights.spec, **OWN_FACTS[fact](weights.spec))
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["granite_swa", "flint"])
def test_dropping_the_attention_sinks_shows(models, ids, name):
    """granite_swa's and Flint's sinks (the latter stored under another name), read from
    each layer by every kernel (Layer.sinks): without them the runtime no longer computes
    what transformers does."""
    want = _transformers_logits(models[name], ids)
    weights = load_weights(resolve(str(models[name])), device="cpu")
    assert all(layer.sinks is not None for layer in weights.layers)
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    for layer in weights.layers:
        layer.sinks = None
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() > 1e-2


def test_rope_modules_of_the_model_are_rebuilt_each_from_its_own_config(models, ids):
    """granite_swa's model holds one rotary module per rope base (`model.rotary_embs`):
    transformers' model built from the checkpoint computes what transformers' own does,
    and an adapter that did not name them is refused for that module, where it had taken
    `rotary_embs` for `rotary_emb` and left their tables uninitialized."""
    from compress.artifact.dense import load_model
    from compress.artifact.reader import dense_state_dict
    from compress.model.loading import build_model

    ckpt = resolve(str(models["granite_swa"]))
    want = _transformers_logits(models["granite_swa"], ids)
    with torch.no_grad():
        got = load_model(ckpt)(ids).logits[0]
    assert (got - want).abs().max() < 1e-5
    blind = dataclasses.replace(ckpt.adapter, derived_modules=("model.rotary_emb",))
    with pytest.raises(LlmpressError, match=r"model\.rotary_embs\.0\.\w*inv_freq is computed"):
        build_model(ckpt.config, dense_state_dict(ckpt), blind)


def test_a_params_target_weighs_candidates_that_cut_a_renamed_sink(models, wikitext, tmp_path):
    """Flint at a `params` target: `split: auto` weighs candidates that cut its heads, each
    cut from transformers' block as it is read (pruning/streamed.py), whose sinks are
    `sinks` there and `softmax_offset` in the checkpoint; the chosen cut is read by both
    tools alike."""
    cut = {"params": 0.8, "split": "auto", "multiple": 16}
    out = _compress(models["flint"], tmp_path / "pruned", [{"prune": cut}], wikitext)
    tried = json.loads((out / "manifest.json").read_text())["stages"][0]["splits_tried"]
    assert any(t["cuts"].get("heads") for t in tried)
    want = _transformers_logits(out, ids := torch.arange(3, 40)[None])
    got = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)(ids)
    assert (got.logits[0] - want).abs().max() < 1e-3


@pytest.mark.parametrize("name", ["stablelm", "gpt_neox"])
def test_a_sequential_block_where_the_option_says_equals_transformers(
    tmp_path, tokenizer_dir, ids, name
):
    """use_parallel_residual false (StableLM 2 1.6B, StableLM-3B; Pythia's option off): the
    MLP's norm reads the residual after attention's branch. True (the tiny models):
    stablelm's one norm feeds both branches, gpt_neox's each branch its own."""
    src = write_family(tmp_path / "s", name, tokenizer_dir, use_parallel_residual=False)
    weights = load_weights(resolve(str(src)), device="cpu")
    assert not weights.spec.parallel
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4


def test_a_pythia_config_json_as_published_is_read(tmp_path, tokenizer_dir, ids):
    """Pythia's published config.json states its rope as `rotary_pct` and
    `rotary_emb_base` (no rope_parameters) and no attention_bias key (on by default): the
    runtime reads them as transformers does."""
    src = write_family(tmp_path / "s", "gpt_neox", tokenizer_dir)
    config = json.loads((src / "config.json").read_text())
    rope = config.pop("rope_parameters")
    config.pop("attention_bias", None)
    config.update(rotary_pct=rope["partial_rotary_factor"], rotary_emb_base=rope["rope_theta"])
    (src / "config.json").write_text(json.dumps(config))
    weights = load_weights(resolve(str(src)), device="cpu")
    assert weights.spec.rope[0].rotary_dim == 4 and "q" in weights.spec.biases
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4


def test_gpt_neox_buffers_older_checkpoints_hold_are_never_read(tmp_path, wikitext, ids):
    """Pythia's checkpoints, saved by older transformers, still hold each layer's causal
    mask, masked_bias and rotary inv_freq, which today's model computes: they are left
    out of the reading, and out of the artifact."""
    from safetensors.torch import load_file, save_file

    src = write_family(tmp_path / "src", "gpt_neox")
    tensors = load_file(src / "model.safetensors")
    for i in range(2):
        p = f"gpt_neox.layers.{i}.attention"
        tensors[f"{p}.bias"] = torch.tril(torch.ones(1, 1, 64, 64, dtype=torch.bool))
        tensors[f"{p}.masked_bias"] = torch.tensor(-1e9)
        tensors[f"{p}.rotary_emb.inv_freq"] = torch.ones(2)
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    out = _compress(src, tmp_path / "out", [parse_quant("rtn:w4g32")], wikitext)
    stored = load_file(out / "model.safetensors")
    assert not [n for n in stored if n.endswith(("attention.bias", "masked_bias", "inv_freq"))]
    got = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH)(ids).logits[0]
    assert (got - _transformers_logits(out, ids)).abs().max() < 1e-3


@pytest.mark.parametrize(
    "stages",
    [
        [{"prune": {"mlp": 0.25, "heads": 0.5, "hidden": 0.5}}, {"distill": {"tokens": 256}}],
        [parse_quant("rtn:w4g32"), {"distill": {"tokens": 256}}],
    ],
    ids=["prune+repair", "quantize+repair"],
)
def test_a_gpt_neox_trained_whole_is_written_under_its_checkpoint_names(
    models, wikitext, tmp_path, ids, stages
):
    """transformers' model calls gpt_neox's head lm_head; its checkpoints and vLLM call it
    embed_out. The repairs train the whole model (the pruned one, or the quantized one
    with its int8 head wrapped), and what they write is named as checkpoints are: read
    back by plain transformers and the runtime alike."""
    from safetensors.torch import load_file

    out = _compress(models["gpt_neox"], tmp_path / "out", stages, wikitext)
    stored = load_file(out / "model.safetensors")
    heads = {n.split(".")[0] for n in stored if not n.startswith("gpt_neox.")}
    assert heads == {"embed_out"}
    want = _transformers_logits(out, ids)
    got = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH)(ids).logits[0]
    assert (got - want).abs().max() < 2e-3


def test_phi_q_k_layernorms_are_refused_in_one_line():
    """Phi's q/k LayerNorms carry a bias, which no q/k norm kernel adds (no published phi
    turns them on)."""
    config = family_config("phi", qk_layernorm=True).to_dict()
    with pytest.raises(LlmpressError, match=r"^phi: qk_layernorm .* is not supported yet"):
        adapter_for(config)


def test_hy_v3_mlp_biases_are_refused_in_one_line():
    """Hy3's mlp_bias would put biases on its dense MLPs and shared experts, which its
    experts' kernels do not add (its published config leaves it off)."""
    config = family_config("hy_v3", mlp_bias=True).to_dict()
    with pytest.raises(LlmpressError, match=r"^hy_v3: mlp_bias .* is not supported yet"):
        adapter_for(config)


def test_stablelm_2_12b_s_per_head_q_k_norms_run_prune_and_quantize(
    tokenizer_dir, wikitext, tmp_path, ids
):
    """qk_layernorm (StableLM 2 12B): a LayerNorm per head of q and per KV head of k, each
    a module of its own, stacked at load into each head's weight row (cohere's kind of
    norm). The runtime equals transformers on the checkpoint; heads cut by pruning take
    their norms along, renumbered; the pruned, quantized artifact is read alike by plain
    transformers and the runtime."""
    src = write_family(tmp_path / "s", "stablelm", tokenizer_dir, qk_layernorm=True)
    weights = load_weights(resolve(str(src)), device="cpu")
    assert weights.spec.qk_norm == "each_head"
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4
    cut = {"prune": {"mlp": 0.25, "heads": 0.5, "hidden": 0.5, "multiple": 16}}
    out = _compress(src, tmp_path / "pruned", [cut, parse_quant("rtn:w4g32")], wikitext)
    config = json.loads((out / "config.json").read_text())
    assert config["num_attention_heads"] == 2 and config["qk_layernorm"] is True
    got = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)(ids)
    assert (got.logits[0] - _transformers_logits(out, ids)).abs().max() < 1e-3


ROUTING_FACTS = {  # glm4_moe's and ernie4_5_moe's, each undone on the loaded experts
    "glm4_moe sigmoid scores": {"sigmoid": False},
    "glm4_moe choice bias": {"choice_bias": None},
    "glm4_moe routed scale": {"scale": 1.0},
    "glm4_moe ungated shared expert": {"shared": None},
    "ernie4_5_moe choice bias": {"choice_bias": None},
    "minimax_m2 choice bias": {"choice_bias": None},
    "minimax_m2 sigmoid scores": {"sigmoid": False},
    "exaone_moe choice bias": {"choice_bias": None},  # read beside the router, not in it
    "afmoe choice bias": {"choice_bias": None},
    "cohere2_moe shared average": {"shared_scale": 1.0},
    "afmoe routed scale": {"scale": 1.0},
    "phimoe sparsemixer": {"sparsemixer": None, "renormalize": True},  # mixtral's top 2
    "phimoe router's folded norm bias": {"router.bias": None},
}


def test_a_phimoe_config_routing_more_than_two_experts_is_refused_in_one_line():
    """transformers' sparsemixer picks 2 experts whatever num_experts_per_tok says (its
    experts then read top_k of them): llmpress refuses the config rather than guess."""
    config = family_config("phimoe", num_experts_per_tok=4).to_dict()
    with pytest.raises(LlmpressError, match="picks 2 experts whatever it says: set it to 2"):
        adapter_for(config).spec(config)


@pytest.mark.parametrize("cut", [{"heads": 0.5}, {"hidden": 0.25, "mlp": 0.25}])
def test_pruning_minicpm5_moe_s_attention_is_refused_in_one_line(models, wikitext, tmp_path, cut):
    """Each head's query and output gate share MiniCPM5-MoE's q_proj: a cut of its heads
    or of the hidden width is refused before any work (mlp, experts and layers are cut)."""
    kept = "heads" if "heads" in cut else "hidden"
    with pytest.raises(LlmpressError, match=rf"^prune: minicpm5_moe's attention keeps its {kept}"):
        _compress(models["minicpm5_moe"], tmp_path / "p", [{"prune": cut}], wikitext)
    assert not (tmp_path / "p").exists()


def test_cohere2_moe_s_config_chosen_kinds_run_as_transformers(tmp_path, tokenizer_dir, ids):
    """Command A+'s config picks its norm (RMS where rms_norm_eps is set), its scores
    (sigmoid, renormalized by norm_topk_prob), how the shared expert joins (sum) and the
    dense layers' width (prefix_dense_intermediate_size): each as transformers reads it."""
    overrides = {
        "rms_norm_eps": 1e-6,
        "expert_selection_fn": "sigmoid",
        "shared_expert_combination_strategy": "sum",
        "prefix_dense_intermediate_size": 192,
    }
    src = write_family(tmp_path / "src", "cohere2_moe", tokenizer_dir, **overrides)
    config = json.loads((src / "config.json").read_text())
    adapter = adapter_for(config)
    spec = adapter.spec(config)
    assert spec.norm == "rms" and spec.mlp.scoring == "sigmoid"
    assert (spec.mlp.scale, spec.mlp.shared_scale) == (1.0, 1.0)
    assert adapter.shape(config).intermediate == 192
    weights = load_weights(resolve(str(src)), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4
    with pytest.raises(LlmpressError, match="by softmax or sigmoid; set one of them"):
        adapter_for({**config, "expert_selection_fn": "relu"}).spec(config)


def test_hyperclovax_without_its_post_norms_runs_as_transformers(tmp_path, tokenizer_dir, ids):
    """use_post_norm false leaves HyperCLOVA X's blocks without Peri-LN's output norms
    (transformers' nn.Identity): the checkpoint holds none, and the runtime computes the
    model transformers computes."""
    src = write_family(tmp_path / "src", "hyperclovax", tokenizer_dir, use_post_norm=False)
    assert _adapter("hyperclovax").post_attn_norm == "post_norm1"
    config = json.loads((src / "config.json").read_text())
    assert adapter_for(config).post_attn_norm is None
    weights = load_weights(resolve(str(src)), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4


def test_dropping_afmoe_attention_output_gate_shows(models, ids, monkeypatch):
    """afmoe's attention output times sigmoid(gate_proj(x)): the runtime's agreement with
    transformers (the family battery) depends on it, on the per-op path and in C."""
    import compress.runtime.model as runtime_model

    want = _transformers_logits(models["afmoe"], ids)
    weights = load_weights(resolve(str(models["afmoe"])), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    monkeypatch.setattr(runtime_model, "gate_rows", lambda att, gate: att)
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() > 1e-2


@pytest.mark.parametrize("fact", ROUTING_FACTS)
def test_dropping_a_routing_fact_shows(models, ids, fact):
    """Each routing fact moves its tiny model's logits: the runtime's agreement with
    transformers is not one the facts could miss."""
    name = fact.split()[0]
    want = _transformers_logits(models[name], ids)
    weights = load_weights(resolve(str(models[name])), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    for layer in weights.layers:
        if layer.moe is not None:
            for key, value in ROUTING_FACTS[fact].items():
                owner, _, attr = f"moe.{key}".rpartition(".")  # "router.bias": the router's
                setattr(attrgetter(owner)(layer), attr, value)
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() > 1e-2


@pytest.mark.parametrize("name", ["glm4", "glm", "ernie4_5", "helium", "cohere"])
def test_an_interleaved_rope_shows_where_its_rows_are_not_reordered(models, ids, monkeypatch, name):
    """glm4 and ernie4_5 rotate each head's pairs (2i, 2i+1): the runtime loads q and k
    reordered into the halves layout it rotates (adapter.rope_interleaved). Loaded as
    stored, the logits leave transformers' (glm4's tiny model: 1.5 apart in one run)."""
    want = _transformers_logits(models[name], ids)
    got = RuntimeLM(load_weights(resolve(str(models[name])), device="cpu"), LENGTH, exact=True)
    assert (got(ids).logits[0] - want).abs().max() < 1e-4
    stored = dataclasses.replace(ADAPTERS[name], rope_interleaved=False)
    monkeypatch.setitem(ADAPTERS, name, stored)
    got = RuntimeLM(load_weights(resolve(str(models[name])), device="cpu"), LENGTH, exact=True)
    assert (got(ids).logits[0] - want).abs().max() > 1e-2


def test_a_gemma3_config_s_attention_softcap_is_ignored_as_transformers_ignores_it(
    tmp_path, ids, tokenizer_dir
):
    """Gemma 3 configs carry attn_logit_softcapping, which Gemma3Attention never applies:
    the description must not apply it either (only gemma2's adapter reads it)."""
    path = write_family(tmp_path / "g3", "gemma3_text", tokenizer_dir, attn_logit_softcapping=0.5)
    weights = load_weights(resolve(str(path)), device="cpu")
    assert weights.spec.attn_softcap is None
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(path, ids)).abs().max() < 1e-4


@pytest.fixture(scope="module")
def w4(models, wikitext, tmp_path_factory):
    root = _run_root(tmp_path_factory) / "families-w4-shared"
    rtn = [parse_quant("rtn:w4g32")]
    return _Shared(root, lambda n, f: _compress(models[n], f, rtn, wikitext))


@pytest.mark.parametrize("name", NAMES)
def test_quantized_artifact_in_transformers_and_the_one_call_decoder(w4, ids, name):
    path = w4[name]
    want = _transformers_logits(path, ids)  # plain from_pretrained of the artifact
    weights = load_weights(resolve(str(path)), device="cpu")
    exact = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (exact - want).abs().max() < 1e-3
    # served: prefill a prompt, then decode the rest one token at a time (teacher forced)
    model = Model(weights, LENGTH + 1)
    assert model.backend.fused is not None, "the one-call C decoder takes every family"
    prompt = 12
    tokens = ids[0]

    def decode_all(m, ids=False):
        cache = KVCache(
            weights.shape.layers, 1, weights.shape.kv_heads, LENGTH, weights.shape.head_dim
        )
        rows = [m.prefill(tokens[:prompt], cache, 0)[-1:]]
        for t in range(prompt, LENGTH - 1):
            if ids:  # the engine's call: embedding to logits in C where it can
                rows.append(m.decode_ids([int(tokens[t])], cache, [0]))
            else:
                rows.append(m.decode(tokens[t : t + 1], cache, torch.tensor([0])))
        assert int(cache.lengths[0]) == LENGTH - 1
        return torch.cat(rows)

    fused = decode_all(model)
    packed_head = isinstance(weights.lm_head, QuantLinear)  # then the step is one C call
    assert (model.backend.fused.ctx is not None) == packed_head
    assert torch.equal(decode_all(model, ids=True), fused)
    model.backend.fused = None  # the per-op path: the same C steps, op by op
    per_op = decode_all(model)
    assert (fused - per_op).abs().max() < 1e-4  # measured 0: the same roundings
    # decode steps equal a served prefill of the whole sequence (int8 activations both)
    cache = KVCache(weights.shape.layers, 1, weights.shape.kv_heads, LENGTH, weights.shape.head_dim)
    served = model.prefill(tokens[: LENGTH - 1], cache, 0)[prompt - 1 :]
    # (measured max 2e-6, but gemma3 0.035 at 1 position in 60: prefill's and decode's
    # attention sum in different orders, and an int8 activation code can round the
    # other way; its 8x embedding scale amplifies that. olmoe's mean 1.7e-3: one code of
    # layer 0's o input at position 38 (the attention 2.4e-7 apart) carried to every later
    # position by that position's k and v; a wrong op gives 0.1 and more)
    assert (fused - served).abs().mean() < 5e-3
    assert (fused.argmax(-1) == served.argmax(-1)).all()
    # and int8 activations stay close to the exact logits: the same next token almost always
    reference = want[prompt - 1 : LENGTH - 1]
    agree = (fused.argmax(-1) == reference.argmax(-1)).float().mean()
    assert agree > 0.8  # measured 0.85-1.0
    assert (fused - reference).abs().mean() < 0.1 * reference.std()  # measured 0.011-0.07


def _counting_prefill(artifact) -> tuple[Model, list]:
    """A model over `artifact` whose one-call prefill records each call's chunks."""
    model = Model(load_weights(resolve(str(artifact)), device="cpu"), LENGTH + 1)
    fused, calls = model.backend.fused, []
    one_call = fused.prefill
    fused.prefill = lambda *a: (calls.append(a[2]), one_call(*a))[1]
    return model, calls


@pytest.mark.parametrize("name", NAMES)
def test_a_prefill_step_in_one_call_equals_the_per_op_path(w4, ids, name):
    """Every block of a prefill step in one C call (fp32 cache): two prompts batched, then
    one continued over its cached prefix (past a sliding window) beside a prompt long
    enough for the threaded row loops: the per-op path's bits, logits and cache alike."""
    model, calls = _counting_prefill(w4[name])
    s, tokens = model.w.shape, ids[0]

    def run():
        cache = KVCache(s.layers, 3, s.kv_heads, LENGTH, s.head_dim)
        steps = [
            [Chunk(tokens[:9], 0, 0, True), Chunk(tokens[9:14], 1, 0)],
            [Chunk(tokens[9:20], 0, 9, True), Chunk(tokens[:66], 2, 0, True)],
        ]
        out = [x for chunks in steps for x in model.prefill_batch(chunks, cache)]
        return out + [
            t for slot in range(3) for t in cache.read(s.layers - 1, torch.tensor([slot]), 14)
        ]

    got = run()
    assert calls == [[(0, 0, 9), (1, 0, 5)], [(0, 9, 11), (2, 0, 66)]]
    model.backend.fused = None
    want = run()
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("kv", ["int8", "int4"])
@pytest.mark.parametrize("name", NAMES)
def test_a_prefill_step_over_a_quantized_cache_in_one_call_equals_the_per_op_path(
    w4, ids, name, kv
):
    """The one-call prefill over an int8/int4 (KIVI) cache: a chunked prompt attends to its
    earlier chunks in full precision (Chunk.prefix, extended by each chunk), a continued
    one to its prefix read back from the cache (quantized groups, then the fp32 residual),
    and token groups are quantized as they complete, mid-chunk too: the per-op path's bits
    in the logits, the full-precision prefix and every array of the cache."""
    model, calls = _counting_prefill(w4[name])
    s, tokens = model.w.shape, ids[0]

    def run():
        cache = KVCache(s.layers, 3, s.kv_heads, LENGTH, s.head_dim, parse_kv(kv))
        prompt = []  # slot 0's prompt k/v in full precision, as serve keeps a chunked one's
        steps = [
            [Chunk(tokens[:40], 0, 0, True, prompt), Chunk(tokens[9:14], 1, 0)],
            [
                Chunk(tokens[40:70], 0, 40, True, prompt),
                Chunk(tokens[14:50], 1, 5, True),
                Chunk(tokens[:66], 2, 0, True),
            ],
            [Chunk(tokens[50:60], 1, 41, True)],
        ]
        out = [x for chunks in steps for x in model.prefill_batch(chunks, cache)]
        return (
            out
            + [t for kv_pair in prompt for t in kv_pair]
            + list(cache._arrays())
            + [cache.k_res, cache.v_res]
        )

    got = run()
    assert calls == [[(0, 0, 40), (1, 0, 5)], [(0, 40, 30), (1, 5, 36), (2, 0, 66)], [(1, 41, 10)]]
    model.backend.fused = None
    want = run()
    assert len(got) == len(want) == 6 + 2 * s.layers + 8
    assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))


@pytest.mark.parametrize("kv", ["none", "int4"])
@pytest.mark.parametrize("name", NAMES)
def test_a_step_of_prefill_and_decode_rows_in_one_call_equals_two_passes(w4, ids, name, kv):
    """Model.step: three sequences' decode rows (two past a sliding window) beside a new
    prompt's rows in one C call give the logits, and leave the cache, of a prefill pass
    then a decode step: routing, sliding windows and norms alike."""
    model, calls = _counting_prefill(w4[name])
    s, tokens = model.w.shape, ids[0]
    caches = [KVCache(s.layers, 4, s.kv_heads, LENGTH, s.head_dim, parse_kv(kv)) for _ in (0, 1)]
    for cache in caches:
        for slot, (a, b) in enumerate([(0, 20), (20, 31), (31, 36)]):
            model.prefill(tokens[a:b], cache, slot)
    last, slots = [int(t) for t in tokens[40:43]], [0, 1, 2]
    calls.clear()
    (mixed,), rows = model.step([Chunk(tokens[43:60], 3)], caches[0], last, slots)
    assert calls == [[(3, 0, 17)]]  # one pass
    (alone,) = model.prefill_batch([Chunk(tokens[43:60], 3)], caches[1])
    want = model.decode_ids(last, caches[1], slots)
    assert torch.equal(rows, want) and torch.equal(mixed, alone)
    assert torch.equal(caches[0].lengths, caches[1].lengths)
    for slot in range(4):
        n = int(caches[0].lengths[slot])
        got = caches[0].read(s.layers - 1, torch.tensor([slot]), n)
        assert all(
            torch.equal(x, y)
            for x, y in zip(got, caches[1].read(s.layers - 1, torch.tensor([slot]), n), strict=True)
        )


@pytest.mark.parametrize("quant", ["rtn:w4g32", "int8"])
@pytest.mark.parametrize("name", MOE_FAMILIES)
def test_batched_expert_steps_in_one_call_equal_the_per_op_path(
    models, w4, ids, wikitext, tmp_path, name, quant
):
    """Five sequences at once: tokens routed to different experts are gathered per expert
    in C as the per-op path groups them (with LLM.int8() outlier columns too), and both
    count the same expert reads."""
    path = w4[name] if quant == "rtn:w4g32" else None
    if path is None:
        path = _compress(models[name], tmp_path / "int8", [parse_quant(quant)], wikitext)
    weights = load_weights(resolve(str(path)), device="cpu")
    model = Model(weights, LENGTH + 1)
    batch, prompt, steps = 5, 6, 6
    tokens = ids[0][: batch * (prompt + steps)].view(batch, prompt + steps)

    def run(m):
        cache = KVCache(
            weights.shape.layers, batch, weights.shape.kv_heads, LENGTH, weights.shape.head_dim
        )
        for b in range(batch):
            m.prefill(tokens[b, :prompt], cache, b)
        for layer in moe_layers:
            layer.moe.reads.zero_()
        rows = [
            m.decode(tokens[:, t], cache, torch.arange(batch))
            for t in range(prompt, prompt + steps)
        ]
        return torch.stack(rows), [layer.moe.reads.clone() for layer in moe_layers]

    moe_layers = [layer for layer in weights.layers if layer.moe is not None]  # glm4_moe's 1
    if quant == "int8":  # the outlier pass is what this case exercises
        experts = [x for layer in moe_layers for pair in layer.moe.experts for x in pair]
        assert any(x.outlier_index is not None for x in experts)
    fused, fused_reads = run(model)
    fused_path = model.backend.fused
    assert fused_path is not None
    model.backend.fused = None
    per_op, per_op_reads = run(model)
    model.backend.fused = fused_path
    assert (fused - per_op).abs().max() < 1e-4
    assert all(torch.equal(a, b) for a, b in zip(fused_reads, per_op_reads, strict=True))
    # a batch of 5 with top_k of several experts reads more than one expert per layer
    assert all((r > 0).sum() > weights.spec.mlp.top_k for r in fused_reads)


@pytest.mark.parametrize("name", NAMES)
def test_every_quantizer_compresses_and_loads(models, w4, wikitext, tmp_path, ids, name):
    original = torch.log_softmax(_transformers_logits(models[name], ids), -1)
    kl = {}
    recipes = {
        "rtn": None,  # the w4 fixture's artifact: rtn:w4g32 on the same calibration
        "awq": [parse_quant("awq:w4g32")],
        "gptq+tune": [parse_quant("gptq:w4g32"), {"tune": {"steps": 4}}],
        "int8": [parse_quant("int8")],
    }
    for method, stages in recipes.items():
        out = (
            w4[name]
            if stages is None
            else _compress(models[name], tmp_path / method, stages, wikitext)
        )
        got = torch.log_softmax(_transformers_logits(out, ids), -1)
        kl[method] = (original.exp() * (original - got)).sum(-1).mean().item()
        config = json.loads((out / "config.json").read_text())
        tensors = [k for f in out.glob("*.safetensors") for k in safe_open(str(f), "pt").keys()]  # noqa: SIM118
        if method != "int8":  # LLM.int8()'s outlier columns are llmpress's own layout
            assert engine_problems(config, tensors)["vllm"] == []
    # measured awq/rtn 0.87-1.01; folding AWQ's scales into gemma's norm as if it were
    # x·w instead of x·(1+w) measured 1.55
    assert kl["awq"] < 1.15 * kl["rtn"], kl
    assert kl["gptq+tune"] < 2 * kl["rtn"] + 1e-3, kl
    assert kl["int8"] < kl["rtn"], kl


@pytest.mark.parametrize("name", NAMES)
def test_the_cli_decodes_each_family(w4, name, monkeypatch):
    """`llmpress bench` in this process (test_runtime_cli.py runs it as its own). The
    machine's ceilings (memory bandwidth, matmul and int8 rates) are taken as given: their
    measurement was 1 s of each family's 1.05 s here, and test_runtime_cli.py tests it."""
    from compress.runtime import bench

    for name_, value in (("measure_bandwidth", 40e9), ("measure_matmul_flops", 1e11)):
        monkeypatch.setattr(bench, name_, lambda *a, value=value, **k: value)
    monkeypatch.setattr(bench, "int8_dot_rate", lambda *a, **k: 1e11)
    args = ["--batch", "1,2", "--prompt-len", "8", "--output-len", "8"]
    code, out, err = run_cli(["bench", str(w4[name]), *args])
    assert code == 0, err
    assert "tok/s" in out or "tokens/s" in out


@pytest.mark.parametrize("name", [n for n in NAMES if n not in MOE_FAMILIES])
def test_pruning_then_quantizing_each_family(models, wikitext, tmp_path, ids, name):
    hidden = 0.5 if _adapter(name).heads_span_hidden else 0.25  # phi3, helium: heads × head_dim
    prune = {"prune": {"mlp": 0.25, "heads": 0.5, "hidden": hidden, "multiple": 16}}
    out = _compress(models[name], tmp_path / "pruned", [prune, parse_quant("rtn:w4g32")], wikitext)
    config = json.loads((out / "config.json").read_text())
    assert config["intermediate_size"] == 96 and config["num_attention_heads"] == 2
    want = _transformers_logits(out, ids)  # plain transformers reads the pruned artifact
    weights = load_weights(resolve(str(out)), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-3


@pytest.mark.parametrize("name", list(MOE_FAMILIES))
def test_pruning_experts_then_quantizing_each_moe_family(models, wikitext, tmp_path, ids, name):
    """Whole experts and each expert's width are cut (with heads and hidden; a dense MLP
    layer's width too, glm4_moe's and ernie4_5_moe's first): the pruned repaired fp32
    artifact is read by plain transformers and the runtime alike, and it quantizes."""
    hidden = 0.5 if _adapter(name).heads_span_hidden else 0.25  # olmoe keeps heads × head_dim
    cut = {"experts": 0.5, "mlp": 0.25, "heads": 0.5, "hidden": hidden, "multiple": 16}
    if _adapter(name).attn_gate_in_q:  # its attention stays whole (the refusal's test)
        cut = {"experts": 0.5, "mlp": 0.25, "multiple": 16}
    repair = {"distill": {"tokens": 512, "batch": 2}}  # the repair trains through the experts
    out = _compress(models[name], tmp_path / "pruned", [{"prune": cut}, repair], wikitext)
    before = Widths.of(json.loads((models[name] / "config.json").read_text()))
    after = Widths.of(json.loads((out / "config.json").read_text()))  # the family's own keys
    assert after.experts == before.experts // 2 and after.intermediate == 96
    assert after.dense_intermediate == (96 if _mixed(name) else 0)
    # a shared expert n experts wide (glm4_moe's, ernie4_5_moe's) is cut with them
    assert after.shared == (96 * before.shared_experts if before.shared_experts else before.shared)
    assert after.dense_layers == before.dense_layers
    want = _transformers_logits(out, ids)
    weights = load_weights(resolve(str(out)), device="cpu")
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-3
    manifest = json.loads((out / "manifest.json").read_text())
    assert [r["stage"] for r in manifest["stages"]] == ["prune", "distill"]
    kept = manifest["stages"][0]["kept"]["experts"]
    dense = _adapter(name).dense_layers
    assert [e is None for e in kept] == [i in dense for i in range(len(kept))]
    assert all(len(layer) == before.experts // 2 for layer in kept if layer is not None)
    bias = _adapter(name).choice_bias  # minimax_m2's: each kept expert keeps its own
    if bias:
        from safetensors.torch import load_file

        was, now = (load_file(str(p / "model.safetensors")) for p in (models[name], out))
        for i, experts in enumerate(kept):
            if experts is None:
                continue
            key = f"model.layers.{i}.{bias}"
            assert torch.equal(now[key], was[key][..., experts]), key
    quantized = _compress(out, tmp_path / "w4", [parse_quant("rtn:w4g32")], wikitext)
    layers = load_weights(resolve(str(quantized)), device="cpu").layers
    assert [layer.moe is None for layer in layers] == [i in dense for i in range(len(layers))]


def test_experts_and_expert_neurons_that_contribute_nothing_are_the_ones_removed(
    models, wikitext, tmp_path
):
    """Experts 1 and 3 of the tiny mixtral write nothing (zero down projections), and
    expert 0's first 32 neurons neither: halving the experts and cutting a quarter of each
    one's width removes exactly those, and the rest are the original slices."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "mixtral"
    shutil.copytree(models["mixtral"], src)
    (weights_file,) = src.glob("*.safetensors")
    state = load_file(weights_file)
    expert = "model.layers.{}.block_sparse_moe.experts.{}.{}.weight"
    layers = json.loads((src / "config.json").read_text())["num_hidden_layers"]
    for i in range(layers):
        for e in (1, 3):
            state[expert.format(i, e, "w2")].zero_()
        state[expert.format(i, 0, "w2")][:, :32] = 0
    save_file(state, weights_file, metadata={"format": "pt"})
    cut = {"experts": 0.5, "mlp": 0.25, "multiple": 16}
    out = _compress(src, tmp_path / "pruned", [{"prune": cut}], wikitext)
    record = json.loads((out / "manifest.json").read_text())["stages"][0]
    assert record["kept"]["experts"] == [[0, 2]] * layers
    (pruned_file,) = out.glob("*.safetensors")
    pruned = load_file(pruned_file)
    for i in range(layers):
        for role, dim in (("w1", 0), ("w3", 0), ("w2", 1)):
            original = state[expert.format(i, 0, role)]
            kept = original[32:] if dim == 0 else original[:, 32:]
            assert torch.equal(pruned[expert.format(i, 0, role)], kept)
        router = f"model.layers.{i}.block_sparse_moe.gate.weight"
        assert torch.equal(pruned[router], state[router][[0, 2]])


def test_dense_layer_and_shared_expert_neurons_that_contribute_nothing_are_the_ones_removed(
    models, wikitext, tmp_path
):
    """glm4_moe's dense layer 0 and its layer 1's shared expert (one expert wide, so cut
    with the experts) have their first 32 neurons writing nothing: cutting a quarter of the
    MLP width removes exactly those, and the rest are the original slices."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "glm4_moe"
    shutil.copytree(models["glm4_moe"], src)
    (weights_file,) = src.glob("*.safetensors")
    state = load_file(weights_file)
    mlps = ("model.layers.0.mlp", "model.layers.1.mlp.shared_experts")
    for mlp in mlps:
        state[f"{mlp}.down_proj.weight"][:, :32] = 0
    save_file(state, weights_file, metadata={"format": "pt"})
    out = _compress(src, tmp_path / "pruned", [{"prune": {"mlp": 0.25, "multiple": 16}}], wikitext)
    record = json.loads((out / "manifest.json").read_text())["stages"][0]
    assert record["kept"]["shared"] == [None, list(range(32, 128))]
    assert record["shape_after"]["dense_intermediate"] == record["shape_after"]["shared"] == 96
    from compress.eval.report import plot_pruning  # the dense layer's scores, beside the experts'

    plot_pruning(tmp_path / "pruning.png", record)
    assert (tmp_path / "pruning.png").stat().st_size > 10_000
    (pruned_file,) = out.glob("*.safetensors")
    pruned = load_file(pruned_file)
    for mlp in mlps:
        for role, dim in (("gate_proj", 0), ("up_proj", 0), ("down_proj", 1)):
            original = state[f"{mlp}.{role}.weight"]
            kept = original[32:] if dim == 0 else original[:, 32:]
            assert torch.equal(pruned[f"{mlp}.{role}.weight"], kept), (mlp, role)


@pytest.mark.parametrize(
    "name,cut",
    [
        ("llama3", {"params": 0.6}),  # candidate splits, one removing a layer
        ("gemma3_text", {"hidden": 0.25, "layers": 1}),  # a scaled embedding; softcapped logits
        ("glm4_moe", {"params": 0.6}),  # dense layer, shared expert cut with the experts
        ("qwen2_moe", {"experts": 0.5, "mlp": 0.25, "layers": 1}),  # a gated shared expert
    ],
)
def test_pruning_block_by_block_is_pruning_the_model_in_memory(
    models, tokenizer, wikitext, tmp_path, name, cut
):
    """compress prunes a checkpoint one block in memory at a time (scores, the
    layer-removal and candidate KLs, the surgery); the in-memory stage (after another
    whole-model stage) keeps the same units and writes the same tensors."""
    from safetensors.torch import load_file

    from compress.artifact.dense import load_model
    from compress.calib_data import calibration_samples, read_texts, token_stream
    from compress.model.blocks import BlockStore
    from compress.pruning.stage import Prune, PruneConfig
    from compress.stage import ModelContext

    stream = token_stream(tokenizer, read_texts(str(wikitext / "valid.txt"))[:400])
    samples = calibration_samples(stream, 6, 64, 0)
    ckpt = resolve(str(models[name]))
    stage = Prune(PruneConfig(**cut, multiple=16))
    ctx = ModelContext(
        teacher=None, model=load_model(ckpt), config=dict(ckpt.config), adapter=ckpt.adapter,
        tokenizer=tokenizer, samples=samples, work_dir=None, log=lambda _: None,
    )  # fmt: skip
    want = stage.run(ctx)
    out = tmp_path / "pruned"
    got, keep = stage.run_streamed(
        BlockStore(ckpt), samples, tokenizer, out, ckpt.sha256, lambda _: None
    )
    assert got["kept"] == want["kept"] and got["cuts"] == want["cuts"]
    assert got["shape_after"] == want["shape_after"]
    for a, b in zip(got["splits_tried"], want["splits_tried"], strict=True):
        assert a["cuts"] == b["cuts"] and abs(a["kl"] - b["kl"]) < 1e-4, (a, b)
    drift = got["importance"]["layer_removal_kl"], want["importance"]["layer_removal_kl"]
    assert (drift[0] is None) == (drift[1] is None)
    if drift[0] is not None:
        assert torch.allclose(torch.tensor(drift[0]), torch.tensor(drift[1]), rtol=1e-3)
    assert json.loads((out / "config.json").read_text()) == ctx.config
    written = {}
    for f in out.glob("*.safetensors"):
        written.update(load_file(f))
    state = ctx.model.state_dict()
    if ctx.config.get("tie_word_embeddings"):
        state.pop(f"{ctx.adapter.lm_head}.weight")
    assert written.keys() == state.keys()
    for k, v in written.items():
        assert torch.allclose(v.float(), state[k], atol=1e-6), k
    reloaded = resolve(str(out))
    assert reloaded.sha256 == ckpt.sha256  # eval compares the artifact with the original
    assert keep.layers == want["kept"]["layers"]


def test_where_vllm_runs_a_family_otherwise_is_said_at_compress(models, tmp_path):
    """smollm3 and helium would run in vLLM's Transformers backend, which the vLLM verdict
    does not model, and vLLM's cohere2 multiplies by the embedding whatever lm_head the
    artifact holds: compress says so in a note, for them only. phimoe by the name its
    config gives: transformers' (a tiny model's), which vLLM's registry lacks, or the
    published one, which it has."""
    published = tmp_path / "published"
    shutil.copytree(models["phimoe"], published)
    config = json.loads((published / "config.json").read_text())
    (published / "config.json").write_text(
        json.dumps({**config, "architectures": ["PhiMoEForCausalLM"]})
    )
    said = {
        "helium": "vLLM has no model of its own",
        "smollm3": "vLLM has no model of its own",
        "cohere2": "vLLM's Cohere2ForCausalLM computes the logits with the embedding",
        "glm4": None,
        "phimoe": "vLLM has no model of its own for PhimoeForCausalLM",
        published: None,
    }
    for name, note in said.items():
        lines = []
        recipe = parse_recipe({"stages": [parse_quant("rtn:w4g32")]})
        src = models[name] if isinstance(name, str) else name
        compress(str(src), recipe, tmp_path / f"out-{Path(name).name}", log=lines.append)
        noted = [x for x in lines if x.startswith("note: vLLM")]
        assert noted == ([] if note is None else noted[:1]), (name, lines)
        assert note is None or noted[0].startswith(f"note: {note}"), (name, lines)


def test_an_olmoe_whose_q_k_v_are_clipped_compresses_and_the_runtime_refuses_it(
    tokenizer_dir, wikitext, tmp_path
):
    """OLMoE's clip_qkv (null in the published models) clamps q, k and v: transformers
    computes it while compressing, and the runtime, which does not, says so in one line
    rather than decode something else."""
    src = write_family(tmp_path / "src", "olmoe", tokenizer_from=tokenizer_dir, clip_qkv=0.5)
    out = _compress(src, tmp_path / "w4", [parse_quant("rtn:w4g32")], wikitext)
    assert json.loads((out / "config.json").read_text())["clip_qkv"] == 0.5
    with pytest.raises(LlmpressError, match=r"qkv_clip 0\.5 \(q, k and v clamped\)") as e:
        load_weights(resolve(str(out)), device="cpu")
    assert "\n" not in str(e.value)


def test_expert_groups_compress_and_the_runtime_routes_within_them(
    tokenizer_dir, wikitext, tmp_path, ids
):
    """glm4_moe's routing within expert groups (n_group > 1; 1 in the published models)
    is computed while compressing, and the runtime routes within them too: transformers'
    logits from the original, and from the 4-bit artifact."""
    src = write_family(tmp_path / "src", "glm4_moe", tokenizer_dir, n_group=2, topk_group=1)
    weights = load_weights(resolve(str(src)), device="cpu")
    assert {layer.moe.groups for layer in weights.layers if layer.moe} == {(2, 1)}
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4
    out = _compress(src, tmp_path / "w4", [parse_quant("rtn:w4g32")], wikitext)
    got = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)(ids)
    assert (got.logits[0] - _transformers_logits(out, ids)).abs().max() < 1e-3


@pytest.mark.parametrize(
    "name,dense",
    [("qwen3_moe", {"mlp_only_layers": [0]}), ("qwen2_moe", {"decoder_sparse_step": 2})],
)
def test_qwen_moe_layers_kept_dense_compress_and_run(
    tokenizer_dir, wikitext, tmp_path, ids, name, dense
):
    """qwen3_moe's mlp_only_layers and qwen2_moe's decoder_sparse_step keep some layers
    dense (glm4_moe's path): the runtime computes transformers' logits, and the 4-bit
    artifact opens in plain transformers and agrees with the runtime."""
    src = write_family(tmp_path / "src", name, tokenizer_dir, **dense)
    assert (
        _adapter(name).mixed is False
        and adapter_for(json.loads((src / "config.json").read_text())).mixed
    )
    weights = load_weights(resolve(str(src)), device="cpu")
    assert [layer.moe is None for layer in weights.layers] == [True, False]
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - _transformers_logits(src, ids)).abs().max() < 1e-4
    out = _compress(src, tmp_path / "w4", [parse_quant("rtn:w4g32")], wikitext)
    got = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)(ids)
    assert (got.logits[0] - _transformers_logits(out, ids)).abs().max() < 1e-3


@pytest.mark.parametrize(
    "name,dense",
    [
        ("glm4_moe", {}),  # first_k_dense_replace: 1
        ("ernie4_5_moe", {}),  # moe_layer_start_index: 1
        ("qwen3_moe", {"mlp_only_layers": [1]}),
    ],
)
def test_removing_expert_layers_keeps_the_dense_ones_where_the_config_says(
    tokenizer_dir, wikitext, tmp_path, ids, name, dense
):
    """Of 4 layers, one dense, 2 are removed: never the dense one, and the keys that place
    it are rewritten for the new depth, so plain transformers builds the pruned model as
    the original with those layers deleted and computes the same logits (unrepaired)."""
    from transformers import AutoModelForCausalLM

    src = write_family(tmp_path / "src", name, tokenizer_dir, num_hidden_layers=4, **dense)
    adapter = adapter_for(json.loads((src / "config.json").read_text()))
    assert len(adapter.dense_layers) == 1
    out = _compress(src, tmp_path / "pruned", [{"prune": {"layers": 2}}], wikitext)
    kept = json.loads((out / "manifest.json").read_text())["stages"][0]["kept"]["layers"]
    assert len(kept) == 2 and adapter.dense_layers[0] in kept
    config = json.loads((out / "config.json").read_text())
    pruned = adapter_for(config)
    assert pruned.dense_layers == (kept.index(adapter.dense_layers[0]),)
    assert not config.get("num_nextn_predict_layers")  # glm4_moe's MTP block: not cut
    original = AutoModelForCausalLM.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    blocks = original.get_submodule(adapter.blocks)
    original.get_submodule(adapter.blocks.rpartition(".")[0]).layers = torch.nn.ModuleList(
        [blocks[i] for i in kept]
    )
    original.config.num_hidden_layers = 2
    with torch.no_grad():
        want = original(ids).logits[0]
    assert (_transformers_logits(out, ids) - want).abs().max() < 1e-4
    weights = load_weights(resolve(str(out)), device="cpu")
    assert [layer.moe is None for layer in weights.layers] == [
        i in pruned.dense_layers for i in range(2)
    ]
    got = RuntimeLM(weights, LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-3


def test_an_output_projection_with_a_bias_is_refused_in_one_line(tokenizer_dir, tmp_path):
    """ERNIE 4.5 MoE's use_bias (false in the published models) also biases lm_head, which
    llmpress does not compute: refused before any work, not decoded without it."""
    src = write_family(tmp_path / "src", "ernie4_5_moe", tokenizer_dir, use_bias=True)
    code, _, err = run_cli(["compress", str(src), "-o", str(tmp_path / "w4"), "--quant", "w4g32"])
    ours = [x for x in err.strip().splitlines() if not x.startswith("[transformers]")]
    assert code != 0 and len(ours) == 1 and "has a bias (lm_head.bias)" in err, err
    assert not (tmp_path / "w4").exists()


def test_a_glm4_moe_checkpoint_s_prediction_block_is_carried_into_the_artifact(
    models, ids, wikitext, tmp_path
):
    """GLM-4.5 checkpoints hold a next-token-prediction block after the model's own (layer
    46 of 46 for speculative decoding, which transformers' forward skips): compression
    accepts it, carries it into the artifact as it is, and the model computes as without
    it."""
    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(models["glm4_moe"], src)
    tensors = load_file(str(src / "model.safetensors"))
    extra = {k.replace(".layers.1.", ".layers.2."): v + 1 for k, v in tensors.items()}
    extra = {k: v for k, v in extra.items() if ".layers.2." in k}
    extra["model.layers.2.eh_proj.weight"] = torch.randn(128, 256)  # its own projection
    save_file({**tensors, **extra}, str(src / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    assert adapter_for(config).predictor_layers and config["num_hidden_layers"] == 2
    out = _compress(src, tmp_path / "w4", [parse_quant("rtn:w4g32")], wikitext)
    written = {k: t for f in out.glob("*.safetensors") for k, t in load_file(str(f)).items()}
    assert all(torch.equal(written[k], v) for k, v in extra.items())
    without = _compress(
        models["glm4_moe"], tmp_path / "plain", [parse_quant("rtn:w4g32")], wikitext
    )
    got, want = (
        RuntimeLM(load_weights(resolve(str(p)), device="cpu"), LENGTH, exact=True)(ids).logits[0]
        for p in (out, without)
    )
    assert torch.equal(got, want)
    assert (_transformers_logits(out, ids) - got).abs().max() < 1e-3  # it opens beside them
    (src / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 0}))
    args = ["compress", str(src), "-o", str(tmp_path / "refused"), "--quant", "rtn:w4g32"]
    code, _, err = run_cli(args)
    assert code != 0 and "holds block 2 but config.json's num_hidden_layers is 2" in err, err


def test_what_the_surgery_cannot_cut_is_refused_in_one_line(models, wikitext, tmp_path):
    cases = {
        "phi3": ({"hidden": 0.25}, "need heads × head_dim = hidden"),
        "helium": ({"heads": 0.5}, "need heads × head_dim = hidden"),
        "llama3": ({"experts": 0.5}, "not a Mixture-of-Experts model"),
        "mixtral": ({"experts": 0.9}, "fewer than the 2 each token is routed to"),
        "glm4_moe": ({"layers": 1}, "keeps them all and at least one of its 1 Mixture"),
    }
    for name, (targets, message) in cases.items():
        code, _, err = run_cli([
            "compress", str(models[name]), "-o", str(tmp_path / name), "--recipe",
            str(_recipe_file(tmp_path, [{"prune": targets}, {"rtn": {}}])),
        ])  # fmt: skip
        assert code != 0 and message in err, err
        # one line of ours (transformers may warn about the config beside it)
        ours = [x for x in err.strip().splitlines() if not x.startswith("[transformers]")]
        assert len(ours) == 1 and not (tmp_path / name).exists()


def _recipe_file(tmp_path, stages):
    import yaml

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"stages": stages}))
    return path


# every family on a GPU; under the interpreter those that hold the rest's features
TRITON_NAMES = (
    NAMES
    if DEVICE == "cuda"
    else [
        "gemma3_text", "phi3", "qwen2_moe", "granite", "exaone4", "glm4", "glm4_moe", "cohere2",
        "afmoe", "granite_swa", "kolibri1",
    ]
)  # fmt: skip


@pytest.mark.parametrize("name", TRITON_NAMES)
def test_the_triton_backend_runs_the_description(w4, ids, name):
    """The GPU backend, compiled on a GPU or on CPU tensors under TRITON_INTERPRET=1:
    gemma3's scale, windows, sandwich and q/k norms, phi3's partial rotary, the experts
    (qwen2_moe's shared one too), granite's multipliers, exaone4's branches without input
    norms and its full layer without rope, glm4's q/k rows reordered from the stored words
    for its interleaved rope, afmoe's gated attention output. Its prefill and decode steps
    (Triton attention over a window shorter than the sequence) equal transformers' forward
    on the artifact's fp32 weights (plain from_pretrained keeps a quantized MoE's experts
    in bf16)."""
    triton_steps_match_reference(w4[name], ids, DEVICE)


def test_the_default_lm_head_is_int8_tied_or_not(models, wikitext, tmp_path):
    """--lm-head auto: w8 for an untied head, and for a head tied to an fp32 or 16-bit
    embedding (its own int8 copy; the embedding stays), when the blocks are quantized:
    either is most of a small model's decode bytes otherwise. `none` keeps the head as
    stored, and tied stays tied."""
    rtn = [parse_quant("rtn:w4g32")]
    untied = _compress(models["llama3"], tmp_path / "untied", rtn, wikitext)
    tied32 = _compress(models["gemma3_text"], tmp_path / "tied32", rtn, wikitext)
    bf16 = parse_recipe({"stages": rtn, "dtype": "bfloat16", "calib": _wikitext_calib(wikitext)})
    tied16 = compress(str(models["gemma3_text"]), bf16, tmp_path / "tied16", log=lambda _: None)
    recipe = parse_recipe({"stages": rtn, "lm_head": "none"})
    kept = compress(str(models["llama3"]), recipe, tmp_path / "kept", log=lambda _: None)
    tied = compress(str(models["gemma3_text"]), recipe, tmp_path / "tied", log=lambda _: None)

    def head(path):
        names = {k for f in path.glob("*.safetensors") for k in safe_open(str(f), "pt").keys()}  # noqa: SIM118
        return sorted(n.rsplit(".", 1)[-1] for n in names if n.startswith("lm_head."))

    def config(path):
        return json.loads((path / "config.json").read_text())

    for path in (untied, tied32, tied16):
        assert head(path) == ["weight_packed", "weight_scale", "weight_shape"]
        assert json.loads((path / "manifest.json").read_text())["recipe"]["lm_head"] == "w8"
        assert not config(path)["tie_word_embeddings"]
    assert head(kept) == ["weight"]
    assert head(tied) == [] and config(tied)["tie_word_embeddings"]


@pytest.mark.parametrize("name", ["gemma3_text", "qwen3_moe"])
def test_serve_answers_the_openai_client_for_each_kind_of_block(w4, name):
    """serve on a sandwich-norm, windowed family and on a Mixture-of-Experts one: the
    openai client gets its greedy completion, the same one twice."""
    replies = serve_greedy_twice(w4[name])
    assert [r.usage.completion_tokens for r in replies] == [8, 8]
    assert replies[0].choices[0].text == replies[1].choices[0].text


@pytest.mark.parametrize(
    ("wrapper", "text", "tied"),
    [
        ("gemma3", None, True),
        ("mistral3", "ministral3", True),
        ("mistral3", "mistral", False),
        ("llava", "mistral", False),  # Pixtral-12B's
        ("llava_next", "qwen2", False),
        ("llava_onevision", None, False),
        ("aya_vision", None, True),
        ("internvl", None, False),
        ("smolvlm", None, True),
        ("idefics3", None, False),
        ("qwen2_vl", None, True),
        ("qwen2_5_vl", None, True),
        ("qwen3_vl", None, False),
        ("qwen3_vl_moe", None, False),
        ("glm4v", None, False),
        ("glm4v_moe", None, False),
        ("apertus1p5", None, False),  # its head kept to the text ids: never tied
        ("lfm2_vl", None, True),
    ],
)
def test_the_text_part_of_a_multimodal_checkpoint(tmp_path, ids, wikitext, wrapper, text, tied):
    """A Gemma3ForConditionalGeneration checkpoint (Gemma 3 from 4B up) or a
    Mistral3ForConditionalGeneration one (Ministral 3, its head tied; Mistral Small
    3.1/3.2, its head stored): every command reads its language model, and the artifact
    is that family's ForCausalLM, which plain transformers opens."""
    import transformers
    from family_models import MULTIMODAL, family_config, write_multimodal

    src = write_multimodal(
        tmp_path / "mm", wrapper, convert_gguf(default_gguf()), text=text, tied=tied
    )
    outer = MULTIMODAL[wrapper][1]
    text = family_config(text or MULTIMODAL[wrapper][2]).model_type  # llama3's is llama
    arch = ADAPTERS[text].architecture
    names = list(safe_open(str(src / "model.safetensors"), "pt").keys())
    text_names = [n for n in names if text_name(n, wrapper) is not None]
    assert any(".layers." in n for n in text_names) and len(text_names) < len(names)
    full = getattr(transformers, outer).from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        want = full.eval()(input_ids=ids).logits[0]
    ckpt = resolve(str(src))
    assert ckpt.config["model_type"] == text
    assert ckpt.text_part_of == outer
    assert ckpt.config["tie_word_embeddings"] is tied
    assert ("lm_head.weight" in ckpt.tensors) is not tied
    assert all(
        n.startswith(("model.layers.", "model.embed", "model.norm", "lm_head."))
        for n in ckpt.tensors
    )
    got = RuntimeLM(load_weights(ckpt, device="cpu"), LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    assert resolve(str(src)).path == ckpt.path  # made once, then reused

    out = tmp_path / "w4"
    code, stdout, stderr = run_cli(["compress", str(src), "-o", str(out), "--quant", "rtn:w4g32"])
    assert code == 0, stderr
    assert outer in stdout + stderr and "vision" in stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["text_part_of"] == outer
    assert manifest["source"]["sha256"] == ckpt.sha256
    assert f"| read as | the language model of a `{outer}`" in (out / "README.md").read_text()
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == [arch]
    quantized = _transformers_logits(out, ids)  # plain from_pretrained of the artifact
    exact = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)
    assert (exact(ids).logits[0] - quantized).abs().max() < 1e-3


def test_a_published_qwen2_5_vl_config_keeps_its_text_keys_at_the_top_level(tmp_path, ids):
    """Qwen2.5-VL's published config.json has no text_config: the language model's keys
    and its M-RoPE (`rope_scaling` {"type": "mrope"}) sit beside `vision_config`. Its text
    part is read from there, as transformers reads it, and computes what the whole model
    computes on text."""
    import transformers
    from family_models import write_multimodal

    src = write_multimodal(tmp_path / "mm", "qwen2_5_vl", convert_gguf(default_gguf()))
    config = json.loads((src / "config.json").read_text())
    text = config.pop("text_config")
    rope = text.pop("rope_parameters")
    flat = {**{k: v for k, v in text.items() if k != "model_type"}, **config}
    flat["rope_scaling"] = {"type": "mrope", "mrope_section": rope["mrope_section"]}
    flat["rope_theta"] = rope["rope_theta"]
    (src / "config.json").write_text(json.dumps(flat))
    full = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        src, dtype=torch.float32, attn_implementation="eager"
    )
    with torch.no_grad():
        want = full.eval()(input_ids=ids).logits[0]
    ckpt = resolve(str(src))
    assert ckpt.config["model_type"] == "qwen2" and "vision_config" not in ckpt.config
    assert "mrope" not in json.dumps(ckpt.config)
    got = RuntimeLM(load_weights(ckpt, device="cpu"), LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4


def test_a_multimodal_checkpoint_of_an_unsupported_text_family_is_refused(tmp_path):
    """Its language model's family is named in one line, before anything is converted."""
    folder = tmp_path / "mm"
    folder.mkdir()
    config = {"model_type": "mistral3", "text_config": {"model_type": "falcon"}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"")
    with pytest.raises(LlmpressError, match="falcon model, a family llmpress does not support"):
        resolve(str(folder))


def test_a_16bit_embedding_is_looked_up_inside_the_one_call_step(models, wikitext, tmp_path, ids):
    """The engine's decode step (embedding, blocks, head in one C call) widens a bf16
    embedding's rows as torch does: the same logits as the step from torch's lookup."""
    recipe = parse_recipe(
        {
            "stages": [parse_quant("rtn:w4g32")],
            "dtype": "bfloat16",
            "calib": _wikitext_calib(wikitext),
        }
    )
    path = compress(str(models["llama3"]), recipe, tmp_path / "bf16", log=lambda _: None)
    weights = load_weights(resolve(str(path)), device="cpu")
    assert weights.embed.dtype == torch.bfloat16
    model = Model(weights, 32)
    assert model.backend.fused.ctx is not None
    tokens = ids[0]

    def run(from_ids):
        s = weights.shape
        cache = KVCache(s.layers, 1, s.kv_heads, 32, s.head_dim)
        model.prefill(tokens[:8], cache, 0)
        rows = []
        for t in range(8, 20):
            if from_ids:
                rows.append(model.decode_ids([int(tokens[t])], cache, [0]))
            else:
                rows.append(model.decode(tokens[t : t + 1], cache, torch.tensor([0])))
        return torch.cat(rows)

    assert torch.equal(run(True), run(False))
    s = weights.shape
    cache = KVCache(s.layers, 1, s.kv_heads, 32, s.head_dim)
    rows = weights.embed.shape[0]
    for tokens, slots in (([rows], [0]), ([-1], [0]), ([1], [1])):  # refused, not read
        with pytest.raises(IndexError):
            model.decode_ids(tokens, cache, slots)


def test_a_rope_base_list_that_misses_layers_is_refused_in_one_line(models):
    """granite_swa's layer_rope_theta must give each layer a base: one short is refused
    with what to fix, not read as fewer layers."""
    config = json.loads((models["granite_swa"] / "config.json").read_text())
    config["layer_rope_theta"] = config["layer_rope_theta"][:-1]
    with pytest.raises(LlmpressError, match=r"layer_rope_theta names 2 layers, its layer_types 3"):
        adapter_for(config).spec(config)


def test_an_exaone_checkpoint_is_read_as_llama_under_its_own_names(tmp_path, tokenizer_dir, ids):
    """EXAONE 3.0/3.5 (`ExaoneForCausalLM`) is llama's model under names of its own
    (transformer.h.N.attn.attention.q_proj, ln_1, mlp.c_fc_0, ...), which transformers
    renames as it loads it: llmpress reads it as llama once (text_part.RENAMED), computes
    what transformers computes, says so at compress and records it, and the artifact is a
    LlamaForCausalLM that plain transformers opens."""
    import transformers
    from family_models import COMMON
    from safetensors import safe_open

    config = transformers.ExaoneConfig(**{**COMMON, **FAMILIES["llama3"][1]})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
    src = tmp_path / "exaone"
    model.save_pretrained(src)
    saved = json.loads((src / "config.json").read_text())
    saved["architectures"] = ["ExaoneForCausalLM"]  # as the published configs say
    (src / "config.json").write_text(json.dumps(saved))
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(f, src / f.name)
    names = list(safe_open(str(src / "model.safetensors"), "pt").keys())
    assert any(".attn.attention.out_proj." in n for n in names)
    assert any(n.startswith("transformer.h.") for n in names)
    want = _transformers_logits(src, ids)
    ckpt = resolve(str(src))
    assert ckpt.config["model_type"] == "llama" and ckpt.renamed_from == "ExaoneForCausalLM"
    got = RuntimeLM(load_weights(ckpt, device="cpu"), LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    out = tmp_path / "w4"
    code, stdout, stderr = run_cli(["compress", str(src), "-o", str(out), "--quant", "rtn:w4g32"])
    assert code == 0, stderr
    assert "ExaoneForCausalLM" in stdout + stderr and "read as llama" in stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["renamed_from"] == "ExaoneForCausalLM"
    assert "a `ExaoneForCausalLM` checkpoint, as `llama`" in (out / "README.md").read_text()
    assert json.loads((out / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    quantized = _transformers_logits(out, ids)  # plain from_pretrained of the artifact
    exact = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)
    assert (exact(ids).logits[0] - quantized).abs().max() < 1e-3


@pytest.mark.parametrize(
    "model_type,config_class,arch",
    [
        ("sarvam_moe", "SarvamMoEConfig", "SarvamMoEForCausalLM"),
        ("param2moe", "Param2MoeConfig", "Param2MoeForCausalLM"),
    ],
)
def test_a_bailing_named_checkpoint_is_read_as_glm4_moe(
    model_type, config_class, arch, tmp_path, tokenizer_dir, ids
):
    """Sarvam-30B and Param-2 are glm4_moe's model rotating whole heads, stored under
    Bailing's names (a fused query_key_value with its bias, attention.dense,
    word_embeddings, the router's expert_bias), which transformers renames and splits as
    it loads them: llmpress reads each as glm4_moe once (text_part.RENAMED), computes what
    transformers computes, and the artifact is a Glm4MoeForCausalLM plain transformers
    opens."""
    from compress.model.text_part import RENAMED

    assert RENAMED[model_type].family == "glm4_moe"
    model = build_family("glm4_moe", config_class=config_class)
    assert model.config.model_type == model_type
    src = tmp_path / model_type
    model.save_pretrained(src)
    saved = json.loads((src / "config.json").read_text())
    saved["architectures"] = [arch]  # as the published configs say
    (src / "config.json").write_text(json.dumps(saved))
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy2(f, src / f.name)
    names = list(safe_open(str(src / "model.safetensors"), "pt").keys())
    assert any(n.endswith("attention.query_key_value.bias") for n in names)
    assert any(n.endswith("mlp.gate.expert_bias") for n in names)
    want = _transformers_logits(src, ids)
    ckpt = resolve(str(src))
    assert ckpt.config["model_type"] == "glm4_moe" and ckpt.renamed_from == arch
    assert ckpt.config["rope_parameters"]["partial_rotary_factor"] == 1.0
    got = RuntimeLM(load_weights(ckpt, device="cpu"), LENGTH, exact=True)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    out = tmp_path / "w4"
    code, stdout, stderr = run_cli(["compress", str(src), "-o", str(out), "--quant", "rtn:w4g32"])
    assert code == 0, stderr
    assert f"is a {arch}" in stdout + stderr and "read as glm4_moe" in stdout + stderr
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["source"]["renamed_from"] == arch
    card = (out / "README.md").read_text()
    assert f"| read as | a `{arch}` checkpoint, as `glm4_moe` (its model) |" in card
    code, stdout, _ = run_cli(["inspect", str(out)])
    assert code == 0 and f"read as: a `{arch}` checkpoint, as `glm4_moe`" in stdout
    assert json.loads((out / "config.json").read_text())["architectures"] == ["Glm4MoeForCausalLM"]
    quantized = _transformers_logits(out, ids)  # plain from_pretrained of the artifact
    exact = RuntimeLM(load_weights(resolve(str(out)), device="cpu"), LENGTH, exact=True)
    assert (exact(ids).logits[0] - quantized).abs().max() < 1e-3


def test_a_fused_projection_that_does_not_match_the_config_is_refused(tmp_path, tokenizer_dir):
    """A Bailing-named checkpoint whose query_key_value rows are not the config's heads
    (a config of another size beside the weights) is refused in one line naming both."""
    model = build_family("glm4_moe", config_class="SarvamMoEConfig")
    src = tmp_path / "sarvam"
    model.save_pretrained(src)
    saved = json.loads((src / "config.json").read_text())
    saved["num_key_value_heads"] = 4
    (src / "config.json").write_text(json.dumps(saved))
    wrong = r"query_key_value\.(weight|bias) has 128 rows .* 192"
    with pytest.raises(LlmpressError, match=wrong) as e:
        resolve(str(src))
    assert "\n" not in str(e.value)
