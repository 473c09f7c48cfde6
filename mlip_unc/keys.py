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
CELL: Final[str] = (
    "cell"  # (1, 3, 3) per graph -> (n_graphs, 3, 3) batched | rows = lattice vectors
)
PBC: Final[str] = "pbc"  # (1, 3) bool per graph -> (n_graphs, 3) batched
NUM_ATOMS: Final[str] = "num_atoms"  # (1,) long per graph -> (n_graphs,) batched
BATCH: Final[str] = "batch"  # (n_atoms,) long | graph index of each atom (added by PyG)
FRAME_INDEX: Final[str] = (
    "frame_id"  # (1,) long | index of the frame in its source file (no "index" in the name: PyG would offset it when batching)
)

# ---------------------------------------------------------------- structure labels
ENERGY: Final[str] = "energy"  # (1,) per graph -> (n_graphs,) | total energy, eV
FORCES: Final[str] = "forces"  # (n_atoms, 3) | eV/Angstrom
STRESS: Final[str] = "stress"  # (1, 3, 3) per graph -> (n_graphs, 3, 3) | eV/Angstrom^3, ASE sign
HAS_ENERGY: Final[str] = "has_energy"  # (1,) bool | label present
HAS_FORCES: Final[str] = "has_forces"  # (1,) bool | label present
HAS_STRESS: Final[str] = "has_stress"  # (1,) bool | label present

# ---------------------------------------------------------------- provenance (atoms.info of structure files)
PREDICTED_ENERGY: Final[str] = (
    "mlip_unc_predicted_energy"  # float, eV | the model's energy of a frame whose calculator results are its predictions (md.traj; mlip_unc/data/provenance.py): readers refuse them as labels
)

# ---------------------------------------------------------------- molecular graphs (PyG from_smiles)
NODE_FEATURES: Final[str] = "x"  # (n_atoms, 9) long | RDKit categorical atom features
EDGE_FEATURES: Final[str] = "edge_attr"  # (n_edges, 3) long | RDKit categorical bond features
TARGET: Final[str] = "y"  # (1, n_targets) float | regression targets
SMILES: Final[str] = "smiles"  # str per graph | input SMILES
ROW_INDEX: Final[str] = (
    "row_id"  # (1,) long | 0-based data row in the source CSV (not offset by PyG batching)
)

# ---------------------------------------------------------------- model outputs
LATENT: Final[str] = "latent"  # (n_graphs, d) | graph latent z (property) or Phi = sum_a z_a
NODE_LATENT: Final[str] = "node_latent"  # (n_atoms, d) | per-atom latents z_a
ATOMIC_ENERGIES: Final[str] = "energies"  # (n_atoms,) | per-atom energies (mean), eV
ENERGY_VAR: Final[str] = "energy_var"  # (n_graphs,) | total predictive variance of E, eV^2
ENERGY_EPISTEMIC_VAR: Final[str] = "energy_epistemic_var"  # (n_graphs,) | Phi^T S Phi (+ s_b^2)
ENERGY_ALEATORIC_VAR: Final[str] = "energy_aleatoric_var"  # (n_graphs,) | noise variance, eV^2
LOCAL_ENERGY_VAR: Final[str] = "energies_var"  # (n_atoms,) | z_a^T S z_a, eV^2
FORCES_VAR: Final[str] = (
    "forces_var"  # (n_atoms, 3) | EPISTEMIC force variance, (eV/A)^2 (the calculator's forces_var adds the noise)
)
STRESS_VAR: Final[str] = (
    "stress_var"  # (n_graphs, 3, 3) | EPISTEMIC stress variance, (eV/A^3)^2 (likewise)
)
KAPPA: Final[str] = "kappa"  # (n_graphs,) | alignment factor kappa(Phi), docs/method.md s.4

PREDICTION: Final[str] = "prediction"  # (n_graphs, n_targets) | predictive mean
PREDICTION_VAR: Final[str] = "prediction_var"  # (n_graphs, n_targets) | total variance
EPISTEMIC_VAR: Final[str] = "epistemic_var"  # (n_graphs, n_targets)
ALEATORIC_VAR: Final[str] = "aleatoric_var"  # (n_graphs, n_targets)

# ---------------------------------------------------------------- ASE calculator results
# Names of ``UncertaintyCalculator.results`` (mlip_unc/calculator.py): float64 NumPy arrays or
# Python scalars; n = atoms of the structure; stress-like values in Voigt order xx yy zz yz xz xy.
# Every *_var without "epistemic" in its name is the TOTAL predictive variance = epistemic +
# aleatoric (the model's ``noise_variances``); *_std is its square root. With a full posterior
# both parts are the calibrated ones. Committee: epistemic = the members' population variance.
CALC_ENERGY_VAR: Final[str] = (
    "energy_var"  # () eV^2 | total: energy_epistemic_var + energy_aleatoric_var
)
CALC_ENERGY_STD: Final[str] = "energy_std"  # () eV | sqrt(energy_var)
CALC_ENERGY_EPISTEMIC_VAR: Final[str] = (
    "energy_epistemic_var"  # () eV^2 | Phi^T S Phi, S the head posterior covariance (diagonal or full)
)
CALC_ENERGY_ALEATORIC_VAR: Final[str] = "energy_aleatoric_var"  # () eV^2 | noise n_atoms sigma_e^2
CALC_ENERGIES_STD: Final[str] = (
    "energies_std"  # (n,) eV | EPISTEMIC local energy std sqrt(z_a^T S z_a)
)
CALC_FORCES_VAR: Final[str] = (
    "forces_var"  # (n, 3) (eV/A)^2 | total: forces_epistemic_var + sigma_f^2
)
CALC_FORCES_STD: Final[str] = "forces_std"  # (n, 3) eV/A | sqrt(forces_var)
CALC_FORCES_EPISTEMIC_VAR: Final[str] = (
    "forces_epistemic_var"  # (n, 3) (eV/A)^2 | the model's FORCES_VAR
)
CALC_MAX_FORCE_STD: Final[str] = (
    "max_force_std"  # () eV/A | EPISTEMIC max_i sqrt(sum_c forces_epistemic_var[i, c]): the flagging score
)
CALC_STRESS_VAR: Final[str] = (
    "stress_var"  # (6,) (eV/A^3)^2 | total: stress_epistemic_var + stress noise (0 unless the model has one)
)
CALC_STRESS_STD: Final[str] = "stress_std"  # (6,) eV/A^3 | sqrt(stress_var)
CALC_STRESS_EPISTEMIC_VAR: Final[str] = (
    "stress_epistemic_var"  # (6,) (eV/A^3)^2 | the model's STRESS_VAR
)
CALC_ALIGNMENT: Final[str] = (
    "alignment"  # () | kappa(Phi), docs/method.md s.4 (not for a committee)
)
CALC_UNCERTAINTY_FLAG: Final[str] = (
    "uncertainty_flag"  # bool | a configured sigma threshold exceeded
)
CALC_OUT_OF_DOMAIN: Final[str] = (
    "out_of_domain"  # bool | a domain-guard rule fired (mlip_unc/data/domain.py)
)
CALC_OUT_OF_DOMAIN_REASON: Final[str] = (
    "out_of_domain_reason"  # str | "" or the rules fired, atoms, distances
)
CALC_FLAG: Final[str] = "flag"  # bool | uncertainty_flag or out_of_domain

# ---------------------------------------------------------------- uncertainty scores
# What thresholds, validation levels (metadata["uncertainty_levels"]) and flagging rank by:
# the calculator's max_force_std and the per-atom epistemic energy std.
CALC_ENERGY_STD_PER_ATOM: Final[str] = (
    "energy_std_per_atom"  # () eV/atom | EPISTEMIC sqrt(energy_epistemic_var) / n_atoms
)
UNCERTAINTY_SCORES: Final[tuple[str, ...]] = (CALC_MAX_FORCE_STD, CALC_ENERGY_STD_PER_ATOM)
