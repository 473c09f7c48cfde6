"""Structure files read one frame at a time: memory flat in the length of the file.

extxyz is split into frames here (atom-count line, comment line, one line per atom, optional
``VEC`` lines) and each frame's text is parsed by ASE's extxyz reader, so a frame read here
equals the one ``ase.io.read(path, ":")`` gives. Unlike ``ase.io.iread``, which first scans the
whole file into an in-memory table of frame positions, nothing here grows with the file, and a
reader can start at a byte offset (:func:`extxyz_checkpoints` finds them in one cheap pass), so
parallel readers can take contiguous ranges of one file. Other formats fall back to
``ase.io.iread`` (JSON, CIF and POSCAR to :mod:`mlip_unc.data.readers`, which read them whole).

Errors name the file, the frame and, for extxyz, the line.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import ase
import ase.io

from mlip_unc.data.errors import DataError, not_found, where

__all__ = [
    "Checkpoint",
    "count_frames",
    "extxyz_checkpoints",
    "is_extxyz",
    "iter_extxyz",
    "iter_frames",
]

_EXTXYZ_SUFFIXES = {".xyz", ".extxyz"}
_WHOLE_FILE_SUFFIXES = {".json", ".cif", ".vasp", ".poscar"}


@dataclass(frozen=True)
class Checkpoint:
    """Where frame ``frame`` of an extxyz file starts: byte ``offset``, 1-based ``line``."""

    frame: int
    offset: int
    line: int


def is_extxyz(path: str | Path) -> bool:
    """Whether ``path`` is read as extxyz (suffix ``.xyz`` or ``.extxyz``)."""
    return Path(path).suffix.lower() in _EXTXYZ_SUFFIXES


def _frame_lines(
    handle: io.BufferedReader, path: Path, frame: int, line: int
) -> tuple[list[bytes], int] | None:
    """The raw lines of the frame at the handle's position (None at the end of the file) and
    the number of lines consumed."""
    header = handle.readline()
    while header and not header.strip():  # blank lines between or after frames
        header, line = handle.readline(), line + 1
    if not header:
        return None
    try:
        natoms = int(header.split()[0])
    except (ValueError, IndexError):
        raise DataError(
            f"{where(path, frame)} (line {line}): expected the number of atoms, got "
            f"{header[:60].decode(errors='replace')!r}"
        ) from None
    if natoms < 0:
        raise DataError(f"{where(path, frame)} (line {line}): negative number of atoms {natoms}")
    lines = [header]
    for _ in range(natoms + 1):  # comment + atoms
        text = handle.readline()
        if not text:
            raise DataError(
                f"{where(path, frame)} (line {line}): the file ends inside the frame "
                f"({natoms} atoms announced, {len(lines) - 2} found)"
            )
        lines.append(text)
    while True:  # lattice vectors of old-style extxyz
        position = handle.tell()
        text = handle.readline()
        if text.lstrip().startswith(b"VEC"):
            lines.append(text)
        else:
            handle.seek(position)
            break
    return lines, len(lines)


def extxyz_checkpoints(path: str | Path, every: int) -> tuple[int, list[Checkpoint]]:
    """One pass over an extxyz file: the number of frames and where frames ``0, every,
    2 * every, ...`` start (memory: one entry per ``every`` frames).

    Raises:
        DataError: a malformed frame (file, frame and line named).
    """
    path = Path(path)
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")
    marks: list[Checkpoint] = []
    frame, line = 0, 1
    with open(path, "rb") as handle:
        while True:
            offset = handle.tell()
            found = _frame_lines(handle, path, frame, line)
            if found is None:
                break
            _, used = found
            if frame % every == 0:
                marks.append(Checkpoint(frame, offset, line))
            frame, line = frame + 1, line + used
    return frame, marks


def _parse(lines: list[bytes], path: Path, frame: int, line: int) -> ase.Atoms:
    try:
        text = io.StringIO(b"".join(lines).decode())
        return cast(ase.Atoms, ase.io.read(text, index=0, format="extxyz"))  # index=0: one frame
    except Exception as err:  # any parser failure -> one error naming the file, frame and line
        raise DataError(
            f"{where(path, frame)} (line {line}): could not parse the frame: "
            f"{type(err).__name__}: {err}"
        ) from err


def iter_extxyz(
    path: str | Path, start: Checkpoint | None = None, count: int | None = None
) -> Iterator[tuple[int, ase.Atoms]]:
    """``(frame index, structure)`` of an extxyz file, from ``start`` (default: the first frame),
    at most ``count`` frames."""
    path = Path(path)
    start = start or Checkpoint(0, 0, 1)
    frame, line, done = start.frame, start.line, 0
    with open(path, "rb") as handle:
        handle.seek(start.offset)
        while count is None or done < count:
            found = _frame_lines(handle, path, frame, line)
            if found is None:
                return
            lines, used = found
            yield frame, _parse(lines, path, frame, line)
            frame, line, done = frame + 1, line + used, done + 1


def iter_frames(path: str | Path) -> Iterator[tuple[int, ase.Atoms]]:
    """``(frame index, structure)`` of any structure file, streamed where the format allows
    (extxyz here, others through ``ase.io.iread``; JSON, CIF, POSCAR are read whole)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(not_found(path))
    if is_extxyz(path):
        yield from iter_extxyz(path)
        return
    name = path.name.upper()
    if path.suffix.lower() in _WHOLE_FILE_SUFFIXES or name.startswith(("POSCAR", "CONTCAR")):
        from mlip_unc.data.readers import _read_frames

        yield from _read_frames(path)
        return
    frame = 0
    try:
        for frame, atoms in enumerate(ase.io.iread(path, index=":")):
            yield frame, atoms
    except DataError:
        raise
    except Exception as err:  # any parser failure -> one clear error naming the file
        raise DataError(
            f"could not read '{path}' after frame {frame}: {type(err).__name__}: {err}"
        ) from err


def count_frames(path: str | Path) -> int:
    """Number of frames in ``path`` (extxyz: a line scan, no parsing)."""
    if is_extxyz(path):
        return extxyz_checkpoints(path, every=1 << 62)[0]
    return sum(1 for _ in iter_frames(path))
