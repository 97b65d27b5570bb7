"""Mamba-2 (IBM's Bamba, Granite 4.0 H), Mamba (AI21's Jamba) and gated short convolutions
(Liquid AI's LFM2) beside attention: compression reads them through transformers' own
blocks, each layer by the kind its config names, and the artifact opens in plain
transformers and passes vLLM's loading rules; the runtime runs each sequence's state
beside the KV cache of the attention layers alone; pruning, speculation and the prefix
cache refuse them in one line, as they do Gated DeltaNet models."""

import json

import pytest
import torch
from family_models import serve_greedy_twice, triton_steps_match_reference, write_family
from safetensors import safe_open
from test_hybrid_attention import (
    each_quantizer,
    one_call_equals_per_op,
    runs_and_refuses,
    runtime_matches_transformers,
)
from test_latent_attention import _compress, _logits

from compress.errors import LlmpressError
from compress.eval.reference import BlockwiseOriginal
from compress.model.adapters import Mamba1, Mamba2, ShortConv, adapter_for, dense_shapes
from compress.model.loading import resolve
from compress.recipe import parse_quant
from compress.runtime.kv_cache import cache_for, parse_kv
from compress.runtime.lm import RuntimeLM
from compress.runtime.model import Chunk, Model
from compress.runtime.states import MixerStates
from compress.runtime.weights import load_weights

LENGTH = 72  # past one 64-token chunk of transformers' chunked scan
_MAMBA = Mamba2(8, 16, 16, 2, 4, conv_bias=True)
_MAMBA_KEPT = [f"mamba.{n}" for n in ("conv1d.weight", "conv1d.bias", "A_log", "dt_bias", "D")]
# family -> its mixer, recurrent layers, input projection, the tensors kept as stored, and
# what messages call its layers
FAMILY = {
    "bamba": (_MAMBA, (0, 1, 2), "mamba.in_proj", _MAMBA_KEPT, "Mamba-2"),
    "granitemoehybrid": (_MAMBA, (0, 1, 2), "mamba.in_proj", _MAMBA_KEPT, "Mamba-2"),
    "lfm2": (
        ShortConv(64, 3),
        (0, 1, 3),
        "conv.in_proj",
        ["conv.conv.weight"],
        "short-convolution",
    ),
    "jamba": (
        Mamba1(128, 16, 8, 4, conv_bias=True), (0, 1, 2), "mamba.in_proj",
        [f"mamba.{n}" for n in ("x_proj.weight", "dt_proj.weight", "dt_proj.bias",
                                "conv1d.weight", "A_log", "D")],
        "Mamba",
    ),
}  # fmt: skip


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 49152, (1, LENGTH), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module", params=list(FAMILY))
def model(request, tmp_path_factory, tokenizer_dir):
    """Bamba, Granite 4.0 H's dense kind (granite's multipliers, no rope, the MLP as one
    input_linear) and LFM2."""
    return write_family(tmp_path_factory.mktemp("mamba") / "src", request.param, tokenizer_dir)


@pytest.fixture(scope="module")
def w4(model, wikitext, tmp_path_factory):
    return _compress(
        model, tmp_path_factory.mktemp("w4") / "w4", [parse_quant("rtn:w4g32")], wikitext
    )


def _family(model) -> tuple:
    return FAMILY[json.loads((model / "config.json").read_text())["model_type"]]


def test_the_adapter_names_each_layer_kind_and_its_shapes(model):
    """The recurrent layers hold the mixer (in_proj, out_proj as o), the other attention;
    every tensor of the checkpoint has the shape the config implies, and nothing the
    config implies is missing."""
    config = json.loads((model / "config.json").read_text())
    adapter = adapter_for(config)
    mixer, layers, in_proj, *_ = _family(model)
    assert adapter.linear_layers == layers
    assert (adapter.mamba or adapter.short_conv) == mixer
    full = next(i for i in range(4) if i not in layers)
    linear, full = adapter.layer(layers[0]), adapter.layer(full)
    assert linear.block_linears[:2] == (in_proj, in_proj.replace("in_proj", "out_proj"))
    assert linear.block_linears[2:] == full.block_linears[4:]
    (norm_fed, *_) = linear.input_groups
    assert norm_fed.producer == adapter.attn_norm and norm_fed.linears == (in_proj,)
    with safe_open(str(model / "model.safetensors"), "pt") as f:
        stored = {k: tuple(f.get_slice(k).get_shape()) for k in f.keys()}  # noqa: SIM118
    assert dense_shapes(adapter, adapter.shape(config)) == stored


def test_the_block_walk_equals_transformers(model, ids):
    """What compression calibrates on and eval scores the original with: the checkpoint
    read block by block, each Mamba layer over the whole window at once (transformers'
    chunked scan, two chunks here), gives transformers' own log-probs."""
    want = torch.log_softmax(_logits(model, ids)[:-1], -1)
    walk = BlockwiseOriginal(resolve(str(model)), ids, log=lambda _: None)
    assert (walk.reference(0, ids[0]) - want).abs().max() < 1e-4


def test_every_quantizer_compresses_and_loads(model, wikitext, tmp_path, ids):
    """RTN, AWQ, GPTQ with tuning and LLM.int8(): plain from_pretrained of each artifact
    computes what llmpress's own dense reading of it does, near the original; in_proj is
    compressed whole (vLLM loads it as one merged linear), the convolution and the state's
    parameters stay as stored, and vLLM's loading rules pass."""
    _, _, in_proj, kept, _ = _family(model)
    kl = each_quantizer(model, wikitext, tmp_path, ids, kept, f"{in_proj}.weight_packed")
    # measured on bamba: rtn 0.0105, awq 0.0079, gptq+tune 0.0067, int8 0.00005
    assert kl["awq"] < 1.15 * kl["rtn"], kl
    assert kl["gptq+tune"] < 2 * kl["rtn"] + 1e-3, kl
    assert kl["int8"] < kl["rtn"], kl


def test_the_c_step_equals_torch_s(w4):
    """The Mamba mixing every CPU prompt and decode row runs (kernels/cpu/mamba.c) against
    the torch path (the one off the CPU): a prompt from zeros, then a chunk continuing its
    state, each layer's output and the states it leaves."""
    weights = load_weights(resolve(str(w4)), device="cpu")
    x = torch.randn(LENGTH, weights.shape.hidden, generator=torch.Generator().manual_seed(1))
    nets = {i: layer.mixer for i, layer in enumerate(weights.layers) if layer.mixer}
    assert tuple(nets) == weights.spec.linear_layers
    for i, m in nets.items():
        got, want = [], []
        c_states, t_states = MixerStates(nets, 1, "cpu"), MixerStates(nets, 1, "cpu")
        for a, b in ((0, 40), (40, LENGTH)):
            got.append(m.mix(x[a:b], [(0, 0, b - a, a == 0)], c_states, i))
            tail, state = t_states.start(i, 0, a == 0)
            want.append(m._rows(m.in_proj(x[a:b]), tail, state))  # (as mix reads them)
        assert (torch.cat(got) - torch.cat(want)).abs().max() < 1e-5, i
        assert torch.allclose(c_states.state[i], t_states.state[i], rtol=0, atol=1e-5), i
        assert torch.equal(c_states.conv[i], t_states.conv[i]), i


def test_runtime_logits_equal_transformers(model, w4, ids):
    """The runtime's Mamba layers (each slot's convolution tail and state beside the cache,
    token by token) compute what transformers' chunked scan does: on the original and on
    the artifact's weights alone, a whole prompt at once."""
    runtime_matches_transformers(model, w4, ids, 1e-4)


@pytest.mark.parametrize("kv", ["none", "int8"])
@pytest.mark.parametrize("exact", [True, False], ids=["weights", "served"])
def test_chunks_decode_steps_and_a_batch_continue_each_slots_state(w4, ids, exact, kv):
    """A prompt prefilled in two chunks over a slot another sequence used before, then
    decoded token by token beside another sequence, gives the logits one pass over the
    whole gives (served and exact, an fp32 and an int8 KV cache that holds the attention
    layer alone); the other sequence's rows equal its own pass alone."""
    weights = load_weights(resolve(str(w4)), device="cpu")
    model = Model(weights, LENGTH + 1, exact=exact)
    cache = cache_for(weights, 2, LENGTH, parse_kv(kv))
    assert cache.shape[0] == 1  # the attention layer's keys and values alone
    other = torch.flip(ids[0], [0])
    model.prefill(other[:40], cache, 0)  # what slot 0 held before
    whole = model.prefill(ids[0], cache, 1)
    prefix = [] if kv == "int8" else None  # the prompt's k/v in fp32, as serve keeps it
    (first,) = model.prefill_batch([Chunk(ids[0, :30], 0, 0, True, prefix)], cache)
    (second,) = model.prefill_batch([Chunk(ids[0, 30:50], 0, 30, True, prefix)], cache)
    rows = [first, second]
    model.prefill(other[:50], cache, 1)  # slot 1: another sequence, decoded beside
    for t in range(50, LENGTH):
        step = model.decode(torch.stack([ids[0, t], other[t]]), cache, torch.tensor([0, 1]))
        rows.append(step[:1])
    # (decode rows read an int8 cache as stored, where the whole pass reads its own rows)
    end = len(whole) if kv == "none" else 50
    assert (torch.cat(rows)[:end] - whole[:end]).abs().max() < 1e-4
    alone = Model(weights, LENGTH + 1, exact=exact)
    cache = cache_for(weights, 1, LENGTH, parse_kv(kv))
    alone.prefill(other[:50], cache, 0)
    for t in range(50, LENGTH):
        last = alone.decode(other[t : t + 1], cache, torch.tensor([0]))
    assert (last - step[1:]).abs().max() < 1e-4


@pytest.mark.parametrize("kv", ["none", "int8"])
def test_the_one_call_steps_equal_the_per_op_path(w4, ids, kv):
    """The one-call C decoder runs the Mamba layers too (layers.c's QMamba, its states bound
    to the cache's): a prompt in two chunks, the second in a step with another sequence's
    decode row, then decode steps of both give the per-op path's logits and leave the same
    states, over an fp32 and an int8 KV cache of the attention layer alone."""
    one_call_equals_per_op(w4, ids, kv)


def test_the_triton_backend_runs_it(w4, ids):
    """The GPU backend (compiled on a GPU, or on CPU tensors under TRITON_INTERPRET=1):
    the Mamba layers in torch's ops beside Triton's attention and products, a prefill then
    decode steps equal to transformers' forward on the artifact's fp32 weights."""
    triton_steps_match_reference(w4, ids, "cuda" if torch.cuda.is_available() else "cpu")


def test_bench_eval_and_the_engine_run_it_and_refuse_what_they_cannot(
    model, w4, wikitext, tmp_path
):
    """bench decodes it, eval measures it as served and by its weights; speculation, an
    asked-for prefix cache and pruning refuse it in one line each; the engine generates for
    two prompts at once what it does for each alone."""
    runs_and_refuses(model, w4, wikitext, tmp_path, _family(model)[-1])


@pytest.mark.parametrize("rope", ["rope", None])
def test_granite_4_with_attention_alone_and_its_experts_refused(tmp_path, tokenizer_dir, ids, rope):
    """Granite 4.0 Micro, 1B and 350M are granitemoehybrid with attention in every layer
    and rope (the H models have Mamba layers and none): the block walk and the runtime
    compute transformers' logits either way; a model with experts beside the shared MLP
    (H-Tiny, H-Small) is refused in one line."""
    src = write_family(
        tmp_path / "dense", "granitemoehybrid", tokenizer_dir,
        layer_types=["attention"] * 2, num_hidden_layers=2, position_embedding_type=rope,
    )  # fmt: skip
    assert adapter_for(json.loads((src / "config.json").read_text())).linear_layers == ()
    want = _logits(src, ids)
    walk = BlockwiseOriginal(resolve(str(src)), ids, log=lambda _: None)
    assert (walk.reference(0, ids[0]) - torch.log_softmax(want[:-1], -1)).abs().max() < 1e-4
    got = RuntimeLM(load_weights(resolve(str(src)), device="cpu"), LENGTH)(ids).logits[0]
    assert (got - want).abs().max() < 1e-4
    moe = write_family(tmp_path / "moe", "granitemoehybrid", tokenizer_dir, num_local_experts=4)
    with pytest.raises(LlmpressError, match=r"^granitemoehybrid: num_local_experts \(experts"):
        resolve(str(moe))


def test_jamba_with_experts_is_refused(tmp_path, tokenizer_dir):
    """Jamba Mini and Large put experts in every other layer: refused in one line."""
    src = write_family(tmp_path / "moe", "jamba", tokenizer_dir, num_experts=4)
    with pytest.raises(LlmpressError, match=r"^jamba: experts beside the Mamba layers"):
        resolve(str(src))


def test_serve_answers_the_openai_client(w4):
    """serve: the openai client's greedy completion, the same twice (the second request
    takes a slot the first left: its Mamba state starts from zeros again)."""
    replies = serve_greedy_twice(w4)
    assert [r.usage.completion_tokens for r in replies] == [8, 8]
    assert replies[0].choices[0].text == replies[1].choices[0].text
