"""The small text files of a run (JSON, YAML): :func:`json_safe` turns values into standard
JSON data, :func:`write_json` and :func:`write_yaml` write them atomically
(:mod:`mlip_unc.atomic_write`)."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mlip_unc.atomic_write import atomic_write_text

__all__ = ["atomic_write_text", "write_json", "write_yaml", "json_safe"]


def json_safe(value: Any) -> Any:
    """``value`` as standard JSON data: mapping keys as strings, tuples and NumPy arrays as
    lists, NumPy scalars as Python numbers, non-finite floats as None, so that
    ``json.loads(json.dumps(json_safe(value)))`` equals ``json_safe(value)``."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [json_safe(v) for v in value]
    if isinstance(value, (np.floating, np.integer, np.bool_)):
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
