"""mlip_unc.data: neighbour lists, structure and molecule graphs, datasets and splits.

Public API (see each module for details):

* neighbours: :func:`neighbour_list`, :func:`edge_vectors`, :func:`edge_lengths`
* structures: :class:`TypeMap`, :func:`atoms_to_graph`, :func:`read_structures`,
  :class:`StructureDataset`, :func:`fit_reference_energies`, :class:`StressConvention`
* molecules: :func:`smiles_to_graph`, :func:`load_csv`, :func:`load_moleculenet`,
  :func:`load_dataset`, :func:`bemis_murcko_scaffold`
* splits: :class:`Split`, :func:`random_split`, :func:`scaffold_split`,
  :func:`training_subset`, :func:`save_split`, :func:`load_split`
* errors: :class:`DataError` (a ``ValueError``)
"""

from mlip_unc.data.errors import DataError
from mlip_unc.data.neighbours import check_cell, edge_lengths, edge_vectors, neighbour_list
from mlip_unc.data.splits import (
    SPLIT_PARTS,
    Split,
    load_split,
    random_split,
    save_split,
    scaffold_split,
    training_subset,
)
from mlip_unc.data.structures import (
    ISOLATED_ATOM_CONFIG_TYPES,
    StressConvention,
    StructureDataset,
    TypeMap,
    atoms_to_graph,
    fit_reference_energies,
    frame_energy,
    frame_forces,
    frame_stress,
    read_structures,
    validate_atoms,
)

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


def __getattr__(name: str):
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
    # structures
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
