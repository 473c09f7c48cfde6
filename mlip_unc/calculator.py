"""The ASE calculator: energies, forces, stress and their closed-form uncertainties.

:class:`UncertaintyCalculator` wraps a :class:`~mlip_unc.models.potential.BayesianPotential`
(or its checkpoint) and follows the ASE calculator contract (``ase/calculators/lj.py``):
``implemented_properties`` at class level, ``Calculator.calculate`` called first, only the
requested work done (an energy-only request runs no backward pass), results cached until the
atoms change, stress in Voigt order ``xx yy zz yz xz xy``. Units are eV, Angstrom, eV/Angstrom
and eV/Angstrom^3 throughout; tensors become float64 NumPy arrays only here.

Uncertainty results (keys follow MACE's committee convention: ``*_var`` beside ``*_std``):

======================== =========== ==========================================================
key                      shape, unit meaning
======================== =========== ==========================================================
energy_var, energy_std   (), eV^2/eV total predictive variance of E (epistemic + aleatoric)
energy_epistemic_var     (), eV^2    Phi^T S Phi (+ bias term), docs/method.md s.3
energy_aleatoric_var     (), eV^2    learned noise variance
energies_std             (n,), eV    per-atom local energy std sqrt(z_a^T S z_a) (free)
forces_var, forces_std   (n, 3)      epistemic force variance/std per atom and component
max_force_std            (), eV/A    max over atoms of sqrt(sum_c forces_var[i, c])
alignment                ()          kappa(Phi) of this structure (< 1 = aligned), s.4
flag                     bool        True when a configured threshold is exceeded (False
                                     when none is configured; see :class:`Thresholds`)
======================== =========== ==========================================================

Uncertainty modes (``uncertainty=``): ``"exact"`` (closed-form force variance, d backward
passes), ``"sampled"`` (``n_samples`` weight draws, one backward each, an unbiased estimate;
reproducible: the draws come from a ``torch.Generator`` re-seeded with ``seed`` at every
calculation, so results are a deterministic function of the structure), ``"energy"`` (energy
uncertainties only, free with the forward pass) and ``"none"``.

Cost follows the request: energy-like properties (energy, energies and every energy
uncertainty, ``alignment``) take one forward pass; ``forces`` one backward pass more; force
uncertainties (``forces_std``, ``forces_var``, ``max_force_std``, and ``flag`` when a force
threshold is set) the d (exact) or ``n_samples`` (sampled) backward passes on top, and come
with everything cheaper. So MD that asks for forces only pays for forces, and a monitor that
asks for ``max_force_std`` every n steps pays the uncertainty cost every n steps.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.data.graphs import atoms_to_graph
from mlip_unc.data.typemap import TypeMap
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.models.potential import BayesianPotential

__all__ = ["UncertaintyCalculator", "Thresholds", "ThresholdError", "UNCERTAINTY_MODES", "LEVELS_KEY"]

UNCERTAINTY_MODES = ("exact", "sampled", "energy", "none")
LEVELS_KEY = "uncertainty_levels"  # payload["metadata"][LEVELS_KEY] = {"max_force_std": ..., ...}

_ENERGY = ("energy", "free_energy", "energies")
_ENERGY_UNC = (
    "energy_std",
    "energy_var",
    "energies_std",
    "energy_epistemic_var",
    "energy_aleatoric_var",
    "alignment",
)
_FORCE_UNC = ("forces_std", "forces_var", "max_force_std")


class ThresholdError(ValueError):
    """Thresholds that cannot be applied (e.g. relative without calibrated levels)."""


@dataclass(frozen=True)
class Thresholds:
    """When a structure counts as uncertain ("flagged"): any configured threshold exceeded.

    Quantities compared:

    - ``max_force_std``: the calculator's ``max_force_std``, i.e. the largest per-atom force
      std norm ``max_i sqrt(sum_c Var[F_ic])`` in eV/Angstrom;
    - ``energy_std_per_atom``: ``sqrt(energy_epistemic_var) / n_atoms`` in eV/atom (epistemic,
      since the learned noise is the same everywhere and says nothing about extrapolation).

    With ``relative=False`` the values are absolute (eV/A, eV/atom). With ``relative=True`` they
    are multiples of the calibrated validation-set levels stored by training in the checkpoint
    (``payload["metadata"]["uncertainty_levels"]``, same keys, same definitions): e.g.
    ``Thresholds(max_force_std=3.0, relative=True)`` flags structures whose max force std is
    more than three times the typical validation value. ``None`` disables a criterion.
    """

    max_force_std: float | None = None
    energy_std_per_atom: float | None = None
    relative: bool = False

    def __post_init__(self) -> None:
        for name in ("max_force_std", "energy_std_per_atom"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ThresholdError(f"threshold {name} must be a positive number, got {value!r}")

    @property
    def active(self) -> bool:
        return self.max_force_std is not None or self.energy_std_per_atom is not None

    @property
    def needs_forces(self) -> bool:
        return self.max_force_std is not None

    @classmethod
    def coerce(cls, value: Thresholds | Mapping[str, Any] | None) -> Thresholds:
        if value is None:
            return cls()
        if isinstance(value, Thresholds):
            return value
        unknown = set(value) - {"max_force_std", "energy_std_per_atom", "relative"}
        if unknown:
            raise ThresholdError(
                f"unknown threshold keys {sorted(unknown)}; use max_force_std, "
                "energy_std_per_atom, relative"
            )
        return cls(**value)

    def absolute(self, levels: Mapping[str, float] | None) -> Thresholds:
        """These thresholds in absolute units (multiplied by ``levels`` when relative)."""
        if not self.relative:
            return self
        out = {}
        for name in ("max_force_std", "energy_std_per_atom"):
            factor = getattr(self, name)
            if factor is None:
                out[name] = None
                continue
            if not levels or levels.get(name) is None:
                raise ThresholdError(
                    f"relative threshold on {name} needs the calibrated validation-set level "
                    f"metadata['{LEVELS_KEY}']['{name}'] in the checkpoint, which it lacks "
                    f"(found: {sorted(levels or {})}); give an absolute threshold instead"
                )
            out[name] = factor * float(levels[name])
        return Thresholds(**out, relative=False)

    def exceeded(self, values: Mapping[str, float]) -> bool:
        """True when any configured (absolute) threshold is exceeded by ``values``."""
        if self.relative:
            raise ThresholdError("call absolute(levels) before comparing relative thresholds")
        return any(
            limit is not None and float(values[name]) > limit
            for name, limit in (
                ("max_force_std", self.max_force_std),
                ("energy_std_per_atom", self.energy_std_per_atom),
            )
        )


def _load_model(model: Any, device: torch.device) -> tuple[torch.nn.Module, dict]:
    """(model, metadata) from a model instance, a checkpoint path or a checkpoint payload."""
    if isinstance(model, torch.nn.Module):
        return model, dict(getattr(model, "metadata", None) or {})
    if isinstance(model, (str, os.PathLike)):
        model = load_checkpoint(Path(model), map_location=device, kind="potential")
    if not isinstance(model, Mapping):
        raise TypeError(f"expected a BayesianPotential, a checkpoint path or payload, got {type(model).__name__}")
    return BayesianPotential.from_checkpoint(model), dict(model.get("metadata") or {})


class UncertaintyCalculator(Calculator):
    """ASE calculator for a Bayesian potential, with closed-form uncertainties and a flag.

    Args:
        model: a ``BayesianPotential``, a checkpoint path (``model.pt``) or a loaded payload.
        device: torch device.
        uncertainty: ``"exact"``, ``"sampled"``, ``"energy"`` or ``"none"`` (module docstring).
        n_samples: weight draws per calculation in ``"sampled"`` mode.
        dtype: ``torch.float32``/``torch.float64`` (or their names); ``None`` keeps the model's.
            A model instance is put in eval mode; it is copied (not converted in place) when
            ``dtype`` or ``device`` differ from its own.
        thresholds: :class:`Thresholds` (or a mapping of its fields) behind ``flag``.
        seed: seed of the generator of ``"sampled"`` mode.
        **kwargs: passed to ``ase.calculators.calculator.Calculator``.

    Raises:
        ThresholdError: relative thresholds without calibrated levels in the checkpoint, or a
            force threshold with ``uncertainty`` ``"energy"``/``"none"``.
    """

    implemented_properties = [
        "energy",
        "free_energy",
        "forces",
        "stress",
        "energies",
        *_ENERGY_UNC,
        *_FORCE_UNC,
        "flag",
    ]
    default_parameters: dict[str, Any] = {}

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device = "cpu",
        uncertainty: str = "exact",
        n_samples: int = 4,
        dtype: torch.dtype | str | None = None,
        thresholds: Thresholds | Mapping[str, Any] | None = None,
        seed: int = 0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if uncertainty not in UNCERTAINTY_MODES:
            raise ValueError(f"uncertainty must be one of {UNCERTAINTY_MODES}, got {uncertainty!r}")
        if uncertainty == "sampled" and n_samples < 2:
            raise ValueError(f"the sampled mode needs n_samples >= 2, got {n_samples}")
        self.device = torch.device(device)
        self.model, self.metadata = _load_model(model, self.device)
        if isinstance(dtype, str):
            dtype = getattr(torch, dtype)
        first = next(self.model.parameters())
        self.dtype = dtype or first.dtype
        if (first.dtype, first.device) != (self.dtype, self.device):
            self.model = copy.deepcopy(self.model)  # never convert the caller's model in place
        self.model = self.model.to(device=self.device, dtype=self.dtype).eval()
        # The model maps atomic numbers itself; the TypeMap validates elements with a clear error.
        self._type_map = TypeMap.from_list(self.model.type_map)
        self.uncertainty = uncertainty
        self.n_samples = int(n_samples)
        self.seed = int(seed)
        self.uncertainty_levels: dict[str, float] | None = self.metadata.get(LEVELS_KEY)
        self.thresholds_config = Thresholds.coerce(thresholds)
        self.thresholds = self.thresholds_config.absolute(self.uncertainty_levels)
        if self.thresholds.needs_forces and uncertainty in ("energy", "none"):
            raise ThresholdError(
                f"a max_force_std threshold needs uncertainty='exact' or 'sampled', got {uncertainty!r}"
            )
        # Per instance: only what this configuration can deliver (class list copied, not mutated).
        props = list(type(self).implemented_properties)
        if uncertainty == "none":
            props = [p for p in props if p not in (*_ENERGY_UNC, *_FORCE_UNC, "flag")]
        elif uncertainty == "energy":
            props = [p for p in props if p not in _FORCE_UNC]
        self.implemented_properties = props
        self.n_model_calls = 0  # forward passes run (for tests and profiling)

    # ------------------------------------------------------------------ ASE entry point
    def calculate(
        self,
        atoms: Atoms | None = None,
        properties: list[str] | None = None,
        system_changes: list[str] = all_changes,
    ) -> None:
        """Compute ``properties`` (default: all implemented ones) for ``atoms``."""
        Calculator.calculate(self, atoms, properties, system_changes)
        if properties is None:  # everything this structure allows
            properties = [p for p in self.implemented_properties if p != "stress" or self.atoms.pbc.all()]
        if system_changes:
            self.results = {}
        unknown = [p for p in properties if p not in self.implemented_properties]
        if unknown:
            raise PropertyNotImplementedError(
                f"{unknown} not available with uncertainty={self.uncertainty!r}"
            )
        periodic = bool(self.atoms.pbc.all())
        want_stress = "stress" in properties
        if want_stress and not periodic:
            raise PropertyNotImplementedError("stress needs a fully periodic cell (atoms.pbc all True)")
        force_unc = self.uncertainty in ("exact", "sampled") and (
            any(p in _FORCE_UNC for p in properties) or ("flag" in properties and self.thresholds.needs_forces)
        )
        want_forces = force_unc or "forces" in properties
        mode = self.uncertainty if force_unc else ("none" if self.uncertainty == "none" else "energy")
        out = self._run(mode, forces=want_forces, stress=want_stress)
        self.results.update(self._convert(out, forces=want_forces, stress=want_stress, force_unc=force_unc))

    # ------------------------------------------------------------------ internals
    def _graph_batch(self, atoms: Atoms) -> Batch:
        graph = atoms_to_graph(atoms, float(self.model.r_max), self._type_map, dtype=self.dtype)
        return Batch.from_data_list([graph]).to(self.device)

    def _run(self, mode: str, *, forces: bool, stress: bool) -> dict[str, torch.Tensor]:
        batch = self._graph_batch(self.atoms)
        generator = None
        if mode == "sampled":
            generator = torch.Generator(device=self.device).manual_seed(self.seed)
        self.n_model_calls += 1
        with torch.set_grad_enabled(forces or stress):
            out = self.model(
                batch,
                compute_forces=forces,
                compute_stress=stress,
                uncertainty=mode,
                n_samples=self.n_samples,
                generator=generator,
            )
        return {k: v.detach() for k, v in out.items() if isinstance(v, torch.Tensor)}

    def _convert(
        self, out: dict[str, torch.Tensor], *, forces: bool, stress: bool, force_unc: bool
    ) -> dict[str, Any]:
        def arr(key: str) -> np.ndarray:
            return out[key].to(dtype=torch.float64, device="cpu").numpy()

        n_atoms = len(self.atoms)
        res: dict[str, Any] = {}
        res["energy"] = res["free_energy"] = float(arr(keys.ENERGY).reshape(-1)[0])
        if keys.ATOMIC_ENERGIES in out:
            res["energies"] = arr(keys.ATOMIC_ENERGIES).reshape(n_atoms)
        if forces:
            res["forces"] = arr(keys.FORCES).reshape(n_atoms, 3)
        if stress:
            res["stress"] = full_3x3_to_voigt_6_stress(arr(keys.STRESS).reshape(3, 3))
        if self.uncertainty == "none":
            return res
        var = float(arr(keys.ENERGY_VAR).reshape(-1)[0])
        res["energy_var"] = var
        res["energy_std"] = math.sqrt(max(var, 0.0))
        res["energy_epistemic_var"] = float(arr(keys.ENERGY_EPISTEMIC_VAR).reshape(-1)[0])
        res["energy_aleatoric_var"] = float(arr(keys.ENERGY_ALEATORIC_VAR).reshape(-1)[0])
        res["energies_std"] = np.sqrt(np.clip(arr(keys.LOCAL_ENERGY_VAR).reshape(n_atoms), 0.0, None))
        res["alignment"] = float(arr(keys.KAPPA).reshape(-1)[0])
        if force_unc:
            fvar = np.clip(arr(keys.FORCES_VAR).reshape(n_atoms, 3), 0.0, None)
            res["forces_var"] = fvar
            res["forces_std"] = np.sqrt(fvar)
            res["max_force_std"] = float(np.sqrt(fvar.sum(axis=1)).max())
        if force_unc or not self.thresholds.needs_forces:
            res["flag"] = self.thresholds.exceeded(
                {
                    "max_force_std": res.get("max_force_std", 0.0),
                    "energy_std_per_atom": self.energy_std_per_atom(res),
                }
            )
        return res

    @torch.no_grad()
    def latent(self, atoms: Atoms) -> np.ndarray:
        """Mean per-atom latent ``Phi / n_atoms`` ``(d,)`` (one forward pass; results untouched).

        A structure descriptor in the model's own latent space, e.g. for diverse selection.
        """
        out = self.model(self._graph_batch(atoms), compute_forces=False, uncertainty="none")
        return out[keys.LATENT].to(dtype=torch.float64, device="cpu").numpy().reshape(-1) / len(atoms)

    @staticmethod
    def energy_std_per_atom(results: Mapping[str, Any]) -> float:
        """``sqrt(energy_epistemic_var) / n_atoms`` (eV/atom), the quantity of the energy threshold."""
        n_atoms = len(results["energies_std"])
        return math.sqrt(max(float(results["energy_epistemic_var"]), 0.0)) / max(n_atoms, 1)
