"""Checkpoints: atomic writes, safe loads (``torch.load(..., weights_only=True)``).

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads
without unpickling any code::

    {"format": "mlip_unc", "version": 1, "kind": "property" | "potential",
     "config": {...}, "metadata": {...}, "model_state": {...},
     "optimizer_state": {...} (optional), "epoch": int, ..., "sha256": str}

``sha256`` is a digest of the whole payload, written at save and checked at load: every tensor
(name, dtype, shape, bytes) and every other value (name, type, ``repr``), so flipped bits
inside a weight tensor or in the config or metadata, which still unpickle, are refused with a
clear error instead of producing NaN or another model later (``digest: 2``). Checkpoints with
``digest`` 1 (absent: tensors only) are checked with that older digest, and checkpoints
written before any digest existed load without the check.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import torch

from mlip_unc.atomic import atomic_write

__all__ = [
    "FORMAT",
    "VERSION",
    "CheckpointError",
    "save_checkpoint",
    "load_checkpoint",
    "tensor_digest",
]

_UNHASHED = ("sha256", "digest")  # the digest's own fields

FORMAT = "mlip_unc"
VERSION = 1


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupted or not an mlip-unc checkpoint."""


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically: a temporary file in the same folder, then rename.

    A crash mid-write leaves the previous checkpoint intact.
    """
    full = {"format": FORMAT, "version": VERSION, **payload, "digest": 2}
    full["sha256"] = tensor_digest(full, values=True)
    return atomic_write(path, lambda handle: torch.save(full, handle))


def tensor_digest(payload: Any, *, values: bool = False) -> str:
    """SHA-256 over every tensor in ``payload`` (nested dicts/lists), in a fixed order; with
    ``values`` over every other leaf too (its type and ``repr``)."""
    digest = hashlib.sha256()

    def walk(node: Any, name: str) -> None:
        if isinstance(node, torch.Tensor):
            t = node.detach().cpu().contiguous()
            digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
            digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(node, dict):
            for key in sorted(node, key=str):
                if not (name == "" and key in _UNHASHED):
                    walk(node[key], f"{name}/{key!r}" if values else f"{name}/{key}")
        elif isinstance(node, (list, tuple)):
            for i, item in enumerate(node):
                walk(item, f"{name}[{i}]")
        elif values:
            digest.update(f"{name}|{type(node).__name__}|{node!r}\n".encode())

    walk(payload, "")
    return digest.hexdigest()


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
        if "Unsupported global" in str(err):  # a pickled class or function: code, not data
            raise CheckpointError(
                f"{path} holds pickled Python objects, not a plain-data mlip-unc checkpoint; it is "
                "refused because loading it would run code (weights_only=True). Re-save the model "
                "with mlip-unc, or load it yourself only if you trust its source"
            ) from None
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
    expected, full = payload.get("sha256"), payload.get("digest") == 2
    if expected is not None and tensor_digest(payload, values=full) != expected:
        what = "its contents" if full else "its tensors"
        raise CheckpointError(
            f"checkpoint {path} is corrupted: {what} do not match the SHA-256 digest written with it "
            "(changed bytes in a weight tensor, the config or the metadata); restore it from a copy or retrain"
        )
    if kind is not None and payload.get("kind") != kind:
        raise CheckpointError(f"{path} holds a {payload.get('kind')!r} model, expected {kind!r}")
    return payload
