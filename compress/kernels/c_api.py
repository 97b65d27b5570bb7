"""The C kernels' interface as cpu/llmpress.h states it, for ctypes: the structs, the
functions' signatures and the enum constants, read from the header itself so that Python
never restates them (the compiler checks every definition against the same header).

The reader takes the forms the header keeps to: `typedef struct { ... } Name;`, one
prototype per line of C, `enum { NAME = value, ... };`. Anything else it does not know
raises, naming the line: a declaration the bindings would silently get wrong must fail
the build's tests instead.
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

HEADER = Path(__file__).parent / "cpu" / "llmpress.h"

SCALARS = {
    "void": None,
    "int": ctypes.c_int,
    "int8_t": ctypes.c_int8,
    "uint8_t": ctypes.c_uint8,
    "uint16_t": ctypes.c_uint16,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "double": ctypes.c_double,
}


@dataclass
class Api:
    structs: dict[str, type[ctypes.Structure]] = field(default_factory=dict)
    functions: dict[str, tuple[object, list]] = field(default_factory=dict)  # restype, args
    constants: dict[str, int] = field(default_factory=dict)


def _code(text: str) -> str:
    """The header without comments and preprocessor lines, one statement per line."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = "\n".join(ln for ln in text.splitlines() if not ln.lstrip().startswith("#"))
    return re.sub(r"\s+", " ", text)


def _ctype(decl: str, api: Api, where: str):
    """The ctypes type of a declaration's type part (`const float *`, `QLin`, `int`):
    every pointer is an address (c_void_p), a struct by value its Structure."""
    words = decl.replace("*", " * ").split()
    if "*" in words:
        return ctypes.c_void_p
    base = [w for w in words if w != "const"]
    if len(base) == 1 and base[0] in SCALARS:
        return SCALARS[base[0]]
    if len(base) == 1 and base[0] in api.structs:
        return api.structs[base[0]]
    raise ValueError(f"{HEADER.name}: type {decl!r} in {where!r} is not one c_api.py reads")


def _split_declarator(part: str) -> tuple[str, str]:
    """`const float *name` -> (`const float *`, `name`)."""
    m = re.fullmatch(r"(.*?[\s*])(\w+)", part.strip())
    if m is None:
        raise ValueError(f"{HEADER.name}: cannot read the declaration {part!r}")
    return m.group(1), m.group(2)


def _struct(name: str, body: str, api: Api) -> None:
    fields = []
    for stmt in filter(None, (s.strip() for s in body.split(";"))):
        first, *more = stmt.split(",")
        base, ident = _split_declarator(first)
        type_words = base.replace("*", " ").split()
        fields.append((ident, _ctype(base, api, stmt)))
        for extra in more:  # `float *k, *v`: each declarator's own stars
            stars, ident = re.fullmatch(r"\s*(\**)\s*(\w+)\s*", extra).groups()
            fields.append((ident, _ctype(" ".join(type_words) + " " + stars, api, stmt)))
    api.structs[name] = type(name, (ctypes.Structure,), {"_fields_": fields})


def _function(stmt: str, api: Api) -> None:
    m = re.fullmatch(r"(.+?[\s*])(llmp_\w+)\s*\((.*)\)", stmt)
    if m is None:
        raise ValueError(f"{HEADER.name}: cannot read the declaration {stmt!r}")
    ret, name, params = m.groups()
    args = []
    if params.strip() != "void":
        for param in params.split(","):
            base, _ = _split_declarator(param)
            args.append(_ctype(base, api, stmt))
    api.functions[name] = (_ctype(ret, api, stmt), args)


def parse(text: str) -> Api:
    api = Api()
    code = _code(text)
    pos = 0
    for m in re.finditer(r"typedef struct \{(.*?)\} (\w+);|enum \{(.*?)\};|([^;{}]+);", code):
        if code[pos : m.start()].strip():
            raise ValueError(f"{HEADER.name}: cannot read {code[pos : m.start()].strip()!r}")
        pos = m.end()
        if m.group(2):
            _struct(m.group(2), m.group(1), api)
        elif m.group(3) is not None:
            for item in filter(None, (s.strip() for s in m.group(3).split(","))):
                key, value = (s.strip() for s in item.split("="))
                api.constants[key] = int(value, 0)
        else:
            _function(m.group(4).strip(), api)
    if code[pos:].strip():
        raise ValueError(f"{HEADER.name}: cannot read {code[pos:].strip()!r}")
    return api


@cache
def api() -> Api:
    """The header's interface (read once per process)."""
    return parse(HEADER.read_text())


def declare(lib) -> None:
    """Every function of the header declared on the loaded library `lib`."""
    for name, (restype, args) in api().functions.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, restype
