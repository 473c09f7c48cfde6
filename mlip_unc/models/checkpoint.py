"""Checkpoints: atomic writes, safe loads (``torch.load(..., weights_only=True)``).

A checkpoint is a plain dict of tensors, numbers, strings, lists and dicts, so it loads
without unpickling any code::

    {"format": "mlip_unc", "version": 1, "format_version": 2,
     "kind": "property" | "potential" | "training",
     "config": {...}, "metadata": {...}, "model_state": {...},
     "optimizer_state": {...} (optional), "epoch": int, ..., "sha256": str}

``format_version`` (:data:`FORMAT_VERSION`) says how the contents are laid out, so a loader
tells an older layout by its number rather than by the keys it lacks; a checkpoint without the
key was written before it existed and is format 1 (:func:`checkpoint_format_version`).
``version`` is the container's version: 1 since the first checkpoint, kept at 1 because
mlip-unc 0.1.0 refuses anything above it.

``sha256`` is a digest of the whole payload, written at save and checked at load: every tensor
(name, dtype, shape, bytes) and every other value (name, type, ``repr``), so flipped bits
inside a weight tensor or in the config or metadata, which still unpickle, are refused with a
clear error instead of producing NaN or another model later (``digest: 2``). Checkpoints with
``digest`` 1 (absent: tensors only) are checked with that older digest; checkpoints written
before any digest existed load with a :class:`CheckpointWarning` that names the file and
:func:`resave_checkpoint`, which adds the digest.

:func:`check_checkpoint_file` reads only the first bytes of a file (no torch), so the command
line refuses a missing file or one of another format (YAML, text, ...) at once, before it
imports torch; :func:`load_checkpoint` runs the same check first. torch is imported inside the
functions that need it for the same reason.
"""

from __future__ import annotations

import hashlib
import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlip_unc.atomic_write import atomic_write

if TYPE_CHECKING:
    import torch

__all__ = [
    "FORMAT",
    "VERSION",
    "FORMAT_VERSION",
    "CheckpointError",
    "CheckpointWarning",
    "check_checkpoint_file",
    "checkpoint_format_version",
    "save_checkpoint",
    "load_checkpoint",
    "resave_checkpoint",
    "tensor_digest",
]

_UNHASHED = ("sha256", "digest")  # the digest's own fields

FORMAT = "mlip_unc"
VERSION = 1

FORMAT_VERSION = 2
"""The layout of the contents that :func:`save_checkpoint` writes (``"format_version"``).

1. No ``format_version`` key: every checkpoint written before the key existed. A potential's
   config may lack keys that later code added (a backbone's ``concat_layers``,
   ``readout_hidden`` and ``check_latent_span``; ``gradient_method``, ``posterior``,
   ``dtype``), so the loaders infer them from their absence
   (:func:`mlip_unc.nn.radial.checkpoint_backbone_kwargs`).
2. The payload builders write the complete config (every backbone's constructor arguments), and
   the loaders take it as written.

Raise it, and add a test that a checkpoint of the previous format still loads, whenever a
loader has to tell the new layout from the old one.
"""


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, corrupted or not an mlip-unc checkpoint."""


class CheckpointWarning(UserWarning):
    """A checkpoint loads, but cannot be checked (no digest): re-save it."""


_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format (a zip archive)
_PICKLE_PROTO = b"\x80"  # torch.save's legacy format (a pickle stream) opens with PROTO


def _describe(head: bytes, path: Path) -> str:
    """What a file that is not a torch checkpoint looks like, from its first bytes."""
    if head.startswith(b"\x89HDF"):
        return "HDF5 data"
    if head.startswith(b"\x93NUMPY"):
        return "a NumPy array (.npy)"
    text = head.decode("utf-8", errors="replace").lstrip()
    if b"\x00" in head or text.count("\ufffd") > 3:  # a cut multi-byte character is not binary
        return "binary data of another format"
    first_line = text.split("\n", 1)[0].strip()
    suffix = path.suffix.lower()
    if suffix == ".json" or text[:1] in ("{", "["):
        return "JSON text"
    if suffix in (".xyz", ".extxyz") or first_line.isdigit():
        return "structures (extended XYZ text)"
    if suffix in (".yaml", ".yml") or ":" in first_line:
        return "YAML text (a config? it goes to --config)"
    return "text"


def check_checkpoint_file(path: str | os.PathLike) -> Path:
    """Cheap checks (no torch): ``path`` exists, is a file and starts like a torch checkpoint.

    Raises:
        CheckpointError: a missing path, a folder, an empty file, or a file of another format
            (named, e.g. "YAML text").
    """
    path = Path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} is a folder; pass the checkpoint file inside it")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    with path.open("rb") as handle:
        head = handle.read(256)
    if not head:
        raise CheckpointError(
            f"checkpoint {path} is empty (0 bytes): truncated or corrupted; restore it or retrain"
        )
    if not (head.startswith(_ZIP_MAGIC) or head.startswith(_PICKLE_PROTO)):
        raise CheckpointError(
            f"{path} is not an mlip-unc checkpoint: it holds {_describe(head, path)}; a checkpoint "
            "is the model.pt written by mlip-unc train, attach or property train"
        )
    return path


def checkpoint_format_version(payload: dict[str, Any]) -> int:
    """The :data:`FORMAT_VERSION` of a checkpoint payload: 1 when it has no ``format_version``
    (written before the key existed)."""
    return int(payload.get("format_version", 1))


def save_checkpoint(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write ``payload`` atomically: a temporary file in the same folder, then rename.

    A crash mid-write leaves the previous checkpoint intact. The file gets ``format_version``
    :data:`FORMAT_VERSION` unless ``payload`` has its own: a loaded checkpoint written again
    (e.g. with new metadata) keeps the version of its unchanged contents.
    """
    import torch

    full = {
        "format": FORMAT,
        "version": VERSION,
        "format_version": FORMAT_VERSION,
        **payload,
        "digest": 2,
    }
    full["sha256"] = tensor_digest(full, values=True)
    return atomic_write(path, lambda handle: torch.save(full, handle))


def tensor_digest(payload: Any, *, values: bool = False) -> str:
    """SHA-256 over every tensor in ``payload`` (nested dicts/lists), in a fixed order; with
    ``values`` over every other leaf too (its type and ``repr``)."""
    import torch

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
    """Load a checkpoint with ``weights_only=True``; raise :class:`CheckpointError` on bad files
    (and ValueError naming CUDA for a ``map_location`` on a GPU this machine lacks).

    A checkpoint without a digest (written before digests existed) loads with a
    :class:`CheckpointWarning` naming the file and :func:`resave_checkpoint`. The payload
    returned always holds ``format_version`` (1 for a checkpoint without it); a format above
    :data:`FORMAT_VERSION` is refused.
    """
    import torch

    from mlip_unc.models.devices import require_available

    path = check_checkpoint_file(path)
    require_available(map_location, name="map_location")  # not "truncated" when CUDA is missing
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except Exception as err:  # pickle, zip and EOF errors all mean an unreadable file
        if "Unsupported global" in str(err):  # a pickled class or function: code, not data
            raise CheckpointError(
                f"{path} holds pickled Python objects, not a plain-data mlip-unc checkpoint; it is "
                "refused because loading it would run code (weights_only=True). Re-save the model "
                "with mlip-unc, or load it yourself only if you trust its source"
            ) from None
        detail = str(err).splitlines()[0] if str(err) else "no detail"
        if "weights_only" in detail or "Weights only" in detail:  # torch's advice, not ours
            detail = "the pickle inside cannot be read as plain data"
        raise CheckpointError(
            f"checkpoint {path} is truncated or corrupted and cannot be read "
            f"({type(err).__name__}: {detail})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an mlip-unc checkpoint")
    if payload.get("version", 0) > VERSION:
        raise CheckpointError(
            f"{path} was written by a newer mlip-unc (checkpoint version {payload['version']})"
        )
    fmt = payload.get("format_version", 1)
    if isinstance(fmt, int) and fmt > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} was written by a newer mlip-unc (checkpoint format {fmt}; this version "
            f"reads formats 1 to {FORMAT_VERSION}): upgrade mlip-unc to load it"
        )
    expected, full = payload.get("sha256"), payload.get("digest") == 2
    if expected is not None and tensor_digest(payload, values=full) != expected:
        what = "its contents" if full else "its tensors"
        raise CheckpointError(
            f"checkpoint {path} is corrupted: {what} do not match the SHA-256 digest written with it "
            "(changed bytes in a weight tensor, the config or the metadata); restore it from a copy or retrain"
        )
    if not isinstance(fmt, int) or isinstance(fmt, bool) or fmt < 1:
        raise CheckpointError(f"{path} has an invalid format_version {fmt!r}")
    if kind is not None and payload.get("kind") != kind:
        raise CheckpointError(f"{path} holds a {payload.get('kind')!r} model, expected {kind!r}")
    if expected is None:
        warnings.warn(
            f"checkpoint {path} has no SHA-256 digest (written before checkpoints carried one), so damage "
            'to it cannot be detected; re-save it once to add one: python -c "from '
            f"mlip_unc.models.checkpoint import resave_checkpoint; resave_checkpoint('{path}')\"",
            CheckpointWarning,
            stacklevel=2,
        )
    payload["format_version"] = fmt  # explicit: a re-save keeps the version of these contents
    return payload


def resave_checkpoint(path: str | os.PathLike, out: str | os.PathLike | None = None) -> Path:
    """Load ``path`` and write it again (to ``out``, default in place) with the current digest.

    For checkpoints written before digests existed: their contents are kept as they are, and so
    is their ``format_version`` (1 for one without the key, now written out).
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CheckpointWarning)
        payload = load_checkpoint(path)
    kept = {k: v for k, v in payload.items() if k not in ("format", "version", *_UNHASHED)}
    return save_checkpoint(path if out is None else out, kept)
