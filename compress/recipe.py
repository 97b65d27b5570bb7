"""Recipes: an ordered list of stages plus calibration settings, validated before any work.

YAML form:

    stages:
      - prune: {params: 0.7}        # whole-model stages first (prune, distill)
      - distill: {tokens: 300000}
      - rtn: {bits: 4, group_size: 64, zero_point: true}
    calib: {source: self, samples: 128, length: 512, seed: 0}
    ignore: ["*.down_proj"]      # globs or re:REGEX on module names
    lm_head: w8                  # also quantize the output projection (RTN; w8, w4g64...);
                                 # a tied embedding is then stored untied, in full
    kv_cache: int8               # KV-cache scheme the runtime uses: int8 (the default),
                                 # int4 (KIVI), none (fp32)
    dtype: auto                  # storage dtype of unquantized tensors and scales (auto:
                                 # the checkpoint's; auto16: the same, but bfloat16 for
                                 # a float32 checkpoint)
    export: auto                 # compressed-tensors (+ int8 outlier columns, if kept);
                                 # compressed-tensors: exactly, nothing extra;
                                 # awq-gemm: AutoAWQ's layout (4-bit, zero point)

Flag form: `--quant rtn:w4g64` (see `parse_quant`). Every key is checked against the
stage's config dataclass, so a typo fails in a second with a suggestion instead of
after an hour of calibration.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from compress.artifact.formats import DEFAULT, codec
from compress.calib_data.config import CalibConfig
from compress.errors import LlmpressError
from compress.methods import STAGES
from compress.stage import Stage
from compress.strict_yaml import load_yaml

# auto: the checkpoint's own; auto16: the checkpoint's when it is 16-bit, else bfloat16
DTYPES = ("auto", "auto16", "float32", "bfloat16", "float16")


# The KV cache an artifact's runtime uses unless the recipe or `--kv` says otherwise.
# int8 (KIVI) measured against fp32 on the default model (benchmarks/kv_default.py): 1.00x
# at batch 1 and 1.03-1.06x at batch 8-32 with 32-token prompts, 1.4-1.5x at 1,024-token
# contexts, 3.4x smaller; served KL of the w4g64 artifact +0.0003 (0.1794 -> 0.1797).
# The AVX2 kernels (built so on the same host): 1.00-1.02x short, 1.4x at 1,024 tokens.
DEFAULT_KV = "int8"


@dataclass(frozen=True)
class Recipe:
    stages: tuple[tuple[str, Any], ...]
    calib: CalibConfig = field(default_factory=CalibConfig)
    ignore: tuple[str, ...] = ()
    dtype: str = "auto"
    export: str = "auto"
    # "w8", "w4g64", ...: RTN-quantize the output projection; None: keep it as stored;
    # "auto" (the default): w8 for an untied head, or one tied to a 32-bit embedding, of a
    # model whose blocks are quantized without a bits budget; as stored otherwise
    # (resolve_lm_head, once the checkpoint is known)
    lm_head: str | None = "auto"
    kv_cache: str = DEFAULT_KV  # "int8", "int4", "int4:g64", "none" (fp32)
    # engines the artifact must load in ("vllm", "vllm-cpu", "transformers"): plans keep to
    # what they run and the rest is refused before any work (plan.fit_targets)
    targets: tuple[str, ...] = ()

    def lm_head_scheme(self):
        """The lm_head's QuantScheme, or None to keep it as stored (or not yet resolved)."""
        if self.lm_head in (None, "auto"):
            return None
        from compress.quantizers.rtn import RTNConfig

        return RTNConfig(**parse_quant(f"rtn:{self.lm_head}")["rtn"]).scheme

    def build(self) -> list[Stage]:
        return [STAGES[name].factory(config) for name, config in self.stages]

    @property
    def needs_calibration(self) -> bool:
        return any(STAGES[name].factory.needs_calibration for name, _ in self.stages)

    def to_dict(self) -> dict:
        return {
            "stages": [{name: dataclasses.asdict(cfg)} for name, cfg in self.stages],
            "calib": dataclasses.asdict(self.calib),
            "ignore": list(self.ignore),
            "dtype": self.dtype,
            "export": self.export,
            "lm_head": self.lm_head,
            "kv_cache": self.kv_cache,
            "targets": list(self.targets),
        }

    def label(self) -> str:
        parts = []
        for name, cfg in self.stages:
            scheme = getattr(cfg, "scheme", None)
            parts.append(f"{name}:{scheme.label()}" if scheme else name)
        if self.lm_head_scheme() is not None:
            parts.append(f"lm_head:{self.lm_head_scheme().label()}")
        if self.kv_cache != "none":
            parts.append(f"kv:{self.kv_cache}")
        return "+".join(parts)


def _suggest(word: str, options: typing.Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(options), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _type_ok(value: Any, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_type_ok(value, a) for a in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in (tuple, list):
        return isinstance(value, (list, tuple))
    return isinstance(value, annotation) if isinstance(annotation, type) else True


def build_config(config_type: type, params: Any, where: str):
    """Instantiate a config dataclass from user data, rejecting unknown keys and bad types."""
    if params is None:
        params = {}
    if not isinstance(params, dict):
        raise LlmpressError(f"{where}: expected a mapping of settings, got {params!r}")
    hints = typing.get_type_hints(config_type)
    names = [f.name for f in dataclasses.fields(config_type)]
    for key, value in params.items():
        if key not in names:
            raise LlmpressError(
                f"{where}: unknown key {key!r}{_suggest(str(key), names)}; "
                f"valid keys: {', '.join(names)}"
            )
        if not _type_ok(value, hints[key]):
            raise LlmpressError(f"{where}.{key}: {value!r} is not a valid {hints[key]}")
        _check_value(f"{where}.{key}", value)
    try:
        return config_type(**params)
    except LlmpressError as e:
        raise LlmpressError(f"{where}: {e}") from e


# Settings whose value must be above a floor, whatever the stage: (name, floor, why).
_FLOORS = {
    "threshold": (0, "an outlier threshold <= 0 keeps every column in 16 bits"),
    "top_k": (-1, "a count of outlier columns cannot be negative"),
}
MIN_GROUP = 32


def check_group_size(value: Any, where: str) -> None:
    """Refuse a group size that is not a power of two of at least MIN_GROUP: each group
    stores a 16- or 32-bit scale, so groups of 1-16 spend more bits on scales than 4-bit
    weights save, and engines' kernels (vLLM: 32, 64, 128) take powers of two."""
    if value is None or isinstance(value, bool) or not isinstance(value, int):
        return
    if value < MIN_GROUP or value & (value - 1):
        raise LlmpressError(
            f"{where}: group size {value} is not a power of two >= {MIN_GROUP}: smaller groups "
            "spend more bits on scales than they save, and engines take powers of two; use "
            "32, 64 or 128 (or null: one scale per output channel)"
        )


def _check_value(where: str, value: Any) -> None:
    """Refuse a setting's value that no stage can mean: NaN or infinity, a group size the
    engines cannot take, or a value under its floor (_FLOORS)."""
    if isinstance(value, float) and not math.isfinite(value):
        raise LlmpressError(f"{where}: {value} is not a finite number")
    key = where.rpartition(".")[2]
    if key == "group_size":
        check_group_size(value, where)
    floor = _FLOORS.get(key)
    if floor and isinstance(value, (int, float)) and value <= floor[0]:
        raise LlmpressError(f"{where}: {value} is too small: {floor[1]}")


def _kv_cache(value: Any) -> str:
    """The recipe's KV-cache scheme, checked now: "none" (or null, "fp32") for fp32."""
    from compress.runtime.kv_cache import parse_kv

    value = "none" if value in (None, "none", "fp32") else str(value)
    parse_kv(value)
    return value


def parse_recipe(data: Any) -> Recipe:
    if not isinstance(data, dict):
        raise LlmpressError("recipe: expected a mapping with a `stages` list")
    allowed = ("stages", "calib", "ignore", "dtype", "export", "lm_head", "kv_cache", "targets")
    for key in data:
        if key not in allowed:
            raise LlmpressError(
                f"recipe: unknown key {key!r}{_suggest(str(key), allowed)}; "
                f"valid keys: {', '.join(allowed)}"
            )
    export = data.get("export", "auto")
    stages = _parse_stages(data.get("stages"), export)
    calib = build_config(CalibConfig, data.get("calib"), "calib")
    ignore = _parse_ignore(data.get("ignore") or [])
    dtype, lm_head = data.get("dtype", "auto"), data.get("lm_head", "auto")
    lm_head = None if lm_head in (None, "none") else lm_head
    _check_layout(export, dtype, None if lm_head == "auto" else lm_head)
    recipe = Recipe(
        stages=stages,
        calib=calib,
        ignore=ignore,
        dtype=dtype,
        export=export,
        lm_head=None if lm_head is None else str(lm_head),
        kv_cache=_kv_cache(data.get("kv_cache", DEFAULT_KV)),
        targets=_parse_targets(data.get("targets") or []),
    )
    try:
        recipe.lm_head_scheme()
    except LlmpressError as e:
        raise LlmpressError(f"recipe: lm_head {lm_head!r}: {e} (use e.g. w8 or w4g64)") from e
    return recipe


TARGETS = ("vllm", "vllm-cpu", "transformers")


def _parse_targets(raw: Any) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, list | tuple):
        raise LlmpressError(f"recipe: targets must be a list of engines ({', '.join(TARGETS)})")
    for name in items:
        if name not in TARGETS:
            raise LlmpressError(
                f"recipe: target {name!r} is not an engine llmpress knows; use {', '.join(TARGETS)}"
            )
    return tuple(dict.fromkeys(items))


def _parse_stages(raw: Any, export: str) -> tuple[tuple[str, Any], ...]:
    """Each `name: {settings}` entry as (name, its config), in an order the stages accept:
    whole-model stages first, each after the stages it requires, then the block stages."""
    if not isinstance(raw, list) or not raw:
        raise LlmpressError("recipe: `stages` must be a non-empty list, e.g. [{rtn: {bits: 4}}]")
    stages: list[tuple[str, Any]] = []
    for i, entry in enumerate(raw):
        if isinstance(entry, str):
            entry = {entry: {}}
        if not isinstance(entry, dict) or len(entry) != 1:
            raise LlmpressError(f"recipe: stage {i} must be one `name: {{settings}}` mapping")
        ((name, params),) = entry.items()
        if name not in STAGES:
            raise LlmpressError(
                f"recipe: unknown stage {name!r}{_suggest(str(name), STAGES)}; "
                f"available: {', '.join(sorted(STAGES))}"
            )
        config = build_config(STAGES[name].config_type, params, f"stages[{i}].{name}")
        codec(export).check_scheme(name, getattr(config, "scheme", None))
        stages.append((name, config))
        _check_order(stages, i)
    return _fill_prune_multiple(_fill_base_scheme(stages, export))


def _fill_prune_multiple(stages: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    """A prune stage without `multiple` keeps widths in whole groups of the quantizing
    stages after it (their largest group size, and at least the kernels' 32)."""
    out = []
    for i, (name, cfg) in enumerate(stages):
        if name == "prune" and cfg.multiple is None:
            groups = [getattr(c, "scheme", None) for _, c in stages[i + 1 :]]
            sizes = [s.group_size for s in groups if s is not None and (s.group_size or 0) > 0]
            cfg = dataclasses.replace(cfg, multiple=math.lcm(cfg.widths_multiple, *sizes))
        out.append((name, cfg))
    return tuple(out)


def _fill_base_scheme(stages: list[tuple[str, Any]], export: str) -> tuple[tuple[str, Any], ...]:
    """Give a stage that plans per-linear schemes (mixed) the quantizing stages' scheme."""
    out = []
    for i, (name, cfg) in enumerate(stages):
        if STAGES[name].factory.plans_schemes:
            rest = stages[i + 1 :]
            if rest and STAGES[rest[0][0]].factory.whole_model:
                raise LlmpressError(
                    f"recipe: {name} plans the schemes of the model the quantizers see: put "
                    f"{rest[0][0]} before it"
                )
            rounders = [(n, c) for n, c in rest if getattr(c, "scheme", None)]
            if not rounders or not all(STAGES[n].factory.per_layer_schemes for n, _ in rounders):
                raise LlmpressError(
                    f"recipe: {name} chooses each linear's scheme for the quantizing stages "
                    "after it: follow it with awq, gptq or rtn (not int8)"
                )
            if not codec(export).per_layer_schemes:
                raise LlmpressError(
                    f"recipe: the {export} export holds one scheme; mixed precision needs "
                    f"the default {codec(DEFAULT).family} export"
                )
            cfg = dataclasses.replace(cfg, base=rounders[0][1].scheme.label())
        out.append((name, cfg))
    return tuple(out)


def _check_order(stages: list[tuple[str, Any]], i: int) -> None:
    """Refuse stage i (the last of `stages`) where it cannot stand."""
    name, factory = stages[-1][0], STAGES[stages[-1][0]].factory
    trailing = [n for j, (n, _) in enumerate(stages[:-1]) if _after_walk(stages, j)]
    if trailing:
        raise LlmpressError(
            f"recipe: stage {i} ({name}) follows {trailing[0]}, which repairs the quantized "
            f"model: put {trailing[0]} last"
        )
    after_walk = _after_walk(stages, len(stages) - 1)
    if after_walk and not factory.repairs_quantized:
        raise LlmpressError(
            f"recipe: stage {i} ({name}) works on the whole model and must come before "
            "the quantizing stages (e.g. prune → distill → awq)"
        )
    if not after_walk:
        for need, why in factory.requires:
            if not any(n == need for n, _ in stages[:-1]):
                raise LlmpressError(
                    f"recipe: stage {i} ({name}) {why}: put a {need} stage before it"
                )
    _check_block_stages(stages, i)


def _after_walk(stages: list[tuple[str, Any]], j: int) -> bool:
    """Whether stage j works on the whole model after a block stage (on the quantized one)."""
    return STAGES[stages[j][0]].factory.whole_model and any(
        not STAGES[n].factory.whole_model for n, _ in stages[:j]
    )


def _check_block_stages(stages: list[tuple[str, Any]], i: int) -> None:
    """Block stages chain as: quantizers, every one but the last only preparing the weights
    for the next with the same scheme (awq → gptq), then stages that refine the result."""
    block = [(n, cfg) for n, cfg in stages if not STAGES[n].factory.whole_model]
    if not block:
        return
    name, config = block[-1]
    factory = STAGES[name].factory
    rounding = [(n, cfg) for n, cfg in block[:-1] if not STAGES[n].factory.refines]
    if factory.refines:
        if not rounding:
            raise LlmpressError(
                f"recipe: stage {i} ({name}) refines a quantization: put a quantizing stage "
                "(e.g. awq or gptq) before it"
            )
        return
    if len(block) > len(rounding) + 1:
        raise LlmpressError(
            f"recipe: stage {i} ({name}) quantizes after a stage that refines the result; "
            "put the refining stage last"
        )
    if rounding:
        before, cfg = rounding[-1]
        if not STAGES[before].factory.prepares:
            raise LlmpressError(
                f"recipe: stages {before!r} and {name!r} both quantize the block linears; keep "
                "one, or put awq first to prepare them for the other (awq → gptq)"
            )
        if cfg.scheme != config.scheme:
            raise LlmpressError(
                f"recipe: {before} prepares the weights for {cfg.scheme.label()} but {name} "
                f"rounds them to {config.scheme.label()}; give both the same scheme"
            )


def _parse_ignore(ignore: Any) -> tuple[str, ...]:
    if not isinstance(ignore, list) or not all(isinstance(p, str) for p in ignore):
        raise LlmpressError("recipe: `ignore` must be a list of module-name patterns")
    for pattern in ignore:
        if pattern.startswith("re:"):
            try:
                re.compile(pattern[3:])
            except re.error as e:
                raise LlmpressError(
                    f"ignore pattern {pattern!r} is not a valid regular expression ({e}); "
                    "fix it, or use a glob such as 'model.layers.0.*'"
                ) from None
    return tuple(ignore)


AUTO_LM_HEAD = "w8"  # benchmarks/lm_head.py: the smallest drift of the quantized heads


def resolve_lm_head(recipe: Recipe) -> Recipe:
    """`lm_head: auto` made concrete. When the recipe quantizes the blocks to 8 bits or
    fewer (no --bits budget, which the head would exceed) and the layout holds a quantized
    head, the head is stored as int8 per channel: it is most of a small model's decode
    bytes (545 of 770 MB a step at Qwen2.5-0.5B's shape; 113 of 173 MB on the default
    model, whose GGUF embedding converts to fp32). A tied head becomes an int8 copy of its
    own and the embedding stays as stored for the input lookup: in bf16 too, the copy
    decoded 1.29x faster at Qwen2.5-0.5B's shape and 1.51x at Llama-3.2-1B's, for an
    artifact 25-28% larger (benchmarks/scale.py --heads w8). Blocks with zero points keep
    the head as stored: beside their groups a per-channel int8 head leaves transformers
    no way to load the artifact (engines.transformers_route)."""
    if recipe.lm_head != "auto":
        return recipe
    bits = [getattr(cfg, "scheme", None) for _, cfg in recipe.stages]
    quantized = any(b is not None and b.bits <= 8 for b in bits)
    if any(name == "mixed" for name, _ in recipe.stages):  # a --bits budget it would exceed
        quantized = False
    if any(b is not None and b.zero_point for b in bits):
        quantized = False
    holds = codec(recipe.export).holds_lm_head
    return dataclasses.replace(recipe, lm_head=AUTO_LM_HEAD if quantized and holds else None)


def _check_layout(export: str, dtype: str, lm_head: Any) -> None:
    """The dtype and lm_head the export's layout can hold."""
    if dtype not in DTYPES:
        raise LlmpressError(f"recipe: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    layout = codec(export)
    forced = layout.storage_dtype and str(layout.storage_dtype).removeprefix("torch.")
    if forced and dtype not in ("auto", "auto16", forced):
        raise LlmpressError(
            f"recipe: the {export} export stores {forced}; drop `dtype` or set {forced}"
        )
    if not layout.holds_lm_head and lm_head is not None:
        raise LlmpressError(f"recipe: the {export} export cannot hold a quantized lm_head")


def recipe_from_flags(
    recipe_file: Path | None,
    quant: str | None,
    calib_flags: dict,
    flags: dict,
    ignore: tuple[str, ...] = (),
    bits: float | None = None,
    targets: tuple[str, ...] = (),
) -> Recipe:
    """The recipe `llmpress compress` runs: a recipe file or one `--quant` stage, with the
    flags that were given (not None) overriding its settings, `--ignore` and `--target`
    adding to its lists and `--bits` setting (or adding) mixed precision's budget."""
    if bool(recipe_file) == bool(quant):
        raise LlmpressError("give exactly one of --recipe FILE or --quant SPEC (e.g. rtn:w4g64)")
    data = load_recipe(recipe_file) if recipe_file else quant_recipe(quant, flags.get("export"))
    if not isinstance(data, dict):
        raise LlmpressError(f"recipe {recipe_file}: expected a mapping with a `stages` list")
    if bits is not None:
        if not math.isfinite(bits) or bits <= 0:
            raise LlmpressError(f"--bits {bits}: give a positive average bits per weight, e.g. 4.6")
        data = {**data, "stages": with_budget(data.get("stages"), bits)}
    calib = dict(data.get("calib") or {})
    calib.update({k: v for k, v in calib_flags.items() if v is not None})
    data = {**data, "calib": calib, **{k: v for k, v in flags.items() if v}}
    if targets:
        data["targets"] = [*(data.get("targets") or []), *targets]
    if ignore:
        data["ignore"] = [*(data.get("ignore") or []), *ignore]
    return parse_recipe(data)


def with_budget(stages: Any, bits: float) -> Any:
    """The stages with mixed precision to `bits` per weight: the recipe's own mixed stage
    given that budget, else one put just before the first block stage."""
    if not isinstance(stages, list):
        return stages  # parse_recipe says what is wrong

    def entry(e: Any) -> tuple[Any, Any]:
        if isinstance(e, str):
            return e, {}
        return next(iter(e.items())) if isinstance(e, dict) and len(e) == 1 else (None, None)

    names = [entry(e)[0] for e in stages]
    factories = [STAGES[n].factory if n in STAGES else None for n in names]
    for k, factory in enumerate(factories):
        if factory is not None and factory.plans_schemes:
            params = entry(stages[k])[1]
            params = params if isinstance(params, dict) else {}
            return [*stages[:k], {names[k]: {**params, "bits_budget": bits}}, *stages[k + 1 :]]
    first = next(
        (k for k, f in enumerate(factories) if f is not None and not f.whole_model), len(stages)
    )
    return [*stages[:first], {"mixed": {"bits_budget": bits}}, *stages[first:]]


def load_recipe(path: Path) -> Any:
    """The recipe file's data, read strictly (strict_yaml: no aliases, deep nesting or
    duplicate keys)."""
    return load_yaml(path, "recipe")


_INT8 = re.compile(r"^int8(?::g(?P<group>\d+))?$")
_QUANT = re.compile(
    r"^(?:(?P<method>[a-z0-9_]+):)?w(?P<bits>\d+)(?:g(?P<group>\d+))?(?P<zp>zp|sym)?$"
)
DEFAULT_PRESET = "fast"  # what a spec naming no method (`--quant w4g64`) runs


@dataclass(frozen=True)
class Preset:
    """A named recipe for `--quant NAME:w<BITS>g<GROUP>`.

    `stages`: each with its settings; the quantizing ones are also given the scheme (tune
    and distill keep it). `extra_bits`: mixed precision to the scheme's bits plus this
    many per weight (scales counted), spent on the linears the Fisher estimate finds most
    sensitive. `dtype`: the recipe's storage dtype unless `--dtype` is given. `calib`:
    calibration settings, under the user's own flags."""

    stages: tuple[tuple[str, dict], ...]
    extra_bits: float | None = None
    dtype: str = "auto"
    calib: tuple[tuple[str, object], ...] = ()


# `best` is the recipe with the lowest KL measured within about ten minutes on 2 cores for
# the default model (benchmarks/quality.py): mixed precision within w4g64's class of 4.6
# bits per weight, with 16-bit scales (32-bit ones take 0.5 of w4g64's 4.5 bits, 16-bit
# ones 0.25, and every engine computes in 16 bits anyway), GPTQ with searched scales, and
# a 64-step repair of the scales, on 64 × 512 calibration tokens: KL 0.0747 at 4.60 bits
# in 8 to 10 minutes (the repair's matmuls in bf16; 32 steps: 0.0778 in 6.6, and more drift
# at 3 and 2 bits as well), where the earlier chain with AWQ and block tuning (min-max GPTQ)
# took 29 minutes for 0.0792. `fast` (also what `--quant w4g64` with no method means) is
# the lowest KL measured within about two minutes: GPTQ with importance-searched group
# scales on 16 × 512 calibration tokens, KL 0.145 at w4g64 in a minute (32 samples: 0.141,
# but self-generated text for them takes two minutes, not one), where RTN drifts 0.425
# and 128-sample min-max GPTQ 0.235 in 5 minutes.
PRESETS: dict[str, Preset] = {
    "fast": Preset(stages=(("gptq", {}),), calib=(("samples", 16),)),
    "best": Preset(
        stages=(("gptq", {}), ("distill", {"tokens": 65536, "batch": 2})),
        extra_bits=0.6,
        dtype="auto16",
        calib=(("samples", 64),),
    ),
}


def quant_recipe(spec: str, export: str | None = None) -> dict:
    """The recipe a `--quant` spec stands for: one stage, or a preset's whole recipe (its
    mixed precision left out where the export's layout holds one scheme)."""
    m = _QUANT.match(spec.strip())
    method = m and (m["method"] or DEFAULT_PRESET)
    if not (m and method in PRESETS):
        return {"stages": [parse_quant(spec)]}
    preset = PRESETS[method]
    scheme = parse_quant(f"rtn:{spec.strip().split(':')[-1]}")["rtn"]
    codec(export or "auto").check_scheme(method, _rtn_scheme(scheme))  # in its own name
    stages = [
        {name: {**settings, **({} if _keeps_scheme(name) else scheme)}}
        for name, settings in preset.stages
    ]
    if preset.extra_bits is not None and codec(export or "auto").per_layer_schemes:
        stages = with_budget(stages, round(scheme["bits"] + preset.extra_bits, 4))
    return {"stages": stages, "dtype": preset.dtype, "calib": dict(preset.calib)}


def _rtn_scheme(settings: dict):
    """The QuantScheme that shorthand `settings` stand for, defaults filled in."""
    from compress.quantizers.rtn import RTNConfig

    return RTNConfig(**settings).scheme


def _keeps_scheme(name: str) -> bool:
    factory = STAGES[name].factory
    return factory.refines or factory.whole_model


def parse_quant(spec: str) -> dict:
    """`rtn:w4g64zp` → {"rtn": {bits: 4, group_size: 64, zero_point: true}}; `int8[:g128]`.

    What the spec leaves out takes the stage's defaults, exactly as an omitted recipe key
    does: groups of 64 below 8 bits and per-channel at 8, symmetric (scheme.py).
    """
    int8 = _INT8.match(spec.strip())
    if int8:
        if not int8["group"]:
            return {"int8": {}}
        check_group_size(int(int8["group"]), spec)
        return {"int8": {"group_size": int(int8["group"])}}
    m = _QUANT.match(spec.strip())
    if not (m and m["method"]):
        raise LlmpressError(
            f"--quant {spec!r} not understood: use [METHOD:]w<BITS>[g<GROUP>][zp|sym], "
            "e.g. w4g64 (the fast preset), best:w4g64, awq:w4g64, rtn:w8, or int8 "
            "(LLM.int8()-style outliers)"
        )
    settings: dict[str, Any] = {"bits": int(m["bits"])}
    if m["group"]:
        settings["group_size"] = int(m["group"])
        check_group_size(settings["group_size"], spec)
    if m["zp"]:
        settings["zero_point"] = m["zp"] == "zp"
    return {m["method"]: settings}
