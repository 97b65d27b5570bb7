"""Run every bad-input case of tests/test_bad_input.py and write docs/bad-input.md: the
input, the exit code, the one line printed, and what is left on disk.

    .venv/bin/python scripts/bad_input_table.py
"""

from __future__ import annotations

import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from test_bad_input import CASES, run_case  # noqa: E402


def main() -> None:
    rows, clean = [], 0
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp:
            got = run_case(case, Path(tmp))
            line = (got["lines"] or [""])[0]
            line = re.sub(re.escape(tmp), "TMP", line)
        ok = (
            got["code"] == case.code
            and not got["traceback"]
            and got["left_ok"]
            and (not case.message or (len(got["lines"]) == 1 and case.message in line))
        )
        clean += ok
        shown = line.replace("|", "\\|") or "(none: it works)"
        verdict = "yes" if ok else "NO"
        rows.append(f"| {case.name} | {got['code']} | `{shown}` | {case.left} | {verdict} |")
        print(f"{'ok ' if ok else 'BAD'} {case.name}", flush=True)
    text = [
        "# Bad input: what llmpress says and what it leaves",
        "",
        "Made by `.venv/bin/python scripts/bad_input_table.py` (the cases of",
        "tests/test_bad_input.py, run through the real command line). Exit codes: 0 success,",
        "1 a gate or `verify` failed, 2 bad input or environment (one line), 3 a bug (one",
        "line; the traceback goes to a file). Four more faults are tested in the same file",
        "outside this table: a full disk during the write, a read-only target, a file-size",
        "limit (`ulimit -f`) and SIGTERM during compress: each exits with one line (2, 2, 2",
        "and 143) and leaves nothing on disk.",
        "",
        "More faults are tested beside the table, each through the real command line or a",
        "real socket:",
        "",
        "- tests/test_target_safety.py: a folder created at `-o` during a run is kept (the",
        "  artifact goes beside it, exit 2); two runs to one `-o` (the second is refused at",
        "  once); `--overwrite` keeps a user's own files and refuses a GGUF source inside the",
        "  target; look-alike temporary folders survive cleanup; an unlisted weight file, a",
        "  truncated packed weight with re-hashed manifest, a malformed hash table, an index",
        "  pointing outside the folder and a tensor in two files are one-line refusals; eval",
        "  of a read-only artifact prints its results and then says it could not record; a",
        "  planted checkpoint pickle is never run.",
        "- tests/test_serve_faults.py: sampling values that would make NaN, request",
        "  smuggling, slow clients, the connection cap, `--api-key`, deep JSON, a wrong",
        "  `model`, a prompt past the context, SIGTERM (143); one failing request never stops",
        "  the server.",
        "- tests/test_input_validation.py and tests/test_no_silent.py: the cache folder, stale",
        "  conversions, `--base` that is not the artifact's source, non-finite JSON, and no",
        "  silent change of scheme, path or tag in what is written.",
        "",
        f"{clean} of {len(CASES)} cases clean.",
        "",
        "| input | exit | message | left on disk | clean |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ]
    (ROOT / "docs" / "bad-input.md").write_text("\n".join(text))


if __name__ == "__main__":
    main()
