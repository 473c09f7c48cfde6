"""Resumable results files: JSONL records appended one per finished run, and a per-folder lock.

A path ending in ``.gz`` is read and appended gzip-compressed (one gzip member per record), for
records of per-frame values that would be large as text.
"""

from __future__ import annotations

import gzip
import json
import os
import sys
from pathlib import Path
from typing import Any


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a JSONL file in file order (none when it is missing).

    A line that is not valid JSON (cut by a kill during the write) is skipped with a warning, so
    the run it recorded is redone on resume.
    """
    if not path.exists():
        return []
    out = []
    text = (
        gzip.decompress(path.read_bytes()).decode("utf-8")
        if path.suffix == ".gz"
        else path.read_text(encoding="utf-8")
    )
    for n, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                print(f"warning: {path}:{n} is not valid JSON; ignored", file=sys.stderr)
    return out


def append_jsonl(path: Path, record: dict[str, Any]) -> None:
    """Append one record as one line and fsync it, so a finished run survives a kill."""
    line = json.dumps(record, allow_nan=True) + "\n"
    with path.open("ab") as handle:
        handle.write(
            gzip.compress(line.encode("utf-8")) if path.suffix == ".gz" else line.encode("utf-8")
        )
        handle.flush()
        os.fsync(handle.fileno())


def take_lock(path: Path, owner: str) -> None:
    """One invocation per output folder: ``path`` holds the pid; a dead process's lock is taken.

    Raises:
        SystemExit: another live ``owner`` process holds the lock.
    """
    try:
        pid = int(path.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError):
        path.write_text(str(os.getpid()))
        return
    except PermissionError:
        pass
    raise SystemExit(
        f"error: another {owner} (pid {pid}) writes to {path.parent}; wait for it or stop it"
    )
