"""`compress`: load a checkpoint, run the recipe's stages, write the artifact."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from compress.artifact.manifest import build_manifest, write_manifest
from compress.artifact.writer import check_output, write_artifact
from compress.calib_data.prepare import load_calibration
from compress.model.default import DEFAULT_NAME
from compress.model.loading import Checkpoint, load_model, load_tokenizer, resolve
from compress.recipe import Recipe
from compress.stage import Workspace

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def storage_dtype(requested: str, config: dict) -> torch.dtype:
    """`auto` keeps the checkpoint's own dtype (fp32 when it names none we store)."""
    if requested != "auto":
        return _DTYPES[requested]
    return _DTYPES.get(str(config.get("dtype") or config.get("torch_dtype")), torch.float32)


def source_info(ckpt: Checkpoint) -> dict:
    name = DEFAULT_NAME if ckpt.source == "default" else ckpt.config.get("_name_or_path")
    return {
        "source": ckpt.source,
        "name": name or Path(ckpt.source).name,
        "model_type": ckpt.config.get("model_type"),
        "sha256": ckpt.sha256,
        "bytes": sum(f.stat().st_size for f in ckpt.files),
    }


def compress(
    model: str,
    recipe: Recipe,
    output: Path,
    *,
    overwrite: bool = False,
    command: str | None = None,
    log=print,
) -> Path:
    output = Path(output)
    check_output(output, overwrite)
    stages = recipe.build()
    started = time.perf_counter()
    ckpt = resolve(model)
    log(f"loading {model} ({ckpt.config['model_type']}, {ckpt.num_layers} layers)")
    ws = Workspace(
        model=load_model(ckpt),
        adapter=ckpt.adapter,
        config=ckpt.config,
        tokenizer=load_tokenizer(ckpt),
        storage_dtype=storage_dtype(recipe.dtype, ckpt.config),
        ignore=recipe.ignore,
    )
    samples = None
    if recipe.needs_calibration:
        log(
            f"calibration: {recipe.calib.samples} × {recipe.calib.length} tokens "
            f"from {recipe.calib.source}"
        )
        samples = load_calibration(recipe.calib, ws.model, ws.tokenizer, cache_key=ckpt.sha256)
    records = []
    for stage in stages:
        log(f"stage {stage.name}")
        stage.calibrate(ws, samples)
        stage.transform(ws)
        records.append(stage.export(ws))

    def finish(folder: Path) -> None:
        manifest = build_manifest(
            ws=ws,
            source=source_info(ckpt),
            recipe=recipe.to_dict(),
            stages=records,
            folder=folder,
            seconds=time.perf_counter() - started,
            command=command,
        )
        manifest["label"] = recipe.label()
        write_manifest(folder, manifest)

    write_artifact(ws, output, ckpt.path, finish, overwrite=overwrite)
    log(f"wrote {output} in {time.perf_counter() - started:.1f} s")
    return output
