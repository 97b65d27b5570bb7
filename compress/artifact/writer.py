"""Write an artifact into a temporary folder beside the target and rename it at the end,
so a crash, a full disk or Ctrl-C never leaves a half-written artifact or loses an old one."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from compress.artifact.formats import codec
from compress.artifact.integrity import user_entries
from compress.artifact.stream_safetensors import merge
from compress.artifact.target import (
    OWNER,
    check_output,
    divert,
    existing_ancestor,
    identity,
    is_artifact,
    mark_owner,
    publish_permissions,
    rename_noreplace,
)
from compress.errors import LlmpressError, explain_os_error
from compress.model.adapters import Adapter
from compress.model.loading import Checkpoint, read_tensors
from compress.quantizers.scheme import QuantizedWeight

SHARD_BYTES = 5 * 10**9  # the hub's 5 GB shards
_COPIED = ("generation_config.json", "chat_template.jinja")


@dataclass
class ExportState:
    """What the writer reads of a compression run, as plain data (the stages' Workspace
    hands it over). `quantized` and `updated` are the run's own dicts: the writer drops
    each layer's data once written."""

    ckpt: Checkpoint
    adapter: Adapter
    num_layers: int
    storage_dtype: torch.dtype
    tokenizer: Any
    quantized: dict[str, QuantizedWeight]
    updated: dict[str, torch.Tensor]

    @property
    def config(self) -> dict:
        return self.ckpt.config


def preflight_export(export: str, widths: Iterable[int], schemes: list) -> None:
    """Refuse, before calibration, a recipe whose result the chosen layout cannot hold
    (`widths`: the input widths of the linears to quantize)."""
    codec(export).preflight(widths, schemes)


def _to_meta(qw: QuantizedWeight) -> None:
    """Drop a written layer's data, keeping shapes and dtypes for the config and manifest."""
    for field in ("q", "scale", "zero_point", "outlier_index", "outlier_weight"):
        t = getattr(qw, field)
        if t is not None:
            setattr(qw, field, t.to("meta"))


def artifact_config(
    ws: ExportState, export: str, extra: dict | None = None, layers: dict | None = None
) -> dict:
    """config.json for the quantized linears `layers` (default: the run's; a plan of
    LayerFormats gives the config before any work)."""
    layers = ws.quantized if layers is None else layers
    config = {**_model_keys(ws.config), **(extra or {})}
    # what the loaders dispatch on
    config["architectures"] = config.get("architectures") or [ws.adapter.architecture]
    config["dtype"] = str(ws.storage_dtype).removeprefix("torch.")
    if "torch_dtype" in config:  # the older name, which some readers still prefer
        config["torch_dtype"] = config["dtype"]
    unquantized = [n for n in ws.adapter.linear_names(ws.num_layers) if n not in layers]
    if layers:
        block_names: dict[str, list[str]] = {}
        for i in range(ws.num_layers):
            for kind in ws.adapter.layer(i).block_linears:
                block_names.setdefault(kind, []).append(f"{ws.adapter.block_prefix(i)}.{kind}")
        head, alias = ws.adapter.lm_head, ws.adapter.head_loaded_as
        ignore = unquantized if head in layers else [head, *unquantized]
        if alias and head not in layers:
            ignore.append(alias)
        aliases = {head: alias} if alias else {}
        for i in range(ws.num_layers):  # block modules transformers names otherwise
            p = ws.adapter.block_prefix(i)
            for stored, attribute in ws.adapter.module_aliases:
                aliases[f"{p}.{stored}"] = f"{p}.{attribute}"
            for stored, loaded in ws.adapter.load_renames:  # (their linears)
                old, new = f"{p}.{stored}.", f"{p}.{loaded}."
                for name in (n for n in [*layers, *unquantized] if n.startswith(old)):
                    aliases[name] = new + name[len(old) :]
        ignore += [aliases[n] for n in unquantized if n in aliases and n != head]
        config["quantization_config"] = codec(export).config(layers, block_names, ignore, aliases)
    if ws.adapter.lm_head in layers:
        config["tie_word_embeddings"] = False
    return config


_KEPT = ("architectures", "dtype", "model_type", "transformers_version")


def _model_keys(config: dict) -> dict:
    """The source's config.json without what a `to_dict()` dump adds to every model (a
    GGUF-converted source has it): private keys (`_name_or_path`, a path of the machine
    that made it; `_model_name_or_path`, a GGUF's title) and transformers' generic keys
    for task heads and outputs (`id2label`, `return_dict`...) where they hold the default
    every loader fills in itself, so dropping them changes nothing a reader sees."""
    from transformers import PretrainedConfig

    generic = PretrainedConfig().to_dict()

    def default(key: str, value) -> bool:
        same = json.dumps(value, sort_keys=True) == json.dumps(generic[key], sort_keys=True)
        return key not in _KEPT and same

    return {
        k: v
        for k, v in config.items()
        if not k.startswith("_") and not (k in generic and default(k, v))
    }


class ArtifactWriter:
    """Writes an artifact while the model is being compressed, block by block.

    Each finished block's tensors are written at once to a part file in a temporary
    folder beside the target, and the block's data dropped, so memory does not grow with
    depth; `finish` merges the parts into model.safetensors (streaming, sharded above
    SHARD_BYTES), adds config, tokenizer, manifest and card, and renames the folder into
    place. Any failure removes the temporary folder and leaves an existing artifact as it
    was.
    """

    def __init__(
        self,
        ws: ExportState,
        out: Path,
        export: str,
        needed: int,
        overwrite: bool = False,
        extra_config: dict | None = None,
    ):
        """needed: the free bytes writing it takes (artifact/size.py), checked first."""
        self.ws, self.out, self.export = ws, Path(out), export
        self.codec = codec(export)
        self.extra_config = extra_config
        check_output(self.out, overwrite)
        self.replaces = identity(self.out)  # what --overwrite was checked against
        free = shutil.disk_usage(existing_ancestor(self.out.parent)).free
        if free < needed:
            raise LlmpressError(
                f"out of disk space: {self.out.parent} has {free >> 20} MiB free, writing the "
                f"artifact may need up to {needed >> 20} MiB; free space or write elsewhere with -o"
            )
        with self._disk_errors():
            self.out.parent.mkdir(parents=True, exist_ok=True)  # as `mkdir -p`
            # named before it exists, so that abort() removes it whenever a SIGTERM lands
            # (with mkdtemp one could land between the folder's making and its naming)
            self.tmp = self.out.parent / f".{self.out.name}.partial-{secrets.token_hex(4)}"
            self.tmp.mkdir(mode=0o700)
            try:
                mark_owner(self.tmp)
                self.parts_dir = self.tmp / ".parts"
                self.parts_dir.mkdir()
            except BaseException:
                self.abort()
                raise
        self.parts: list[Path] = []
        self.written: set[str] = set()

    def _save(self, tensors: dict[str, torch.Tensor], name: str) -> None:
        if not tensors:
            return
        path = self.parts_dir / f"{len(self.parts):05d}-{name}.safetensors"
        with self._disk_errors():
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
        self.parts.append(path)

    def _tensors(self, names: list[str]) -> dict[str, torch.Tensor]:
        """The stored form of source tensors `names`: encoded, updated or copied."""
        ws = self.ws
        out: dict[str, torch.Tensor] = {}
        copy = []
        for name in names:
            prefix, _, leaf = name.rpartition(".")
            if prefix in ws.quantized and leaf == "weight":
                out.update(self.codec.encode(prefix, ws.quantized[prefix]))
                _to_meta(ws.quantized[prefix])
                ws.updated.pop(name, None)  # a producer AWQ rescaled, then quantized
            elif name in ws.updated:
                out[name] = ws.updated.pop(name)
            else:
                copy.append(name)
        for name, t in read_tensors(ws.ckpt, copy).items():
            out[name] = t.to(ws.storage_dtype) if t.is_floating_point() else t
        self.written.update(names)
        return out

    def add_block(self, index: int) -> None:
        prefix = self.ws.adapter.block_prefix(index) + "."
        names = [n for n in self.ws.ckpt.tensors if n.startswith(prefix)]
        self._save(self._tensors(names), f"block{index}")

    def finish(self, source_folder: Path, finish: Callable[[Path], None]) -> Path:
        """Write what is left and move the artifact into place; `finish(folder)` adds the
        manifest and card."""
        ws = self.ws
        rest = [n for n in ws.ckpt.tensors if n not in self.written]
        head = ws.adapter.lm_head
        if head in ws.quantized and f"{head}.weight" not in rest:  # was tied: add it
            rest.append(f"{head}.weight")
        self._save(self._tensors(rest), "rest")
        with self._disk_errors():
            merge(self.parts, self.tmp, SHARD_BYTES, consume=True)
            shutil.rmtree(self.parts_dir)
            config = artifact_config(ws, self.export, self.extra_config)
            (self.tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
            if ws.tokenizer is not None:
                ws.tokenizer.save_pretrained(str(self.tmp))
            for name in _COPIED:
                if (source_folder / name).is_file() and not (self.tmp / name).exists():
                    shutil.copy2(source_folder / name, self.tmp / name)
            finish(self.tmp)
            publish_permissions(self.tmp)
            (self.tmp / OWNER).unlink()
            return _replace(self.tmp, self.out, self.replaces)

    def abort(self) -> None:
        tmp = getattr(self, "tmp", None)
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

    @contextmanager
    def _disk_errors(self):
        """A full disk, a file-size limit, a read-only or forbidden target: one line, the
        temporary folder removed, an existing artifact untouched."""
        try:
            yield
        except Exception as e:
            known = explain_os_error(e, f"writing {self.out} failed, nothing was changed")
            if known is None:
                raise
            self.abort()
            raise known from e


def _replace(tmp: Path, out: Path, replaces: tuple[int, int] | None) -> Path:
    """Move the finished artifact to `out`, replacing only what was checked at the start
    (`replaces`: nothing, or that artifact or empty folder). Whatever appeared at `out`
    during the run is left untouched and the artifact goes beside it; a user's own files
    in a replaced artifact move into the new one."""
    now = identity(out)
    ours = now is not None and now == replaces and out.is_dir() and not out.is_symlink()
    if now is not None and not (ours and (is_artifact(out) or not any(out.iterdir()))):
        raise _diverted(tmp, out)
    if now is None:
        try:
            rename_noreplace(tmp, out)
        except FileExistsError:
            raise _diverted(tmp, out) from None
        return out
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    mark_owner(old)
    previous = old / "artifact"
    os.replace(out, previous)
    _carry_user_entries(previous, tmp)
    try:
        rename_noreplace(tmp, out)
    except FileExistsError:
        raise _diverted(tmp, out) from None
    shutil.rmtree(old, ignore_errors=True)
    return out


def _carry_user_entries(previous: Path, new: Path) -> None:
    """Move what a user added to the replaced artifact (notes, folders) into the new one;
    a name the new artifact also uses gets the suffix `.user`."""
    try:
        manifest = json.loads((previous / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        manifest = {}
    for entry in user_entries(previous, manifest if isinstance(manifest, dict) else {}):
        target = new / entry.name
        os.replace(entry, new / f"{entry.name}.user" if target.exists() else target)


def _diverted(tmp: Path, out: Path) -> LlmpressError:
    alt = divert(tmp, out)
    return LlmpressError(
        f"{out} was created or changed by someone else while this run worked: it is left "
        f"untouched, and the artifact was written to {alt} instead; move it where you want"
    )
