"""llmpress: compress a language model and measure what the compression cost in quality.

The commands' work, callable from Python (the CLI's options as keyword arguments):

    import compress

    out = compress.compress("default", "out/smollm2-w4g64", quant="rtn:w4g64")
    drift = compress.evaluate(out, data="test.txt", windows=8)
    print(drift.ppl, drift.kl, drift.top1)
    assert compress.verify(out) == []

Errors a user can fix raise `compress.errors.LlmpressError` with a one-line message.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from compress.eval.drift import Drift
    from compress.recipe import Recipe

__version__ = "0.1.0"
__all__ = ["__version__", "compress", "evaluate", "verify"]


_NOT_FLAGS = {"model", "output", "recipe", "overwrite", "resume", "log", "device"}


def compress(
    model: str | Path,
    output: str | Path,
    *,
    quant: str | None = None,
    recipe: str | Path | dict | Recipe | None = None,
    bits: float | None = None,
    calib: str | None = None,
    calib_samples: int | None = None,
    calib_len: int | None = None,
    text_field: str | None = None,
    dtype: str | None = None,
    ignore: Iterable[str] = (),
    export: str | None = None,
    lm_head: str | None = None,
    kv: str | None = None,
    targets: Iterable[str] = (),
    overwrite: bool = False,
    resume: bool = False,
    log=print,
    device: str = "auto",
) -> Path:
    """`llmpress compress MODEL -o OUTPUT ...`: write the artifact, return its folder.

    `model`: a model folder, a .gguf file, a hub id, or "default". Give `quant` (e.g.
    "rtn:w4g64", "best:w4g64") or `recipe`: a recipe YAML file, or the same recipe as a
    dict (or a parsed `Recipe`), whose own keys then replace the flag arguments. The other
    arguments are the CLI's flags of the same names (`kv` is `--kv`, `targets` the
    `--target` engines)."""
    ignore, targets = tuple(ignore), tuple(targets)
    flags_given = {k: v for k, v in locals().items() if k not in _NOT_FLAGS}
    from compress.errors import LlmpressError
    from compress.pipeline import compress as run
    from compress.recipe import Recipe, parse_recipe, recipe_from_flags

    if isinstance(recipe, dict | Recipe):
        given = [name for name, value in flags_given.items() if value not in (None, ())]
        if given:
            raise LlmpressError(
                f"compress(recipe=<a dict>) takes its settings from the recipe: put "
                f"{', '.join(given)} into the recipe instead of passing them beside it"
            )
        built = recipe if isinstance(recipe, Recipe) else parse_recipe(recipe)
    else:
        calib_flags = {"source": calib, "samples": calib_samples, "length": calib_len,
                       "text_field": text_field}  # fmt: skip
        flags = {"dtype": dtype, "export": export, "lm_head": lm_head, "kv_cache": kv}
        built = recipe_from_flags(recipe, quant, calib_flags, flags, ignore, bits, targets)
    return run(
        str(model), built, Path(output), overwrite=overwrite, resume=resume, log=log, device=device
    )


def evaluate(
    artifact: str | Path,
    base: str | Path | None = None,
    data: str | Path = "self",
    **options: Any,
) -> Drift:
    """`llmpress eval ARTIFACT ...`: the drift against the original (`base`, default the
    source in the manifest) on `data` (a text file, a dataset name or "self"). Returns a
    `Drift` with `ppl`, `base_ppl`, `ppl_ratio`, `kl`, `top1`, `tokens`; `options` are
    `compress.eval.run.evaluate`'s (`ctx`, `windows`, `record`, `engine`, `kv`, `log`, ...)
    and records the result in the manifest unless `record=False`."""
    from compress.eval.run import evaluate as run

    return run(str(artifact), None if base is None else str(base), str(data), **options)


def verify(artifact: str | Path) -> list[str]:
    """`llmpress verify ARTIFACT`: the files that do not match the sha256 the manifest
    recorded, one line each; an empty list when every file matches."""
    from compress.artifact.integrity import problems

    return problems(Path(artifact))
