"""Atomic writes of the small text files that training runs produce (JSON, YAML)."""

from __future__ import annotations

import json
import math
import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import yaml

__all__ = ["atomic_write_text", "write_json", "write_yaml", "json_safe"]


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` to a temporary file in the same folder, fsync, rename over ``path``.

    A crash mid-write leaves the previous file intact and no temporary file behind.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def json_safe(value: Any) -> Any:
    """NumPy scalars -> Python numbers; non-finite floats -> None (standard JSON)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer)):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Atomic JSON (non-finite floats written as null)."""
    return atomic_write_text(path, json.dumps(json_safe(data), indent=1) + "\n")


def write_yaml(path: str | os.PathLike, data: Any) -> Path:
    """Atomic YAML, keys in insertion order."""
    return atomic_write_text(path, yaml.safe_dump(data, sort_keys=False))
