"""Crash-safe writes of directories and small files on possibly shared storage.

A writer works in a hidden temporary path named after its process (``.tmp-<name>.<host>.<pid>``), fsyncs it
and renames it into place, so a crash or a kill at any point leaves the previous version whole. Leftovers of
writers that are gone are removed by `remove_partial_saves`; only the host that wrote one can tell whether its
process is alive, so leftovers of other hosts stay.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
from pathlib import Path

# leftovers of a save end in .<host>.<pid> of the saving process: only this host can tell whether it is alive
PARTIAL = re.compile(r"\.(tmp|old)-.*\.(?P<host>[^.]+)\.(?P<pid>\d+)")


def owner() -> str:
    """The suffix naming this process in temporary paths (run dirs may sit on shared storage)."""
    return f"{_host()}.{os.getpid()}"


def remove_partial_saves(root: Path, name: str | None = None) -> None:
    """Delete the temporary paths under `root` of saves whose process is gone (killed or crashed); with
    `name`, only those of saves to `root / name` (a directory shared with other files)."""
    for path in root.iterdir():
        match = PARTIAL.fullmatch(path.name)
        if name is not None and not path.name.startswith((f".tmp-{name}.", f".old-{name}.")):
            continue
        if match and match["host"] == _host() and not _process_alive(int(match["pid"])):
            if path.is_dir():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)


def move_into_place(tmp: Path, final: Path) -> None:
    """Rename the finished temporary directory to its final name, replacing an older save of the same name."""
    if final.exists():
        old = final.with_name(f".old-{final.name}.{owner()}")
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    fsync_dir(final.parent)


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` through a synced temporary file renamed over it."""
    tmp = path.with_name(f".tmp-{path.name}.{owner()}")
    with open(tmp, "w") as file:
        file.write(text)
        file.flush()
        os.fsync(file.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree(directory: Path) -> None:
    """fsync every file and directory under `directory`, deepest first, then `directory` itself."""
    for path in sorted(directory.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if path.is_file():
            with open(path, "rb") as file:
                os.fsync(file.fileno())
        else:
            fsync_dir(path)
    fsync_dir(directory)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _host() -> str:
    return socket.gethostname().replace(".", "-") or "localhost"


def _process_alive(pid: int) -> bool:
    if pid == os.getpid():
        return False  # saves are synchronous: a leftover of this process is from an earlier failed save
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
