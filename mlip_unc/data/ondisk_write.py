"""Writing on-disk sets (:mod:`mlip_unc.data.ondisk`): ``mlip-unc convert``.

Frames are streamed from the files (:func:`mlip_unc.data.stream.iter_frames`), validated and
turned into graphs by :func:`~mlip_unc.data.graphs.atoms_to_graph` (the in-memory path, so
the items are the same), and appended to the array files (buffered writes); memory holds one frame.
Atomic: everything is written into a temporary folder beside the target, checksummed while
written, fsync'ed, and renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

import ase
import numpy as np
from tqdm.auto import tqdm

from mlip_unc import keys
from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.data.errors import DataError, where
from mlip_unc.data.graphs import atoms_to_graph
from mlip_unc.data.labels import StressConvention
from mlip_unc.data.ondisk import ARRAYS, FORMAT, META, VERSION, OnDiskStore, array_file
from mlip_unc.data.provenance import refuse_predicted
from mlip_unc.data.references import is_isolated_atom
from mlip_unc.data.stream import iter_frames
from mlip_unc.data.typemap import TypeMap

__all__ = ["StoreWriter", "convert_files"]

log = logging.getLogger(__name__)

_ALL_ELEMENTS = TypeMap(tuple(range(1, 119)))  # the type index is not stored (see ondisk.py)


class StoreWriter:
    """Append graphs to a new on-disk set; :meth:`close` publishes it, :meth:`abort` drops it.

    Args:
        out: the set's folder (must not exist unless ``overwrite``).
        r_max: cutoff of the neighbour lists, Angstrom.
        label_keys: ``energy``/``forces``/``stress`` label names (``None``: standard name).
        stress_convention: how the stress label is stored (inferred from the key if ``None``).
        accept_predicted: store labels that a model predicted (``md.traj``) as references
            (False: refused, :mod:`mlip_unc.data.provenance`).
    """

    def __init__(
        self,
        out: str | Path,
        r_max: float,
        *,
        label_keys: dict[str, str | None] | None = None,
        stress_convention: StressConvention | str | None = None,
        overwrite: bool = False,
        accept_predicted: bool = False,
    ) -> None:
        self.out = Path(out)
        if self.out.exists() and not overwrite:
            raise FileExistsError(
                f"'{self.out}' exists; pass overwrite (--overwrite) to replace it"
            )
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(
            tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".tmp", dir=self.out.parent)
        )
        os.chmod(self.tmp, 0o755)  # mkdtemp's 0700 would stay on the published folder
        self.r_max = float(r_max)
        self.label_keys = dict(label_keys or {"energy": None, "forces": None, "stress": None})
        self.stress_convention = (
            None if stress_convention is None else StressConvention(stress_convention).value
        )
        self.accept_predicted = accept_predicted
        self.sources: list[str] = []
        self.elements: set[int] = set()
        self.counts = {"frames": 0, "atoms": 0, "edges": 0}
        self._files: dict[str, IO[bytes]] = {
            n: open(self.tmp / array_file(n), "wb") for n in ARRAYS
        }  # noqa: SIM115 (closed by close/abort)
        self._hash = {n: hashlib.sha256() for n in ARRAYS}
        self._write("atom_offset", np.zeros(1, dtype=np.int64))
        self._write("edge_offset", np.zeros(1, dtype=np.int64))

    def _write(self, name: str, values: Any) -> None:
        _, dtype, _ = ARRAYS[name]
        data = np.ascontiguousarray(np.asarray(values), dtype=np.dtype(dtype)).tobytes()
        self._files[name].write(data)
        self._hash[name].update(data)

    def add_source(self, source: str | Path) -> int:
        """Register a source file; returns its id for :meth:`add`."""
        self.sources.append(str(source))
        return len(self.sources) - 1

    def add(self, atoms: ase.Atoms, *, source_id: int, frame_index: int) -> None:
        """Validate ``atoms``, build its graph and append it.

        Raises:
            DataError: naming the source file and frame (bad structure or labels).
        """
        source = self.sources[source_id]
        lk = self.label_keys
        if not self.accept_predicted:
            refuse_predicted(atoms, lk, where(source, frame_index))
        graph = atoms_to_graph(
            atoms,
            self.r_max,
            _ALL_ELEMENTS,
            energy_key=lk.get("energy"),
            forces_key=lk.get("forces"),
            stress_key=lk.get("stress"),
            stress_convention=self.stress_convention,
            frame_index=frame_index,
            source=source,
        )
        shift = graph[keys.CELL_SHIFT].numpy()
        if shift.size and np.abs(shift).max() > np.iinfo(np.int32).max:
            raise DataError(
                f"{where(source, frame_index)}: periodic image shifts too large to store"
            )
        n_atoms, n_edges = len(atoms), graph[keys.EDGE_INDEX].shape[1]
        self.counts["frames"] += 1
        self.counts["atoms"] += n_atoms
        self.counts["edges"] += n_edges
        self.elements.update(int(z) for z in np.unique(atoms.numbers))
        self._write("atom_offset", [self.counts["atoms"]])
        self._write("edge_offset", [self.counts["edges"]])
        self._write("frame_index", [frame_index])
        self._write("source_id", [source_id])
        for name, key in (
            ("cell", keys.CELL),
            ("pbc", keys.PBC),
            ("energy", keys.ENERGY),
            ("stress", keys.STRESS),
            ("has_energy", keys.HAS_ENERGY),
            ("has_forces", keys.HAS_FORCES),
            ("has_stress", keys.HAS_STRESS),
            ("positions", keys.POSITIONS),
            ("numbers", keys.ATOMIC_NUMBERS),
            ("forces", keys.FORCES),
        ):
            self._write(name, graph[key].numpy())
        self._write("isolated", [is_isolated_atom(atoms)])
        self._write("edge_index", graph[keys.EDGE_INDEX].numpy().T)  # (n_edges, 2)
        self._write("cell_shift", shift)

    def close(self) -> Path:
        """Flush, fsync, write ``meta.json`` and rename the folder into place."""
        if not self.counts["frames"]:
            self.abort()
            raise DataError(f"no frames to write to '{self.out}'")
        arrays = {}
        for name, handle in self._files.items():
            handle.flush()
            os.fsync(handle.fileno())
            handle.close()
            arrays[name] = {
                "dtype": ARRAYS[name][1],
                "rows": ARRAYS[name][0],
                "shape": list(ARRAYS[name][2]),
                "sha256": self._hash[name].hexdigest(),
            }
        meta = {
            "format": FORMAT,
            "version": VERSION,
            "r_max": self.r_max,
            "n_frames": self.counts["frames"],
            "n_atoms": self.counts["atoms"],
            "n_edges": self.counts["edges"],
            "elements": sorted(self.elements),
            "label_keys": self.label_keys,
            "stress_convention": self.stress_convention,
            "sources": self.sources,
            "arrays": arrays,
        }
        atomic_write_text(self.tmp / META, json.dumps(meta, indent=1) + "\n")
        OnDiskStore(self.tmp)  # the sizes and offsets check before publishing
        old = None
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old-{os.getpid()}")
            os.replace(self.out, old)
        os.replace(self.tmp, self.out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        return self.out

    def abort(self) -> None:
        """Drop the temporary folder (nothing is published)."""
        for handle in self._files.values():
            handle.close()
        shutil.rmtree(self.tmp, ignore_errors=True)


def convert_files(
    paths: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    r_max: float,
    energy_key: str | None = None,
    forces_key: str | None = None,
    stress_key: str | None = None,
    stress_convention: StressConvention | str | None = None,
    overwrite: bool = False,
    progress: bool = False,
    accept_predicted: bool = False,
) -> OnDiskStore:
    """Convert structure files (extxyz streamed, any readable format) into one on-disk set.

    Frames keep their file and index (errors and ``FRAME_INDEX`` name them). Labels are read
    with the given keys and stored with ``HAS_*`` flags (absent labels are allowed here;
    training checks what it needs); labels that a model predicted (``md.traj``) are refused
    unless ``accept_predicted``.

    Raises:
        DataError: a bad frame (file and frame named); nothing is written then.
        FileExistsError: ``out`` exists and not ``overwrite``.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    for path in paths:
        if not Path(path).is_file():
            raise DataError(f"structure file not found: '{path}'")
    writer = StoreWriter(
        out,
        r_max,
        label_keys={"energy": energy_key, "forces": forces_key, "stress": stress_key},
        stress_convention=stress_convention,
        overwrite=overwrite,
        accept_predicted=accept_predicted,
    )
    try:
        with tqdm(desc=f"convert -> {Path(out).name}", unit="frame", disable=not progress) as bar:
            for path in paths:
                source = writer.add_source(path)
                for frame, atoms in iter_frames(path):
                    writer.add(atoms, source_id=source, frame_index=frame)
                    bar.update()
        writer.close()
    except BaseException:
        writer.abort()
        raise
    store = OnDiskStore(out)
    log.info(
        "wrote %d frames (%d atoms, %d edges, elements %s) to %s",
        store.n_frames,
        store.n_atoms,
        store.n_edges,
        store.type_map.symbols,
        out,
    )
    return store
