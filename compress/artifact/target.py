"""Where an artifact may be written, decided before any work, so that nothing the user
has is ever lost: only an llmpress artifact (or an empty folder) is replaced, never the
model being compressed, and the hidden temporary folders of killed runs are cleaned.

A run holds `.NAME.llmpress-lock` beside the target for its whole length (a second run
for the same target is refused at once), writes into `.NAME.partial-XXXX` (with its pid
inside) and renames it at the end; a previous artifact is moved to `.NAME.old-XXXX` for
the moment of the swap. The rename never replaces what the run did not check at its
start: a folder that appeared meanwhile is left alone and the artifact goes beside it.
A run killed with SIGKILL leaves its temporary folders behind: the next run for the same
target removes those that carry llmpress's owner file and whose process is gone, and
nothing else.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from compress.errors import LlmpressError

MANIFEST = "manifest.json"
OWNER = ".llmpress-owner"  # inside a temporary folder: "pid host"


def is_artifact(folder: Path) -> bool:
    """An llmpress artifact: a folder whose manifest.json llmpress wrote."""
    try:
        manifest = json.loads((Path(folder) / MANIFEST).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "llmpress_manifest" in manifest


def check_output(out: Path, overwrite: bool) -> None:
    """Refuse, before any work, a target that exists (without --overwrite), that is not an
    artifact (with it), or that is not a folder path at all."""
    if str(out).strip() in ("", "."):
        raise LlmpressError("-o is empty: name the folder to write the artifact to")
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise LlmpressError(
                f"output {out} already exists: choose another -o or pass --overwrite"
            )
        if not out.is_dir() or out.is_symlink():
            raise LlmpressError(
                f"output {out} is not a folder: --overwrite replaces only llmpress artifacts; "
                "choose another -o"
            )
        if any(out.iterdir()) and not is_artifact(out):
            raise LlmpressError(
                f"output {out} exists and is not an llmpress artifact (no llmpress "
                "manifest.json): --overwrite replaces only artifacts; choose another -o or "
                "empty that folder yourself"
            )
        if Path.cwd().resolve().is_relative_to(out.resolve()):
            raise LlmpressError(
                f"output {out} holds the current folder: run from elsewhere or choose another -o"
            )
    parent = existing_ancestor(out.parent)
    if not parent.is_dir():
        raise LlmpressError(f"cannot create {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK):
        raise LlmpressError(f"cannot write to {parent}: permission denied; choose another -o")


def check_not_source(out: Path, source: Path) -> None:
    """Refuse to write over (or around) the checkpoint being compressed."""
    out, source = Path(out).resolve(), Path(source).resolve()
    if source == out or source.is_relative_to(out):
        raise LlmpressError(
            f"output {out} is (or holds) the model being compressed ({source}): writing "
            "there would replace the source; choose another -o"
        )


def existing_ancestor(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (where disk space can be measured)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _owner_line() -> str:
    return f"{os.getpid()} {socket.gethostname()}\n"


def mark_owner(folder: Path) -> None:
    (Path(folder) / OWNER).write_text(_owner_line())


def is_stale(folder: Path) -> bool:
    """A temporary folder a killed llmpress run left: it carries llmpress's owner marker
    and its process is gone. A look-alike without the marker is a user's, never stale."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink() or not (folder / OWNER).is_file():
        return False
    return not _owner_alive(folder / OWNER)


def _owner_alive(marker: Path) -> bool:
    """Whether the run named in `marker` ("pid host") may still be running. An unreadable
    marker counts as alive: only what llmpress provably left is ever removed."""
    try:
        pid, host = marker.read_text().split()
    except (OSError, ValueError):
        return True
    if host != socket.gethostname():
        return True  # another machine's run on a shared disk: not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError):
        return True
    return True


def clean_stale(out: Path, log=print) -> None:
    """Remove temporary folders that killed runs left beside `out`."""
    parent = Path(out).parent
    if not parent.is_dir():
        return
    for prefix in (f".{Path(out).name}.partial-", f".{Path(out).name}.old-"):
        for folder in parent.glob(prefix + "*"):
            if not is_stale(folder):
                continue
            previous = folder / "artifact"  # killed mid-swap: the old artifact comes back
            if ".old-" in folder.name and previous.is_dir() and not Path(out).exists():
                os.replace(previous, out)
                log(f"restored {out} from {folder}, left by an interrupted run")
            shutil.rmtree(folder, ignore_errors=True)
            log(f"removed {folder}, left by an interrupted run")


def publish_permissions(folder: Path) -> None:
    """mkdtemp makes a private (0700) folder; give the finished one the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def lock_path(out: Path) -> Path:
    return Path(out).parent / f".{Path(out).name}.llmpress-lock"


@contextmanager
def claim(out: Path) -> Iterator[None]:
    """Hold the target for one run: a second run writing the same -o is refused at once,
    rather than both finishing and the later one silently replacing the first."""
    lock = lock_path(out)
    lock.parent.mkdir(parents=True, exist_ok=True)
    mine = _owner_line()
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _owner_alive(lock):
                owner = lock.read_text().split()[:1] or ["?"]
                raise LlmpressError(
                    f"another llmpress run (pid {owner[0]}) is writing {out}: wait for it to "
                    f"finish or choose another -o (a stale lock is {lock})"
                ) from None
            lock.unlink(missing_ok=True)  # its run was killed: take over
            continue
        with os.fdopen(fd, "w") as f:
            f.write(mine)
        break
    try:
        yield
    finally:
        try:
            if lock.read_text() == mine:
                lock.unlink()
        except OSError:
            pass


def identity(path: Path) -> tuple[int, int] | None:
    """(device, inode) of what is at `path` now, or None: a replaced folder has another."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return (st.st_dev, st.st_ino)


_RENAME_NOREPLACE = 1
_AT_FDCWD = -100


def rename_noreplace(src: Path, dst: Path) -> None:
    """Rename `src` to `dst`, failing with FileExistsError if anything is at `dst`, in one
    atomic step where the kernel offers it (renameat2); os.rename would silently replace
    an empty folder another process just made."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        rc = renameat2(_AT_FDCWD, os.fsencode(src), _AT_FDCWD, os.fsencode(dst), _RENAME_NOREPLACE)
        if rc == 0:
            return
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "exists", str(dst))
        if err not in (errno.ENOSYS, errno.EINVAL):
            raise OSError(err, os.strerror(err), str(dst))
    if os.path.lexists(dst):
        raise FileExistsError(errno.EEXIST, "exists", str(dst))
    os.rename(src, dst)


def divert(tmp: Path, out: Path) -> Path:
    """Give a finished artifact a visible name beside `out`, when `out` is not ours to
    replace any more."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(100):
        alt = out.parent / f"{out.name}.llmpress-{stamp}{f'-{k}' if k else ''}"
        try:
            rename_noreplace(tmp, alt)
            return alt
        except FileExistsError:
            continue
    raise LlmpressError(f"cannot find a free name beside {out} for the finished artifact")
