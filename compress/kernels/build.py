"""Build the C kernels once per machine and load them with ctypes.

Compiled on first use with the system C compiler for this very processor (-march=native:
AVX2, and VNNI where present), cached under ~/.cache/llmpress/kernels keyed by the source,
the flags and the CPU, and written to a temporary name then renamed so that concurrent
first uses cannot load a half-written library. No torch headers: it builds in a second.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from compress.errors import LlmpressError
from compress.kernels.c_api import declare

FOLDER = Path(__file__).parent / "cpu"  # every .c file there, built into one library
SOURCES = sorted(FOLDER.glob("*.c"))
HEADERS = sorted(FOLDER.glob("*.h"))  # llmpress.h: the interface (c_api.py reads it)
# No -ffast-math (NaN and infinity must survive), but the parts of it that let the compiler
# vectorize float reductions and inline rounding.
FAST = ["-fno-math-errno", "-fno-trapping-math", "-fassociative-math", "-fno-signed-zeros"]
FLAG_SETS = (
    ["-O3", "-march=native", *FAST, "-fopenmp"],
    ["-O3", "-march=native", *FAST],
    ["-O3"],
)


def cache_dir() -> Path:
    root = os.environ.get("LLMPRESS_CACHE") or Path.home() / ".cache" / "llmpress"
    return Path(root) / "kernels"


def _cpu_id() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
        return next((ln for ln in text.splitlines() if ln.startswith("flags")), "")
    except OSError:
        return platform.processor()


def _compile(compiler: str, flags: list[str], target: Path) -> str | None:
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        sources = [str(path) for path in SOURCES]
        cmd = [compiler, *flags, "-shared", "-fPIC", *sources, "-o", str(out), "-lm"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            return run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "failed"
        os.replace(out, target)
    return None


def fallback_note(failed: str, used: list[str]) -> str:
    """One line on a build that fell back to fewer flags: what it costs and the fix."""
    cost = "one thread" if "-fopenmp" not in used else "no native instructions"
    if "-march=native" not in used:
        cost = "portable C without SIMD, many times slower"
    return (
        f"the CPU kernels were built with `{' '.join(used)}` ({cost}) because `{failed}`; "
        "install the compiler's OpenMP runtime (libgomp for gcc, libomp for clang) or a "
        "newer compiler, or set LLMPRESS_KERNEL_FLAGS"
    )


@cache
def ready(fallback: str) -> bool:
    """Whether the library is built; where it cannot be, says once, per `fallback` (what
    then runs in torch instead: the same results, slower), why."""
    try:
        library()
    except LlmpressError as e:
        print(f"llmpress: {fallback} runs in torch, slower: {e}", file=sys.stderr)
        return False
    return True


@cache
def library() -> ctypes.CDLL:
    """The compiled kernel library (built now if this machine has none yet)."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise LlmpressError(
            "no C compiler found for llmpress's CPU kernels: install gcc (apt install gcc) "
            "or set CC"
        )
    source = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    errors = []
    override = os.environ.get("LLMPRESS_KERNEL_FLAGS")  # e.g. "-O3 -mavx2 -mfma" or "-O3"
    for flags in [override.split()] if override else FLAG_SETS:
        key = hashlib.sha256(source + " ".join(flags).encode() + _cpu_id().encode()).hexdigest()
        target = cache_dir() / f"llmpress-{key[:16]}.so"
        target.parent.mkdir(parents=True, exist_ok=True)
        if not target.exists():
            error = _compile(compiler, flags, target)
            if error:
                errors.append(f"{' '.join(flags)}: {error}")
                continue
        lib = ctypes.CDLL(str(target))
        declare(lib)
        # tile instructions where the processor and the OS allow, unless LLMPRESS_AMX=0
        lib.llmp_amx_enable(int(os.environ.get("LLMPRESS_AMX", "1") != "0"))
        if errors:  # a slower build: never quietly
            print(f"llmpress: {fallback_note(errors[0], flags)}", file=sys.stderr)
        return lib
    raise LlmpressError("could not build llmpress's CPU kernels: " + "; ".join(errors))
