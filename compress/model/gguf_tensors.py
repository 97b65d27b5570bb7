"""A GGUF file's tensors as a safetensors checkpoint, one tensor at a time.

transformers' GGUF loader builds the whole model in memory (a 7B in fp32: 28 GB). Here
each tensor is read from the memory-mapped file, dequantized with the gguf package, put
back in the layout checkpoints of its family use, and appended to the output (sharded at
5 GB), so memory is the largest tensor whatever the model's size.

What llama.cpp's converter changed, undone here (as transformers' reader does):
- names: the gguf package's own map between checkpoint and GGUF names;
- llama, granite, smollm3, mistral3, arcee (llama.cpp's "normal" rope): each q/k head's
  rotary halves were interleaved;
- gemma, gemma2, gemma3, nemotron: norms' weights were stored as 1 + w;
- q, k and v stored as one attn_qkv (ChatGLM; `--fuse-qkv`): cut apart by rows;
- Mixture-of-Experts: each layer's experts were stacked into one tensor per projection
  (early Mixtral files hold one tensor per expert; both are read);
- stablelm: StableLM 2 12B's per-head q/k norm modules were stacked into one tensor each;
- apertus: each layer's xIELU parameters became header arrays (`xielu.alpha_p`, ...),
  written back as the layer's act_fn tensors;
- deepseek2: kv_b_proj was split into attn_k_b (each head's key part, transposed) and
  attn_v_b, put back together (files of older converters hold attn_kv_b whole);
- gptneox: the fused q/k/v's rows were regrouped from head by head into q, then k, then
  v; its head is `embed_out` in checkpoints (transformers' model calls it lm_head);
- granitehybrid (Granite 4.0 H): A_log as -exp(A_log), dt_bias as dt_proj.bias, conv1d
  squeezed, A, D and the gated norm reshaped; q/k in LlamaModel's layout (even without
  rope); the MLP's input_linear cut into ffn_gate and ffn_up;
- qwen35, qwen35moe, qwen3next (Gated DeltaNet layers): every norm but the DeltaNet's own
  stored as 1 + w, A_log as -exp(A_log), dt_bias renamed dt_proj.bias, conv1d squeezed;
  Qwen3.5's value heads tiled (value head j of key head k moved to j · key heads + k, so
  that ggml's broadcast of the key heads meets them) in every tensor that has them;
  Qwen3-Next's in_proj_qkvz cut into all q, k and v rows (attn_qkv) and all z rows
  (attn_gate), put back key head by key head (older files hold it whole, as ssm_in).
Values keep the precision the file holds them in: F16/BF16/F32 tensors stay so, quantized
ones become fp32 (a Q4_1 value, a 16-bit scale times a 4-bit code plus an offset, needs
more mantissa than bf16 or fp16 have), so the converted model is exactly the GGUF's.
"""

from __future__ import annotations

import json
import mmap
import re
from pathlib import Path

import numpy as np
import torch

from compress.artifact.stream_safetensors import write_produced
from compress.errors import LlmpressError
from compress.model.adapters import adapter_for

SHARD_BYTES = 5 * 10**9
_NATIVE = {
    "F32": ("F32", torch.float32),
    "F16": ("F16", torch.float16),
    "BF16": ("BF16", torch.bfloat16),
}
_EXPERT = re.compile(r"(?P<prefix>.*)\.experts\.(?P<e>\d+)\.(?P<proj>\w+)\.weight$")
# one head's q/k norm of StableLM 2 12B, which llama.cpp's converter stacks per layer into
# blk.N.attn_q_norm / attn_k_norm [heads, head_dim]
_HEAD_NORM = re.compile(
    r"layers\.(?P<block>\d+)\.self_attn\.(?P<qk>q|k)_layernorm\.norms\.(?P<h>\d+)\.weight$"
)
# a learned activation's parameters, which llama.cpp keeps per layer in the header
_HEADER_PARAM = re.compile(r"\.(?P<layer>\d+)\.mlp\.act_fn\.(?P<key>alpha_p|alpha_n|beta|eps)$")


def checkpoint_shapes(config) -> dict[str, tuple[int, ...]]:
    """Every tensor a checkpoint of transformers config `config` holds, with its shape, in
    the model's order (experts one by one, as checkpoints name them; no tied head)."""
    from transformers import AutoModelForCausalLM

    from compress.model.moe import install_experts

    config_dict = config.to_dict()
    adapter = adapter_for(config_dict)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(config)
    spec = adapter.spec(config_dict)
    if spec.mlp is not None:
        install_experts(skeleton, adapter, spec)
    shapes = {n: tuple(t.shape) for n, t in skeleton.state_dict().items()}
    shapes = adapter.checkpoint_names(shapes)  # gpt_neox's head: embed_out, not lm_head
    if config.tie_word_embeddings:
        shapes.pop(f"{adapter.lm_head}.weight", None)
    return shapes


def write_tensors(path: Path, out: Path, arch: str, config) -> str | None:
    """Write `path`'s tensors into `out` as the checkpoint of `config` (transformers'
    config of the file, gguf_config) names and lays them out. Returns the 16-bit dtype the
    linears were stored in, or None (fp32)."""
    import gguf
    from gguf.quants import dequantize

    reader = gguf.GGUFReader(str(path))
    tensors = {t.name: t for t in reader.tensors}
    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(enum, config.num_hidden_layers)
    shapes = checkpoint_shapes(config)
    expert_names = adapter_for(config.to_dict()).expert_names
    roles = dict(zip(expert_names, ("gate", "up", "down"), strict=True))
    # checkpoint name -> (GGUF name, expert, rows, part): rows (first, end) of a fused
    # q/k/v, and the name of that part (attn_q, ...), whose layout is undone
    sources: dict[str, tuple[str, int | None, tuple[int, int] | None, str]] = {}
    fused_rows = _fused_qkv_rows(config)
    header = {}  # checkpoint name -> its value, held in the header
    for name in shapes:
        param = _HEADER_PARAM.search(name)
        if param:
            header[name] = _header_value(reader, path, param["key"], int(param["layer"]))
            continue
        head_norm = _HEAD_NORM.search(name)
        if head_norm:  # row h of the layer's stacked norms
            stacked = f"blk.{head_norm['block']}.attn_{head_norm['qk']}_norm.weight"
            h = int(head_norm["h"])
            sources[name] = (stacked, None, (h, h + 1), stacked)
            continue
        expert = _EXPERT.match(name)
        if expert:
            block = name.split(".")[2]
            proj = roles[expert["proj"]]  # mixtral's w1/w3/w2, others' gate/up/down_proj
            e, stacked = int(expert["e"]), f"blk.{block}.ffn_{proj}_exps.weight"
            single = f"blk.{block}.ffn_{proj}.{e}.weight"  # early Mixtral files: one each
            early = stacked not in tensors and single in tensors
            sources[name] = (single, None, None, single) if early else (stacked, e, None, stacked)
            if sources[name][0] not in tensors:
                raise LlmpressError(
                    f"{path.name} has no tensor for {name} (looked for {stacked} and "
                    f"{single}): the file is incomplete or of another model; re-download it"
                )
            continue
        # a choice bias is written as <module>.e_score_correction.bias (llama.cpp's rename),
        # a DeltaNet's dt_bias as dt_proj.bias
        lookup = re.sub(r"e_score_correction_bias$", "e_score_correction.bias", name)
        lookup = re.sub(r"(linear_attn|mamba)\.dt_bias$", r"\1.dt_proj.bias", lookup)
        target = names.get_name(lookup, try_suffixes=(".weight", ".bias"))
        if arch == "granitehybrid" and ".shared_mlp." in name:  # (its dense MLP, cut)
            block = name.split(".")[2]
            if "input_linear" in name:  # gate's rows, then up's
                sources[name] = (f"blk.{block}.ffn_gate.weight", None, None, _JOIN_GATE_UP)
                continue
            target = f"blk.{block}.ffn_down.weight"
        qkv = (target or "").replace("ssm_in.weight", "attn_qkv.weight")
        if target != qkv and target not in tensors and qkv in tensors:  # Qwen3-Next's, cut
            sources[name] = (qkv, None, None, _JOIN_QKVZ)  # with attn_gate: produce joins
            continue
        part = _FUSED_QKV.match(target or "")
        fused = part and f"{part[1]}qkv{part[3]}"
        if target not in tensors and fused in tensors:  # q, k and v in one tensor
            sources[name] = (fused, None, fused_rows[part[2]], target)
            continue
        k_b = (target or "").replace("attn_kv_b", "attn_k_b")
        if target and target.endswith("attn_kv_b.weight") and k_b in tensors:
            sources[name] = (k_b, None, None, _SPLIT_KV_B)  # with attn_v_b: produce joins them
            continue
        if target is None or target not in tensors:
            raise LlmpressError(
                f"{path.name} has no tensor for {name} (looked for {target}): the file is "
                "incomplete or of another model; re-download it"
            )
        sources[name] = (target, None, None, target)

    def stored(name: str) -> tuple[str, torch.dtype]:
        if name in header:
            return "F32", torch.float32
        gguf_name = sources[name][0]
        return _NATIVE.get(tensors[gguf_name].tensor_type.name, ("F32", torch.float32))

    def read(t, expert):
        if t.tensor_type.name in _NATIVE:
            return np.array(t.data[expert] if expert is not None else t.data)  # off the map
        return dequantize(t.data[expert] if expert is not None else t.data, t.tensor_type)

    def produce(name: str) -> torch.Tensor:
        if name in header:
            return torch.full(shapes[name], header[name], dtype=torch.float32)
        gguf_name, expert, rows, part = sources[name]
        t = tensors[gguf_name]
        data = read(t, expert)
        if part == _SPLIT_KV_B:  # [heads, rank, nope] transposed back, beside [heads, v, rank]
            v_b = read(tensors[gguf_name.replace("attn_k_b", "attn_v_b")], None)
            data = np.concatenate([data.swapaxes(1, 2), v_b], axis=1)
        if part == _JOIN_GATE_UP:
            data = np.concatenate(
                [data, read(tensors[gguf_name.replace("ffn_gate", "ffn_up")], None)]
            )
        if part == _JOIN_QKVZ:
            z = read(tensors[gguf_name.replace("attn_qkv", "attn_gate")], None)
            data = _qkvz(data, z, config)
        if rows is not None:  # its part of a fused q/k/v: rows of the [out, in] matrix
            data = data.reshape(int(t.shape[-1]), -1)[rows[0] : rows[1]]
        w = torch.from_numpy(np.ascontiguousarray(data)).reshape(shapes[name])
        w = _undo_layout(arch, part, w, config).to(stored(name)[1])
        _drop_pages(reader)
        return w

    specs = [(name, stored(name)[0], list(shape)) for name, shape in shapes.items()]
    write_produced(out, specs, produce, SHARD_BYTES)
    dtypes = {d for _, d, _ in specs if d != "F32"}
    return {"F16": "float16", "BF16": "bfloat16"}.get(dtypes.pop()) if len(dtypes) == 1 else None


def _header_value(reader, path: Path, key: str, layer: int) -> float:
    """Layer `layer`'s value of header key `xielu.<key>`: an array with one per layer, or
    one value for all (llama.cpp's get_key_or_arr)."""
    field = reader.fields.get(f"xielu.{key}")
    if field is None:
        raise LlmpressError(
            f"{path.name} has no xielu.{key} (each layer's xIELU parameter): the file is "
            "incomplete or of another model; re-download it"
        )
    value = field.contents()
    return float(value[layer] if isinstance(value, list) else value)


_SPLIT_KV_B = "split kv_b"  # a source part: attn_k_b and attn_v_b, joined into kv_b_proj
_JOIN_QKVZ = "split qkvz"  # a source part: attn_qkv and attn_gate, joined into in_proj_qkvz
_JOIN_GATE_UP = "split gate_up"  # ffn_gate and ffn_up, joined into Granite 4.0's input_linear


def _qkvz(qkv: np.ndarray, z: np.ndarray, config) -> np.ndarray:
    """Qwen3-Next's in_proj_qkvz from its converter's attn_qkv (all q rows, all k rows, all
    v rows) and attn_gate (all z rows): per key head its q, its k, its value heads' v,
    their z, as the checkpoint holds them."""
    nk, hk = config.linear_num_key_heads, config.linear_key_head_dim
    width = config.linear_num_value_heads * config.linear_value_head_dim // nk  # per key head
    q, k, v = np.split(qkv, [nk * hk, 2 * nk * hk])
    if v.shape[0] != nk * width or z.shape[0] != nk * width:
        raise LlmpressError(
            f"attn_qkv and attn_gate hold {v.shape[0]} and {z.shape[0]} value rows where the "
            f"header's widths give {nk * width}: the file is damaged; re-download it"
        )
    parts = [p.reshape(nk, -1, p.shape[-1]) for p in (q, k, v, z)]
    return np.concatenate(parts, axis=1).reshape(-1, qkv.shape[-1])


# blk.N.attn_q/k/v.{weight,bias}: the parts llama.cpp's converters may store fused as
# blk.N.attn_qkv (ChatGLM's query_key_value; `--fuse-qkv`), rows q, then k, then v
_FUSED_QKV = re.compile(r"^(blk\.\d+\.attn_)(q|k|v)(\.(?:weight|bias))$")


def _fused_qkv_rows(config) -> dict[str, tuple[int, int]]:
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    q, k = heads * head_dim, kv * head_dim
    return {"q": (0, q), "k": (q, q + k), "v": (q + k, q + 2 * k)}


def _drop_pages(reader) -> None:
    """Unmap the file pages read so far: they are the page cache's, but count in this
    process's resident memory until dropped (a 4 GB GGUF would otherwise end at 4 GB)."""
    view = getattr(reader.data, "_mmap", None)
    if view is not None and hasattr(mmap, "MADV_DONTNEED"):
        view.madvise(mmap.MADV_DONTNEED)


# architectures whose converter interleaves each q/k head's rotary halves (llama.cpp's
# LlamaModel and its subclasses; olmo2, exaone4, glm4 and ernie4_5 keep transformers' layout)
_INTERLEAVED_ROPE = ("llama", "granite", "smollm3", "mistral3", "arcee", "granitehybrid")


# architectures whose converter stores each norm's weight as 1 + w (gemma's and nemotron's
# norms compute with 1 + w; llama.cpp's graphs then multiply by the weight as stored)
_NORMS_PLUS_ONE = ("gemma", "gemma2", "gemma3", "nemotron")


# Gated DeltaNet architectures (llama.cpp's Qwen3NextModel and its Qwen3.5 subclasses)
_DELTANET = ("qwen35", "qwen35moe", "qwen3next")
# the tensors of Qwen3.5's DeltaNets that llama.cpp's converter tiles the value heads of:
# GGUF name suffix -> (the dimension, each head's width there: "v" for a value head's)
_TILED = {
    "attn_qkv.weight": (0, "v"),  # the v rows, after q's and k's
    "attn_gate.weight": (0, "v"),
    "ssm_beta.weight": (0, 1),
    "ssm_alpha.weight": (0, 1),
    "ssm_a": (0, 1),
    "ssm_dt.bias": (0, 1),
    "ssm_conv1d.weight": (0, "v"),  # the v channels, after q's and k's
    "ssm_out.weight": (1, "v"),  # its input columns
}


def _deltanet_layout(arch: str, gguf_name: str, w: torch.Tensor, config) -> torch.Tensor:
    """A DeltaNet family's tensor as its checkpoint holds it (see the module docstring)."""
    if gguf_name.endswith("norm.weight") and not gguf_name.endswith("ssm_norm.weight"):
        return w - 1
    if gguf_name.endswith(".ssm_a"):
        w = torch.log(-w)  # -exp(A_log) stored
    suffix = next((s for s in _TILED if gguf_name.endswith("." + s)), None)
    nk, nv = config.linear_num_key_heads, config.linear_num_value_heads
    if arch == "qwen3next" or suffix is None or nk == nv:
        return w
    dim, width = _TILED[suffix]
    width = config.linear_value_head_dim if width == "v" else width
    qk = (
        2 * nk * config.linear_key_head_dim
        if suffix in ("attn_qkv.weight", "ssm_conv1d.weight")
        else 0
    )
    head, tiled = w.narrow(dim, 0, qk), w.narrow(dim, qk, w.shape[dim] - qk)
    # position j · nk + k holds value head j of key head k: back to k · (nv / nk) + j
    heads = tiled.unflatten(dim, (nv // nk, nk, width)).transpose(dim, dim + 1)
    return torch.cat([head, heads.flatten(dim, dim + 2)], dim)


def _undo_layout(arch: str, gguf_name: str, w: torch.Tensor, config) -> torch.Tensor:
    if arch in _DELTANET:
        return _deltanet_layout(arch, gguf_name, w, config)
    if arch == "granitehybrid" and gguf_name.endswith(".ssm_a"):
        return torch.log(-w)  # -exp(A_log) stored
    q_or_k = ("attn_q.weight", "attn_k.weight", "attn_q.bias", "attn_k.bias")
    if arch in _INTERLEAVED_ROPE and gguf_name.endswith(q_or_k):
        heads = config.num_attention_heads if "attn_q" in gguf_name else config.num_key_value_heads
        halves = w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:])
        return halves.transpose(1, 2).reshape(w.shape)
    if arch in _NORMS_PLUS_ONE and gguf_name.endswith("norm.weight"):
        return w - 1
    if arch == "gptneox" and gguf_name.endswith(("attn_qkv.weight", "attn_qkv.bias")):
        parts = w.reshape(3, config.num_attention_heads, -1, *w.shape[1:])
        return parts.transpose(0, 1).reshape(w.shape)  # [heads, 3, head_dim, ...]
    return w


def write_config(config, out: Path, dtype: str | None) -> None:
    """config.json (and generation_config.json) of the converted checkpoint."""
    from transformers import GenerationConfig

    config.save_pretrained(str(out))
    GenerationConfig.from_model_config(config).save_pretrained(str(out))
    data = json.loads((out / "config.json").read_text())
    data.pop("quantization_config", None)
    data["architectures"] = [adapter_for(data).architecture]
    data["dtype"] = dtype or "float32"
    (out / "config.json").write_text(json.dumps(data, indent=2, sort_keys=True))
