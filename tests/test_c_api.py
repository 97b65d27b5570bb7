"""The C kernels' header is their one interface: the library exports exactly what it
declares, every kernel file compiles against it, and the ctypes structs c_api.py makes
from it have the compiler's own layout."""

from __future__ import annotations

import ctypes
import fnmatch
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from compress.kernels import c_api
from compress.kernels.build import FLAG_SETS, FOLDER, HEADERS, SOURCES, library


def _compiler() -> str:
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "the kernels need a C compiler (cc or gcc)"
    return cc


def test_the_library_exports_exactly_what_the_header_declares():
    nm = shutil.which("nm")
    assert nm, "nm (binutils, which gcc needs) lists the library's exports"
    lib = library()
    out = subprocess.run(
        [nm, "-D", "--defined-only", lib._name], capture_output=True, text=True, check=True
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert exported == set(c_api.api().functions)
    assert all(name.startswith("llmp_") for name in exported)


@pytest.mark.parametrize("flags", FLAG_SETS[::2], ids=["native", "portable"])
def test_every_kernel_file_compiles_against_the_header_without_warnings(flags):
    """-Wmissing-prototypes: a function another file or Python calls is declared in a
    header (llmpress.h, or internal.h for the files' own), never only where it is
    defined; every definition is then checked against its declaration."""
    warn = ["-Wall", "-Wmissing-prototypes", "-Werror=implicit-function-declaration"]
    if "-fopenmp" not in flags:
        warn.append("-Wno-unknown-pragmas")
    for source in SOURCES:
        run = subprocess.run(
            [_compiler(), *flags, *warn, "-fsyntax-only", str(source)],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
        bad = [ln for ln in run.stderr.splitlines() if "missing-prototypes" in ln]
        assert not bad, "\n".join(bad)
    assert {path.name for path in HEADERS} >= {"llmpress.h", "internal.h"}


# Every instruction set's kernels (the *_ref.h, *_avx2.h, *_avx512.h and gemm_amx.h files
# each .c file picks from), whichever this host has: plain C, AVX2, AVX-VNNI, AVX-512
# VNNI, AMX.
MARCHES = ("x86-64", "x86-64-v3", "alderlake", "icelake-server", "sapphirerapids")


@pytest.mark.parametrize("march", MARCHES)
def test_each_instruction_sets_kernels_compile_on_any_host(march):
    """The build compiles only this host's instruction sets; another's kernels must not
    wait for a machine that has them to show they no longer compile."""
    if platform.machine() not in ("x86_64", "AMD64"):
        march = "native"
    flags = ["-O2", f"-march={march}", "-fopenmp", "-Wall", "-Wextra", "-Werror"]
    for source in SOURCES:
        run = subprocess.run(
            [_compiler(), *flags, "-c", str(source), "-o", os.devnull],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, f"{source.name}: {run.stderr}"


def test_the_structs_have_the_compilers_layout(tmp_path):
    api = c_api.api()
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "llmpress.h"']
    lines.append("int main(void) {")
    expected = []
    for name, struct in api.structs.items():
        lines.append(f'    printf("%zu\\n", sizeof({name}));')
        expected.append(ctypes.sizeof(struct))
        for field, _ in struct._fields_:
            lines.append(f'    printf("%zu\\n", offsetof({name}, {field}));')
            expected.append(getattr(struct, field).offset)
    lines += ["    return 0;", "}"]
    src, exe = tmp_path / "layout.c", tmp_path / "layout"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([_compiler(), f"-I{FOLDER}", str(src), "-o", str(exe)], check=True)
    run = subprocess.run([str(exe)], capture_output=True, text=True, check=True)
    assert [int(v) for v in run.stdout.split()] == expected


def test_the_header_reader_refuses_what_it_cannot_bind():
    for text in (
        "typedef struct { long x; } S;",  # a type with no ctypes mapping here
        "int llmp_f(int a[4]);",  # an array parameter
        "#define N 4\nint llmp_g(int x) { return x; }",  # a definition, not a declaration
    ):
        with pytest.raises(ValueError, match=r"llmpress\.h"):
            c_api.parse(text)
    api = c_api.parse(
        "enum { A = 1, B = 0x10 };\ntypedef struct { float *k, *v; int n; } P;\n"
        "int64_t llmp_h(const P *p, float s, void *out);\nvoid llmp_i(void);"
    )
    assert api.constants == {"A": 1, "B": 16}
    assert [f for f, _ in api.structs["P"]._fields_] == ["k", "v", "n"]
    assert api.functions["llmp_h"] == (
        ctypes.c_int64,
        [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p],
    )
    assert api.functions["llmp_i"] == (None, [])


def test_the_package_ships_every_kernel_file():
    """A wheel's users compile the kernels from its package data: every source and header
    in kernels/cpu must match pyproject's patterns."""
    text = (Path(__file__).parents[1] / "pyproject.toml").read_text()
    line = re.search(r'^"compress\.kernels" = \[(.*?)\]', text, re.M)
    assert line, "pyproject.toml declares the kernels' package data"
    patterns = re.findall(r'"([^"]+)"', line.group(1))
    for path in [*SOURCES, *HEADERS]:
        rel = path.relative_to(FOLDER.parent).as_posix()
        assert any(fnmatch.fnmatch(rel, p) for p in patterns), f"{rel} is not package data"
