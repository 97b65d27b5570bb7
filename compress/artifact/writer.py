"""Write an artifact into a temporary folder beside the target and rename it at the end,
so a crash, a full disk or Ctrl-C never leaves a half-written artifact or loses an old one."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from compress.artifact.awq_format import awq_config, encode_awq
from compress.artifact.ct_format import encode, quantization_config
from compress.errors import LlmpressError
from compress.model.loading import read_tensors
from compress.stage import Workspace

SHARD_BYTES = 4 << 30
_COPIED = ("generation_config.json", "chat_template.jinja")


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse an existing output before any work is done."""
    if out.exists() and not overwrite:
        raise LlmpressError(f"output {out} already exists: choose another -o or pass --overwrite")
    if not out.parent.exists():
        raise LlmpressError(f"output folder's parent {out.parent} does not exist: create it first")


def preflight_export(export: str, ws: Workspace, schemes: list) -> None:
    """Refuse, before calibration, a recipe whose result the chosen layout cannot hold."""
    if export != "awq-gemm":
        return
    groups = set()
    for scheme in schemes:
        if scheme.bits != 4 or not scheme.zero_point:
            raise LlmpressError(
                f"the awq-gemm export holds only 4-bit weights with a zero point, not "
                f"{scheme.label()}; use the default compressed-tensors export"
            )
        groups |= {scheme.group_for(ws.weight_shape(n)[1]) for n in ws.target_linears()}
    if len(groups) > 1:
        raise LlmpressError(
            f"layers would use group sizes {sorted(groups)} (widths the requested group does "
            "not divide) but the awq-gemm layout has one group size: pick one that divides "
            "every layer (e.g. 64 or 32) or use the compressed-tensors export"
        )


def artifact_tensors(ws: Workspace, export: str) -> dict[str, torch.Tensor]:
    """Every tensor to store: quantized linears encoded, tensors a stage changed as changed,
    the rest copied from the source in the storage dtype."""
    ckpt = ws.store.ckpt
    tensors: dict[str, torch.Tensor] = {}
    copy = []
    for name in ckpt.tensors:
        prefix, _, leaf = name.rpartition(".")
        if prefix in ws.quantized and leaf == "weight":
            qw = ws.quantized[prefix]
            if export == "awq-gemm":
                tensors.update(encode_awq(prefix, qw))
            else:  # `compressed-tensors` exactly; `auto` adds int8 outlier columns if any
                tensors.update(encode(prefix, qw, outliers=export == "auto"))
        elif name in ws.updated:
            tensors[name] = ws.updated[name].contiguous()
        else:
            copy.append(name)
    for name, t in read_tensors(ckpt, copy).items():
        tensors[name] = (t.to(ws.storage_dtype) if t.is_floating_point() else t).contiguous()
    return tensors


def artifact_config(ws: Workspace, export: str) -> dict:
    config = dict(ws.config)
    config["dtype"] = str(ws.storage_dtype).removeprefix("torch.")
    unquantized = [n for n in ws.adapter.linear_names(ws.num_layers) if n not in ws.quantized]
    if ws.quantized and export == "awq-gemm":
        (group,) = {qw.group_size for qw in ws.quantized.values()}
        config["quantization_config"] = awq_config(group, [ws.adapter.lm_head, *unquantized])
    elif ws.quantized:
        block_names: dict[str, list[str]] = {}
        for i in range(ws.num_layers):
            for kind in ws.adapter.block_linears:
                block_names.setdefault(kind, []).append(f"{ws.adapter.block_prefix(i)}.{kind}")
        config["quantization_config"] = quantization_config(
            ws.quantized, block_names, [ws.adapter.lm_head, *unquantized]
        )
    return config


def _shards(tensors: dict[str, torch.Tensor]) -> list[dict[str, torch.Tensor]]:
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def _write_weights(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    shards = _shards(tensors)
    if len(shards) == 1:
        save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
        return
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def write_artifact(
    ws: Workspace,
    out: Path,
    source_folder: Path,
    finish: Callable[[Path], None],
    overwrite: bool = False,
    export: str = "auto",
) -> Path:
    """Write weights, config and tokenizer into a temp folder, call `finish(tmp)` to add the
    manifest and card, then move it to `out`."""
    out = Path(out)
    check_output(out, overwrite)
    tensors = artifact_tensors(ws, export)
    needed = sum(t.numel() * t.element_size() for t in tensors.values()) + (16 << 20)
    free = shutil.disk_usage(out.parent).free
    if free < needed:
        raise LlmpressError(
            f"out of disk space: {out.parent} has {free >> 20} MiB free, the artifact needs about "
            f"{needed >> 20} MiB; free space or write elsewhere with -o"
        )
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        _write_weights(tmp, tensors)
        (tmp / "config.json").write_text(
            json.dumps(artifact_config(ws, export), indent=2, sort_keys=True)
        )
        if ws.tokenizer is not None:
            ws.tokenizer.save_pretrained(str(tmp))
        for name in _COPIED:
            if (source_folder / name).is_file() and not (tmp / name).exists():
                shutil.copy2(source_folder / name, tmp / name)
        finish(tmp)
        publish_permissions(tmp)
        _replace(tmp, out)
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno == errno.ENOSPC:
            raise LlmpressError(
                f"out of disk space while writing {out}: nothing was changed; free space or "
                "write elsewhere with -o"
            ) from e
        raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def publish_permissions(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; give the finished one the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _replace(tmp: Path, out: Path) -> None:
    if not out.exists():
        os.replace(tmp, out)
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / "artifact")
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)
