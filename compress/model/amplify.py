"""A test model where LLM.int8()'s outlier features matter: an exact reparametrization.

Outlier features appear in models of several billion parameters; SmolLM2-135M has
none large enough to break int8. This amplifies chosen hidden channels of every norm's
output by `factor` and divides the matching input columns of the linears that read
them by the same factor, so the model computes the same function (up to float
rounding) while its activations now carry outliers of that size — and the weights of
those columns become tiny, which is exactly what plain int8 rounds away.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

from compress.model.loading import Checkpoint, read_tensors


def amplify_checkpoint(ckpt: Checkpoint, out: Path, channels: list[int], factor: float) -> Path:
    """Write `ckpt` with `channels` of every norm output amplified by `factor` into `out`."""
    tensors = read_tensors(ckpt)
    a = ckpt.adapter
    idx = torch.tensor(channels)
    for i in range(ckpt.num_layers):
        p = a.block_prefix(i)
        for group in a.layer(i).input_groups:
            if group.producer not in (a.attn_norm, a.mlp_norm):
                continue
            tensors[f"{p}.{group.producer}.weight"][idx] *= factor
            for rel in group.linears:
                tensors[f"{p}.{rel}.weight"][:, idx] /= factor
    out.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    for f in ckpt.path.iterdir():
        # llmpress_source.json names the GGUF this came from: no longer true
        if f.is_file() and not f.name.endswith(".safetensors") and f.name != "llmpress_source.json":
            shutil.copy2(f, out / f.name)
    note = {"amplified_channels": channels, "factor": factor, "from": ckpt.source}
    (out / "llmpress_amplified.json").write_text(json.dumps(note, indent=2))
    return out
