"""Checkpoints: atomic writes, safe loads (``torch.load(..., weights_only=True)``).

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads
without unpickling any code::

    {"format": "mlip_unc", "version": 1, "kind": "property" | "potential",
     "config": {...}, "metadata": {...}, "model_state": {...},
     "optimizer_state": {...} (optional), "epoch": int, ...}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from mlip_unc.atomic import atomic_write

__all__ = ["FORMAT", "VERSION", "CheckpointError", "save_checkpoint", "load_checkpoint"]

FORMAT = "mlip_unc"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupted or not an mlip-unc checkpoint."""


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically: a temporary file in the same folder, then rename.

    A crash mid-write leaves the previous checkpoint intact.
    """
    full = {"format": FORMAT, "version": VERSION, **payload}
    return atomic_write(path, lambda handle: torch.save(full, handle))


def load_checkpoint(
    path: str | os.PathLike, *, map_location: str | torch.device = "cpu", kind: str | None = None
) -> dict[str, Any]:
    """Load a checkpoint with ``weights_only=True``; raise :class:`CheckpointError` on bad files."""
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; pass the checkpoint file inside it")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # pickle, zip and EOF errors all mean an unreadable file
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupted and cannot be read "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else 'no detail'})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an mlip-unc checkpoint")
    if payload.get("version", 0) > VERSION:
        raise CheckpointError(
            f"{path} was written by a newer mlip-unc (format version {payload['version']})"
        )
    if kind is not None and payload.get("kind") != kind:
        raise CheckpointError(f"{path} holds a {payload.get('kind')!r} model, expected {kind!r}")
    return payload
