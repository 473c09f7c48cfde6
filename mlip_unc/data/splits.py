"""Train/validation/test splits: random, Bemis-Murcko scaffold, nested training subsets, JSON.

Split files are JSON objects ``{"train": [...], "val": [...], "test": [...]}`` of 0-based
indices into the dataset (for CSV datasets: data rows, header excluded). Every split function
returns each part sorted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.data.errors import DataError

__all__ = [
    "Split",
    "SPLIT_PARTS",
    "random_split",
    "scaffold_split",
    "training_subset",
    "save_split",
    "load_split",
]

SPLIT_PARTS: tuple[str, str, str] = ("train", "val", "test")
Fractions = tuple[float, float, float]


@dataclass(frozen=True)
class Split:
    """Index sets of one split (each a sorted tuple of ints)."""

    train: tuple[int, ...]
    val: tuple[int, ...]
    test: tuple[int, ...]

    def to_dict(self) -> dict[str, list[int]]:
        return {part: list(getattr(self, part)) for part in SPLIT_PARTS}

    @classmethod
    def from_dict(
        cls, parts: Mapping[str, Iterable[int]], *, n: int | None = None, source: object = None
    ) -> Split:
        """Validated split from a mapping with keys train/val/test (extra keys are ignored).

        Raises:
            DataError: missing part, non-integer or negative index, duplicate, index in two
                parts, or index >= ``n``; naming ``source`` (e.g. the file) and the index.
        """
        loc = f"'{source}': " if source is not None else ""
        missing = [part for part in SPLIT_PARTS if part not in parts]
        if missing:
            raise DataError(f"{loc}split is missing {missing}; found keys {sorted(parts)}")
        values = {part: _check_indices(parts[part], part, n, loc) for part in SPLIT_PARTS}
        _check_disjoint(values, loc)
        return cls(*(tuple(sorted(values[part])) for part in SPLIT_PARTS))

    def __len__(self) -> int:
        return len(self.train) + len(self.val) + len(self.test)


def _check_indices(values: object, part: str, n: int | None, loc: str) -> list[int]:
    """Plain non-negative ints, no duplicates, below ``n`` when given."""
    if not isinstance(values, (list, tuple, np.ndarray)):
        raise DataError(f"{loc}'{part}' must be a list of indices, got {type(values).__name__}")
    out = []
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise DataError(f"{loc}'{part}' contains a non-integer index {value!r}")
        if value < 0 or (n is not None and value >= n):
            raise DataError(f"{loc}'{part}' index {value} is out of range for n={n}")
        out.append(int(value))
    if len(set(out)) != len(out):
        dup = next(v for v in out if out.count(v) > 1)
        raise DataError(f"{loc}'{part}' contains index {dup} more than once")
    return out


def _check_disjoint(values: dict[str, list[int]], loc: str) -> None:
    for a, b in (("train", "val"), ("train", "test"), ("val", "test")):
        shared = set(values[a]) & set(values[b])
        if shared:
            raise DataError(f"{loc}index {min(shared)} is in both '{a}' and '{b}'")


def _check_fractions(fractions: Sequence[float]) -> Fractions:
    if len(fractions) != 3 or any(not (f >= 0.0) for f in fractions):
        raise DataError(f"fractions must be three non-negative numbers, got {fractions}")
    if not math.isclose(sum(fractions), 1.0, abs_tol=1e-6):
        raise DataError(f"fractions must sum to 1, got {fractions} (sum {sum(fractions)})")
    return (float(fractions[0]), float(fractions[1]), float(fractions[2]))


def _round_half_up(x: float) -> int:
    return int(math.floor(x + 0.5))


# ================================================================ splitting
def random_split(n: int, fractions: Sequence[float] = (0.8, 0.1, 0.1), seed: int = 0) -> Split:
    """Random split: ``numpy.random.default_rng(seed).permutation(n)``; train = the first
    ``round(f_train n)``, val = the next ``round(f_val n)``, test = the rest.

    This is the recipe of the reference files in ``shared/data/splits`` (seed 0).
    """
    f_train, f_val, _ = _check_fractions(fractions)
    perm = np.random.default_rng(seed).permutation(n)  # (n,)
    n_train = min(_round_half_up(f_train * n), n)
    n_val = min(_round_half_up(f_val * n), n - n_train)
    parts = (perm[:n_train], perm[n_train : n_train + n_val], perm[n_train + n_val :])
    return Split(*(tuple(sorted(int(k) for k in part)) for part in parts))


def _scaffold_groups(smiles_list: Sequence[str], include_chirality: bool) -> list[list[int]]:
    """Indices grouped by Bemis-Murcko scaffold, groups in order of first appearance."""
    from mlip_unc.data.molecules import bemis_murcko_scaffold  # RDKit only when needed

    groups: dict[str, list[int]] = {}
    for k, smiles in enumerate(smiles_list):
        try:
            scaffold = bemis_murcko_scaffold(smiles, include_chirality=include_chirality)
        except DataError as err:
            raise DataError(f"molecule {k}: {err}") from None
        groups.setdefault(scaffold, []).append(k)
    return list(groups.values())


def scaffold_split(
    smiles_list: Sequence[str],
    fractions: Sequence[float] = (0.8, 0.1, 0.1),
    seed: int = 0,
    *,
    include_chirality: bool = False,
) -> Split:
    """Bemis-Murcko scaffold split; every scaffold group lies wholly in one part.

    Balanced assignment (as chemprop's ``scaffold_balanced``): groups larger than half the
    val or test size come first, then the rest; each of the two lists is shuffled with
    ``default_rng(seed)``. Groups then fill train up to ``f_train n``, then val up to
    ``f_val n``, and the rest goes to test. Different seeds give different splits.

    Raises:
        DataError: an unparsable SMILES (naming its index and the SMILES).
    """

    f_train, f_val, f_test = _check_fractions(fractions)
    n = len(smiles_list)
    train_size, val_size, test_size = f_train * n, f_val * n, f_test * n
    groups = _scaffold_groups(smiles_list, include_chirality)
    big = [g for g in groups if len(g) > val_size / 2 or len(g) > test_size / 2]
    small = [g for g in groups if not (len(g) > val_size / 2 or len(g) > test_size / 2)]
    rng = np.random.default_rng(seed)
    ordered = [big[k] for k in rng.permutation(len(big))]
    ordered += [small[k] for k in rng.permutation(len(small))]
    train: list[int] = []
    val: list[int] = []
    test: list[int] = []
    for group in ordered:
        if len(train) + len(group) <= train_size:
            train.extend(group)
        elif len(val) + len(group) <= val_size:
            val.extend(group)
        else:
            test.extend(group)
    return Split(tuple(sorted(train)), tuple(sorted(val)), tuple(sorted(test)))


def training_subset(
    train_indices: Iterable[int], fraction: float, seed: int = 0
) -> tuple[int, ...]:
    """The first ``round(fraction * n_train)`` (at least 1) of one fixed seeded shuffle.

    The shuffle (``default_rng(seed).permutation``) is of the *sorted* training indices, so
    for one seed a smaller fraction is always a subset of a larger one (nested learning
    curves), whatever the order of ``train_indices``. Returned sorted.
    """
    if not 0.0 < fraction <= 1.0:
        raise DataError(f"fraction must be in (0, 1], got {fraction}")
    canonical = sorted(int(k) for k in train_indices)
    if len(set(canonical)) != len(canonical):
        raise DataError("train_indices contains duplicates")
    if not canonical:
        return ()
    perm = np.random.default_rng(seed).permutation(len(canonical))  # (n_train,)
    k = max(1, _round_half_up(fraction * len(canonical)))
    return tuple(sorted(canonical[p] for p in perm[:k]))


# ================================================================ files
def save_split(
    path: str | Path, split: Split | Mapping[str, Iterable[int]], *, n: int | None = None
) -> None:
    """Write ``{"train", "val", "test"}`` JSON after validating (indices < ``n`` when given)."""
    if not isinstance(split, Split):
        split = Split.from_dict(split, n=n, source=path)
    else:
        Split.from_dict(split.to_dict(), n=n, source=path)
    atomic_write_text(path, json.dumps(split.to_dict()) + "\n")


def load_split(path: str | Path, *, n: int | None = None) -> Split:
    """Read and validate a split JSON file (indices < ``n`` when given).

    Raises:
        DataError: missing file, invalid JSON, or an invalid split; naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise DataError(f"split file not found: '{path}'")
    try:
        parts = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise DataError(f"'{path}': invalid JSON: {err}") from None
    if not isinstance(parts, dict):
        raise DataError(f"'{path}': expected a JSON object with train/val/test")
    return Split.from_dict(parts, n=n, source=path)
