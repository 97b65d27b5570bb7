"""The `llmpress` command as users and CI run it: exit codes and one-line errors."""

import json
import subprocess
import sys

import pytest
from test_bad_input import run_cli


def llmpress(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "compress", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        timeout=600,
    )


def test_bad_recipe_fails_before_any_work(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("stages:\n  - rtn: {bits: 4, gruop_size: 64}\n")
    r = llmpress("compress", "default", "-o", str(tmp_path / "out"), "--recipe", str(recipe))
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "error: stages[0].rtn: unknown key 'gruop_size' (did you mean 'group_size'?); "
        "valid keys: bits, group_size, zero_point"
    )
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["compress", "default", "-o", "{tmp}", "--quant", "rtn:w4g64"], "already exists"),
        (["compress", "{tmp}/nope", "-o", "{tmp}/x", "--quant", "rtn:w4"], "no such model"),
        (["eval", "default", "--gate", "kl=0.1"], "bad gate 'kl=0.1'"),
    ],
)
def test_one_line_errors(tmp_path, args, message):
    r = llmpress(*[a.format(tmp=tmp_path) for a in args])
    assert r.returncode == 2
    assert message in r.stderr and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr


def test_eval_gate_and_inspect(artifacts, wikitext, tmp_path):
    path = str(artifacts["rtn:w8"])
    one_window = ["eval", path, "--data", str(wikitext / "test.txt"), "--windows", "1"]
    one_window += ["--ctx", "256"]
    out = tmp_path / "r.json"
    ok = llmpress(*one_window, "--gate", "kl<=0.05,top1>=0.8", "--json", str(out))
    assert ok.returncode == 0, ok.stderr
    assert "gate PASS kl = " in ok.stdout and "(limit <= 0.05)" in ok.stdout
    assert "| ppl |" in ok.stdout
    result = json.loads(out.read_text())
    assert result["tokens"] == 255 and all(g["pass"] for g in result["gates"])
    # the failing gate in this process (test_report.py runs one as its own process)
    code, stdout, stderr = run_cli([*one_window, "--gate", "kl<=0.000001", "--no-record"])
    assert code == 1
    assert "gate FAIL kl = " in stdout and "quality gate failed: kl" in stderr
    info = llmpress("inspect", path)
    assert info.returncode == 0
    assert "int8 channel symmetric" in info.stdout
    assert f"KL {result['kl']:.5f}" in info.stdout  # the first eval recorded its drift
