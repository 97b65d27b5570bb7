"""A storage format is one codec: nothing outside compress/artifact/formats/ names one in
code, so a new format is a new module there, never a branch in a consumer (the writer,
the reader, inspect, the model card, the engines' verdicts, eval)."""

from __future__ import annotations

import ast
from pathlib import Path

from compress.artifact.formats import CODECS, DEFAULT, codec, reading_codec

ROOT = Path(__file__).resolve().parent.parent / "compress"
FORMATS = ROOT / "artifact" / "formats"

# what a format's code branches on or writes: its names, config keys and tensor suffixes
WORDS = (
    "compressed-tensors",
    "compressed_tensors",
    "CompressedTensors",
    "awq-gemm",
    "pack-quantized",
    "int-quantized",
    "quant_method",
    "config_groups",
    "modules_to_not_convert",
    "weight_packed",
    "weight_zero_point",
    "weight_outlier",
    "qweight",
    "qzeros",
)


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            out.add(id(first.value))
    return out


def format_words(path: Path) -> list[str]:
    """`file:line: word` for each string in code (docstrings and comments aside) or name
    that holds a format's word."""
    tree = ast.parse(path.read_text())
    docs = _docstrings(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = "" if id(node) in docs else node.value
        elif isinstance(node, ast.Name | ast.alias | ast.Attribute):
            text = getattr(node, "id", None) or getattr(node, "attr", None) or node.name
        else:
            continue
        found += [f"{path.relative_to(ROOT.parent)}:{node.lineno}: {w}" for w in WORDS if w in text]
    return found


def test_no_format_is_named_outside_the_codecs():
    outside = [p for p in ROOT.rglob("*.py") if FORMATS not in p.parents]
    leaks = [hit for path in outside for hit in format_words(path)]
    assert not leaks, "\n".join(leaks)


def test_the_check_finds_what_the_codecs_name():
    """The scan is live: the codecs' own modules are full of the words it looks for."""
    inside = {w.rsplit(": ", 1)[1] for p in FORMATS.glob("*.py") for w in format_words(p)}
    assert {"quant_method", "config_groups", "qweight", "weight_packed"} <= inside


def test_every_codec_reads_its_own_config_and_says_what_it_is():
    """Each export's config.json block is read back by that codec's family, and each has
    the attributes consumers ask of it instead of its name."""
    from compress.artifact.formats.ct_layout import LayerFormat
    from compress.quantizers.scheme import QuantScheme

    scheme = QuantScheme(4, 64, True)
    layers = {"model.layers.0.mlp.down_proj": LayerFormat.planned(scheme, 64, 256, None)}
    for name, c in CODECS.items():
        config = {"quantization_config": c.config(layers, {}, ["lm_head"])}
        assert reading_codec(config).family == c.family, name
        assert c.hub_tag and c.summary and c.package
        assert c.describe(config["quantization_config"])[0].startswith("format: ")
        assert isinstance(c.transformers_problems(config), list)
    assert codec(DEFAULT) is CODECS[DEFAULT] and reading_codec({}) is None
