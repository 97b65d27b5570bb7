"""llama.cpp's own server as a benchmark anchor: started on a free loopback port, waited
for until healthy, stopped on exit, so that a script runs it on the same workload as
`llmpress serve` in the same run."""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """`--llama-server BIN --gguf Q4_0.gguf`: the anchor a serving script runs beside llmpress."""
    ap.add_argument("--llama-server", type=Path, help="folder with llama.cpp's llama-server")
    ap.add_argument("--gguf", type=Path, help="the GGUF llama-server runs (e.g. Q4_0)")
    add_cflags_argument(ap)


def add_cflags_argument(ap: argparse.ArgumentParser) -> None:
    """`--llama-cflags`: how the anchor was built, for the record (scripts/build_llama_cpp
    takes extra compiler flags where llama.cpp's native build does not run)."""
    ap.add_argument(
        "--llama-cflags", default="", help="the LLAMA_CFLAGS scripts/build_llama_cpp was given"
    )


def check_arguments(args: argparse.Namespace) -> None:
    if bool(args.llama_server) != bool(args.gguf):
        raise SystemExit("--llama-server and --gguf go together")


@contextlib.contextmanager
def llama_server(bin_dir: Path, gguf: Path, slots: int, ctx: int, *extra: str) -> Iterator[int]:
    """Run `llama-server -np slots -c ctx -t 2 -tb 2 [extra]` on `gguf`; yield its port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [str(bin_dir / "llama-server"), "-m", str(gguf), "--host", "127.0.0.1", "--port",
           str(port), "-np", str(slots), "-c", str(ctx), "-t", "2", "-tb", "2", *extra]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not _healthy(port):
            if time.time() > deadline or proc.poll() is not None:
                raise SystemExit(f"llama-server did not come up: {' '.join(cmd)}")
            time.sleep(0.5)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _healthy(port: int) -> bool:
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2).status == 200
    except OSError:  # not listening yet, or 503 while the model loads
        return False


def version(bin_dir: Path) -> str:
    """The build's own version line."""
    run = subprocess.run([str(bin_dir / "llama-server"), "--version"], capture_output=True,
                         text=True, timeout=60)  # fmt: skip
    lines = (run.stdout + run.stderr).strip().splitlines()
    return next((ln for ln in lines if ln.startswith("version")), lines[-1] if lines else "")
