"""The data contract: field names of graphs, batches and model outputs.

Every field is a constant with ``(shape) | meaning``. Graphs are ``torch_geometric.data.Data``
objects; batching with PyG concatenates node/edge fields and adds ``batch`` (n_atoms,).

Edge direction (PyG's convention, row 0 = source):
    ``edge_index[0] = j`` is the *sender* (neighbour), ``edge_index[1] = i`` is the *receiver*
    (centre atom); messages flow j -> i and are aggregated at i.
    The edge vector points from the centre to the neighbour, like ASE's ``neighbor_list("D")``::

        edge_vec = pos[j] - pos[i] + cell_shift @ cell[batch[i]]     # (n_edges, 3)

    with ``cell_shift`` the integer image offsets (ASE's ``S``). Recomputing ``edge_vec`` from
    ``pos`` and ``cell`` keeps forces and stress differentiable.

Units: eV, Angstrom, eV/Angstrom, stress in eV/Angstrom^3 (ASE's convention, full 3x3 inside
the package; Voigt only at the ASE boundary).
"""

from __future__ import annotations

from typing import Final

# ---------------------------------------------------------------- structure graphs (inputs)
POSITIONS: Final[str] = "pos"  # (n_atoms, 3) | Cartesian positions, Angstrom
ATOMIC_NUMBERS: Final[str] = "atomic_numbers"  # (n_atoms,) long | chemical element Z
ATOM_TYPE: Final[str] = "atom_type"  # (n_atoms,) long | index of Z in the model's type map
EDGE_INDEX: Final[str] = "edge_index"  # (2, n_edges) long | [sender j, receiver i]
CELL_SHIFT: Final[str] = "cell_shift"  # (n_edges, 3) float | integer image offsets S of j
CELL: Final[str] = "cell"  # (1, 3, 3) per graph -> (n_graphs, 3, 3) batched | rows = lattice vectors
PBC: Final[str] = "pbc"  # (1, 3) bool per graph -> (n_graphs, 3) batched
NUM_ATOMS: Final[str] = "num_atoms"  # (1,) long per graph -> (n_graphs,) batched
BATCH: Final[str] = "batch"  # (n_atoms,) long | graph index of each atom (added by PyG)
FRAME_INDEX: Final[str] = "frame_id"  # (1,) long | index of the frame in its source file (no "index" in the name: PyG would offset it when batching)

# ---------------------------------------------------------------- structure labels
ENERGY: Final[str] = "energy"  # (1,) per graph -> (n_graphs,) | total energy, eV
FORCES: Final[str] = "forces"  # (n_atoms, 3) | eV/Angstrom
STRESS: Final[str] = "stress"  # (1, 3, 3) per graph -> (n_graphs, 3, 3) | eV/Angstrom^3, ASE sign
HAS_ENERGY: Final[str] = "has_energy"  # (1,) bool | label present
HAS_FORCES: Final[str] = "has_forces"  # (1,) bool | label present
HAS_STRESS: Final[str] = "has_stress"  # (1,) bool | label present

# ---------------------------------------------------------------- molecular graphs (PyG from_smiles)
NODE_FEATURES: Final[str] = "x"  # (n_atoms, 9) long | RDKit categorical atom features
EDGE_FEATURES: Final[str] = "edge_attr"  # (n_edges, 3) long | RDKit categorical bond features
TARGET: Final[str] = "y"  # (1, n_targets) float | regression targets
SMILES: Final[str] = "smiles"  # str per graph | input SMILES
ROW_INDEX: Final[str] = "row_id"  # (1,) long | 0-based data row in the source CSV (not offset by PyG batching)

# ---------------------------------------------------------------- model outputs
LATENT: Final[str] = "latent"  # (n_graphs, d) | graph latent z (property) or Phi = sum_a z_a
NODE_LATENT: Final[str] = "node_latent"  # (n_atoms, d) | per-atom latents z_a
ATOMIC_ENERGIES: Final[str] = "energies"  # (n_atoms,) | per-atom energies (mean), eV
ENERGY_VAR: Final[str] = "energy_var"  # (n_graphs,) | total predictive variance of E, eV^2
ENERGY_EPISTEMIC_VAR: Final[str] = "energy_epistemic_var"  # (n_graphs,) | Phi^T S Phi (+ s_b^2)
ENERGY_ALEATORIC_VAR: Final[str] = "energy_aleatoric_var"  # (n_graphs,) | noise variance, eV^2
LOCAL_ENERGY_VAR: Final[str] = "energies_var"  # (n_atoms,) | z_a^T S z_a, eV^2
FORCES_VAR: Final[str] = "forces_var"  # (n_atoms, 3) | epistemic force variance, (eV/A)^2
STRESS_VAR: Final[str] = "stress_var"  # (n_graphs, 3, 3) | epistemic stress variance
KAPPA: Final[str] = "kappa"  # (n_graphs,) | alignment factor kappa(Phi), docs/method.md s.4

PREDICTION: Final[str] = "prediction"  # (n_graphs, n_targets) | predictive mean
PREDICTION_VAR: Final[str] = "prediction_var"  # (n_graphs, n_targets) | total variance
EPISTEMIC_VAR: Final[str] = "epistemic_var"  # (n_graphs, n_targets)
ALEATORIC_VAR: Final[str] = "aleatoric_var"  # (n_graphs, n_targets)
