"""YAML the user hands llmpress (recipes, gate files), read strictly before any object is built.

Plain `yaml.safe_load` lets a 1 KB file expand aliases into gigabytes ("billion laughs"),
recurses once per nesting level until Python's stack gives out, and keeps the last of
two equal keys without a word. A recipe needs none of that, so anchors and aliases,
nesting deeper than MAX_DEPTH and duplicate keys are refused, each in one line that
names the line of the file.
"""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node

from compress.errors import LlmpressError

MAX_DEPTH = 50  # a recipe nests 4 levels (stages → list → stage → settings)
MAX_BYTES = 1 << 20  # a recipe or gate file is a few hundred bytes


class _Refused(yaml.YAMLError):
    """A construct llmpress refuses in user YAML, and where it stands."""

    def __init__(self, problem: str, mark) -> None:
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader without anchors, aliases, deep nesting or duplicate keys."""

    _depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        event = self.peek_event()
        if isinstance(event, AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _Refused(
                "YAML anchors and aliases (&name, *name) are not allowed: write the values out",
                event.start_mark,
            )
        if not isinstance(event, (SequenceStartEvent, MappingStartEvent)):
            return super().compose_node(parent, index)
        if self._depth >= MAX_DEPTH:
            raise _Refused(
                f"nested deeper than {MAX_DEPTH} levels (a recipe needs 4): check the brackets",
                event.start_mark,
            )
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = Composer.compose_mapping_node(self, anchor)
        seen: set[tuple[str, str]] = set()
        for key, _ in node.value:
            ident = (key.tag, key.value if isinstance(key.value, str) else id(key))
            if ident in seen:
                raise _Refused(
                    f"key {key.value!r} is given twice: keep one (YAML would silently use "
                    "the last)",
                    key.start_mark,
                )
            seen.add(ident)
        return node


def load_yaml(path: Path, what: str) -> Any:
    """The data in the YAML file `path` (`what` names it in errors, e.g. "recipe")."""
    path = Path(path)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            kind = "a folder" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise LlmpressError(f"{what} {path} is {kind}: pass a YAML file")
        if info.st_size > MAX_BYTES:
            raise LlmpressError(
                f"{what} {path} is {info.st_size:,} bytes, over the {MAX_BYTES:,} a {what} "
                "may have: pass the YAML file itself"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise LlmpressError(f"cannot read {what} {path}: {e.strerror}") from e
    except UnicodeDecodeError:
        raise LlmpressError(f"{what} {path} is not text (UTF-8 YAML): pass a YAML file") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader: no Python objects
    except _Refused as e:
        raise LlmpressError(f"{what} {path}{_line(e)}: {e.problem}") from None
    except yaml.YAMLError as e:
        raise LlmpressError(f"{what} {path} is not valid YAML{_line(e)}") from None


def _line(e: yaml.YAMLError) -> str:
    line = getattr(getattr(e, "problem_mark", None), "line", None)
    return f" at line {line + 1}" if line is not None else ""
