"""Input validation that the bad-input table's CASES cannot express (an environment
variable, files left by a killed process, a warning beside a result): issue 32, defects
19, 23 and 24. Each runs the real CLI on real files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from test_bad_input import error_lines, run_cli, tiny

from compress.errors import LlmpressError


def test_cache_that_is_a_file_is_named(tmp_path, monkeypatch):
    """LLMPRESS_CACHE naming a file said only `File exists`."""
    (tmp_path / "cache").write_text("not a folder")
    monkeypatch.setenv("LLMPRESS_CACHE", str(tmp_path / "cache"))
    code, _, err = run_cli(
        ["compress", "default", "-o", str(tmp_path / "o"), "--quant", "rtn:w4g64"]
    )
    (line,) = error_lines(err)
    assert code == 2 and "is a file, not a folder: point LLMPRESS_CACHE at a folder" in line
    assert (tmp_path / "cache").read_text() == "not a folder"


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_conversion_folders_are_removed_at_the_next_conversion(tmp_path, monkeypatch):
    """A conversion killed with SIGKILL left `.convert-*` in the cache forever. The next
    conversion removes those whose owner marker names a process that is gone, and
    nothing else (a live conversion, another machine's, a user's look-alike)."""
    import socket

    from compress.artifact.target import OWNER

    cache = tmp_path / "cache"
    dead, host = _dead_pid(), socket.gethostname()
    owners = {
        ".convert-stale": f"{dead} {host}",
        ".convert-live": f"{os.getpid()} {host}",  # a conversion under way
        ".convert-other": f"{dead} another-machine",  # a machine sharing the cache
        ".convert-notes": None,  # a user's folder: no marker
    }
    for name, owner in owners.items():
        (cache / name).mkdir(parents=True)
        (cache / name / "model.safetensors").write_bytes(b"0" * 100)
        if owner:
            (cache / name / OWNER).write_text(owner + "\n")
    (tmp_path / "bad.gguf").write_bytes(b"GGUF not really")
    monkeypatch.setenv("LLMPRESS_CACHE", str(cache))
    code, out, err = run_cli(
        ["compress", str(tmp_path / "bad.gguf"), "-o", str(tmp_path / "o"), "--quant", "rtn:w4g64"]
    )
    assert code == 2 and "cannot read GGUF file" in error_lines(err)[0]
    assert f"removed {cache / '.convert-stale'}, left by an interrupted conversion" in out
    assert sorted(p.name for p in cache.iterdir()) == sorted(set(owners) - {".convert-stale"})


def _same_vocab_model(tmp: Path, default_ckpt) -> Path:
    """A tiny random llama that reads the default model's tokenizer: another model."""
    model = tiny(tmp, vocab_size=default_ckpt.config["vocab_size"])
    for f in default_ckpt.path.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens")):
            shutil.copy(f, model / f.name)
    return model


def test_eval_against_a_base_that_is_not_the_source_warns(tmp_path, default_ckpt):
    """`eval --base default` on an artifact made from another model reported KL 7.17 with no
    word that the base is not the artifact's source (its manifest records the sha256)."""
    model = _same_vocab_model(tmp_path, default_ckpt)
    art = tmp_path / "art"
    assert run_cli(["compress", str(model), "-o", str(art), "--quant", "rtn:w4g32"])[0] == 0
    (tmp_path / "t.txt").write_text("The quick brown fox jumps over the lazy dog. " * 20)
    results = {}
    for base in ("default", str(model)):
        out_json = tmp_path / f"{len(results)}.json"
        code, _, err = run_cli(
            ["eval", str(art), "--base", base, "--data", str(tmp_path / "t.txt")]
            + ["--ctx", "16", "--windows", "1", "--no-record", "--json", str(out_json)]
        )
        assert code == 0, err
        warnings = [ln for ln in err.splitlines() if ln.startswith("warning: --base")]
        results[base] = (warnings, json.loads(out_json.read_text())["base_is_source"])
    (line,), is_source = results["default"]
    assert f"--base default is not the model {art} was made from" in line
    assert is_source is False
    assert results[str(model)] == ([], True)


def test_results_json_never_holds_nan(tmp_path):
    """Strict JSON parsers reject NaN and Infinity: such a result is refused, not written."""
    from compress.cli import write_json

    with pytest.raises(LlmpressError, match="NaN or infinite"):
        write_json(tmp_path / "r.json", {"kl": float("nan")})
    assert not (tmp_path / "r.json").exists()


def test_manifest_is_never_written_with_nan(tmp_path):
    """`--bits nan` once wrote NaN into manifest.json; the writer itself now refuses it,
    leaving the manifest as it was."""
    from compress.artifact.manifest import write_manifest

    (tmp_path / "manifest.json").write_text('{"llmpress_manifest": 1}\n')
    with pytest.raises(ValueError, match="not JSON compliant"):
        write_manifest(tmp_path, {"llmpress_manifest": 1, "drift": {"kl": float("inf")}})
    assert (tmp_path / "manifest.json").read_text() == '{"llmpress_manifest": 1}\n'
