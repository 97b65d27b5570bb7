"""`compress`: load a checkpoint, run the recipe's stages, write the artifact."""

from __future__ import annotations

import math
import shutil
import time
from collections import defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import save_file
from tqdm.auto import tqdm

from compress import distributed
from compress.artifact.dense import load_model
from compress.artifact.engines import engine_problems, transformers_route, vllm_note
from compress.artifact.formats import DEFAULT, codec
from compress.artifact.manifest import build_manifest, write_manifest
from compress.artifact.target import check_not_source, check_output, claim, clean_stale
from compress.artifact.writer import ArtifactWriter, preflight_export
from compress.calib_data.cost import calibration_plan
from compress.calib_data.prepare import load_calibration
from compress.device import activation_home, describe, resolve_device
from compress.errors import LlmpressError
from compress.estimate import estimate, estimate_line
from compress.model.blocks import BlockStore, route_calibration, run_block
from compress.model.default import DEFAULT_LICENSE, DEFAULT_NAME
from compress.model.loading import (
    Checkpoint,
    check_context,
    load_tokenizer,
    read_tensors,
    resolve,
)
from compress.model.moe import expert_record
from compress.model.workload import workload
from compress.plan import (
    ENGINE_NAMES,
    fit_targets,
    planned_disk,
    planned_engine_problems,
    refuse_off_target,
)
from compress.quantizers.scheme import quantize_weight
from compress.recipe import Recipe, resolve_lm_head
from compress.runtime.calib_text import generation_probe, held_bytes, runtime_writer
from compress.stage import BlockContext, Workspace

_CPU = torch.device("cpu")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def storage_dtype(requested: str, config: dict, export: str = DEFAULT) -> torch.dtype:
    """`auto` keeps the checkpoint's own dtype (fp32 when it names none we store); `auto16`
    keeps a 16-bit one and stores a float32 checkpoint in bfloat16."""
    forced = codec(export).storage_dtype
    if forced is not None:
        return forced
    if requested in _DTYPES:
        return _DTYPES[requested]
    own = _DTYPES.get(str(config.get("dtype") or config.get("torch_dtype")), torch.float32)
    return torch.bfloat16 if requested == "auto16" and own.itemsize > 2 else own


def source_info(ckpt: Checkpoint) -> dict:
    name = DEFAULT_NAME if ckpt.source == "default" else ckpt.config.get("_name_or_path")
    if name and Path(name).is_absolute():  # a local path of the machine that saved it
        name = None
    return {
        "source": resolvable_source(ckpt.source),
        "name": name or Path(ckpt.source).name,
        "model_type": ckpt.config.get("model_type"),
        "sha256": ckpt.sha256,
        "bytes": sum(f.stat().st_size for f in ckpt.files),
        "license": source_license(ckpt),
        **({"text_part_of": ckpt.text_part_of} if ckpt.text_part_of else {}),
        **({"renamed_from": ckpt.renamed_from} if ckpt.renamed_from else {}),
        **({"dequantized_from": ckpt.dequantized_from} if ckpt.dequantized_from else {}),
    }


def resolvable_source(source: str) -> str:
    """What `eval` can resolve later: local paths made absolute here, then recorded
    relative to the working directory (manifest.portable); `default` and hub ids as given."""
    path = Path(source).expanduser()
    return str(path.resolve()) if path.exists() else source


def source_license(ckpt: Checkpoint) -> str | None:
    """The source's license: SmolLM2's for the default model, else its card's front matter."""
    if ckpt.source == "default":
        return DEFAULT_LICENSE
    card = ckpt.path / "README.md"
    if card.is_file():
        text = card.read_text(errors="replace")
        if text.startswith("---"):
            for line in text.split("---", 2)[1].splitlines():
                key, _, value = line.partition(":")
                if key.strip() == "license" and value.strip():
                    return value.strip().strip("'\"")
    return None


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
    resume: bool = False,
    command: str | None = None,
    log=print,
    device: str | torch.device = "cpu",
) -> Path:
    """Compress `model` with `recipe` into `output`. Model stages (prune, distill) run
    first on the whole model; `resume` continues their last checkpoint after a kill.
    `device` (auto, cpu, cuda[:N]) is where blocks, their statistics and searches live."""
    output = Path(output)
    device = distributed.local_device(resolve_device(device))
    distributed.start(device)  # under torchrun: join the group (gloo on CPU, nccl on CUDA)
    if not distributed.is_writer():  # the other ranks compute, log nothing, write nothing
        return _compress(model, recipe, output, overwrite, resume, command, _quiet, device)
    check_output(output, overwrite)
    with claim(output):
        return _compress(model, recipe, output, overwrite, resume, command, log, device)


def _quiet(_line: str) -> None:
    pass


def _compress(model, recipe, output, overwrite, resume, command, log, device) -> Path:
    writer_rank = distributed.is_writer()
    if writer_rank:
        clean_stale(output, log)
    model_stages, stages, after = _split(recipe.build())
    single = [st.name for st in [*model_stages, *after] if not st.data_parallel]
    if distributed.world() > 1 and single:
        raise LlmpressError(
            f"{', '.join(single)} run(s) on the whole model in one process: run this recipe "
            "without torchrun (the block stages, prune and distill run on several)"
        )
    started = time.perf_counter()
    ckpt = source = distributed.first_then_rest(lambda: _source(model, output))
    if recipe.targets:  # planned on the source's shapes: mixed's options, the lm_head
        recipe = fit_targets(recipe, _workspace(recipe, ckpt), log)
        model_stages, stages, after = _split(recipe.build())
    else:
        recipe = resolve_lm_head(recipe)
    planned = ckpt.config
    for stage in model_stages:
        stage.preflight(planned)
        planned = stage.planned_config(planned)
    for stage in after:
        stage.preflight(planned)
    ws = _workspace(recipe, ckpt, device)
    _preflight(recipe, stages, ws, planned["hidden_size"])
    if not any(st.changes_model for st in model_stages):  # else after them, on new widths
        refuse_off_target(recipe, stages, ws)
    part = ckpt.text_part_of
    if part:
        log(f"{model} is a {part}: compressing its language model; the vision part is left out")
    if ckpt.renamed_from:
        family = ckpt.config["model_type"]
        log(f"{model} is a {ckpt.renamed_from}, {family}'s model under names of its own: "
            f"read as {family}, and the artifact is {family}'s")  # fmt: skip
    if ckpt.dequantized_from:
        log(f"{model} is stored in FP8: compressing the dense model its weights stand for")
    log(
        f"compressing {model} ({ckpt.config['model_type']}, {ckpt.num_layers} blocks): "
        f"{recipe.label()}" + ("" if device.type == "cpu" else f", on {describe(device)}")
    )
    if not model_stages:  # after pruning the widths are known only once it has run
        warn_engines(planned_engine_problems(recipe, stages, ws), log)
    # the name the artifact's config.json keeps (writer.py), which vLLM's registry reads
    note = vllm_note((ckpt.config.get("architectures") or [ckpt.adapter.architecture])[0])
    if note:
        log(f"note: {note}")
    tokenizer = load_tokenizer(ckpt)
    samples = records = None
    timing: dict[str, float] = defaultdict(float)
    estimated = {}
    if device.type == "cpu":  # its factors are fitted on CPUs: a GPU gets no made-up figure
        estimated = _estimate(recipe, ckpt, [*model_stages, *stages, *after])
        log(estimate_line(estimated))  # before any of the work
    else:
        log(f"estimated time: not estimated on {device} (fitted on CPUs); timing_s records it")
    if recipe.needs_calibration:
        c = recipe.calib
        check_context(ckpt, c.length, "calibration length (--calib-len)")
        # where the text comes from, and what the runtime will take to write it
        log(calibration_plan(c, ckpt, generation_probe(ckpt), held_bytes(ckpt)))
        with _Clock(timing)("calibration data"):  # rank 0 first: it fills the cache
            samples = distributed.first_then_rest(
                lambda: load_calibration(
                    c,
                    tokenizer,
                    lambda: load_model(ckpt),
                    ckpt.sha256,
                    runtime_writer(ckpt, tokenizer, log),
                )
            )
    if model_stages:
        ckpt, records, schemes = run_model_stages(
            source, model_stages, samples, tokenizer, work_dir(output), resume, log, timing,
            ws.storage_dtype, recipe.ignore, device,
        )  # fmt: skip
        ws = _workspace(recipe, ckpt, device)  # again, on the widths the model stages left
        ws.schemes = schemes
        _preflight(recipe, stages, ws, ckpt.config["hidden_size"])
        refuse_off_target(recipe, stages, ws)  # with the schemes mixed chose
    ws.tokenizer = tokenizer
    writer = None
    if writer_rank:
        state = ws.export_state()
        writer = ArtifactWriter(
            state, output, recipe.export, planned_disk(recipe, stages, ws), overwrite,
            _extra(recipe),
        )  # fmt: skip
    try:  # from the writer's making: its partial folder is removed whatever stops the run
        run = _Run(recipe, source, ws, stages, writer, log, started, command, timing, records or [])
        run.after, run.resume, run.estimate = after, resume, estimated
        run.work = work_dir(output)
        _run_stages(run, samples)
    except BaseException:
        if writer is not None:
            writer.abort()
        raise
    if model_stages or after:
        distributed.barrier()  # every rank has read the model the model stages saved there
        if writer_rank:
            shutil.rmtree(work_dir(output), ignore_errors=True)
    distributed.barrier()  # the artifact is in place before any rank returns
    log(f"wrote {output} in {time.perf_counter() - started:.1f} s")
    return output


def _estimate(recipe: Recipe, ckpt: Checkpoint, stages: list) -> dict:
    """Seconds per part of the recipe on this machine (compress/estimate.py): the block
    stages' calibration passes and the walk's, then each stage's own work."""
    calibrating = [st for st in stages if st.needs_calibration and not st.whole_model]
    passes = len(calibrating) + bool(calibrating)
    c = recipe.calib
    load = workload(ckpt, c.samples if recipe.needs_calibration else 0, c.length)
    return estimate(stages, load, passes)


def _split(stages: list) -> tuple[list, list, list]:
    """(whole-model stages before the block walk, block stages, whole-model stages after
    it, which repair the quantized model); the recipe has checked this order."""
    first = next((k for k, st in enumerate(stages) if not st.whole_model), len(stages))
    rest = stages[first:]
    return (
        stages[:first],
        [st for st in rest if not st.whole_model],
        [st for st in rest if st.whole_model],
    )


def _source(model: str, output: Path) -> Checkpoint:
    """The checkpoint to compress: resolved, not the output itself, not already quantized."""
    named = Path(model).expanduser()
    if named.exists():  # a GGUF inside the target is converted elsewhere: check it too
        check_not_source(output, named)
    ckpt = resolve(model)
    check_not_source(output, ckpt.path)
    if ckpt.is_quantized:
        raise LlmpressError(
            f"{model} is already quantized: compress the original checkpoint it was made from"
        )
    return ckpt


def _workspace(recipe: Recipe, ckpt: Checkpoint, device: torch.device = _CPU) -> Workspace:
    return Workspace(
        store=BlockStore(ckpt, device),
        tokenizer=None,
        storage_dtype=storage_dtype(recipe.dtype, ckpt.config, recipe.export),
        ignore=recipe.ignore,
    )


def _extra(recipe: Recipe) -> dict:
    """config.json keys beyond the weights': the runtime's KV-cache scheme, unless fp32."""
    from compress.runtime.kv_cache import CONFIG_KEY, parse_kv

    scheme = parse_kv(recipe.kv_cache).config()
    return {CONFIG_KEY: scheme} if scheme else {}


def _preflight(recipe: Recipe, stages, ws: Workspace, hidden: int) -> None:
    """Every block stage's, the lm_head's and the export layout's refusals, before work."""
    for stage in stages:
        stage.preflight(ws)
    head_scheme = recipe.lm_head_scheme()
    if head_scheme is not None and head_scheme.group_for(hidden) is None:
        raise LlmpressError(
            f"lm_head: no group size fits width {hidden} with "
            f"{head_scheme.label()}: choose another group size or drop lm_head"
        )
    schemes = [st.scheme for st in stages if st.scheme is not None]
    widths = [ws.weight_shape(n)[1] for n in ws.target_linears()]
    preflight_export(recipe.export, widths, schemes)


def written_engines(folder: Path) -> tuple[dict[str, list[str]], dict | None]:
    """What each engine will refuse in the artifact written to `folder`, and the arguments
    transformers' `from_pretrained` needs for it (None: no route), for the manifest."""
    import json

    from compress.model.safetensors_check import check_safetensors

    names = [
        n
        for f in sorted(folder.glob("*.safetensors"))
        for n in check_safetensors(f)
        if n != "__metadata__"
    ]
    config = json.loads((folder / "config.json").read_text())
    return engine_problems(config, names), transformers_route(config)


def warn_engines(problems: dict[str, list[str]], log) -> None:
    for engine, found in problems.items():
        for problem in found:
            name = ENGINE_NAMES.get(engine, engine)
            log(f"warning: {name} will not load this artifact: {problem}")


def work_dir(output: Path) -> Path:
    """Where model stages keep checkpoints and the model they made: beside the output, kept
    after a failure (for --resume), removed once the artifact is written."""
    return output.parent / f".{output.name}.llmpress-work"


def run_model_stages(
    source, stages, samples, tokenizer, folder, resume, log, timing, storage_dtype, ignore,
    device=_CPU,
):  # fmt: skip
    """Run the whole-model stages on `device` and save their result as a checkpoint the
    block walk reads (the source itself when none changed the weights); also the per-linear
    schemes they chose."""
    from compress.calib_data.prepare import load_calibration as load_text
    from compress.stage import ModelContext

    clock = _Clock(timing)
    if not resume and distributed.is_writer():  # under torchrun rank 0 alone writes here
        shutil.rmtree(folder, ignore_errors=True)
    distributed.barrier()
    folder.mkdir(parents=True, exist_ok=True)
    pruned, records = None, []
    if _streams(stages[0], source):  # prune first: one block in memory, not the model
        with clock(stages[0].name):
            record, keep = stages[0].run_streamed(
                BlockStore(source, device),
                samples,
                tokenizer,
                folder / "pruned",
                source.sha256,
                log,
            )
        records.append(record)
        pruned, stages = resolve(str(folder / "pruned")), stages[1:]
        if not stages:
            return pruned, records, {}
    with clock("load model"):
        teacher = load_model(source).to(device)
        model = teacher if pruned is None else load_model(pruned).to(device)
    ctx = ModelContext(
        teacher=teacher,
        model=model,
        config=dict(source.config),
        adapter=source.adapter,
        tokenizer=tokenizer,
        samples=samples,
        work_dir=folder,
        resume=resume,
        load_text=lambda cfg: load_text(cfg, tokenizer, lambda: teacher, source.sha256),
        log=log,
        storage_dtype=storage_dtype,
        ignore=ignore,
        device=device,
    )
    if pruned is not None:  # what later stages read of the pruning
        ctx.config, ctx.adapter = dict(pruned.config), pruned.adapter
        ctx.layer_map, ctx.hidden_index = keep.layers, torch.tensor(keep.hidden)
    for stage in stages:
        with clock(stage.name):
            records.append(stage.run(ctx))
    if not any(stage.changes_model for stage in stages):
        return pruned or source, records, ctx.schemes
    out = folder / "model"
    state = {k: v.contiguous().cpu() for k, v in ctx.model.state_dict().items()}
    state = ctx.adapter.checkpoint_names(state)
    teacher = ctx.model = ctx.teacher = None  # the device's memory goes back to the walk
    if distributed.is_writer():  # every rank holds the same model: rank 0 saves it
        _save_model(state, ctx.config, source, tokenizer, out)
    distributed.barrier()
    return resolve(str(out)), records, ctx.schemes


def _streams(stage, source) -> bool:
    """Whether a first model stage runs one block in memory at a time from the source:
    pruning (pruning/streamed.py) a checkpoint as published (not a quantized artifact,
    which a block read would not dequantize)."""
    return hasattr(stage, "run_streamed") and not source.is_quantized


def _save_model(state: dict, config: dict, source, tokenizer, out: Path) -> None:
    """The model the model stages made, as a checkpoint the block walk reads."""
    import json

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    if config.get("tie_word_embeddings"):
        state.pop(f"{source.adapter.lm_head}.weight", None)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "llmpress_source.json").write_text(json.dumps({"sha256": source.sha256}))
    tokenizer.save_pretrained(str(out))
    for name in ("generation_config.json", "chat_template.jinja"):
        if (source.path / name).is_file():
            shutil.copy2(source.path / name, out / name)


def repair_quantized(run: _Run, samples: torch.Tensor) -> list[dict]:
    """Run the whole-model stages that follow the block walk: the original model as the
    teacher, the model as quantized so far (AWQ's rescaled norms included) as the student,
    `ws.quantized` for them to change."""
    from compress.stage import ModelContext

    ws, clock = run.ws, _Clock(run.timing)
    device = ws.store.device
    with clock("load model"):
        teacher = load_model(run.source).to(device)
        student = load_model(ws.store.ckpt).to(device)
        with torch.no_grad():
            for name, tensor in ws.updated.items():
                student.get_parameter(name).copy_(tensor.float())
    folder = run.work
    folder.mkdir(parents=True, exist_ok=True)
    ctx = ModelContext(
        teacher=teacher,
        model=student,
        config=dict(ws.config),
        adapter=ws.adapter,
        tokenizer=ws.tokenizer,
        samples=samples,
        work_dir=folder,
        resume=run.resume,
        load_text=lambda cfg: load_calibration(
            cfg, ws.tokenizer, lambda: teacher, run.source.sha256
        ),
        log=run.log,
        quantized=ws.quantized,
        updated=ws.updated,
        storage_dtype=ws.storage_dtype,
        device=device,
    )
    records = []
    for stage in run.after:
        with clock(stage.name):
            records.append(stage.run(ctx))
    return records


def quantize_lm_head(ws: Workspace, scheme) -> dict:
    """Round-to-nearest the output projection (the embedding, when tied): read in full every
    token, it is a fifth of a small model's bytes. A tied embedding stays in full precision
    for the input lookup, so the artifact stores the two untied."""
    head, embed = ws.adapter.lm_head, ws.adapter.embed
    names = ws.store.ckpt.tensors
    source = f"{head}.weight" if f"{head}.weight" in names else f"{embed}.weight"
    weight = read_tensors(ws.store.ckpt, [source])[source]  # as stored: widened in slices
    ws.quantized[head] = quantize_weight(weight, scheme, ws.storage_dtype, ws.store.device)
    return {"stage": "lm_head", "scheme": scheme.label(), "source": source}


@dataclass
class _Run:
    """One compression run, as its last steps (the block walk, the manifest) need it."""

    recipe: Recipe
    source: Checkpoint
    ws: Workspace
    stages: list
    writer: ArtifactWriter | None  # None on the ranks that do not write
    log: Callable
    started: float
    command: str | None
    timing: dict[str, float]
    records: list[dict]  # the model stages' records; the block stages' join at the end
    after: list = field(default_factory=list)  # whole-model stages on the quantized model
    resume: bool = False
    estimate: dict = field(default_factory=dict)  # seconds per part, said before the run
    work: Path | None = None  # where the whole-model stages after the walk checkpoint


def _run_stages(run: _Run, samples: torch.Tensor | None) -> None:
    """Walk the blocks: calibrate and transform each, write it, feed its output onward;
    then the lm_head, the manifest, and the artifact moved into place."""
    ws, stages, clock = run.ws, run.stages, _Clock(run.timing)
    hidden = rope = shard = None
    if any(stage.needs_calibration for stage in stages):
        rope = ws.store.position_embeddings(samples.shape[1])
        shard = distributed.Shard.of(samples.shape[0], rope.chunk)  # all in one process
        hidden = _activations(run, ws.store.embed(samples[list(shard.indices)]))
    rounders = [k for k, st in enumerate(stages) if st.scheme is not None]
    # the original model's hidden states, walked beside the compressed ones when asked
    original = hidden if any(stage.needs_original for stage in stages) else None
    quiet = not distributed.is_writer()
    unrounded = any(stage.refines or stage.needs_original for stage in stages)
    for i in tqdm(range(ws.num_layers), desc="blocks", unit="block", disable=quiet):
        with clock("read blocks"):
            block = ws.store.block(i)
        if hidden is not None and ws.adapter.layer(i).experts:  # not a dense layer
            with clock("expert routing"):
                ws.experts[i] = route_calibration(block, hidden, rope)
        ctx = BlockContext(ws, i, block, hidden, rope, shard=shard, keep_unrounded=unrounded)
        ctx.want_reference = any(stage.needs_reference for stage in stages)
        ctx.original_inputs = original  # the original's own output here: before any
        for k, stage in enumerate(stages):  # transform (a calibration pass may keep it)
            ctx.round_later = k < max(rounders, default=-1)
            with clock(f"{stage.name} calibrate"):
                stage.calibrate(ctx)  # the first calibration pass may keep the reference
            if ctx.want_reference and ctx.reference is None:  # before the block changes
                with clock("reference outputs"):
                    ctx.reference = run_block(block, hidden, rope)
            if original is not None and ctx.original is None:
                with clock("original outputs"):
                    ctx.original = run_block(block, original, rope)
            ctx.output = None
            with clock(f"{stage.name} transform"):
                stage.transform(ctx)
        if original is not None:
            original = ctx.original
        if hidden is not None:  # the next block calibrates on this one's compressed output
            with clock("propagate"):
                hidden = ctx.output if ctx.output is not None else run_block(block, hidden, rope)
        ws.store.release(i)
        ws.to_host(i)
        if not run.after and run.writer:  # else written once the repair changed its scales
            with clock("write"):
                run.writer.add_block(i)
        del ctx, block  # before the next block is read (ctx holds what the stages kept)
    run.records = run.records + [stage.export(ws) for stage in stages]
    if run.after:
        run.records = run.records + repair_quantized(run, samples)
        with clock("write"):
            for i in range(ws.num_layers if run.writer else 0):
                run.writer.add_block(i)
    if run.writer is None:  # a rank that does not write is done
        return
    if run.recipe.lm_head_scheme() is not None:
        with clock("lm_head"):
            run.records.append(quantize_lm_head(ws, run.recipe.lm_head_scheme()))
    run.writer.finish(ws.store.ckpt.path, lambda folder: _write_manifest(run, folder))


def _activations(run: _Run, hidden: torch.Tensor) -> torch.Tensor:
    """The calibration activations entering block 0, on the compute device when every
    stream the walk carries (the compressed one, a block's output, the original's and the
    reference, as the stages ask) fits there beside a block; else in host memory."""
    ws, stages = run.ws, run.stages
    device = ws.store.device
    if device.type == "cpu":
        return hidden
    streams = 2 + any(st.needs_original for st in stages) + any(st.needs_reference for st in stages)
    sizes: dict[str, int] = {}  # the largest block (an MoE model's first may be dense)
    for name, (_, shape, _) in ws.store.ckpt.tensors.items():
        if name.startswith(ws.adapter.blocks + "."):
            index = name[len(ws.adapter.blocks) + 1 :].split(".", 1)[0]
            sizes[index] = sizes.get(index, 0) + math.prod(shape)
    block = 4 * max(sizes.values(), default=0)
    home = activation_home(device, streams * hidden.nbytes, block)
    if home != device:
        run.log(
            f"calibration activations ({streams} x {hidden.nbytes / 2**30:.1f} GiB) do not fit "
            f"{device} beside a block: kept in host memory, moved to {device} in chunks"
        )
    return hidden.to(home)


def _write_manifest(run: _Run, folder: Path) -> None:
    manifest = build_manifest(
        ws=run.ws,
        source=source_info(run.source),
        recipe=run.recipe.to_dict(),
        stages=run.records,
        folder=folder,
        seconds=time.perf_counter() - run.started,
        command=run.command,
    )
    manifest["label"] = run.recipe.label()
    if run.ws.experts:
        manifest["experts"] = expert_record(run.ws.experts, run.ws.store.spec.mlp)
    manifest["timing_s"] = {k: round(v, 2) for k, v in run.timing.items()}
    # what was said before the run, beside what it took (timing_s, compress_seconds)
    if run.estimate:
        total = round(sum(run.estimate.values()), 1)
        manifest["estimate_s"] = {**run.estimate, "total": total}
    manifest["device"] = describe(run.ws.store.device)
    if distributed.world() > 1:
        manifest["processes"] = distributed.world()
    if run.ws.store.device.type == "cuda":  # what the device had to hold, at most
        peak = torch.cuda.max_memory_allocated(run.ws.store.device)
        manifest["device_peak_gib"] = round(peak / 2**30, 2)
    manifest["engines"], manifest["transformers_kwargs"] = written_engines(folder)
    if any(r.get("stage") in ("prune", "distill") for r in run.records):
        warn_engines(manifest["engines"], run.log)  # not known before pruning ran
    write_manifest(folder, manifest)
