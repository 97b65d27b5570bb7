"""The import structure docs/architecture.md draws: layers that only import downward, and
no import cycles (imports inside functions included: a deferred import is still a
dependency, it only hides the cycle until run time)."""

from __future__ import annotations

import ast
import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent / "compress"

# Bottom to top. A module named exactly belongs to that layer; otherwise to the first
# layer with a matching pattern.
LAYERS = [
    (
        "base",
        [
            "compress.errors",
            "compress.draw",
            "compress.allocator",
            "compress.device",
            "compress.distributed",
            "compress.strict_yaml",
            "compress.quantizers.scheme",
            "compress.quantizers.packing",
            "compress.artifact.integrity",
            "compress.artifact.target",
            "compress.artifact.stream_safetensors",
            "compress.model.safetensors_check",
            "compress.kernels.build",
            "compress.kernels.c_api",
        ],
    ),
    ("checkpoint", ["compress.model", "compress.model.*", "compress.calib_data*"]),
    ("artifact", ["compress.artifact*"]),
    ("runtime", ["compress.kernels*", "compress.runtime*"]),
    (
        "methods",
        [
            "compress.stage",
            "compress.estimate",
            "compress.quantizers*",
            "compress.pruning*",
            "compress.distill*",
        ],
    ),
    ("recipe", ["compress.methods", "compress.recipe"]),
    (
        "commands",
        [
            "compress.pipeline",
            "compress.plan",
            "compress.artifact.manifest",
            "compress.eval*",
            "compress.hub*",
            "compress.serve*",
            "compress.inspect",
        ],
    ),
    ("cli", ["compress.cli", "compress.__main__", "compress"]),
]


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def layer_of(module: str) -> int:
    for i, (_, patterns) in enumerate(LAYERS):
        if module in patterns:
            return i
    for i, (_, patterns) in enumerate(LAYERS):
        if any(fnmatch.fnmatchcase(module, p) for p in patterns):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS and docs/architecture.md")


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """The compress modules `path` imports anywhere in its body, typing-only ones aside."""
    tree = ast.parse(path.read_text())
    typing_only = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    out = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                out.add(full if full in known else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {m: imports(p, known) - {m} for m, p in known.items()}


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_layers_import_only_downward(graph):
    upward = [
        f"{m} ({LAYERS[layer_of(m)][0]}) imports {d} ({LAYERS[layer_of(d)][0]})"
        for m, deps in sorted(graph.items())
        for d in sorted(deps)
        if layer_of(d) > layer_of(m)
    ]
    assert not upward, "\n".join(upward)


def test_no_import_cycles(graph):
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    assert not cycles, cycles


def test_the_check_finds_an_upward_import(graph):
    """The checks themselves: an import from the checkpoint layer into the pipeline is
    caught, and so is the cycle it would close."""
    bad = {m: set(d) for m, d in graph.items()}
    bad["compress.model.loading"].add("compress.pipeline")
    assert layer_of("compress.pipeline") > layer_of("compress.model.loading")
    with pytest.raises(AssertionError):
        test_no_import_cycles(bad)
