"""The README's first command, verbatim, in a fresh clone of this repository: what a new
user runs first must work (it once failed because `out/` did not exist). Only the
evaluation's window count is shortened, as the brief allows."""

import re
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def first_command() -> str:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Set up and run", 1)[1]
    return re.search(r"```bash\n(.+?)\n```", section, re.S).group(1).strip()


def test_readme_first_command_works_in_a_fresh_clone(tmp_path, wikitext):
    command = first_command()
    assert command.startswith("scripts/setup && ") and " eval " in command
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
