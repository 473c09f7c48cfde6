"""mlip_unc.data: neighbour lists, structure and molecule graphs, datasets and splits.

Public API (see each module for details):

* neighbours: :func:`neighbour_list`, :func:`check_cell` (the differentiable
  :func:`edge_vectors` and :func:`edge_lengths` live in :mod:`mlip_unc.geometry` and are
  re-exported here)
* typemap: :class:`TypeMap`
* labels: :func:`validate_atoms`, :func:`frame_energy`, :func:`frame_forces`,
  :func:`frame_stress`, :class:`StressConvention`
* readers: :func:`read_structures`
* graphs: :func:`atoms_to_graph`, :class:`StructureDataset`
* references: :func:`fit_reference_energies`, :data:`ISOLATED_ATOM_CONFIG_TYPES`
* molecules: :func:`smiles_to_graph`, :func:`load_csv`, :func:`load_moleculenet`,
  :func:`load_dataset`, :func:`bemis_murcko_scaffold`
* splits: :class:`Split`, :func:`random_split`, :func:`scaffold_split`,
  :func:`training_subset`, :func:`save_split`, :func:`load_split`
* errors: :class:`DataError` (a ``ValueError``)
"""

from mlip_unc.data.errors import DataError
from mlip_unc.data.graphs import StructureDataset, atoms_to_graph
from mlip_unc.data.labels import (
    StressConvention,
    frame_energy,
    frame_forces,
    frame_stress,
    validate_atoms,
)
from mlip_unc.data.neighbours import check_cell, neighbour_list
from mlip_unc.data.readers import read_structures
from mlip_unc.data.references import ISOLATED_ATOM_CONFIG_TYPES, fit_reference_energies
from mlip_unc.data.splits import (
    SPLIT_PARTS,
    Split,
    load_split,
    random_split,
    save_split,
    scaffold_split,
    training_subset,
)
from mlip_unc.data.typemap import TypeMap
from mlip_unc.geometry import edge_lengths, edge_vectors

# RDKit-backed names load on first use, so structure-only users do not import RDKit.
_LAZY_MOLECULES = (
    "DATASET_NAMES",
    "MOLECULENET_NAMES",
    "bemis_murcko_scaffold",
    "default_data_root",
    "load_csv",
    "load_dataset",
    "load_moleculenet",
    "moleculenet_raw_path",
    "smiles_to_graph",
)


def __getattr__(name: str) -> object:
    """Load the RDKit-backed names of :mod:`mlip_unc.data.molecules` on first access."""
    if name in _LAZY_MOLECULES:
        from mlip_unc.data import molecules

        return getattr(molecules, name)
    raise AttributeError(f"module 'mlip_unc.data' has no attribute {name!r}")


__all__ = [
    "DataError",
    # neighbours
    "neighbour_list",
    "edge_vectors",
    "edge_lengths",
    "check_cell",
    # typemap, labels, readers, graphs, references
    "TypeMap",
    "StressConvention",
    "StructureDataset",
    "atoms_to_graph",
    "read_structures",
    "validate_atoms",
    "frame_energy",
    "frame_forces",
    "frame_stress",
    "fit_reference_energies",
    "ISOLATED_ATOM_CONFIG_TYPES",
    # molecules
    "MOLECULENET_NAMES",
    "DATASET_NAMES",
    "default_data_root",
    "moleculenet_raw_path",
    "smiles_to_graph",
    "load_csv",
    "load_moleculenet",
    "load_dataset",
    "bemis_murcko_scaffold",
    # splits
    "Split",
    "SPLIT_PARTS",
    "random_split",
    "scaffold_split",
    "training_subset",
    "save_split",
    "load_split",
]
