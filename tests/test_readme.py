"""The README and the documentation pages it leads to stay true: every command they show
exists with the options they give it, every link and anchor resolves, every recipe and
gate file parses, docs/results.md is what scripts/results_doc.py makes of
benchmarks/results/, and the README's commands and Python examples run: the first command
verbatim in a fresh clone (it once failed because `out/` did not exist), the Python
example and the transformers snippet verbatim, the quick start's eval (on 2 windows) and
its server answering the curl command shown."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
# the pages written with the README (the other docs have owners and tests of their own)
PAGES = [README] + [
    ROOT / "docs" / name
    for name in ("commands.md", "recipes.md", "methods.md", "eval.md", "results.md")
]
# the sections the README must have, in this order
SECTIONS = [
    "Install",
    "Quick start",
    "Large models, on one GPU or several",
    "Python",
    "Commands",
    "Documentation",
]


def text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def fenced(page: str) -> list[tuple[str, str]]:
    """(language, body) of every fenced code block, read line by line."""
    out, lang, body = [], None, []
    for line in page.splitlines(keepends=True):
        if line.startswith("```"):
            if lang is None:
                lang, body = line[3:].strip(), []
            else:
                out.append((lang, "".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def blocks(page: str, lang: str) -> list[str]:
    return [body for kind, body in fenced(page) if kind == lang]


def prose(page: str) -> str:
    """The page without its code blocks."""
    return re.sub(r"^```.*?^```[^\n]*$", "", page, flags=re.S | re.M)


def section(name: str) -> str:
    """The README's `## name` section, up to the next `## ` heading."""
    return re.search(rf"^## {name}\n(.*?)(?=^## |\Z)", text(README), re.S | re.M).group(1)


def results_doc():
    spec = importlib.util.spec_from_file_location("results_doc", ROOT / "scripts/results_doc.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- the text ----------------------------------------------------------------------


def test_readme_is_an_entry_point():
    lines = text(README).splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines; move detail into docs/"
    headings = [line[3:] for line in lines if line.startswith("## ")]
    assert headings == SECTIONS


HISTORY = [
    r"\bissues?\s*#?\d",  # "issue 16", "issue #3"
    r"(?<![\w/])#\d+\b",  # "#14" (a link anchor like #rtn is fine)
    r"\bthis stop\b",
    r"\bwas [^.|]{1,40}\bnow\b",  # "was X, now Y"
    r"\b(previously|earlier run|before the change|used to)\b",
]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_no_issue_numbers_or_history(page):
    found = [m.group(0) for p in HISTORY for m in re.finditer(p, text(page), re.I)]
    assert not found, f"{page.name}: development history in user-facing text: {found}"


def heading_anchors(page: Path) -> set[str]:
    anchor = results_doc().anchor
    body = prose(text(page))
    return {anchor(h.replace("`", "")) for h in re.findall(r"^#+ (.+)$", body, re.M)}


@pytest.mark.parametrize(
    "page", [README, *sorted((ROOT / "docs").glob("*.md"))], ids=lambda p: p.name
)
def test_links_and_anchors_resolve(page):
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        missing_anchor = anchor and dest.suffix == ".md" and anchor not in heading_anchors(dest)
        if not dest.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.name}: links to nothing: {broken}"


def command_uses(page: str) -> list[tuple[str, list[str], str]]:
    """(command, its --options, the text) for every `llmpress COMMAND ...` the page shows:
    in code blocks (a line without `llmpress` that starts indented continues the command
    above it), in inline code, and in table rows that start with one."""
    uses = []
    for block in [body for lang, body in fenced(page) if lang in ("bash", "text", "")]:
        commands: list[str] = []
        for line in block.splitlines():
            parts = re.split(r"(?<![\w-])llmpress ", line)  # not org/smollm2-llmpress
            if len(parts) > 1:
                commands += ["llmpress " + p for p in parts[1:]]
            elif line.startswith(" ") and commands:
                commands[-1] += line
        uses += [(c, c) for c in commands]
    body = prose(page)
    for row in re.findall(r"^\| `llmpress .*$", body, re.M):
        uses.append((row.split("`")[1], row))
    uses += [(span, span) for span in re.findall(r"`(llmpress [^`]+)`", body)]
    out = []
    for head, options_text in uses:
        name = head.split()[1]
        out.append((name, re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*|-o)\b", options_text), head))
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_command_and_option_shown_exists(page):
    from compress.cli import cli

    wrong = []
    for name, options, shown in command_uses(text(page)):
        if name.isupper():
            continue  # a placeholder: `llmpress COMMAND --help`
        if name not in cli.commands:
            wrong.append(f"no command {name!r} in {shown!r}")
            continue
        known = {o for p in cli.commands[name].params for o in p.opts + p.secondary_opts}
        wrong += [f"llmpress {name} has no {o} ({shown!r})" for o in options if o not in known]
    assert not wrong, "\n".join(wrong)


def test_the_extras_named_exist():
    import tomllib

    extras = tomllib.loads(text(ROOT / "pyproject.toml"))["project"]["optional-dependencies"]
    named = set(re.findall(r'pip install -e "\.\[(\w+)\]"', text(README)))
    assert named and named <= set(extras)


def test_recipes_and_gate_files_shown_parse(tmp_path):
    from compress.eval.gates import load_gate_file
    from compress.recipe import parse_recipe

    shown = [b for page in PAGES for b in blocks(text(page), "yaml")]
    assert shown
    examples = sorted((ROOT / "examples").glob("*.yaml"))  # files the docs point to
    assert len(examples) >= 2
    for block in shown + [f.read_text() for f in examples]:
        data = yaml.safe_load(block)
        if "stages" in data:
            parse_recipe(data)
        else:
            (tmp_path / "gates.yaml").write_text(block)
            assert load_gate_file(tmp_path / "gates.yaml")


def test_the_best_recipe_shown_is_the_one_the_code_builds():
    """docs/recipes.md writes out what `--quant best:w4g64` stands for: the block must be
    the recipe the code builds, or the page describes a preset nobody runs."""
    from compress.recipe import quant_recipe

    page = text(ROOT / "docs" / "recipes.md")
    shown = re.search(r"`--quant best:w4g64` stands for:\n\n```yaml\n(.*?)```", page, re.S)
    assert shown, "docs/recipes.md no longer writes out the best preset's recipe"
    assert yaml.safe_load(shown.group(1)) == quant_recipe("best:w4g64")


def test_python_blocks_compile():
    for page in PAGES:
        for block in blocks(text(page), "python"):
            compile(block, str(page), "exec")


def test_results_doc_is_what_the_script_writes():
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts/results_doc.py"), "--check"],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_results_doc_gives_a_section_to_an_unknown_results_file(tmp_path, monkeypatch):
    module = results_doc()
    for name in ("quality.json", "serve_load.json"):
        shutil.copy(module.RESULTS / name, tmp_path / name)
    row = {"ppl": 30.0, "base_ppl": 29.0, "kl": 0.1, "top1": 0.9, "ctx": 512, "data": "t"}
    (tmp_path / "new_bench.json").write_text(
        json.dumps({"windows": 4, "results": {"a": row}, "rows": [{"x": 1.5, "y": "b"}]})
    )
    monkeypatch.setattr(module, "RESULTS", tmp_path)
    doc = module.render()
    assert "## Quality of every method" in doc and "## Serving under load" in doc
    assert "## new_bench.json" in doc and "| a | 30.000 | 29.000 | 1.0345 |" in doc
    assert "| 1.5 | b |" in doc and "## RTN" not in doc


def test_python_api_takes_a_recipe_dict(tmp_path):
    """`compress.compress(recipe={...})`, as docs/commands.md shows, on a tiny model; flags
    beside a dict recipe are refused, naming them, before any work."""
    import compress
    from compress.errors import LlmpressError
    from compress.model.loading import resolve
    from tests.conftest import write_tiny_llama

    model = write_tiny_llama(tmp_path / "model")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(resolve("default").path / name, model / name)
    recipe = {"stages": [{"rtn": {"bits": 4, "group_size": 32}}], "kv_cache": "int8"}
    with pytest.raises(LlmpressError, match="put calib, kv into the recipe"):
        compress.compress(model, tmp_path / "out", recipe=recipe, calib="self", kv="int8")
    out = compress.compress(model, tmp_path / "out", recipe=recipe, log=lambda _: None)
    assert out == tmp_path / "out" and compress.verify(out) == []
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["stages"] == [
        {"rtn": {"bits": 4, "group_size": 32, "zero_point": False}}
    ]
    assert manifest["recipe"]["kv_cache"] == "int8"


# --- the commands, run -------------------------------------------------------------


def first_command() -> str:
    for block in blocks(section("Install"), "bash"):
        if block.startswith("scripts/setup && "):
            return block.strip()
    raise AssertionError("the Install section has no `scripts/setup && ...` command")


def test_readme_first_command_works_in_a_fresh_clone(tmp_path, wikitext):
    """Verbatim, but for the evaluation's window count."""
    command = first_command()
    assert " eval " in command
    (tmp_path / "shared").symlink_to(wikitext.parents[1], target_is_directory=True)
    clone = tmp_path / "llmpress"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    assert not (clone / "out").exists() and not (clone / ".venv").exists()
    r = subprocess.run(
        ["bash", "-c", command + " --windows 2"],
        cwd=clone,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "| ppl |" in r.stdout and "wrote out/" in r.stdout
    shutil.rmtree(clone / ".venv", ignore_errors=True)  # a gigabyte: not kept in /tmp


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, wikitext) -> Path:
    """A folder where the README's relative paths hold: ../shared/data/wikitext-2-raw."""
    root = tmp_path_factory.mktemp("readme")
    (root / "shared").symlink_to(wikitext.parents[1], target_is_directory=True)
    (root / "work").mkdir()
    return root / "work"


def run(args: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def python_example(workdir) -> Path:
    """The README's Python example, verbatim; it writes out/smollm2-w4g64."""
    (code,) = blocks(section("Python"), "python")
    r = run([sys.executable, "-c", code], workdir)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert re.search(r"perplexity [\d.]+ \(original [\d.]+\), KL [\d.]+", r.stdout)
    return workdir / "out" / "smollm2-w4g64"


def test_readme_python_example_runs(python_example):
    manifest = json.loads((python_example / "manifest.json").read_text())
    assert manifest["drift"]["windows"] == 4  # recorded by compress.evaluate


def quick_start() -> list[str]:
    (commands,) = [b for b in blocks(section("Quick start"), "bash") if "llmpress compress" in b]
    return commands.strip().splitlines()


def test_quick_start_compress_is_the_first_commands(python_example):
    """The quick start's compress is the first command's (run in a fresh clone above) and
    writes what the Python example wrote, which the other quick-start steps use."""
    (compress_line,) = [c for c in quick_start() if c.startswith("llmpress compress ")]
    assert ".venv/bin/" + compress_line in first_command()
    assert "-o out/smollm2-w4g64 --quant w4g64" in compress_line


def test_quick_start_eval_passes_its_gates(python_example, workdir):
    (line,) = [c for c in quick_start() if c.startswith("llmpress eval ")]
    args = re.sub(r"--windows \d+", "--windows 2", line)
    r = run(["bash", "-c", args], workdir)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "gate PASS kl" in r.stdout and "gate FAIL" not in r.stdout


def test_readme_transformers_snippet_runs(python_example, workdir):
    section_text = section("Quick start")
    (code,) = [b for b in blocks(section_text, "python") if "transformers" in b]
    r = run([sys.executable, "-c", code], workdir)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert r.stdout.startswith("The capital of France is")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_quick_start_server_answers_the_curl_shown(python_example, workdir):
    (serve,) = [c for c in quick_start() if c.startswith("llmpress serve ")]
    (curl,) = [b.strip() for b in blocks(section("Quick start"), "bash") if b.startswith("curl ")]
    assert "--port 8000" in serve and "localhost:8000/" in curl
    port = free_port()
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    server = subprocess.Popen(
        ["bash", "-c", "exec " + serve.replace("--port 8000", f"--port {port}")],
        cwd=workdir,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            assert server.poll() is None, server.stderr.read()[-2000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5):
                    break
            except OSError:
                assert time.monotonic() < deadline, "the server never answered /health"
                time.sleep(1)
        r = run(["bash", "-c", curl.replace("localhost:8000", f"localhost:{port}")], workdir)
        assert r.returncode == 0, r.stderr
        reply = json.loads(r.stdout)
        choice, used = reply["choices"][0], reply["usage"]["completion_tokens"]
        assert choice["text"]
        # The model may end its answer before the limit; then the reply must say it stopped.
        assert (used == 16 and choice["finish_reason"] == "length") or (
            0 < used < 16 and choice["finish_reason"] == "stop"
        ), reply
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
