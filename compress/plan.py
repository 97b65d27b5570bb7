"""The artifact a recipe will write, known before any work from the checkpoint's shapes
and the planned scheme of each linear: what each engine will refuse in it, the disk it
needs, and the recipe kept to the engines a user targets (`--target`)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import torch

from compress.artifact.engines import engine_problems
from compress.artifact.formats import codec, planned_layer
from compress.artifact.size import PlannedLinear, needed_bytes
from compress.artifact.writer import artifact_config
from compress.errors import LlmpressError
from compress.recipe import Recipe, resolve_lm_head
from compress.stage import Workspace

ENGINE_NAMES = {
    "vllm": "vLLM (GPU)",
    "vllm-cpu": "vLLM's CPU build",
    "transformers": "transformers (plain from_pretrained)",
}


def planned_engine_problems(recipe: Recipe, stages, ws: Workspace) -> dict[str, list[str]]:
    """What vLLM and transformers will refuse in the artifact this recipe will write,
    known before any work from the schemes and the layer widths alone."""
    layers = {}
    hidden = ws.config["hidden_size"]
    for name, (scheme, stage) in planned_schemes(recipe, stages, ws).items():
        width = hidden if stage is None else ws.weight_shape(name)[1]
        activations = None if stage is None else stage.activations
        layers[name] = planned_layer(scheme, scheme.group_for(width), width, activations)
    config = artifact_config(ws.export_state(), recipe.export, layers=layers)
    int8 = any(s.name == "int8" for s in stages)
    return engine_problems(config, codec(recipe.export).planned_tensor_names(int8))


def planned_schemes(recipe: Recipe, stages, ws: Workspace) -> dict:
    """Each linear the artifact will store quantized: (its scheme, the block stage that
    writes it, None for the lm_head), the last quantizing stage's unless a model stage
    chose one (mixed precision)."""
    layers = {}
    for stage in (st for st in stages if st.scheme is not None):
        for name in ws.target_linears():
            layers[name] = (ws.schemes.get(name, stage.scheme), stage)
    head = recipe.lm_head_scheme()
    if head is not None:
        layers[ws.adapter.lm_head] = (head, None)
    return layers


def planned_disk(recipe: Recipe, stages, ws: Workspace) -> int:
    """The free bytes writing this recipe's artifact needs (artifact/size.py)."""
    plan = {
        name: PlannedLinear(scheme, _outlier_share(stage))
        for name, (scheme, stage) in planned_schemes(recipe, stages, ws).items()
    }
    tensors = ws.store.ckpt.tensors
    head = f"{ws.adapter.lm_head}.weight"
    added = {}
    if ws.adapter.lm_head in plan and head not in tensors:  # tied: the artifact adds it
        added[head] = (ws.config["vocab_size"], ws.config["hidden_size"])
    blocks = ws.adapter.block_prefix(0).rpartition(".")[0] + "."

    def part(name: str) -> str:
        return name[len(blocks) :].split(".")[0] if name.startswith(blocks) else "rest"

    itemsize = torch.empty((), dtype=ws.storage_dtype).element_size()
    return needed_bytes(tensors, plan, itemsize, part, added)


def _outlier_share(stage) -> float:
    """The share of input columns an LLM.int8() stage may keep in 16-bit (5% when it picks
    them by threshold or count, which only calibration settles)."""
    if stage is None or stage.name != "int8":
        return 0.0
    fraction = stage.config.fraction
    return 0.05 if fraction is None else fraction


def fit_targets(recipe: Recipe, ws: Workspace, log) -> Recipe:
    """`recipe` (with targets, lm_head not yet resolved) kept to what its target engines
    run: mixed precision offered only the schemes they all run at every width, and an
    `auto` lm_head left as stored where they refuse the quantized one. Anything else they
    refuse stays for `refuse_off_target`, which names it."""
    resolved = resolve_lm_head(recipe)
    stages = []
    for name, cfg in recipe.stages:
        if name == "mixed":
            cfg = _runnable_options(recipe, cfg, ws, log)
        stages.append((name, cfg))
    fitted = dataclasses.replace(resolved, stages=tuple(stages))
    if recipe.lm_head == "auto" and fitted.lm_head is not None:
        bare = dataclasses.replace(fitted, stages=())
        refused = _target_problems(fitted, planned_engine_problems(bare, [], ws))
        if refused:
            log(f"lm_head kept as stored: the quantized one is refused ({refused[0]})")
            fitted = dataclasses.replace(fitted, lm_head=None)
    return fitted


def _runnable_options(recipe: Recipe, cfg, ws: Workspace, log):
    from compress.quantizers.mixed import parse_scheme
    from compress.quantizers.scheme import QuantScheme

    base = parse_scheme(cfg.base, QuantScheme())
    bare = dataclasses.replace(recipe, stages=(), lm_head=None)
    keep = []
    for label in cfg.options:
        everywhere = SimpleNamespace(name="rtn", scheme=parse_scheme(label, base), activations=None)
        refused = _target_problems(recipe, planned_engine_problems(bare, [everywhere], ws))
        if refused:
            log(f"mixed precision: option {label} left out: {refused[0]}")
        else:
            keep.append(label)
    return dataclasses.replace(cfg, options=tuple(keep))


def _target_problems(recipe: Recipe, problems: dict[str, list[str]]) -> list[str]:
    return [
        f"{ENGINE_NAMES[engine]} will not load it: {problem}"
        for engine in recipe.targets
        for problem in problems.get(engine, [])
    ]


def refuse_off_target(recipe: Recipe, stages, ws: Workspace) -> None:
    """One line naming what a target engine would refuse in the planned artifact."""
    if not recipe.targets:
        return
    refused = _target_problems(recipe, planned_engine_problems(recipe, stages, ws))
    if refused:
        targets = " ".join(f"--target {t}" for t in recipe.targets)
        raise LlmpressError(
            f"{targets}: {refused[0]}; change the recipe or drop the target"
            + (f" ({len(refused) - 1} more)" if len(refused) > 1 else "")
        )
