"""One decoder block at a time, read from safetensors as needed.

Calibrating stages never hold the whole model: the skeleton lives on the meta device,
a block is materialized (in fp32, whatever the checkpoint dtype, so searches never
overflow) when its turn comes and dropped after, and calibration activations are
carried from block to block. Peak memory is one block plus the activations.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from functools import lru_cache

import torch

from compress.allocator import THRESHOLD
from compress.distributed import all_sum
from compress.model.aliases import install_aliases
from compress.model.loading import Checkpoint, each_tensor, read_tensors
from compress.model.moe import install_experts, moe_modules
from compress.model.rope import RopeSpec, tables
from compress.model.spec import BlockSpec, hf_config

# Samples pushed through a block at once, at most: bounds the MLP intermediates to a few
# hundred MB.
CHUNK = 8


def chunk_samples(length: int, widest: int, device: torch.device | str) -> int:
    """Samples a block's forward takes at once. On the CPU, as many as keep its widest
    activation [samples, length, widest] in fp32 under the allocator's mmap threshold (at
    least one, at most CHUNK): a larger temporary is mapped, faulted in and unmapped anew
    each time it is made. The README's compress of the default model (16 × 512 tokens,
    MLP 1536 wide: one sample a chunk, not 8) took 0.5 million page faults instead of 6
    and 4 s of system time instead of 14. Elsewhere CHUNK (a device's allocator keeps its
    memory)."""
    if torch.device(device).type != "cpu":
        return CHUNK
    return max(1, min(CHUNK, THRESHOLD // (4 * length * widest)))


def skeleton(config: dict, adapter=None) -> torch.nn.Module:
    """The transformers model of `config` on the meta device, its experts' linears as
    checkpoints name them: modules are materialized one at a time."""
    from transformers import AutoModelForCausalLM

    from compress.model.adapters import adapter_for

    adapter = adapter or adapter_for(config)
    hf = hf_config(config)
    spec = adapter.spec(config)
    hf._attn_implementation = attention_kernel(spec)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf)
    if spec.mlp is not None:  # per-expert linears, as the checkpoint names them
        install_experts(model, adapter, spec)
    install_aliases(model, adapter)
    for layer in model.get_submodule(adapter.blocks):  # (Bamba's also return attention's
        layer.register_forward_hook(_hidden_only)  # weights)
    return model


def _hidden_only(module, args, output):
    """A block's output as every stage takes it: the hidden states alone."""
    return output[0] if isinstance(output, tuple) else output


class BlockStore:
    def __init__(self, ckpt: Checkpoint, device: torch.device | str = "cpu"):
        self.ckpt = ckpt
        self.device = torch.device(device)  # where blocks are materialized
        self.adapter = ckpt.adapter
        self.spec = self.adapter.spec(ckpt.config)
        self.skeleton = skeleton(ckpt.config, self.adapter)
        self.hf_config = self.skeleton.config

    @property
    def num_layers(self) -> int:
        return self.ckpt.num_layers

    def read(self, names: list[str]) -> dict[str, torch.Tensor]:
        return read_tensors(self.ckpt, names)

    def block(self, i: int) -> torch.nn.Module:
        """Block i with its weights loaded, in fp32, on the store's device."""
        return self.module(self.adapter.block_prefix(i))

    def module(self, path: str) -> torch.nn.Module:
        """The skeleton's module at `path` (a block, the final norm) with its weights
        loaded, in fp32, on the store's device (moved as stored, widened there)."""
        prefix = path + "."
        names = [n for n in self.ckpt.tensors if n.startswith(prefix)]
        # one stored tensor at a time: widened, then let go (with the whole stored block
        # held until the last was widened, a DeepSeek-V2-Lite block peaked at 1.5x its fp32)
        stored = each_tensor(self.ckpt, names)
        tensors = {n[len(prefix) :]: t.to(self.device).float() for n, t in stored}
        tensors = self.adapter.model_names(tensors)  # (param_aliases: the block's own)
        module = self.skeleton.get_submodule(path)
        module.to_empty(device=self.device)
        module.load_state_dict(tensors, strict=True, assign=True)
        return module.eval()

    def release(self, i: int) -> None:
        self.skeleton.get_submodule(self.adapter.block_prefix(i)).to("meta")

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Hidden states entering block 0 for token ids [n, L] (scaled where the family
        scales its embedding, as gemma's does by sqrt(hidden))."""
        name = f"{self.adapter.embed}.weight"
        weight = self.read([name])[name]  # rows looked up as stored, then widened: the
        hidden = torch.nn.functional.embedding(ids, weight).float()  # table never in fp32
        return hidden * self.spec.embed_scale if self.spec.embed_scale != 1.0 else hidden

    def position_embeddings(self, length: int) -> Positions:
        widest = _widest(self.hf_config, self.spec)
        chunk = chunk_samples(length, widest, self.device)
        dn = self.adapter.deltanet or self.adapter.mamba or self.adapter.short_conv
        return Positions(
            self.spec, length, chunk, self.adapter.rope_tables, self.adapter.attn,
            dn.module if dn else None,
        )  # fmt: skip


def _widest(hf, spec: BlockSpec) -> int:
    """The widest activation a block's forward makes per token: the residual stream, the
    attention heads, the MLP's (a fused gate/up's two halves at once)."""
    heads = hf.num_attention_heads * (
        getattr(hf, "head_dim", None) or hf.hidden_size // hf.num_attention_heads
    )
    mlp = max(
        getattr(hf, name, None) or 0
        for name in (
            "intermediate_size",
            "moe_intermediate_size",
            "shared_expert_intermediate_size",
        )
    )
    return max(hf.hidden_size, heads, mlp * (2 if spec.fused_checkpoint else 1))


def attention_kernel(spec: BlockSpec) -> str:
    """transformers' attention for a block: SDPA, except where scores are softcapped
    (gemma2) or a sink joins the softmax (gpt-oss, granite_swa), which SDPA cannot do:
    eager, which then needs an explicit causal mask."""
    return "eager" if spec.attn_softcap or spec.attn_sinks else "sdpa"


@dataclass(frozen=True)
class Positions:
    """What a block's forward takes besides its input, for sequences of `length` tokens:
    the rope of the block's layer type (from the BlockSpec, the tables the runtime uses)
    and, on a sliding-window layer shorter than the sequence or under eager attention
    (attention_kernel), the mask."""

    spec: BlockSpec
    length: int
    chunk: int = CHUNK  # samples a forward takes at once (chunk_samples)
    tables: str = "halves"  # the form the layer takes its rope in (Adapter.rope_tables)
    attn: str = "self_attn"  # the block's attention module (the adapter's `attn`)
    linear: str | None = None  # a recurrent layer's mixer module (Adapter.deltanet, .mamba)

    def kwargs(self, block: torch.nn.Module) -> dict:
        i = _mixer(block, self.attn, self.linear).layer_idx
        eager = attention_kernel(self.spec) == "eager"
        rope, window = self.spec.rope[i], self.spec.windows[i]
        return _block_kwargs(rope, window, self.length, _device(block), eager, self.tables)

    def prefix(self, length: int) -> Positions:
        return replace(self, length=length)


@lru_cache(maxsize=16)
def _block_kwargs(
    rope: RopeSpec,
    window: int | None,
    length: int,
    device,
    eager: bool = False,
    form: str = "halves",
) -> dict:
    """`eager`: the mask even where it is plain causal (SDPA is causal without one).
    `form`: the tables as the layer takes them (Positions.tables): cos/sin in two halves,
    each frequency's twice in a row ("pairs"), or cos + i·sin per frequency ("complex")."""
    cos, sin = tables(rope, length, device)
    if form == "pairs":
        rotary = (cos.repeat_interleave(2, -1)[None], sin.repeat_interleave(2, -1)[None])
    elif form == "complex":
        rotary = torch.complex(cos, sin)[None]
    else:
        rotary = (torch.cat((cos, cos), -1)[None], torch.cat((sin, sin), -1)[None])
    mask = None  # plain causal attention
    windowed = window is not None and length > window
    if windowed or eager:
        q, k = torch.arange(length)[:, None], torch.arange(length)[None]
        hidden = (k > q) | (k <= q - window) if windowed else k > q
        mask = torch.zeros(length, length).masked_fill(hidden, float("-inf"))
        mask = mask[None, None].to(device)
    kwargs = {"position_embeddings": rotary, "attention_mask": mask}
    if "llama_4_scaling_beta" in dict(rope.params):  # ministral3's attention reads positions
        kwargs["position_ids"] = torch.arange(length, device=device)[None]
    return kwargs


def _mixer(block: torch.nn.Module, attn: str, linear: str | None) -> torch.nn.Module:
    """The block's attention module, or its linear attention's where it has that."""
    if linear is not None and getattr(block, attn.split(".")[0], None) is None:
        return block.get_submodule(linear)
    return block.get_submodule(attn)


def _device(block: torch.nn.Module) -> torch.device:
    return next(block.parameters()).device


@torch.no_grad()
def run_block(block: torch.nn.Module, hidden: torch.Tensor, rope) -> torch.Tensor:
    """The block's output for every sample (causal attention), computed in chunks on the
    block's device; the output lives where `hidden` does (host memory, when the
    activations did not fit the device)."""
    out = torch.empty_like(hidden)
    device, kwargs, chunk = _device(block), rope.kwargs(block), rope.chunk
    for lo in range(0, hidden.shape[0], chunk):
        out[lo : lo + chunk] = block(hidden[lo : lo + chunk].to(device), **kwargs)
    return out


@torch.no_grad()
def observe_inputs(
    block: torch.nn.Module,
    hidden: torch.Tensor,
    rope,
    names,
    observe,
    outputs: torch.Tensor | None = None,
) -> None:
    """Run the block over every sample, calling observe(name, x) with each input x of the
    named sub-modules (chunk by chunk): how calibrating stages collect statistics. The
    block's outputs go into `outputs` when given (the same values run_block computes);
    without them a chunk's forward stops once every named input is seen (GPTQ's pass
    then skips down_proj's product, a quarter of the block's linear work)."""
    names = list(dict.fromkeys(names))
    fired: set[str] = set()
    stop_at = len(names) if outputs is None else None

    def hook(name):
        return _last(lambda _module, args: observe(name, args[0]), name, fired, stop_at)

    handles = [block.get_submodule(n).register_forward_pre_hook(hook(n)) for n in names]
    device, kwargs, chunk = _device(block), rope.kwargs(block), rope.chunk
    moes = moe_modules(block)
    try:
        for moe in moes:
            moe.observing = True
        for lo in range(0, hidden.shape[0], chunk):
            fired.clear()
            try:
                out = block(hidden[lo : lo + chunk].to(device), **kwargs)
            except _AllSeen:
                continue
            if outputs is not None:
                outputs[lo : lo + chunk] = out
    finally:
        for moe in moes:
            moe.observing = False
        for h in handles:
            h.remove()


@torch.no_grad()
def observe_pairs(
    block: torch.nn.Module,
    hidden: torch.Tensor,
    other: torch.Tensor,
    rope,
    names,
    observe,
    outputs: torch.Tensor | None = None,
    others: torch.Tensor | None = None,
    around_other=contextlib.nullcontext,
    kept: dict[str, list[torch.Tensor]] | None = None,
) -> None:
    """observe_inputs over `hidden`, calling observe(name, x, y) with each named module's
    input x and its input y when the block is fed `other` (the same samples, e.g. the
    original model's hidden states there), chunk by chunk: what a stage needs to fit
    x-side weights to y-side outputs. Only for modules that see every token (no experts).
    The block's outputs on `hidden` go into `outputs`, on `other` into `others`; the
    passes over `other` run inside `around_other()` (e.g. with the weights swapped).

    A pass whose output is not wanted stops once every named input is seen: measuring
    q/k/v's input costs the input norm, not the block. `kept` ({name: []}) keeps the other
    side's inputs of its names, chunk by chunk, where `other`'s samples live: a later call
    whose names are all kept runs no pass over `other` (its side does not change)."""
    names, kept = list(names), {} if kept is None else kept
    size = rope.chunk
    starts = range(0, hidden.shape[0], size)
    storing = [n for n in kept if len(kept[n]) < len(starts)]
    served = others is None and all(len(kept.get(n, ())) == len(starts) for n in names)
    seen: dict[str, torch.Tensor] = {}

    def keep(name, _chunk):
        def hook(_module, args):
            seen[name] = args[0]
            if name in storing:
                kept[name].append(args[0].to(other.device, copy=True))  # the forward may reuse it

        return hook

    def pair(name, chunk):
        def hook(_module, args):
            y = seen.pop(name) if name in seen else kept[name][chunk].to(args[0].device)
            observe(name, args[0], y)

        return hook

    device, kwargs = _device(block), rope.kwargs(block)
    for chunk, lo in enumerate(starts):
        passes = [
            (other, keep, others, around_other, [*names, *(n for n in storing if n not in names)]),
            (hidden, pair, outputs, contextlib.nullcontext, names),
        ]
        for source, hook, into, around, hooked in passes[served:]:
            fired: set[str] = set()
            handles = [
                block.get_submodule(n).register_forward_pre_hook(
                    _last(hook(n, chunk), n, fired, len(hooked) if into is None else None)
                )
                for n in hooked
            ]
            try:
                with around():
                    out = block(source[lo : lo + size].to(device), **kwargs)
            except _AllSeen:
                continue
            finally:
                for h in handles:
                    h.remove()
            if into is not None:
                into[lo : lo + size] = out


def _last(hook, name: str, fired: set, stop_at: int | None):
    """`hook`, then stop the forward once `stop_at` distinct hooked inputs are seen."""

    def call(module, args):
        hook(module, args)
        fired.add(name)
        if stop_at is not None and len(fired) == stop_at:
            raise _AllSeen

    return call


class _AllSeen(Exception):
    """Raised inside a forward once every observed input is seen: the rest is not needed."""


@torch.no_grad()
def route_calibration(block: torch.nn.Module, hidden: torch.Tensor, rope) -> dict:
    """Run the block once over the calibration inputs, counting the tokens routed to each
    expert; experts that received fewer than their input width are calibrated on every
    token from then on. Returns the manifest's record of it."""
    (moe,) = moe_modules(block)
    moe.counts = torch.zeros(len(moe.experts), dtype=torch.long)
    moe.all_tokens = set()
    try:
        run_block(block, hidden, rope)
        counts = all_sum(moe.counts).tolist()  # over the ranks' samples
    finally:
        moe.counts = None
    width = hidden.shape[-1]
    moe.all_tokens = {e for e, n in enumerate(counts) if n < width}
    return {"routed_tokens": counts, "calibrated_on_all_tokens": sorted(moe.all_tokens)}
