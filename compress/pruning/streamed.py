"""The prune stage in memory bounded by one block: its scores, its layer-removal and
candidate KLs, and its surgery, read from the checkpoint block by block.

Pruning the experts of a Mixture-of-Experts model people ship (Qwen3-30B-A3B, GLM-4.5-Air)
with the whole model in fp32 takes 4 bytes a parameter: 120 GB and 424 GB. Here a block
is materialized in fp32 when its turn comes (model/blocks.BlockStore) and the
calibration activations are carried from block to block, as in the quantizing walk. The
hooks are the whole-model pass's (importance.Scores), so are the scores, up to the order
of float sums. The layer-removal and candidate KLs carry one stream of the drift samples
per removed layer or candidate through the same sweep, and the pruned checkpoint is
written block by block from the tensors as stored (its rescaled embedding and norm, where
a family scales its embedding, in fp32).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from tqdm.auto import tqdm

from compress import distributed
from compress.artifact.stream_safetensors import merge
from compress.model.adapters import Widths, adapter_for
from compress.model.blocks import BlockStore, Positions, run_block, skeleton
from compress.pruning.importance import Importance, Scores
from compress.pruning.plan import Shape
from compress.pruning.surgery import Keep, prune_block, prune_globals
from compress.runtime.model import final_logits

SHARD_BYTES = 5 << 30  # the pruned checkpoint's shards, as the artifact's


@torch.no_grad()
def streamed_importance(
    store: BlockStore, samples: torch.Tensor, *, drift_samples: int = 0, chunk: int = 4
) -> Importance:
    """activation_importance's scores (and its layer-removal KL on the first
    `drift_samples` samples), one block in memory at a time."""
    adapter, n = store.adapter, store.num_layers
    config = store.ckpt.config
    scores = Scores(Widths.of(config), adapter, n, config["hidden_size"], store.device)
    # under torchrun each rank scores the whole chunks the whole-model pass would
    mine = samples[list(distributed.Shard.of(samples.shape[0], chunk).indices)]
    hidden = store.embed(mine)
    rope = store.position_embeddings(samples.shape[1])
    base = store.embed(samples[:drift_samples]) if drift_samples else None
    skipped: list[torch.Tensor] = []  # the drift samples with layer i skipped, for each i
    bar = tqdm(range(n), desc="importance", unit="block", disable=not distributed.is_writer())
    for i in bar:
        block = store.block(i)
        handles = scores.attach(i, block)
        try:
            hidden = run_block(block, hidden, rope)
        finally:
            scores.detach(i, block, handles)
        if base is not None:
            skipped = [run_block(block, h, rope) for h in skipped] + [base]
            base = run_block(block, base, rope)
        store.release(i)
    norm = store.module(adapter.final_norm)
    hook = scores.final_norm(norm)
    try:
        norm(hidden.to(_device(norm)))  # the activations' home may be host memory
    finally:
        hook.remove()
    result = scores.result(samples.numel())
    if base is not None:
        logits = _Head.of(store)
        reference = torch.log_softmax(logits(base, norm), -1)
        result.layer_drift = torch.tensor(
            [_kl(reference, logits(h, norm)) for h in skipped], device="cpu"
        )
    return result


@torch.no_grad()
def candidate_kls(
    store: BlockStore, samples: torch.Tensor, full: Shape, candidates: list[tuple[dict, Keep]]
) -> list[float]:
    """KL(original ‖ candidate) per token on `samples` for each (pruned config, kept
    units), unrepaired: each candidate's blocks cut from the original's as they are read."""
    adapter = store.adapter
    base = store.embed(samples)
    rope = store.position_embeddings(samples.shape[1])
    streams, models, ropes = [], [], []
    for config, keep in candidates:
        kept = torch.tensor(keep.hidden, device=base.device)  # the kept hidden channels
        streams.append(base.index_select(-1, kept))
        models.append(skeleton(config))
        spec = adapter_for(config).spec(config)
        ropes.append(Positions(spec, samples.shape[1], rope.chunk, rope.tables, rope.attn))
    bar = tqdm(range(store.num_layers), desc="candidates", unit="block",
               disable=not distributed.is_writer())  # fmt: skip
    for i in bar:
        block = store.block(i)
        # cut in host memory, as the surgery's indices are (a block's copy on a GPU run),
        # under the checkpoint's names the surgery reads (Adapter.param_aliases)
        state = {k: v.detach().cpu() for k, v in block.state_dict().items()}
        tensors = adapter.checkpoint_names(state)
        for c, (_, keep) in enumerate(candidates):
            if i not in keep.layers:
                continue
            new = keep.layers.index(i)
            prefix = adapter.block_prefix(new)
            cut = _under(prune_block(tensors, adapter, full, keep, new), prefix)
            cut = adapter.model_names(cut)
            module = _materialize(models[c], prefix, cut, store.device)
            streams[c] = run_block(module, streams[c], ropes[c])
            module.to("meta")
        base = run_block(block, base, rope)
        store.release(i)
    norm = store.module(adapter.final_norm)
    stored = _global_tensors(store, head_only=True)  # read once: the head is vocabulary-sized
    reference = torch.log_softmax(_Head(_head_weight(stored, adapter), store.spec)(base, norm), -1)
    kls = []
    for c, (config, keep) in enumerate(candidates):
        tensors = prune_globals(stored, adapter, full, keep)
        norm_c = _under(tensors, adapter.final_norm)
        norm_c = _materialize(models[c], adapter.final_norm, norm_c, store.device)
        head = _Head(_head_weight(tensors, adapter), adapter_for(config).spec(config))
        kls.append(_kl(reference, head(streams[c], norm_c)))
    return kls


def write_pruned(
    store: BlockStore, full: Shape, keep: Keep, config: dict, tokenizer, out: Path, source_sha: str
) -> None:
    """The pruned checkpoint at `out`, written block by block (rank 0 only under torchrun)."""
    adapter, ckpt = store.adapter, store.ckpt
    shutil.rmtree(out, ignore_errors=True)
    parts_dir = out / ".parts"
    parts_dir.mkdir(parents=True)
    from safetensors.torch import save_file

    parts = []
    for new, old in enumerate(tqdm(keep.layers, desc="pruned blocks", unit="block")):
        src = adapter.block_prefix(old) + "."
        names = [n for n in ckpt.tensors if n.startswith(src)]
        tensors = {n[len(src) :]: t for n, t in store.read(names).items()}
        parts.append(parts_dir / f"block-{new:05d}.safetensors")
        save_file(prune_block(tensors, adapter, full, keep, new), str(parts[-1]))
    parts.append(parts_dir / "rest.safetensors")
    tensors = prune_globals(_global_tensors(store), adapter, full, keep)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(parts[-1]))
    merge(parts, out, SHARD_BYTES, consume=True)
    parts_dir.rmdir()
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "llmpress_source.json").write_text(json.dumps({"sha256": source_sha}))
    tokenizer.save_pretrained(str(out))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (ckpt.path / name).is_file():
            shutil.copy2(ckpt.path / name, out / name)


def _global_tensors(store: BlockStore, head_only: bool = False) -> dict[str, torch.Tensor]:
    """The tensors outside the blocks as stored: the final norm, an untied lm_head, and
    (unless `head_only`) the embedding, or the embedding alone where the head is tied."""
    adapter, ckpt = store.adapter, store.ckpt
    head = f"{adapter.lm_head}.weight"
    tied = ckpt.config.get("tie_word_embeddings") or head not in ckpt.tensors
    blocks = adapter.blocks + "."
    names = [n for n in ckpt.tensors if not n.startswith(blocks) and not (tied and n == head)]
    if head_only:  # what the logits read
        names = [n for n in names if n.startswith((adapter.final_norm + ".", head))
                 or (tied and n.startswith(adapter.embed + "."))]  # fmt: skip
    return store.read(names)


def _head_weight(tensors: dict[str, torch.Tensor], adapter) -> torch.Tensor:
    head = f"{adapter.lm_head}.weight"
    return tensors[head] if head in tensors else tensors[f"{adapter.embed}.weight"]


def _under(tensors: dict[str, torch.Tensor], path: str) -> dict[str, torch.Tensor]:
    return {n[len(path) + 1 :]: t for n, t in tensors.items() if n.startswith(path + ".")}


def _materialize(model, path: str, tensors: dict[str, torch.Tensor], device) -> torch.nn.Module:
    """`model`'s module at `path` with `tensors` (named relative to it), in fp32."""
    module = model.get_submodule(path)
    module.to_empty(device=device)
    tensors = {k: v.to(device).float() for k, v in tensors.items()}
    module.load_state_dict(tensors, strict=True, assign=True)
    return module.eval()


class _Head:
    """The family's logits from the last block's output: the final norm, the head's
    products (its rows widened a slice at a time, never the whole table in fp32), the
    logit scale and softcap."""

    ROWS = 16384

    def __init__(self, weight: torch.Tensor, spec):
        self.weight, self.spec = weight, spec

    @classmethod
    def of(cls, store: BlockStore) -> _Head:
        tensors = _global_tensors(store, head_only=True)
        return cls(_head_weight(tensors, store.adapter), store.spec)

    def __call__(self, hidden: torch.Tensor, norm) -> torch.Tensor:
        x = norm(hidden.to(_device(norm))).float()
        out = torch.empty(*x.shape[:-1], self.weight.shape[0], device=x.device)
        for lo in range(0, self.weight.shape[0], self.ROWS):
            rows = self.weight[lo : lo + self.ROWS].to(x.device).float()
            out[..., lo : lo + rows.shape[0]] = x @ rows.T
        return final_logits(out, self.spec).float()


def _device(module: torch.nn.Module) -> torch.device:
    return next(module.parameters()).device


def _kl(reference: torch.Tensor, logits: torch.Tensor) -> float:
    """KL(reference ‖ logits) per token; `reference` is log-probabilities."""
    logq = torch.log_softmax(logits, -1)
    return float((reference.exp() * (reference - logq)).sum(-1).mean())
