"""`compress`: load a checkpoint, run the recipe's stages, write the artifact."""

from __future__ import annotations

import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import torch
from tqdm.auto import tqdm

from compress.artifact.manifest import build_manifest, write_manifest
from compress.artifact.writer import ArtifactWriter, check_output, preflight_export
from compress.calib_data.prepare import load_calibration
from compress.errors import LlmpressError
from compress.model.blocks import BlockStore, run_block
from compress.model.default import DEFAULT_NAME
from compress.model.loading import Checkpoint, load_model, load_tokenizer, read_tensors, resolve
from compress.quantizers.scheme import quantize_weight
from compress.recipe import Recipe
from compress.stage import BlockContext, Workspace

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def storage_dtype(requested: str, config: dict, export: str = "compressed-tensors") -> torch.dtype:
    """`auto` keeps the checkpoint's own dtype (fp32 when it names none we store)."""
    if export == "awq-gemm":  # AutoAWQ's kernels read float16 scales
        return torch.float16
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


class _Clock:
    """Adds the wall time of each `with clock(name):` section to timing[name]."""

    def __init__(self, timing: dict[str, float]):
        self.timing = timing

    @contextmanager
    def __call__(self, name: str):
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timing[name] += time.perf_counter() - start


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
    if ckpt.is_quantized:
        raise LlmpressError(
            f"{model} is already quantized: compress the original checkpoint it was made from"
        )
    ws = Workspace(
        store=BlockStore(ckpt),
        tokenizer=None,
        storage_dtype=storage_dtype(recipe.dtype, ckpt.config, recipe.export),
        ignore=recipe.ignore,
    )
    for stage in stages:
        stage.preflight(ws)
    head_scheme = recipe.lm_head_scheme()
    if head_scheme is not None and head_scheme.group_for(ckpt.config["hidden_size"]) is None:
        raise LlmpressError(
            f"lm_head: no group size fits width {ckpt.config['hidden_size']} with "
            f"{head_scheme.label()}: choose another group size or drop lm_head"
        )
    schemes = [st.config.scheme for st in stages if hasattr(getattr(st, "config", None), "scheme")]
    preflight_export(recipe.export, ws, schemes)
    ws.tokenizer = load_tokenizer(ckpt)
    extra = {}
    if recipe.kv_cache:
        from compress.runtime.kv_cache import CONFIG_KEY, parse_kv

        extra[CONFIG_KEY] = parse_kv(recipe.kv_cache).config()
    writer = ArtifactWriter(ws, output, recipe.export, overwrite, extra)
    log(
        f"compressing {model} ({ckpt.config['model_type']}, {ckpt.num_layers} blocks): "
        f"{recipe.label()}"
    )
    try:
        _run_stages(ws, ckpt, recipe, stages, writer, log, started, command)
    except BaseException:
        writer.abort()
        raise
    log(f"wrote {output} in {time.perf_counter() - started:.1f} s")
    return output


def quantize_lm_head(ws: Workspace, scheme) -> dict:
    """Round-to-nearest the output projection (the embedding, when tied): read in full every
    token, it is a fifth of a small model's bytes. A tied embedding stays in full precision
    for the input lookup, so the artifact stores the two untied."""
    head, embed = ws.adapter.lm_head, ws.adapter.embed
    names = ws.store.ckpt.tensors
    source = f"{head}.weight" if f"{head}.weight" in names else f"{embed}.weight"
    weight = read_tensors(ws.store.ckpt, [source])[source].float()
    ws.quantized[head] = quantize_weight(weight, scheme, ws.storage_dtype)
    return {"stage": "lm_head", "scheme": scheme.label(), "source": source}


def _run_stages(ws, ckpt, recipe, stages, writer, log, started, command) -> None:
    """Walk the blocks: calibrate and transform each, write it, feed its output onward."""
    timing: dict[str, float] = defaultdict(float)
    clock = _Clock(timing)
    hidden = rope = None
    if recipe.needs_calibration:
        c = recipe.calib
        log(f"calibration: {c.samples} × {c.length} tokens from {c.source}")
        with clock("calibration data"):
            samples = load_calibration(c, ws.tokenizer, lambda: load_model(ckpt), ckpt.sha256)
            hidden = ws.store.embed(samples)
            rope = ws.store.position_embeddings(samples.shape[1])
    for i in tqdm(range(ckpt.num_layers), desc="blocks", unit="block"):
        with clock("read blocks"):
            block = ws.store.block(i)
        ctx = BlockContext(ws, i, block, hidden, rope)
        for stage in stages:
            with clock(f"{stage.name} calibrate"):
                stage.calibrate(ctx)
            with clock(f"{stage.name} transform"):
                stage.transform(ctx)
        if hidden is not None:  # the next block calibrates on this one's compressed output
            with clock("propagate"):
                hidden = run_block(block, hidden, rope)
        ws.store.release(i)
        with clock("write"):
            writer.add_block(i)
    records = [stage.export(ws) for stage in stages]
    if recipe.lm_head:
        with clock("lm_head"):
            records.append(quantize_lm_head(ws, recipe.lm_head_scheme()))

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
        manifest["timing_s"] = {k: round(v, 2) for k, v in timing.items()}
        write_manifest(folder, manifest)

    writer.finish(ckpt.path, finish)
