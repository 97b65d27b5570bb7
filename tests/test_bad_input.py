"""Bad input and faults, as a user meets them: each case runs the real `llmpress` command
line and checks the exit code (2 bad input, 1 gate or verify failed, 3 a bug), that
stderr says what is wrong in one line without a traceback, and what is left on disk.

`python scripts/bad_input_table.py` runs the same CASES and writes docs/bad-input.md.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
WIKITEXT = ROOT.parent / "shared" / "data" / "wikitext-2-raw"


def run_cli(args: list[str], cwd: Path | None = None) -> tuple[int, str, str]:
    """The CLI in this process (no 7 s import per case): exit code, stdout, stderr."""
    from compress.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv, here = sys.argv, os.getcwd()
    sys.argv = ["llmpress", *args]
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
                code = 0
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv = argv
        os.chdir(here)
    return code, out.getvalue(), err.getvalue()


def error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.startswith(("error:", "internal error:"))]


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@dataclass
class Case:
    name: str
    prepare: Callable[[Path], list[str]]  # makes the input in a temp folder, returns argv
    code: int
    message: str
    left: str  # what stays on disk, as the table says it
    check: Callable[[Path], bool] = lambda tmp: True


def tiny(tmp: Path, **overrides) -> Path:
    from conftest import write_tiny_llama

    return write_tiny_llama(tmp / "model", **overrides)


def _binary(tmp: Path, name: str) -> Path:
    path = tmp / name
    path.write_bytes(bytes(range(256)) * 64)
    return path


def _non_artifact(tmp: Path) -> list[str]:
    (tmp / "mine").mkdir()
    (tmp / "mine" / "notes.txt").write_text("keep me")
    return ["compress", "default", "-o", str(tmp / "mine"), "--quant", "rtn:w4g64", "--overwrite"]


def _overlap(tmp: Path) -> list[str]:
    import struct

    model = tiny(tmp)
    raw = (model / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    names = [k for k in header if k != "__metadata__"]
    a, b = header[names[0]], header[names[1]]
    if a["data_offsets"][1] - a["data_offsets"][0] == b["data_offsets"][1] - b["data_offsets"][0]:
        b["data_offsets"] = list(a["data_offsets"])
    else:  # shift b onto a's start, same length
        size = b["data_offsets"][1] - b["data_offsets"][0]
        b["data_offsets"] = [a["data_offsets"][0], a["data_offsets"][0] + size]
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    data = raw[8 + n :]
    (model / "model.safetensors").write_bytes(struct.pack("<Q", len(text)) + text + data)
    return ["compress", str(model), "-o", str(tmp / "out"), "--quant", "rtn:w4g32"]


def _stale(tmp: Path) -> list[str]:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp / ".out.partial-abc123"
    stale.mkdir()
    (stale / ".llmpress-owner").write_text(f"{dead.pid} {socket.gethostname()}\n")
    (stale / "big.bin").write_bytes(b"0" * 1000)
    return ["compress", "default", "-o", str(tmp / "out"), "--quant", "rtn:w4g64"]


def _eval(tmp: Path, *extra: str) -> list[str]:
    return ["eval", "default", "--base", "default", "--windows", "1", *extra]


def _verify_corrupt(tmp: Path) -> list[str]:
    (tmp / "a").mkdir()
    (tmp / "a" / "manifest.json").write_text("{ not json")
    return ["verify", str(tmp / "a")]


def _recipe(tmp: Path, text: str) -> list[str]:
    (tmp / "r.yaml").write_text(text)
    return ["compress", "default", "-o", str(tmp / "out"), "--recipe", str(tmp / "r.yaml")]


def _busy_port(tmp: Path) -> list[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    _busy_port.sock = sock  # held until the case ends
    return ["serve", "default", "--port", str(sock.getsockname()[1])]


def _nothing(tmp: Path) -> bool:
    return listing(tmp) == []


CASES = [
    Case(
        '`-o ""`',
        lambda t: ["compress", "default", "-o", "", "--quant", "rtn:w4g64"],
        2,
        "-o is empty",
        "nothing",
        _nothing,
    ),
    Case(
        "`--overwrite` on a folder that is not an artifact",
        _non_artifact,
        2,
        "not an llmpress artifact",
        "the folder and the user's file, untouched",
        lambda t: (t / "mine" / "notes.txt").read_text() == "keep me",
    ),
    Case(
        "`-o` is the model being compressed",
        lambda t: (
            ["compress", str(tiny(t)), "-o", str(t / "model"), "--quant", "rtn:w4g32"]
            + ["--overwrite"]
        ),
        2,
        "exists and is not an llmpress artifact",
        "the source model, untouched",
        lambda t: (t / "model" / "model.safetensors").is_file(),
    ),
    Case(
        "`-o` is a file",
        lambda t: (
            (t / "f").write_text("x")
            and ["compress", "default", "-o", str(t / "f")]
            + ["--quant", "rtn:w4g64", "--overwrite"]
        ),
        2,
        "is not a folder",
        "the file, untouched",
        lambda t: (t / "f").read_text() == "x",
    ),
    Case(
        "binary recipe file",
        lambda t: ["compress", "default", "-o", str(t / "o"), "--recipe", str(_binary(t, "r"))],
        2,
        "is not text",
        "nothing new",
        lambda t: not (t / "o").exists(),
    ),
    Case(
        "bad `re:` ignore pattern",
        lambda t: (
            ["compress", "default", "-o", str(t / "o"), "--quant", "rtn:w4g64"]
            + ["--ignore", "re:(unclosed"]
        ),
        2,
        "not a valid regular expression",
        "nothing",
        _nothing,
    ),
    Case(
        "`prune: {params: 1.5}`",
        lambda t: _recipe(t, "stages:\n  - prune: {params: 1.5}\n  - rtn: {bits: 4}\n"),
        2,
        "neither a fraction",
        "nothing new",
        lambda t: not (t / "out").exists(),
    ),
    Case(
        "two quantizing stages",
        lambda t: _recipe(t, "stages:\n  - rtn: {bits: 4}\n  - awq: {bits: 4}\n"),
        2,
        "both quantize",
        "nothing new",
        lambda t: not (t / "out").exists(),
    ),
    Case(
        "`--bits` no scheme fits",
        lambda t: [
            "compress",
            "default",
            "-o",
            str(t / "o"),
            "--quant",
            "awq:w4g64",
            "--bits",
            "4",
        ],
        2,
        "leaves nothing for scales",
        "nothing new",
        lambda t: not (t / "o").exists(),
    ),
    Case(
        "`mixed` before int8",
        lambda t: _recipe(t, "stages:\n  - mixed: {bits_budget: 8.5}\n  - int8: {}\n"),
        2,
        "follow it with awq, gptq or rtn",
        "nothing new",
        lambda t: not (t / "out").exists(),
    ),
    Case(
        "safetensors with overlapping tensor offsets",
        _overlap,
        2,
        "overlap",
        "nothing new",
        lambda t: not (t / "out").exists(),
    ),
    Case(
        "garbage parquet as calibration text",
        lambda t: (
            (t / "c.parquet").write_bytes(b"PAR1 garbage")
            and ["compress", "default"]
            + ["-o", str(t / "o"), "--quant", "awq:w4g64", "--calib", str(t / "c.parquet")]
        ),
        2,
        "not a readable parquet file",
        "nothing new",
        lambda t: not (t / "o").exists(),
    ),
    Case(
        "stale `.out.partial-*` of a killed run",
        _stale,
        0,
        "",
        "the stale folder removed, the artifact written",
        lambda t: (
            not (t / ".out.partial-abc123").exists() and (t / "out" / "manifest.json").is_file()
        ),
    ),
    Case(
        "eval `--ctx 0`",
        lambda t: _eval(t, "--ctx", "0"),
        2,
        "--ctx 0",
        "nothing",
        _nothing,
    ),
    Case(
        "eval `--windows -3`",
        lambda t: _eval(t, "--windows", "-3"),
        2,
        "--windows -3",
        "nothing",
        _nothing,
    ),
    Case(
        "eval `--json` under a file",
        lambda t: (t / "f").write_text("x") and _eval(t, "--json", str(t / "f" / "r.json")),
        2,
        "cannot create",
        "the file, untouched",
        lambda t: (t / "f").read_text() == "x",
    ),
    Case(
        "eval binary gate file",
        lambda t: _eval(t, "--gate-file", str(_binary(t, "g.yaml"))),
        2,
        "is not text",
        "the gate file only",
        lambda t: listing(t) == ["g.yaml"],
    ),
    Case(
        "eval on binary text",
        lambda t: _eval(t, "--data", str(_binary(t, "bin.txt"))),
        2,
        "is binary, not text",
        "the data file only",
        lambda t: listing(t) == ["bin.txt"],
    ),
    Case(
        "bench `--batch 0` (hung before)",
        lambda t: ["bench", "default", "--batch", "0"],
        2,
        "each size must be from 1 to 1024",
        "nothing",
        _nothing,
    ),
    Case(
        "bench `--prompt-len -4`",
        lambda t: ["bench", "default", "--prompt-len", "-4"],
        2,
        "a prompt needs >= 1 token",
        "nothing",
        _nothing,
    ),
    Case(
        "bench `--output-len 1`",
        lambda t: ["bench", "default", "--output-len", "1"],
        2,
        ">= 2 generated tokens",
        "nothing",
        _nothing,
    ),
    Case(
        "verify a corrupt manifest",
        _verify_corrupt,
        1,
        "not valid JSON",
        "the folder, untouched",
        lambda t: (t / "a" / "manifest.json").read_text() == "{ not json",
    ),
    Case(
        "serve `--max-batch 0` (was healthy and silent)",
        lambda t: ["serve", "default", "--max-batch", "0"],
        2,
        "the batch needs >= 1",
        "nothing",
        _nothing,
    ),
    Case(
        "serve on a port in use (refused before loading)",
        _busy_port,
        2,
        "cannot listen on",
        "nothing",
        _nothing,
    ),
    # -- issue 32, serve (defects 9, 21): the rest is in tests/test_serve_faults.py --
    Case(
        "serve `--max-len 100000000` (was exit 3, an allocation)",
        lambda t: ["serve", "default", "--port", "0", "--max-len", "100000000"],
        2,
        "longer than this model's context of 8192 tokens",
        "nothing",
        _nothing,
    ),
    Case(
        "serve `--api-key ''` (an empty key)",
        lambda t: ["serve", "default", "--api-key", ""],
        2,
        "--api-key (or LLMPRESS_API_KEY) must be a non-empty key",
        "nothing",
        _nothing,
    ),
]


def run_case(case: Case, tmp: Path) -> dict:
    args = case.prepare(tmp)
    started = time.perf_counter()
    code, out, err = run_cli(args, cwd=tmp)
    seconds = time.perf_counter() - started
    lines = error_lines(err) if case.code != 1 else [ln for ln in out.splitlines() if "FAIL" in ln]
    sock = getattr(_busy_port, "sock", None)
    if sock is not None:
        sock.close()
        del _busy_port.sock
    return {
        "code": code,
        "lines": lines,
        "traceback": "Traceback" in err,
        "left_ok": case.check(tmp),
        "seconds": seconds,
    }


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case, tmp_path, default_ckpt):
    got = run_case(case, tmp_path)
    assert got["code"] == case.code, got
    assert not got["traceback"]
    if case.message:
        assert len(got["lines"]) == 1 and case.message in got["lines"][0], got["lines"]
    assert got["left_ok"], listing(tmp_path)


def _compress_argv(tmp: Path, *extra: str) -> list[str]:
    return ["compress", "default", "-o", str(tmp / "o"), "--quant", "rtn:w4g64", *extra]


def test_disk_full_during_write_loses_nothing(tmp_path, monkeypatch, default_ckpt):
    """safetensors reports ENOSPC inside its own error type ("... os error 28")."""
    from safetensors import SafetensorError

    def full(*args, **kwargs):
        raise SafetensorError("Error while serializing: IoError(Os { code: 28 }) os error 28")

    monkeypatch.setattr("compress.artifact.writer.save_file", full)
    code, _, err = run_cli(_compress_argv(tmp_path))
    assert code == 2 and "out of disk space" in error_lines(err)[0]
    assert listing(tmp_path) == []


def test_read_only_target_is_one_line(tmp_path, monkeypatch, default_ckpt):
    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system", str(tmp_path))

    monkeypatch.setattr("compress.artifact.writer.tempfile.mkdtemp", read_only)
    code, _, err = run_cli(_compress_argv(tmp_path))
    assert code == 2 and "read-only file system" in error_lines(err)[0]


def test_a_bug_exits_3_with_the_traceback_in_a_file(tmp_path, monkeypatch, default_ckpt):
    def bug(*args, **kwargs):
        raise ZeroDivisionError("boom")

    monkeypatch.setattr("compress.pipeline.quantize_lm_head", bug)
    code, _, err = run_cli(_compress_argv(tmp_path, "--lm-head", "w8"))
    (line,) = error_lines(err)
    assert code == 3 and line.startswith("internal error: ZeroDivisionError: boom")
    crash = Path(line.split("traceback in ")[1].split(",")[0])
    assert "Traceback" in crash.read_text() and "Traceback" not in err
    crash.unlink()
    assert listing(tmp_path) == []


def _subprocess(args, **kwargs):
    return subprocess.Popen(
        [sys.executable, "-m", "compress", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def test_file_size_limit_is_one_line(tmp_path, default_ckpt):
    import resource

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (20 << 20, 20 << 20))

    proc = _subprocess(
        _compress_argv(tmp_path),
        preexec_fn=limit,
    )
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 2, err
    assert "file too large" in error_lines(err)[0] and "Traceback" not in err
    assert listing(tmp_path) == []


def test_sigterm_during_compress_leaves_nothing(tmp_path, default_ckpt):
    proc = _subprocess(_compress_argv(tmp_path))
    deadline = time.time() + 300
    while not list(tmp_path.glob(".o.partial-*")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "terminated: nothing was written" in err
    assert listing(tmp_path) == []
