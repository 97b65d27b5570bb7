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


# -- issue 32, input validation (defects 6, 16, 18, 19, 21, 23, 24): helpers --
# "Billion laughs": 9 aliases a level, 9 levels: 1 KB of YAML, 387 million strings.
_LAUGHS = 'l0: &l0 "lol"\n' + "".join(
    f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)


def _tiny_config(tmp: Path, edit: Callable[[dict], object]) -> list[str]:
    """The tiny llama with config.json changed by `edit` (which may return a new one)."""
    model = tiny(tmp)
    config = json.loads((model / "config.json").read_text())
    config = edit(config) or config
    (model / "config.json").write_text(json.dumps(config))
    return ["compress", str(model), "-o", str(tmp / "out"), "--quant", "rtn:w4g32"]


def _set(**values) -> Callable[[dict], None]:
    return lambda c: c.update(values)


def _tiny_tensors(tmp: Path, edit: Callable[[dict], None]) -> list[str]:
    """The tiny llama with its tensors changed by `edit`."""
    from safetensors.torch import load_file, save_file

    model = tiny(tmp)
    tensors = load_file(str(model / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(model / "model.safetensors"))
    return ["compress", str(model), "-o", str(tmp / "out"), "--quant", "rtn:w4g32"]


def _drop(name: str) -> Callable[[dict], None]:
    def drop(config: dict) -> None:
        del config[name]

    return drop


def _int32_norm(tensors: dict) -> None:
    tensors["model.norm.weight"] = tensors["model.norm.weight"].int()


def _junk_index(tmp: Path) -> list[str]:
    args = _tiny_config(tmp, lambda c: None)
    (tmp / "model" / "model.safetensors.index.json").write_text("{ junk")
    return args


_CONFIG_DEFECTS = [  # (what, edit, message): each exited 3 before, or worked on nonsense
    ("without hidden_size", _drop("hidden_size"), "config.json: hidden_size is missing"),
    ("hidden_size 0", _set(hidden_size=0), "hidden_size is 0, not a positive integer"),
    ("hidden_size -64", _set(hidden_size=-64), "hidden_size is -64, not a positive"),
    ('hidden_size "64"', _set(hidden_size="64"), "hidden_size is '64', not a positive"),
    (
        "3 heads for width 64",
        lambda c: c.update(num_attention_heads=3, num_key_value_heads=1, head_dim=None),
        "num_attention_heads 3 does not divide hidden_size 64",
    ),
    ("num_key_value_heads 0", _set(num_key_value_heads=0), "num_key_value_heads is 0"),
    ("a list", lambda c: [c], "is not a JSON object of settings"),
    ("num_hidden_layers 3 (2 stored)", _set(num_hidden_layers=3), "layers.2.input_layernorm"),
    ("num_hidden_layers -2", _set(num_hidden_layers=-2), "num_hidden_layers is -2, not a"),
    ("intermediate_size 100 (96 stored)", _set(intermediate_size=100), "implies [100, 64]"),
    ("vocab_size 10^12", _set(vocab_size=10**12), "implies [1000000000000, 64]"),
    ("max_position_embeddings 0", _set(max_position_embeddings=0), "max_position_embeddings is 0"),
]


def _no_out(tmp: Path) -> bool:
    return not (tmp / "out").exists() and not (tmp / "o").exists()


def _fifo_calib(tmp: Path) -> list[str]:
    os.mkfifo(tmp / "calib.txt")
    return ["compress", "default", "-o", str(tmp / "o"), "--quant", "awq:w4g64"] + [
        "--calib",
        str(tmp / "calib.txt"),
    ]


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
        "serve `--prefix-cache-mb -1`",
        lambda t: ["serve", "default", "--prefix-cache-mb", "-1"],
        2,
        "give 0 (off) or more",
        "nothing",
        _nothing,
    ),
    Case(
        "serve `--kv-tokens 0`",
        lambda t: ["serve", "default", "--kv-tokens", "0"],
        2,
        "--kv-tokens 0: give 1 or more",
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
    # -- issue 32, input validation (defects 6, 16, 18, 19, 21, 23, 24) --
    Case(
        "recipe: YAML alias bomb in `stages[0].rtn.bits` (grew without bound)",
        lambda t: _recipe(t, _LAUGHS + "stages: [{rtn: {bits: *l9}}]\n"),
        2,
        "YAML anchors and aliases (&name, *name) are not allowed",
        "nothing new",
        _no_out,
    ),
    Case(
        "recipe: YAML alias bomb in `calib.source`",
        lambda t: _recipe(t, _LAUGHS + "stages: [awq]\ncalib: {source: *l9}\n"),
        2,
        "YAML anchors and aliases (&name, *name) are not allowed",
        "nothing new",
        _no_out,
    ),
    Case(
        "eval: YAML alias bomb in the gate file",
        lambda t: (
            (t / "g.yaml").write_text(_LAUGHS + "kl: {max: *l9}\n")
            and _eval(t, "--gate-file", str(t / "g.yaml"))
        ),
        2,
        "YAML anchors and aliases (&name, *name) are not allowed",
        "the gate file only",
        lambda t: listing(t) == ["g.yaml"],
    ),
    Case(
        "recipe: `stages` nested 5,000 deep (was RecursionError, exit 3)",
        lambda t: _recipe(t, "stages: " + "[" * 5000 + "]" * 5000 + "\n"),
        2,
        "nested deeper than 50 levels",
        "nothing new",
        _no_out,
    ),
    Case(
        "recipe: two top-level `stages:` keys (the last won silently)",
        lambda t: _recipe(t, "stages: [{rtn: {bits: 4}}]\nstages: [{rtn: {bits: 8}}]\n"),
        2,
        "key 'stages' is given twice",
        "nothing new",
        _no_out,
    ),
    Case(
        "recipe: `int8: {threshold: -1}` (kept every column 16-bit)",
        lambda t: _recipe(t, "stages:\n  - int8: {threshold: -1}\n"),
        2,
        "stages[0].int8.threshold: -1 is too small",
        "nothing new",
        _no_out,
    ),
    Case(
        "recipe: `group_size: 1` (36 bits per weight)",
        lambda t: _recipe(t, "stages:\n  - rtn: {bits: 4, group_size: 1}\n"),
        2,
        "group size 1 is not a power of two >= 32",
        "nothing new",
        _no_out,
    ),
    Case(
        "`--quant rtn:w4g48` (not a power of two)",
        lambda t: _compress_argv(t)[:-1] + ["rtn:w4g48"],
        2,
        "group size 48 is not a power of two >= 32",
        "nothing new",
        _no_out,
    ),
    Case(
        "recipe: `mixed: {bits_budget: .nan}`",
        lambda t: _recipe(t, "stages:\n  - mixed: {bits_budget: .nan}\n  - rtn: {bits: 4}\n"),
        2,
        "stages[0].mixed.bits_budget: nan is not a finite number",
        "nothing new",
        _no_out,
    ),
    *[
        Case(
            f"config.json {what} (was exit 3, or compressed)",
            lambda t, edit=edit: _tiny_config(t, edit),
            2,
            message,
            "the model, untouched; nothing new",
            _no_out,
        )
        for what, edit, message in _CONFIG_DEFECTS
    ],
    Case(
        "an int32 norm weight (compressed, then eval exited 3)",
        lambda t: _tiny_tensors(t, _int32_norm),
        2,
        "tensor model.norm.weight is I32, not floating point",
        "nothing new",
        _no_out,
    ),
    Case(
        "a tensor missing from the checkpoint",
        lambda t: _tiny_tensors(t, lambda w: w.pop("model.layers.1.mlp.up_proj.weight")),
        2,
        "tensor model.layers.1.mlp.up_proj.weight is missing",
        "nothing new",
        _no_out,
    ),
    Case(
        "a junk `model.safetensors.index.json`",
        _junk_index,
        2,
        "model.safetensors.index.json is not valid JSON",
        "nothing new",
        _no_out,
    ),
    Case(
        "`--calib-len 9000` past the model's 8192 (a 13 h ETA)",
        lambda t: (
            _compress_argv(t)[:-1]
            + ["awq:w4g64", "--calib-len", "9000"]
            + ["--calib-samples", "16"]
        ),
        2,
        "9000 tokens exceed the context of default (8192 tokens",
        "nothing",
        _nothing,
    ),
    Case(
        "`--calib-samples 100000000000` (was exit 3, a 51 TB allocation)",
        lambda t: _compress_argv(t)[:-1] + ["awq:w4g64", "--calib-samples", "100000000000"],
        2,
        "over the 1,048,576 calibration can hold",
        "nothing",
        _nothing,
    ),
    Case(
        "`--bits nan` (wrote NaN into manifest.json)",
        lambda t: _compress_argv(t, "--bits", "nan"),
        2,
        "--bits nan: give a positive average bits per weight",
        "nothing",
        _nothing,
    ),
    Case(
        "`--bits inf`",
        lambda t: _compress_argv(t, "--bits", "inf"),
        2,
        "--bits inf: give a positive average bits per weight",
        "nothing",
        _nothing,
    ),
    Case(
        "eval `--ctx 9000` past the model's context",
        lambda t: _eval(t, "--ctx", "9000"),
        2,
        "--ctx: 9000 tokens exceed the context of default (8192 tokens",
        "nothing",
        _nothing,
    ),
    Case(
        "bench `--prompt-len 9000` past the model's context",
        lambda t: ["bench", "default", "--prompt-len", "9000"],
        2,
        "9128 tokens exceed the context of default (8192 tokens",
        "nothing",
        _nothing,
    ),
    Case(
        "bench `--output-len 100000000` (was exit 3, an allocation)",
        lambda t: ["bench", "default", "--output-len", "100000000"],
        2,
        "--prompt-len + --output-len: 100000032 tokens exceed the context",
        "nothing",
        _nothing,
    ),
    Case(
        "push `--repo org/näme --dry-run` (a non-ASCII hub id)",
        lambda t: ["push", str(t / "a"), "--repo", "org/näme", "--dry-run"],
        2,
        "--repo 'org/näme' is not a hub id",
        "nothing",
        _nothing,
    ),
    Case(
        "eval `--gate ''` (silently gated nothing)",
        lambda t: _eval(t, "--gate", ""),
        2,
        "--gate '' is empty, so nothing would be gated",
        "nothing",
        _nothing,
    ),
    Case(
        "verify a folder that does not exist (was exit 1)",
        lambda t: ["verify", str(t / "nonexistent")],
        2,
        "does not exist: pass an artifact folder",
        "nothing",
        _nothing,
    ),
    Case(
        "`--calib-samples abc` (printed click's 4-line usage)",
        lambda t: _compress_argv(t, "--calib-samples", "abc"),
        2,
        "Invalid value for '--calib-samples': 'abc' is not a valid integer",
        "nothing",
        _nothing,
    ),
    Case(
        "eval `--engine foo`",
        lambda t: _eval(t, "--engine", "foo"),
        2,
        "'foo' is not one of 'runtime', 'transformers'. (see `llmpress eval --help`)",
        "nothing",
        _nothing,
    ),
    Case(
        "serve `--port abc`",
        lambda t: ["serve", "default", "--port", "abc"],
        2,
        "Invalid value for '--port': 'abc' is not a valid integer",
        "nothing",
        _nothing,
    ),
    Case(
        "an unknown command",
        lambda t: ["frobnicate"],
        2,
        "No such command 'frobnicate'. Commands: bench, compress, eval",
        "nothing",
        _nothing,
    ),
    Case(
        "a FIFO as `--calib` (was called a folder)",
        _fifo_calib,
        2,
        "calib.txt is not a regular file (a pipe, socket or device)",
        "the FIFO only",
        lambda t: listing(t) == ["calib.txt"],
    ),
    # -- issue 32, no silent changes: a symmetric scheme for the zero-point-only layout --
    Case(
        "`--quant rtn:w4g64 --export awq-gemm` (was silently given a zero point)",
        lambda t: _compress_argv(t, "--export", "awq-gemm"),
        2,
        "rtn:w4g64sym is symmetric: ask for rtn:w4g64zp",
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
    mkdir = Path.mkdir

    def read_only(self, *args, **kwargs):  # the artifact's partial folder cannot be made
        if ".partial-" in self.name:
            raise OSError(30, "Read-only file system", str(tmp_path))
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", read_only)
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
