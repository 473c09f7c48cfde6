"""Atomic file writes: a temporary file in the same folder, fsync, rename over the target.

A crash or exception mid-write leaves the previous file intact and no temporary file behind;
only ``kill -9`` (or a power cut) can leave the temporary file ``.<name>.<8 random>.tmp``,
which :func:`remove_stale_temps` deletes when a run folder is opened again (the training core
and the active-learning loop call it). Used by every writer of the package (checkpoints, JSON,
YAML); imports nothing of mlip_unc.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["TEMP_PATTERN", "atomic_write", "atomic_write_text", "remove_stale_temps"]

log = logging.getLogger(__name__)
#: names of :func:`atomic_write`'s temporary files: ``.<target name>.<8 of [a-z0-9_]>.tmp``
#: (``tempfile.mkstemp`` with our prefix and suffix)
TEMP_PATTERN = re.compile(r"^\.(?P<target>.+)\.[a-z0-9_]{8}\.tmp$")


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object]) -> Path:
    """Call ``write(handle)`` on a binary temporary file beside ``path``, then rename it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.chmod(tmp, _file_mode(path))  # mkstemp makes 0600; give the permissions of open()
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _file_mode(path: Path) -> int:
    """The target's permissions when it exists, else 0666 less the umask (as ``open`` gives),
    the umask read from /proc (no change of process state), 022 where that is unavailable."""
    try:
        return path.stat().st_mode & 0o7777
    except FileNotFoundError:
        pass
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o644


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """:func:`atomic_write` of UTF-8 ``text``."""
    return atomic_write(path, lambda handle: handle.write(text.encode("utf-8")))


def remove_stale_temps(folder: str | os.PathLike | None, *, recursive: bool = False) -> list[Path]:
    """Delete the temporary files of :func:`atomic_write` (:data:`TEMP_PATTERN`) in ``folder``
    (and its sub-folders with ``recursive``); returns the paths removed.

    Such a file exists only when a writer was killed mid-write (its target is then the previous
    version, or absent). Call this when a run folder is (re)opened by the one process that
    writes it: a write in progress by another process would lose its temporary file.
    ``folder`` None or missing: nothing to do.
    """
    if folder is None or not Path(folder).is_dir():
        return []
    candidates = Path(folder).rglob(".*.tmp") if recursive else Path(folder).glob(".*.tmp")
    removed = []
    for path in sorted(candidates):
        if TEMP_PATTERN.match(path.name) and path.is_file() and not path.is_symlink():
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.info(
            "removed %d temporary file(s) left by an interrupted write in %s: %s",
            len(removed),
            folder,
            ", ".join(str(p.relative_to(folder)) for p in removed),
        )
    return removed
