"""The one exception class of the data layer, and the messages that more than one reader gives."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["DataError", "no_frames", "not_found", "where"]


class DataError(ValueError):
    """Bad input data: the message names the culprit (file, frame or row, element, key)."""


def where(source: object | None = None, frame: int | None = None, *, row: str = "frame") -> str:
    """Describe a location for error messages, e.g. ``"train.xyz, frame 3"``.

    Args:
        source: file path or any label of the data source (``None`` if unknown).
        frame: index of the frame/row in the source (``None`` if unknown).
        row: word used for the index ("frame", "line", "row").
    """
    parts = []
    if source is not None:
        parts.append(f"'{source}'")
    if frame is not None:
        parts.append(f"{row} {frame}")
    return ", ".join(parts) if parts else "input structure"


def no_frames(path: object) -> str:
    """The message of a structure file that holds no frames (an empty file)."""
    return f"file '{path}' holds no frames"


def not_found(path: object, what: str = "structure file") -> str:
    """The message of a missing input file; under the data root (``$MLIP_UNC_DATA``, default
    ``../shared/data``, where the shipped configs read their data) it says how to point the root
    at the data instead of naming only a path the user never wrote."""
    return f"{what} not found: '{path}'{_data_root_hint(path)}"


def _data_root_hint(path: object) -> str:
    from mlip_unc.config.loader import DATA_ROOT_ENV, default_data_root

    root = Path(default_data_root())
    try:
        Path(str(path)).resolve().relative_to(root.resolve())
    except ValueError:
        return ""
    if os.environ.get(DATA_ROOT_ENV):
        source = f"${DATA_ROOT_ENV}"
    else:
        source = f"the default, as ${DATA_ROOT_ENV} is not set"
    state = "does not hold it" if root.is_dir() else "does not exist"
    return (
        f"; the data root '{root}' ({source}) {state}: set {DATA_ROOT_ENV} to the folder that "
        "holds the data (structures/, moleculenet/)"
    )
