"""The one exception class of the data layer, and the messages that more than one reader gives."""

from __future__ import annotations

from mlip_unc.config.loader import not_found

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
