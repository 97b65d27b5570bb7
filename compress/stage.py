"""The one interface every compression method plugs into: calibrate → transform → export.

Two kinds of stage share it. Block stages (quantizers) run while the pipeline walks the
model one decoder block at a time (compress/model/blocks.py).
For each block every stage first `calibrate`s (looks at the block and the calibration
activations entering it) and then `transform`s it (changes weights, records quantized
ones); the block's output, computed with the transformed weights, feeds the next block.
`export` returns a record of what the stage did for the manifest. Model stages (pruning,
distillation) change the architecture or train the whole model, so they see it whole:
they come first in a recipe, `run` on a ModelContext, and their result becomes the
checkpoint the block stages then walk. The pipeline knows nothing about any particular
method.
"""

from __future__ import annotations

import contextlib
import fnmatch
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import torch

from compress.artifact.writer import ExportState
from compress.distributed import Shard
from compress.model.blocks import BlockStore, Positions, observe_inputs, observe_pairs
from compress.quantizers.scheme import QuantizedWeight, QuantScheme


def matches_ignore(name: str, patterns: tuple[str, ...]) -> bool:
    """Whether a recipe's `ignore` patterns (globs, or re:REGEX) name module `name`."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.fullmatch(pattern[3:], name):
                return True
        elif fnmatch.fnmatchcase(name, pattern):
            return True
    return False


@dataclass
class Workspace:
    """What stages have decided about the model so far (never the whole dense model).

    `quantized` holds the integers of every quantized linear; `updated` holds dense
    tensors a stage changed (e.g. norm weights that absorbed AWQ scales), in storage dtype.
    Everything else is copied from the source checkpoint at export.
    """

    store: BlockStore
    tokenizer: Any
    storage_dtype: torch.dtype = torch.float32
    ignore: tuple[str, ...] = ()
    quantized: dict[str, QuantizedWeight] = field(default_factory=dict)
    updated: dict[str, torch.Tensor] = field(default_factory=dict)
    # per-linear schemes that replace the quantizing stages' own (mixed precision)
    schemes: dict[str, QuantScheme] = field(default_factory=dict)
    # Mixture-of-Experts: per block, the tokens routed to each expert in calibration and
    # the experts calibrated on every token (compress/model/moe.py), for the manifest
    experts: dict[int, dict] = field(default_factory=dict)

    @property
    def adapter(self):
        return self.store.adapter

    @property
    def config(self) -> dict:
        return self.store.ckpt.config

    @property
    def num_layers(self) -> int:
        return self.store.num_layers

    def export_state(self) -> ExportState:
        """What the artifact writer reads (this workspace's own dicts, not copies)."""
        return ExportState(
            self.store.ckpt, self.adapter, self.num_layers, self.storage_dtype, self.tokenizer,
            self.quantized, self.updated,
        )  # fmt: skip

    def target_linears(self, index: int | None = None) -> list[str]:
        """Block linears (of one block, or all) stages may compress, minus `ignore` patterns."""
        blocks = range(self.num_layers) if index is None else [index]
        return [
            f"{self.adapter.block_prefix(i)}.{rel}"
            for i in blocks
            for rel in self.adapter.layer(i).block_linears
            if not self.ignored(f"{self.adapter.block_prefix(i)}.{rel}")
        ]

    def ignored(self, name: str) -> bool:
        return matches_ignore(name, self.ignore)

    def weight_shape(self, name: str) -> tuple[int, ...]:
        return self.store.ckpt.tensors[f"{name}.weight"][1]

    def to_host(self, index: int) -> None:
        """Bring block `index`'s results to the CPU, where the writer reads them, once no
        stage of the block needs them on the compute device any more."""
        prefix = self.adapter.block_prefix(index) + "."
        for name, qw in self.quantized.items():
            if name.startswith(prefix):
                self.quantized[name] = qw.to("cpu")
        for name, tensor in self.updated.items():
            if name.startswith(prefix):
                self.updated[name] = tensor.cpu()


@dataclass
class BlockContext:
    """One materialized block, the activations entering it, and how to record changes."""

    ws: Workspace
    index: int
    module: torch.nn.Module
    inputs: torch.Tensor | None = None  # [samples, length, hidden], None if nothing calibrates
    rope: Positions | None = None  # rope and window mask, by block (model/blocks.py)
    # the block's output on `inputs` before any stage changed it (when a stage needs_reference)
    reference: torch.Tensor | None = None
    # a stage needs_reference: the pipeline sets `reference` before the first transform,
    # unless the first stage's calibration pass (`observe`) kept it already
    want_reference: bool = False
    # the original model's output of this block, fed the original's own hidden states (when
    # a stage needs_original): where the uncompressed model's residual stream is here
    original: torch.Tensor | None = None
    # ... and the original model's hidden states entering this block (its input there)
    original_inputs: torch.Tensor | None = None
    # the block's output on `inputs` as the stage that just transformed it left it, when that
    # stage computed it anyway (the pipeline then need not run the block again to propagate)
    output: torch.Tensor | None = None
    # each linear's weight as it was just before it was first rounded (what refiners re-round
    # and the original's side of observe_original computes with), where a stage reads it:
    # kept by every recipe, it held a second fp32 copy of each block (an rtn walk at
    # DeepSeek-V2-Lite's widths peaked at 7.86 GB; 4.02 GB once it and the block's stored
    # copy were no longer held: benchmarks/latent_scale.py)
    unrounded: dict[str, torch.Tensor] = field(default_factory=dict)
    keep_unrounded: bool = True
    # the original side's inputs of named linears, chunk by chunk (observe_original's keep)
    original_kept: dict[str, list[torch.Tensor]] = field(default_factory=dict)
    # set while a stage runs that a later stage will round: it prepares the weights only
    round_later: bool = False
    # which calibration samples `inputs` holds (all of them in one process; a shard of them
    # under torchrun, whose statistics stages sum over the ranks: compress/distributed.py)
    shard: Shard | None = None

    @property
    def samples(self) -> int:
        """Calibration samples over every rank."""
        return self.shard.total if self.shard is not None else self.inputs.shape[0]

    def rows_below(self, count: int) -> int:
        """How many of `inputs`' rows are among the first `count` calibration samples (they
        come first): a stage that works on the first few samples works on these."""
        if self.shard is None:
            return min(count, self.inputs.shape[0])
        return self.shard.below(count)

    @property
    def prefix(self) -> str:
        return self.ws.adapter.block_prefix(self.index)

    @property
    def adapter(self):
        """This block's adapter (a dense layer of a Mixture-of-Experts model has no experts)."""
        return self.ws.adapter.layer(self.index)

    def targets(self) -> list[str]:
        """Names relative to the block of the linears stages may compress here."""
        return [n[len(self.prefix) + 1 :] for n in self.ws.target_linears(self.index)]

    def observe(self, names, observe) -> None:
        """observe_inputs over the calibration inputs. A pass while `reference` is wanted and
        still missing is over the block as read (the pipeline fills it before any transform),
        so it keeps its output as `reference`: one forward of the block instead of two."""
        keep = self.want_reference and self.reference is None
        outputs = torch.empty_like(self.inputs) if keep else None
        observe_inputs(self.module, self.inputs, self.rope, names, observe, outputs)
        if keep:
            self.reference = outputs

    def observe_original(self, names, observe, keep=()) -> None:
        """observe_pairs: each named input on `inputs` beside the same input on the original
        model's hidden states (`original_inputs`, when a stage needs_original), there with
        the weights as they were before any was rounded (`unrounded`). A pass over the
        block as read keeps both outputs (`reference` when wanted, `original`). The
        original side of the inputs named in `keep` is kept for this block's later calls,
        which then run no pass over the original's side."""
        wanted = self.want_reference and self.reference is None
        outputs = torch.empty_like(self.inputs) if wanted else None
        others = torch.empty_like(self.original_inputs) if self.original is None else None
        for name in keep:
            self.original_kept.setdefault(name, [])
        observe_pairs(
            self.module, self.inputs, self.original_inputs, self.rope, names, observe,
            outputs, others, self._unrounded_weights, self.original_kept,
        )  # fmt: skip
        if wanted:
            self.reference = outputs
        if others is not None:
            self.original = others

    @contextlib.contextmanager
    def _unrounded_weights(self):
        """The block's rounded linears hold their weights from before rounding meanwhile."""
        rounded = {}
        with torch.no_grad():
            for rel, weight in self.unrounded.items():
                rounded[rel] = self.sub(rel).weight.detach().clone()
                self.sub(rel).weight.copy_(weight)
            try:
                yield
            finally:
                for rel, weight in rounded.items():
                    self.sub(rel).weight.copy_(weight)

    def sub(self, rel: str) -> torch.nn.Module:
        return self.module.get_submodule(rel)

    def scheme(self, rel: str, default: QuantScheme) -> QuantScheme:
        """The scheme linear `rel` takes: a stage's own, unless mixed precision chose another."""
        return self.ws.schemes.get(f"{self.prefix}.{rel}", default)

    def set_quantized(self, rel: str, qw: QuantizedWeight) -> None:
        """Record a quantized linear; the block computes with its dequantized values from now on."""
        module = self.sub(rel)
        if tuple(qw.shape) != tuple(module.weight.shape):
            raise ValueError(f"{rel}: quantized shape {tuple(qw.shape)} != weight shape")
        self.ws.quantized[f"{self.prefix}.{rel}"] = qw
        if self.keep_unrounded and rel not in self.unrounded:
            self.unrounded[rel] = exact_copy(module.weight.detach(), self.ws.storage_dtype)
        self.output = None
        with torch.no_grad():
            module.weight.copy_(qw.dequantize(module.weight.dtype))

    def mark_changed(self, rel: str) -> None:
        """Keep the current parameters of sub-module `rel` for export (they differ from source)."""
        self.output = None
        for pname, param in self.sub(rel).named_parameters():
            key = f"{self.prefix}.{rel}.{pname}"
            self.ws.updated[key] = param.detach().to(self.ws.storage_dtype).clone()


def exact_copy(w: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A copy of w, in `dtype` where that holds every value exactly (a 16-bit checkpoint's
    weights no stage has changed yet: half the bytes), else in w's own dtype."""
    if dtype != w.dtype and dtype.is_floating_point:
        narrow = w.to(dtype)
        if torch.equal(narrow.to(w.dtype), w):
            return narrow
    return w.clone()


@dataclass(frozen=True)
class Figure:
    """A plot a stage asks the eval report for, drawn from its manifest record. `kind`
    says how: "per_layer" (`data` maps module names to values, one line per projection
    kind over the layers) or "pruning" (`data` is the prune record)."""

    title: str
    file: str
    kind: str
    data: Any
    ylabel: str = ""
    zero_label: str = ""
    plot_title: str = ""  # the figure's own title (default: `title`)


class Described:
    """What a stage says about itself to the report, `inspect` and the model card, read
    from its manifest record or its recipe settings; by default nothing. Stages inherit it
    and override what applies, so no consumer reads a record by the stage's name."""

    tags: ClassVar[tuple[str, ...]] = ()  # the model card's hub tags
    requires: ClassVar[tuple[tuple[str, str], ...]] = ()  # (stage, why) that must come first
    changes_architecture: ClassVar[bool] = False  # the hub relation is then "finetune"
    # block stages: `prepares` can leave the linears unrounded for a later quantizing stage
    # (AWQ's scales before GPTQ's rounding); `refines` changes the quantization an earlier
    # stage made (scheme None); `needs_reference` wants the block's output as read on the
    # compressed inputs, `needs_original` the original model's output of the block
    prepares: ClassVar[bool] = False
    refines: ClassVar[bool] = False
    per_layer_schemes: ClassVar[bool] = False  # reads ctx.scheme (mixed precision's choice)
    needs_reference: ClassVar[bool] = False
    needs_original: ClassVar[bool] = False
    # whole-model stages: may also run after the block walk, on the quantized model;
    # one that only plans (mixed precision) leaves the weights as they were
    repairs_quantized: ClassVar[bool] = False
    changes_model: ClassVar[bool] = True
    plans_schemes: ClassVar[bool] = False  # chooses per-linear schemes (mixed precision)

    @staticmethod
    def weight_bits(settings: dict) -> int | None:
        """Bits of the weights it writes, from its recipe settings (card tags)."""
        return None

    @staticmethod
    def summary(record: dict) -> str | None:
        """One line for `llmpress inspect`."""
        return None

    @staticmethod
    def figures(record: dict) -> list[Figure]:
        return []

    def work(self, load) -> float:
        """FLOPs of this stage's own work on a `compress.estimate.Workload`, beyond the
        calibration passes the pipeline counts (the estimate printed before a run); 0
        where it is negligible."""
        return 0.0


class Stage(Protocol):
    """One step of a recipe. `needs_calibration` tells the pipeline to carry activations;
    `scheme` is the weight scheme the stage writes to its target linears and
    `activations` how their inputs are quantized at run time ("int8-token" or None), which
    the pipeline's preflight and the planned artifact's config read. A stage that `refines`
    has no scheme of its own (None): it keeps the one it found."""

    name: ClassVar[str]
    needs_calibration: ClassVar[bool]
    activations: ClassVar[str | None]

    @property
    def scheme(self) -> QuantScheme | None: ...

    def preflight(self, ws: Workspace) -> None:
        """Refuse, before any work, what this stage cannot do (naming the layer and the fix)."""

    def calibrate(self, ctx: BlockContext) -> None: ...

    def transform(self, ctx: BlockContext) -> None: ...

    def export(self, ws: Workspace) -> dict: ...


@dataclass
class ModelContext:
    """The whole dense model as model stages see it, and what they have done to it.

    `teacher` is the original model (never changed); `model` is the current one, which a
    stage may replace (pruning builds a smaller one). `layer_map[j]` is the original
    index of layer j and `hidden_index` the original hidden channels kept, so later
    stages can match the two models' hidden states.
    """

    teacher: torch.nn.Module
    model: torch.nn.Module
    config: dict
    adapter: Any
    tokenizer: Any
    samples: torch.Tensor  # calibration token ids [n, length]
    work_dir: Any  # Path: where long stages keep checkpoints (survives a killed run)
    resume: bool = False
    load_text: Any = None  # Callable[[CalibConfig], Tensor]: more calibration text on request
    log: Any = print
    layer_map: list[int] = field(default_factory=list)
    hidden_index: torch.Tensor | None = None
    # after the block walk: the quantized linears (a stage may replace their entries)
    quantized: dict[str, QuantizedWeight] | None = None
    # after the walk: dense tensors the artifact stores in place of the source's
    # (Workspace.updated), for a repair that trains some of them
    updated: dict[str, torch.Tensor] | None = None
    storage_dtype: torch.dtype = torch.float32
    # before the walk: per-linear schemes for the quantizing stages (Workspace.schemes),
    # and the recipe's `ignore` patterns (linears no stage quantizes)
    schemes: dict[str, QuantScheme] = field(default_factory=dict)
    ignore: tuple[str, ...] = ()
    # where the models are and the stages compute (`--device`); `samples` stay in host
    # memory and each stage moves what it feeds the model
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))


class ModelStage(Protocol):
    """A stage that works on the whole model (`whole_model = True`): before the block walk,
    or after it when it `repairs_quantized` (then `ModelContext.quantized` is set)."""

    name: ClassVar[str]
    needs_calibration: ClassVar[bool]
    whole_model: ClassVar[bool]
    # runs under torchrun: its statistics summed over the ranks, or its training as DDP
    data_parallel: ClassVar[bool]

    def preflight(self, config: dict) -> None:
        """Refuse, before any work, what this stage cannot do to a model with `config`."""

    def planned_config(self, config: dict) -> dict:
        """The config of the model this stage will return (for later stages' preflight)."""

    def run(self, ctx: ModelContext) -> dict:
        """Change `ctx.model` (and `ctx.config`); return the manifest record."""


@dataclass(frozen=True)
class StageEntry:
    config_type: type
    factory: Any  # Callable[[config], Stage]


STAGES: dict[str, StageEntry] = {}


def register_stage(name: str, config_type: type):
    """Class decorator: make a stage available to recipes under `name`."""

    def wrap(cls):
        cls.name = name
        cls.whole_model = getattr(cls, "whole_model", False)
        STAGES[name] = StageEntry(config_type, cls)
        return cls

    return wrap
