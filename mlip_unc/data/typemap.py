"""Element map: sorted atomic numbers -> consecutive type indices ``0..n_types-1``."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import ase
import numpy as np
from ase.data import chemical_symbols

from mlip_unc.data.errors import DataError

__all__ = ["TypeMap", "element_symbol"]


def element_symbol(z: int) -> str:
    """Chemical symbol of atomic number ``z`` (``"Z=<z>"`` outside the periodic table)."""
    return chemical_symbols[z] if 0 <= z < len(chemical_symbols) else f"Z={z}"


@dataclass(frozen=True)
class TypeMap:
    """Sorted atomic numbers -> consecutive type indices ``0..n_types-1``.

    Attributes:
        atomic_numbers: sorted, unique atomic numbers (Z >= 1).
    """

    atomic_numbers: tuple[int, ...]

    def __post_init__(self) -> None:
        zs = tuple(int(z) for z in self.atomic_numbers)
        if not zs:
            raise DataError("a type map needs at least one element")
        if list(zs) != sorted(set(zs)) or zs[0] < 1:
            raise DataError(f"type map atomic numbers must be sorted, unique and >= 1: {zs}")
        object.__setattr__(self, "atomic_numbers", zs)

    @classmethod
    def from_atoms_list(cls, atoms_list: Iterable[ase.Atoms]) -> TypeMap:
        """All elements present in ``atoms_list``."""
        zs: set[int] = set()
        for atoms in atoms_list:
            zs.update(int(z) for z in atoms.numbers)
        return cls(tuple(sorted(zs)))

    @classmethod
    def from_list(cls, atomic_numbers: Sequence[int]) -> TypeMap:
        """Inverse of :meth:`to_list` (for checkpoints); the list is sorted and deduplicated."""
        return cls(tuple(sorted({int(z) for z in atomic_numbers})))

    def to_list(self) -> list[int]:
        """Atomic numbers as a plain list (JSON/checkpoint friendly)."""
        return list(self.atomic_numbers)

    @property
    def symbols(self) -> list[str]:
        """Chemical symbols in type-index order."""
        return [element_symbol(z) for z in self.atomic_numbers]

    def __len__(self) -> int:
        return len(self.atomic_numbers)

    def __contains__(self, z: object) -> bool:
        return z in self.atomic_numbers

    def index(self, z: int, *, context: str | None = None) -> int:
        """Type index of atomic number ``z``.

        Args:
            z: atomic number.
            context: where ``z`` came from (e.g. ``"'train.xyz', frame 3"``) for the error.

        Raises:
            DataError: ``z`` is not in the map; the message names the element and the context.
        """
        try:
            return self.atomic_numbers.index(int(z))
        except ValueError:
            raise DataError(self._unknown_message(int(z), context)) from None

    def indices(self, numbers: np.ndarray, *, context: str | None = None) -> np.ndarray:
        """Vectorised :meth:`index`: (n,) atomic numbers -> (n,) int64 type indices."""
        numbers = np.asarray(numbers, dtype=np.int64)
        table = np.asarray(self.atomic_numbers, dtype=np.int64)
        pos = np.searchsorted(table, numbers)
        pos_clipped = np.minimum(pos, len(table) - 1)
        bad = table[pos_clipped] != numbers
        if np.any(bad):
            raise DataError(self._unknown_message(int(numbers[bad][0]), context))
        return pos_clipped

    def _unknown_message(self, z: int, context: str | None) -> str:
        loc = f" in {context}" if context else ""
        return (
            f"element {element_symbol(z)} (Z={z}){loc} is not in the type map "
            f"{self.symbols}; build the type map from data that contains it"
        )
