"""Storage formats as codecs, registered once by the name a recipe's `export` uses.

A codec owns everything about its format, and nothing outside this package names one
(tests/test_formats.py): what it refuses before any work, the tensors it writes per
quantized linear and their names, the config.json block, how a reader recognizes it, how
the stored tensors decode (to integer codes for the runtime, to floats for the dense
loader), what `inspect` says of it, its hub tag and the model card's loading code, and
what vLLM's and transformers' loaders for it take (artifact/engines.py puts those
verdicts together). Each format is a codec module (compressed_tensors.py, awq_gemm.py)
over a layout module (ct_layout.py, awq_layout.py) that writes the bits out.
"""

from __future__ import annotations

from compress.artifact.formats import awq_gemm, compressed_tensors
from compress.artifact.formats.ct_layout import LayerFormat
from compress.errors import LlmpressError

# the first is the default export; a checkpoint is read by the first codec that reads it
CODECS = {c.name: c for c in (*compressed_tensors.CODECS, *awq_gemm.CODECS)}
EXPORTS = tuple(CODECS)
DEFAULT = EXPORTS[0]
ALL_SUFFIXES = frozenset(s for c in CODECS.values() for s in c.suffixes)
PACKAGES = tuple(dict.fromkeys(c.package for c in CODECS.values()))  # their readers'


def codec(export: str):
    """The codec a recipe's `export` names."""
    if export not in CODECS:
        raise LlmpressError(f"recipe: export {export!r} is not one of {', '.join(EXPORTS)}")
    return CODECS[export]


def reading_codec(config: dict):
    """The codec that reads a checkpoint's config.json (None: a dense checkpoint)."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    for c in CODECS.values():
        if c.reads(qc):
            return c
    families = dict.fromkeys(c.family for c in CODECS.values())
    raise LlmpressError(
        f"quantization method {qc.get('quant_method')!r} is not supported: llmpress reads "
        f"{', '.join(families)} checkpoints and dense ones"
    )


def stored_bits(config: dict) -> list[int]:
    """The weight bit widths a checkpoint's config.json says it stores (none: dense)."""
    c = reading_codec(config)
    return sorted(c.bits(config["quantization_config"])) if c else []


def planned_layer(scheme, group_size: int, in_features: int, activations: str | None):
    """A linear before it is quantized, as every codec's `config` takes it (the engines'
    verdicts before any work)."""
    return LayerFormat.planned(scheme, group_size, in_features, activations)
