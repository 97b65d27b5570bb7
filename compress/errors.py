"""The one exception type users see, the exit codes, and the file-system errors translated.

Exit codes (README "Exit codes"): 0 success; 1 a quality gate or `verify` failed (the
artifact is what it is, the command worked); 2 bad input or environment, with one line
naming the problem and the fix; 3 an internal error (a bug: one line, the traceback in a
file). CI can thus tell a failed gate from a crash.
"""

from __future__ import annotations

import errno
import re

EXIT_GATE = 1
EXIT_INPUT = 2
EXIT_CRASH = 3


class LlmpressError(Exception):
    """Bad input or environment. The CLI prints it as one line and exits with status 2."""


def first_line(e: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, cut: what fits in a one-line error."""
    return (str(e).strip().splitlines() or [""])[0][:limit]


_OS_HINTS = {
    errno.ENOSPC: "out of disk space: free space or write elsewhere",
    errno.EDQUOT: "disk quota exceeded: free space or write elsewhere",
    errno.EFBIG: "file too large for this system's limit (ulimit -f): raise the limit or "
    "write elsewhere",
    errno.EROFS: "read-only file system: write elsewhere",
    errno.EACCES: "permission denied: write elsewhere or fix the permissions",
    errno.EPERM: "operation not permitted: write elsewhere or fix the permissions",
    errno.ENOENT: "no such file or folder",
    errno.ENOTDIR: "a part of the path is a file, not a folder",
    errno.EISDIR: "is a folder, not a file",
}
_OS_ERROR_IN_TEXT = re.compile(r"os error (\d+)")


def os_error_code(exc: BaseException) -> int | None:
    """The errno behind `exc`: an OSError's own, or one named inside another library's
    message (safetensors reports "... os error 28" in a SafetensorError)."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    m = _OS_ERROR_IN_TEXT.search(str(exc))
    return int(m.group(1)) if m else None


def explain_os_error(exc: BaseException, doing: str) -> LlmpressError | None:
    """A one-line LlmpressError for a file-system failure while `doing` (e.g. "writing
    out/x"), or None when `exc` is not one."""
    code = os_error_code(exc)
    if code is None:
        return None
    hint = _OS_HINTS.get(code) or (
        getattr(exc, "strerror", None) or errno.errorcode.get(code, f"os error {code}")
    )
    where = getattr(exc, "filename", None)
    target = f" ({where})" if where and str(where) not in doing else ""
    return LlmpressError(f"{doing}{target}: {hint}")
