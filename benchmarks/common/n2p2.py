"""A Behler-Parrinello neural-network potential stored in n2p2's files (``input.nn``,
``scaling.data``, ``weights.NNN.data``), evaluated in torch: energy, forces and stress by autograd.

Written to run the NNP models published with Zuo et al. 2020 (materialsvirtuallab/mlearn
``mvl_models/*/nnp``) without LAMMPS's ML-HDNNP package (benchmarks/mlearn_published.py). It
covers what those files use, and raises on anything else: one element, radial (type 2) and
angular (type 3) symmetry functions, cosine cutoff (``cutoff_type 1``), min-max scaling of the
symmetry functions, tanh hidden layers and a linear output, ``atom_energy`` offsets. Lengths and
energies inside the files are in the units the model was trained in (mlearn: Bohr and Hartree;
``length_unit`` / ``energy_unit`` give them in Angstrom / eV).

Definitions (n2p2's): with f_c(r) = (cos(pi r / r_c) + 1) / 2 for r < r_c,

    G2_i = sum_j exp(-eta (r_ij - r_s)^2) f_c(r_ij)
    G3_i = 2^(1 - zeta) sum_{j<k} (1 + lambda cos theta_ijk)^zeta
           exp(-eta (r_ij^2 + r_ik^2 + r_jk^2)) f_c(r_ij) f_c(r_ik) f_c(r_jk)

scaled to s_min + (s_max - s_min) (G - G_min) / (G_max - G_min) with G_min, G_max of
scaling.data; scaling.data numbers the symmetry functions in n2p2's sorted order, which is
found here by matching each function's range over given structures (:func:`match_order`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import ase
import numpy as np
import torch
from ase.calculators.calculator import Calculator, all_changes
from ase.neighborlist import neighbor_list

BOHR = 0.529177210903  # Angstrom
HARTREE = 27.211386245988  # eV


@dataclass
class SymmetryFunction:
    kind: int  # 2 radial, 3 angular
    eta: float
    rc: float
    rs: float = 0.0  # radial shift (type 2)
    lam: float = 1.0  # type 3
    zeta: float = 1.0  # type 3


@dataclass
class N2p2Model:
    element: str
    functions: list[SymmetryFunction]  # in input.nn's order
    scaling: np.ndarray  # (n_sf, 2) G_min, G_max in n2p2's order
    order: (
        np.ndarray | None
    )  # order[k] = index in ``functions`` of scaling row k (None: not matched yet)
    weights: list[tuple[np.ndarray, np.ndarray]]  # per layer: W (n_out, n_in), b (n_out,)
    activations: list[str]  # per layer: "t" tanh, "l" linear
    scale_min: float
    scale_max: float
    atom_energy: float  # model units


def read_model(folder: Path, weights_file: str | None = None) -> N2p2Model:
    """The model in ``folder`` (weights: the one ``weights.*.data`` there unless named)."""
    folder = Path(folder)
    keys: dict[str, list[str]] = {}
    functions: list[SymmetryFunction] = []
    for n, line in enumerate((folder / "input.nn").read_text().splitlines(), 1):
        words = line.split("#")[0].split()
        if not words:
            continue
        if words[0] == "symfunction_short":
            kind = int(words[2])
            if kind == 2:
                functions.append(
                    SymmetryFunction(2, eta=float(words[4]), rs=float(words[5]), rc=float(words[6]))
                )
            elif kind == 3:
                functions.append(
                    SymmetryFunction(
                        3,
                        eta=float(words[5]),
                        lam=float(words[6]),
                        zeta=float(words[7]),
                        rc=float(words[8]),
                        rs=float(words[9]) if len(words) > 9 else 0.0,
                    )
                )
            else:
                raise ValueError(
                    f"{folder / 'input.nn'}:{n}: symmetry function type {kind} not supported"
                )
        else:
            keys[words[0]] = words[1:]
    if keys.get("number_of_elements", ["1"])[0] != "1":
        raise ValueError(f"{folder / 'input.nn'}: only one-element models are supported")
    if keys.get("cutoff_type", ["1"])[0] != "1":
        raise ValueError(
            f"{folder / 'input.nn'}: cutoff_type {keys['cutoff_type'][0]} not supported (only 1, cosine)"
        )
    if "scale_symmetry_functions" not in keys or any(
        k in keys for k in ("center_symmetry_functions", "normalize_nodes")
    ):
        raise ValueError(
            f"{folder / 'input.nn'}: only min-max scaled symmetry functions are supported"
        )
    if any(f.kind == 3 and f.rs != 0.0 for f in functions):
        raise ValueError(f"{folder / 'input.nn'}: shifted angular functions not supported")
    scaling = np.array(
        [
            [float(w) for w in line.split()[2:4]]
            for line in (folder / "scaling.data").read_text().splitlines()
            if line.split() and not line.startswith("#")
        ]
    )
    if len(scaling) != len(functions):
        raise ValueError(
            f"{folder}: {len(scaling)} rows in scaling.data for {len(functions)} symmetry functions"
        )
    if weights_file is None:
        found = sorted(folder.glob("weights.*.data"))
        if len(found) != 1:
            raise ValueError(f"{folder}: {len(found)} weights.*.data files; name one")
        weights_file = found[0].name
    nodes = [len(functions), *(int(v) for v in keys["global_nodes_short"]), 1]
    weights = [
        (np.zeros((nodes[k + 1], nodes[k])), np.zeros(nodes[k + 1])) for k in range(len(nodes) - 1)
    ]
    seen = 0
    for line in (folder / weights_file).read_text().splitlines():
        w = line.split()
        if not w or line.startswith("#"):
            continue
        if w[1] == "a":  # value a index layer_from neuron_from layer_to neuron_to (1-based neurons)
            weights[int(w[3])][0][int(w[6]) - 1, int(w[4]) - 1] = float(w[0])
        else:  # value b index layer neuron
            weights[int(w[3]) - 1][1][int(w[4]) - 1] = float(w[0])
        seen += 1
    expected = sum(W.size + b.size for W, b in weights)
    if seen != expected:
        raise ValueError(
            f"{folder / weights_file}: {seen} weights for an architecture of {expected}"
        )
    element = keys["elements"][0]
    energy = dict(
        zip(keys.get("atom_energy", [])[0::2], keys.get("atom_energy", [])[1::2], strict=False)
    )
    return N2p2Model(
        element=element,
        functions=functions,
        scaling=scaling,
        order=None,
        weights=weights,
        activations=list(keys["global_activation_short"]),
        scale_min=float(keys["scale_min_short"][0]),
        scale_max=float(keys["scale_max_short"][0]),
        atom_energy=float(energy.get(element, 0.0)),
    )


def _cutoff(r: torch.Tensor, rc: float) -> torch.Tensor:
    return torch.where(r < rc, 0.5 * (torch.cos(math.pi * r / rc) + 1.0), torch.zeros_like(r))


def symmetry_functions(
    model: N2p2Model,
    atoms: ase.Atoms,
    length_unit: float,
    strain: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """G (n_atoms, n_sf) in input.nn's order, unscaled; ``positions`` (n, 3) in Angstrom and
    ``strain`` (3, 3) may carry gradients. ``length_unit``: Angstrom per model length unit."""
    rc = max(f.rc for f in model.functions) * length_unit  # Angstrom
    i, j, shift = neighbor_list("ijS", atoms, rc)
    pos = torch.as_tensor(atoms.positions, dtype=torch.float64) if positions is None else positions
    cell = torch.as_tensor(np.asarray(atoms.cell), dtype=torch.float64)
    deform = torch.eye(3, dtype=torch.float64) + (strain if strain is not None else 0.0)
    pos, cell = pos @ deform, cell @ deform
    ii, jj = torch.as_tensor(i), torch.as_tensor(j)
    vec = (
        pos[jj] - pos[ii] + torch.as_tensor(shift, dtype=torch.float64) @ cell
    ) / length_unit  # (E, 3) model units
    r = vec.norm(dim=1)
    n = len(atoms)
    # triplets: pairs of edges (a, b), a < b, with the same centre
    order = torch.argsort(ii, stable=True)
    counts = torch.bincount(ii, minlength=n)
    starts = torch.cumsum(counts, 0) - counts
    ea, eb = [], []
    for c in range(n):
        idx = order[starts[c] : starts[c] + counts[c]]
        a, b = torch.triu_indices(len(idx), len(idx), offset=1)
        ea.append(idx[a])
        eb.append(idx[b])
    ea, eb = torch.cat(ea), torch.cat(eb)
    centre = ii[ea]
    rab, rac = r[ea], r[eb]
    rbc = (vec[eb] - vec[ea]).norm(dim=1)
    cos = (vec[ea] * vec[eb]).sum(1) / (rab * rac)
    out = []
    for f in model.functions:
        if f.kind == 2:
            g = torch.exp(-f.eta * (r - f.rs) ** 2) * _cutoff(r, f.rc)
            out.append(torch.zeros(n, dtype=torch.float64).index_add(0, ii, g))
        else:
            g = (
                2.0 ** (1.0 - f.zeta)
                * (1.0 + f.lam * cos).clamp(min=0.0) ** f.zeta
                * torch.exp(-f.eta * (rab**2 + rac**2 + rbc**2))
                * _cutoff(rab, f.rc)
                * _cutoff(rac, f.rc)
                * _cutoff(rbc, f.rc)
            )
            out.append(torch.zeros(n, dtype=torch.float64).index_add(0, centre, g))
    return torch.stack(out, dim=1)


def match_order(model: N2p2Model, frames: list[ase.Atoms], length_unit: float) -> float:
    """Set ``model.order`` by matching each symmetry function's (min, max) over ``frames`` (the
    training set scaling.data was written from) to a scaling.data row; returns the largest
    relative mismatch of the matched ranges (near 0 when the definitions and frames agree)."""
    with torch.no_grad():
        g = torch.cat([symmetry_functions(model, a, length_unit) for a in frames]).numpy()
    ours = np.stack([g.min(0), g.max(0)], axis=1)  # (n_sf, 2)
    scale = np.abs(model.scaling).max(1, keepdims=True) + 1e-300
    cost = np.abs(model.scaling[:, None, :] - ours[None, :, :]).max(2) / scale  # (row, function)
    order = np.full(len(ours), -1)
    for row in np.argsort(cost.min(1)):  # greedy, most certain rows first
        free = [k for k in np.argsort(cost[row]) if k not in set(order)]
        order[row] = free[0]
    model.order = order
    return float(cost[np.arange(len(order)), order].max())


def energy(
    model: N2p2Model,
    atoms: ase.Atoms,
    length_unit: float,
    energy_unit: float,
    positions: torch.Tensor | None = None,
    strain: torch.Tensor | None = None,
) -> torch.Tensor:
    """Total energy (eV) of ``atoms``."""
    if model.order is None:
        raise ValueError(
            "symmetry-function order unknown: call match_order on the training frames first"
        )
    if set(atoms.get_chemical_symbols()) != {model.element}:
        raise ValueError(
            f"model of {model.element} given {sorted(set(atoms.get_chemical_symbols()))}"
        )
    g = symmetry_functions(model, atoms, length_unit, strain=strain, positions=positions)[
        :, torch.as_tensor(model.order)
    ]
    lo, hi = (torch.as_tensor(model.scaling[:, k]) for k in (0, 1))
    x = model.scale_min + (model.scale_max - model.scale_min) * (g - lo) / (hi - lo)
    for (W, b), act in zip(model.weights, model.activations, strict=False):
        x = x @ torch.as_tensor(W).T + torch.as_tensor(b)
        x = torch.tanh(x) if act == "t" else x
    return (x.sum() + len(atoms) * model.atom_energy) * energy_unit


class N2p2Calculator(Calculator):
    """ASE calculator of an :class:`N2p2Model` (energy, forces, stress for periodic cells)."""

    implemented_properties = ["energy", "forces", "stress"]

    def __init__(
        self, model: N2p2Model, length_unit: float = BOHR, energy_unit: float = HARTREE, **kwargs
    ) -> None:
        super().__init__(**kwargs)
        self.model, self.length_unit, self.energy_unit = model, length_unit, energy_unit

    def calculate(self, atoms=None, properties=("energy",), system_changes=all_changes) -> None:
        super().calculate(atoms, properties, system_changes)
        pos = torch.tensor(self.atoms.positions, dtype=torch.float64, requires_grad=True)
        strain = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
        e = energy(
            self.model, self.atoms, self.length_unit, self.energy_unit, positions=pos, strain=strain
        )
        de_dpos, de_dstrain = torch.autograd.grad(e, (pos, strain))
        self.results["energy"] = float(e.detach())
        self.results["forces"] = -de_dpos.numpy()
        if self.atoms.pbc.all() and self.atoms.cell.volume > 0:
            s = de_dstrain.numpy() / self.atoms.cell.volume
            s = 0.5 * (s + s.T)
            self.results["stress"] = np.array(
                [s[0, 0], s[1, 1], s[2, 2], s[1, 2], s[0, 2], s[0, 1]]
            )
