"""The ASE calculator: energies, forces, stress and their closed-form uncertainties.

:class:`UncertaintyCalculator` wraps a :class:`~mlip_unc.models.potential.BayesianPotential`
or a committee (or a checkpoint) and follows the ASE calculator contract (``ase/calculators/
lj.py``): ``implemented_properties`` at class level, ``Calculator.calculate`` called first, only
the requested work done, results cached until the atoms change, stress in Voigt order ``xx yy
zz yz xz xy``. Units: eV, Angstrom; tensors become float64 NumPy arrays only here.

Results: the ``CALC_*`` constants of :mod:`mlip_unc.keys` state each name, shape, unit and
meaning (the README has the same table). In short, every ``*_var`` without "epistemic" in its
name (``energy_var``, ``forces_var``, ``stress_var``) is the TOTAL predictive variance, epistemic
+ aleatoric (``model.noise_variances``), ``*_std`` its square root, ``*_epistemic_var`` beside
it; ``max_force_std`` is EPISTEMIC (the flagging score: the noise is the same everywhere);
stress-like values are in Voigt order; ``flag = uncertainty_flag or out_of_domain``.

Modes (``uncertainty=``): ``"exact"`` (closed-form force variance, d backward passes),
``"lowrank"`` (the model's ``posterior_rank`` leading posterior directions, rank + 1 backward
passes), ``"sketch"`` (one fixed combination of those directions, 2 backward passes at any
size), ``"auto"`` (lowrank on small structures, sketch on large ones: within 2x energy + forces
at every size; the default with a full posterior), ``"sampled"`` (``n_samples`` weight draws, an unbiased estimate, reproducible: the
generator is re-seeded with ``seed`` at every calculation), ``"energy"`` (energy uncertainties
only, free with the forward pass) and ``"none"``; default ``default_uncertainty_mode(model)``.

One model call per structure: the backbone runs once per new structure, and every later
request for the same structure is served from the cache, as MACE's calculator does.
Force uncertainties on demand (``on_demand=True``, the default): a request that needs no force
uncertainty (``get_forces()``, as every ASE integrator makes) runs energy, forces, stress and
the free energy uncertainties, and keeps that forward pass; asking for ``max_force_std`` (or
any force or stress uncertainty) on the same structure later adds only its backward passes,
in ``lowrank`` for ``"auto"`` at every size. So MD that reads sigma every ``interval`` steps
pays for it on those steps only, at full quality. A request that names a force uncertainty
first computes everything in one pass (``"auto"``: lowrank on small structures, sketch on
large ones). The values are the same either way; ``on_demand=False`` always computes
everything in one pass.

Safety: atoms closer than 0.01 A raise :class:`~mlip_unc.data.domain.CoincidentAtomsError` (a
``ValueError`` naming the pair) before the model runs; the domain guard (``metadata["domain"]``
or ``domain=``) reuses the model's neighbour list. No NaN/inf leaves the calculator:
:class:`NonFiniteResultError` names the properties and the number of atoms instead.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import Calculator, PropertyNotImplementedError, all_changes
from ase.stress import full_3x3_to_voigt_6_stress
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.config.enums import ForceUncertaintyMode
from mlip_unc.data.domain import DomainCheck, DomainGuard, check_coincident
from mlip_unc.data.graphs import atoms_to_graph
from mlip_unc.data.typemap import TypeMap
from mlip_unc.models.checkpoint import CheckpointError, load_checkpoint
from mlip_unc.models.committee import Committee
from mlip_unc.models.devices import require_available
from mlip_unc.models.full_posterior import default_uncertainty_mode
from mlip_unc.models.potential import BayesianPotential, UncertaintyMode
from mlip_unc.models.potential_checkpoint import incomplete_reason
from mlip_unc.uncertainty.thresholds import LEVELS_KEY, ThresholdError, Thresholds

__all__ = [
    "UncertaintyCalculator",
    "Thresholds",
    "ThresholdError",
    "NonFiniteResultError",
    "UNCERTAINTY_MODES",
    "LEVELS_KEY",
    "DOMAIN_KEY",
]

_FORCE_MODES = tuple(m.value for m in ForceUncertaintyMode)  # with force (and stress) variances
UNCERTAINTY_MODES = (*_FORCE_MODES, UncertaintyMode.ENERGY.value, UncertaintyMode.NONE.value)
DOMAIN_KEY = "domain"  # payload["metadata"][DOMAIN_KEY] = DomainGuard.to_dict()

_ENERGY_UNC = (
    keys.CALC_ENERGY_STD,
    keys.CALC_ENERGY_VAR,
    keys.CALC_ENERGIES_STD,
    keys.CALC_ENERGY_EPISTEMIC_VAR,
    keys.CALC_ENERGY_ALEATORIC_VAR,
    keys.CALC_ALIGNMENT,
)
_STRESS_UNC = (keys.CALC_STRESS_STD, keys.CALC_STRESS_VAR, keys.CALC_STRESS_EPISTEMIC_VAR)
_FORCE_UNC = (
    keys.CALC_FORCES_STD,
    keys.CALC_FORCES_VAR,
    keys.CALC_FORCES_EPISTEMIC_VAR,
    keys.CALC_MAX_FORCE_STD,
    *_STRESS_UNC,
)
_FLAGS = (keys.CALC_UNCERTAINTY_FLAG, keys.CALC_FLAG)
_DOMAIN = (keys.CALC_OUT_OF_DOMAIN, keys.CALC_OUT_OF_DOMAIN_REASON)
_NEEDS_STRESS = ("stress", *_STRESS_UNC)


class NonFiniteResultError(FloatingPointError):
    """The model produced NaN or inf; raised instead of returning it (nothing is cached)."""


def _load_model(model: Any, device: torch.device) -> tuple[Any, dict]:
    """(model, metadata) from a model instance (a BayesianPotential or a Committee), a
    checkpoint path or a checkpoint payload."""
    if isinstance(model, torch.nn.Module):
        return model, dict(getattr(model, "metadata", None) or {})
    where = "the checkpoint"
    if isinstance(model, (str, os.PathLike)):
        where = str(model)
        model = load_checkpoint(Path(model), map_location=device, kind="potential")
    if not isinstance(model, Mapping):
        raise TypeError(
            f"expected a BayesianPotential, a checkpoint path or payload, got {type(model).__name__}"
        )
    reason = incomplete_reason(dict(model), where)
    if reason is not None:  # an interrupted training's model: its uncertainties are not calibrated
        raise CheckpointError(reason)
    return BayesianPotential.from_checkpoint(dict(model)), dict(model.get("metadata") or {})


def _domain_guard(domain: Any, metadata: Mapping[str, Any]) -> DomainGuard | None:
    """The guard: ``domain`` (a guard or its dict), else the checkpoint's; ``False`` = none."""
    if domain is False:
        return None
    if domain is None:
        domain = metadata.get(DOMAIN_KEY)
    if domain is None or isinstance(domain, DomainGuard):
        return domain
    return DomainGuard.from_dict(domain)


class UncertaintyCalculator(Calculator):
    """ASE calculator for a Bayesian potential (or a committee), with uncertainties and a flag.

    Args:
        model: a ``BayesianPotential`` or ``Committee``, a checkpoint path (``model.pt``) or a
            loaded payload.
        device: torch device.
        uncertainty: one of :data:`UNCERTAINTY_MODES` (module docstring).
        n_samples: weight draws per calculation in ``"sampled"`` mode.
        dtype: ``torch.float32``/``torch.float64`` (or their names); ``None`` keeps the model's.
            A model instance is put in eval mode; it is copied (not converted in place) when
            ``dtype`` or ``device`` differ from its own.
        thresholds: :class:`Thresholds` (or a mapping of its fields) behind ``uncertainty_flag``.
        seed: seed of the generator of ``"sampled"`` mode.
        domain: a :class:`~mlip_unc.data.domain.DomainGuard` (or its ``to_dict()``); ``None``
            reads ``metadata["domain"]`` of the checkpoint (or ``model.metadata``), ``False``
            disables it. Without a guard ``out_of_domain*`` are not available.
        on_demand: force uncertainties only when asked for, from the kept forward pass (module
            docstring); a committee always computes everything in one pass.
        **kwargs: passed to ``ase.calculators.calculator.Calculator``.

    Raises:
        CheckpointError: an unreadable checkpoint, or a training run's model that was never
            finalised (its run was interrupted: no calibrated posterior, levels or guard).
        ThresholdError: relative thresholds without calibrated levels in the checkpoint, or a
            force threshold with ``uncertainty`` ``"energy"``/``"none"``.
        ValueError: an unknown mode, or one the model does not support; a CUDA ``device`` on a
            machine without CUDA.

    Warns:
        CalibrationWarning: relative thresholds on levels measured on fewer than
            :data:`~mlip_unc.uncertainty.sample_size.MIN_CALIBRATION_SIZE` structures.
    """

    implemented_properties = [
        "energy",
        "free_energy",
        "forces",
        "stress",
        "energies",
        *_ENERGY_UNC,
        *_FORCE_UNC,
        *_FLAGS,
        *_DOMAIN,
    ]
    default_parameters: dict[str, Any] = {}

    def __init__(
        self,
        model: Any,
        *,
        device: str | torch.device = "cpu",
        uncertainty: str | None = None,
        n_samples: int = 4,
        dtype: torch.dtype | str | None = None,
        thresholds: Thresholds | Mapping[str, Any] | None = None,
        seed: int = 0,
        domain: DomainGuard | Mapping[str, Any] | bool | None = None,
        on_demand: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.device = require_available(device)  # one line naming CUDA when it is missing
        self.model, self.metadata = _load_model(model, self.device)
        if uncertainty is None:  # the cheap calibrated default when the model has a full posterior
            uncertainty = default_uncertainty_mode(self.model)
        if uncertainty not in UNCERTAINTY_MODES:
            raise ValueError(f"uncertainty must be one of {UNCERTAINTY_MODES}, got {uncertainty!r}")
        if uncertainty not in {m.value for m in UncertaintyMode}:
            raise ValueError(f"this model version does not support uncertainty={uncertainty!r}")
        if uncertainty == "sampled" and n_samples < 2:
            raise ValueError(f"the sampled mode needs n_samples >= 2, got {n_samples}")
        resolved = getattr(torch, dtype) if isinstance(dtype, str) else dtype
        first = next(self.model.parameters())
        self.dtype: torch.dtype = resolved or first.dtype
        if (first.dtype, first.device) != (self.dtype, self.device):
            self.model = copy.deepcopy(self.model)  # never convert the caller's model in place
        self.model = self.model.to(device=self.device, dtype=self.dtype).eval()
        # The model maps atomic numbers itself; the TypeMap validates elements with a clear error.
        self._type_map = TypeMap.from_list(self.model.type_map)
        self.uncertainty = uncertainty
        self.n_samples = int(n_samples)
        self.seed = int(seed)
        self.domain = _domain_guard(domain, self.metadata)
        self.uncertainty_levels: dict[str, float] | None = self.metadata.get(LEVELS_KEY)
        self.thresholds_config = Thresholds.coerce(thresholds)
        self.thresholds = self.thresholds_config.absolute(self.uncertainty_levels)
        if self.thresholds.needs_forces and uncertainty in ("energy", "none"):
            raise ThresholdError(
                f"a max_force_std threshold needs uncertainty in {_FORCE_MODES}, got {uncertainty!r}"
            )
        # Per instance: only what this configuration can deliver (class list copied, not mutated).
        drop: set[str] = set()
        if uncertainty == "none":
            drop |= {*_ENERGY_UNC, *_FORCE_UNC, *_FLAGS}
        elif uncertainty == "energy":
            drop |= set(_FORCE_UNC)
        if self.domain is None:
            drop |= set(_DOMAIN)
        if isinstance(self.model, Committee):
            drop.add(keys.CALC_ALIGNMENT)  # no single latent posterior
        self.implemented_properties = [
            p for p in type(self).implemented_properties if p not in drop
        ]
        self.n_model_calls = 0  # forward passes run (for tests and profiling)
        self.n_uncertainty_calls = 0  # force-uncertainty passes on a kept forward pass
        self.last_domain_check: DomainCheck | None = None
        # On demand: a request without force uncertainties runs energy + forces and keeps the
        # forward pass; asking for them later on the same structure adds only their backward
        # passes (lowrank for "auto": the amortised cost allows the full-quality mode).
        self.on_demand = bool(
            on_demand and uncertainty in _FORCE_MODES and hasattr(self.model, "forward_kept")
        )
        self._kept: tuple[Batch, Any, dict[str, torch.Tensor]] | None = None

    # ------------------------------------------------------------------ ASE entry point
    def calculate(
        self,
        atoms: Atoms | None = None,
        properties: list[str] | None = None,
        system_changes: list[str] = all_changes,
    ) -> None:
        """Compute ``properties`` (default: all implemented ones) for ``atoms``.

        Raises CoincidentAtomsError (before the model runs) and NonFiniteResultError.
        """
        Calculator.calculate(self, atoms, properties, system_changes)
        structure = self.atoms
        if structure is None:
            raise ValueError("UncertaintyCalculator.calculate: no structure given")
        periodic = bool(structure.pbc.all())
        if properties is None:  # everything this structure allows
            properties = [
                p for p in self.implemented_properties if p not in _NEEDS_STRESS or periodic
            ]
        if system_changes:
            self.results = {}
            self._kept = None
        unknown = [p for p in properties if p not in self.implemented_properties]
        if unknown:
            raise PropertyNotImplementedError(
                f"{unknown} not available with uncertainty={self.uncertainty!r}"
            )
        if any(p in _NEEDS_STRESS for p in properties) and not periodic:
            raise PropertyNotImplementedError(
                "stress needs a fully periodic cell (atoms.pbc all True)"
            )
        wants_sigma = any(p in self._sigma_properties for p in properties)
        if self._kept is not None and wants_sigma:  # the same structure: add the uncertainties
            self._add_force_uncertainty(periodic)
            return
        if self.on_demand and not wants_sigma:
            self._plain_kept(structure, periodic)
            return
        # Everything the mode provides, in one pass; later requests are served from the cache.
        force_unc = self.uncertainty in _FORCE_MODES
        want_stress = periodic
        want_forces = True
        mode = self.uncertainty
        batch = self._graph_batch(structure)
        domain = self._check_domain(batch)  # raises on coincident atoms before the model runs
        out = self._run(batch, mode, forces=want_forces, stress=want_stress)
        res = self._convert(out, forces=want_forces, stress=want_stress, force_unc=force_unc)
        self._finish(res, domain)

    # ------------------------------------------------------------------ on demand
    @property
    def _sigma_properties(self) -> set[str]:
        """The properties that need the force uncertainties (the flags too when a force
        threshold is set)."""
        out = set(_FORCE_UNC)
        if self.thresholds.needs_forces:
            out |= set(_FLAGS)
        return out

    def _plain_kept(self, structure: Atoms, periodic: bool) -> None:
        """Energy, forces (stress), the free energy uncertainties and the domain check in one
        forward pass whose graph is kept for :meth:`_add_force_uncertainty`."""
        batch = self._graph_batch(structure)
        domain = self._check_domain(batch)
        self.n_model_calls += 1
        out, state = self.model.forward_kept(batch, compute_stress=periodic)
        plain = {k: v.detach() for k, v in out.items() if isinstance(v, torch.Tensor)}
        res = self._convert(plain, forces=True, stress=periodic, force_unc=False)
        self._finish(res, domain)  # the flag too when no force threshold is set
        self._kept = (batch, state, plain)

    def _add_force_uncertainty(self, periodic: bool) -> None:
        """The force (stress) uncertainties of the kept forward pass: its backward passes only.
        The energy and forces already returned stay as they are."""
        assert self._kept is not None
        batch, state, plain = self._kept
        self._kept = None  # its graph is used up
        mode = "lowrank" if self.uncertainty == "auto" else self.uncertainty
        self.n_uncertainty_calls += 1
        extra = self.model.uncertainty_from_state(
            state, mode, n_samples=self.n_samples, generator=self._generator(mode)
        )
        out = dict(plain)
        for key, value in extra.items():
            if isinstance(value, torch.Tensor) and key not in plain:
                out[key] = value.detach()
        self._add_noise(out, batch)
        res = self._convert(out, forces=True, stress=periodic, force_unc=True)
        new = {k: v for k, v in res.items() if k not in self.results or k in _FLAGS}
        self._finish(new, self.last_domain_check if self.domain is not None else None)

    def _finish(self, res: dict[str, Any], domain: DomainCheck | None) -> None:
        """Domain verdict and combined flag into ``res``, finiteness checked, cached."""
        if domain is not None:
            res[keys.CALC_OUT_OF_DOMAIN] = domain.out_of_domain
            res[keys.CALC_OUT_OF_DOMAIN_REASON] = domain.reason
        if keys.CALC_UNCERTAINTY_FLAG in res:
            res[keys.CALC_FLAG] = res[keys.CALC_UNCERTAINTY_FLAG] or bool(
                domain and domain.out_of_domain
            )
        self._check_finite(res)
        self.results.update(res)

    # ------------------------------------------------------------------ internals
    def _graph_batch(self, atoms: Atoms) -> Batch:
        graph = atoms_to_graph(atoms, float(self.model.r_max), self._type_map, dtype=self.dtype)
        return Batch.from_data_list([graph]).to(self.device)

    def _check_domain(self, batch: Batch) -> DomainCheck | None:
        """Coincident atoms raise; the guard's verdict (None without a guard)."""
        if self.domain is None:
            check_coincident(batch)
            return None
        if self.domain.r_max <= float(self.model.r_max):
            self.last_domain_check = self.domain.check(batch, cutoff=float(self.model.r_max))
        else:  # the guard looks farther than the model's graph
            check_coincident(batch)
            self.last_domain_check = self.domain.check(self.atoms)
        return self.last_domain_check

    def _run(
        self, batch: Batch, mode: str, *, forces: bool, stress: bool
    ) -> dict[str, torch.Tensor]:
        self.n_model_calls += 1
        with torch.set_grad_enabled(forces or stress):
            out = self.model(
                batch,
                compute_forces=forces,
                compute_stress=stress,
                uncertainty=mode,
                n_samples=self.n_samples,
                generator=self._generator(mode),
            )
        out = {k: v.detach() for k, v in out.items() if isinstance(v, torch.Tensor)}
        if mode in _FORCE_MODES:
            self._add_noise(out, batch)
        return out

    def _generator(self, mode: str) -> torch.Generator | None:
        """The sampled mode's generator, re-seeded at every calculation (reproducible)."""
        if mode != "sampled":
            return None
        return torch.Generator(device=self.device).manual_seed(self.seed)

    def _add_noise(self, out: dict[str, torch.Tensor], batch: Batch) -> None:
        """The model's noise variances into ``out`` (for the total force/stress variances)."""
        with torch.no_grad():
            noise = self.model.noise_variances(batch)
        out["_forces_noise"] = noise[keys.FORCES].detach()  # (n_atoms, 3)
        if keys.STRESS in noise:
            out["_stress_noise"] = noise[keys.STRESS].detach()  # (n_graphs, 3, 3)

    def _convert(
        self, out: dict[str, torch.Tensor], *, forces: bool, stress: bool, force_unc: bool
    ) -> dict[str, Any]:
        def arr(key: str) -> np.ndarray:
            return out[key].to(dtype=torch.float64, device="cpu").numpy()

        def scalar(key: str) -> float:
            return float(arr(key).reshape(-1)[0])

        n_atoms = len(cast(Atoms, self.atoms))  # set by calculate
        res: dict[str, Any] = {}
        res["energy"] = res["free_energy"] = scalar(keys.ENERGY)
        if keys.ATOMIC_ENERGIES in out:
            res["energies"] = arr(keys.ATOMIC_ENERGIES).reshape(n_atoms)
        if forces:
            res["forces"] = arr(keys.FORCES).reshape(n_atoms, 3)
        if stress:
            res["stress"] = full_3x3_to_voigt_6_stress(arr(keys.STRESS).reshape(3, 3))
        if self.uncertainty == "none":
            return res
        res[keys.CALC_ENERGY_VAR] = var = scalar(keys.ENERGY_VAR)
        res[keys.CALC_ENERGY_STD] = math.sqrt(max(var, 0.0))
        res[keys.CALC_ENERGY_EPISTEMIC_VAR] = scalar(keys.ENERGY_EPISTEMIC_VAR)
        res[keys.CALC_ENERGY_ALEATORIC_VAR] = scalar(keys.ENERGY_ALEATORIC_VAR)
        if keys.LOCAL_ENERGY_VAR in out:
            res[keys.CALC_ENERGIES_STD] = np.sqrt(
                np.clip(arr(keys.LOCAL_ENERGY_VAR).reshape(n_atoms), 0.0, None)
            )
        if keys.KAPPA in out:
            res[keys.CALC_ALIGNMENT] = scalar(keys.KAPPA)
        if force_unc:
            epistemic = np.clip(arr(keys.FORCES_VAR).reshape(n_atoms, 3), 0.0, None)  # (n, 3)
            total = epistemic + arr("_forces_noise").reshape(n_atoms, 3)
            res[keys.CALC_FORCES_EPISTEMIC_VAR], res[keys.CALC_FORCES_VAR] = epistemic, total
            res[keys.CALC_FORCES_STD] = np.sqrt(total)
            res[keys.CALC_MAX_FORCE_STD] = float(np.sqrt(epistemic.sum(axis=1)).max())
            if stress:
                epistemic = np.clip(
                    full_3x3_to_voigt_6_stress(arr(keys.STRESS_VAR).reshape(3, 3)), 0, None
                )  # (6,)
                noise = (
                    full_3x3_to_voigt_6_stress(arr("_stress_noise").reshape(3, 3))
                    if "_stress_noise" in out
                    else 0.0
                )
                res[keys.CALC_STRESS_EPISTEMIC_VAR], res[keys.CALC_STRESS_VAR] = (
                    epistemic,
                    epistemic + noise,
                )
                res[keys.CALC_STRESS_STD] = np.sqrt(epistemic + noise)
        if force_unc or not self.thresholds.needs_forces:
            res[keys.CALC_UNCERTAINTY_FLAG] = self.thresholds.exceeded(
                {
                    keys.CALC_MAX_FORCE_STD: res.get(keys.CALC_MAX_FORCE_STD, 0.0),
                    keys.CALC_ENERGY_STD_PER_ATOM: self.energy_std_per_atom(res, n_atoms),
                }
            )
        return res

    def _check_finite(self, res: Mapping[str, Any]) -> None:
        bad = [
            k
            for k, v in res.items()
            if not isinstance(v, (str, bool)) and not np.all(np.isfinite(v))
        ]
        if bad:
            atoms = cast(Atoms, self.atoms)  # set by calculate
            raise NonFiniteResultError(
                f"the model gave non-finite {', '.join(bad)} for a structure of {len(atoms)} atoms "
                f"({atoms.get_chemical_formula()}); nothing was stored. Check the geometry "
                "(exploded MD, overlapping atoms) and the checkpoint"
            )

    @torch.no_grad()
    def latent(self, atoms: Atoms) -> np.ndarray:
        """Mean per-atom latent ``Phi / n_atoms`` ``(d,)`` (one forward pass; results untouched).

        A structure descriptor in the model's own latent space, e.g. for diverse selection.
        """
        check_coincident(batch := self._graph_batch(atoms))
        out = self.model(batch, compute_forces=False, uncertainty="none")
        latent = out[keys.LATENT].to(dtype=torch.float64, device="cpu").numpy().reshape(-1) / len(
            atoms
        )
        if not np.all(np.isfinite(latent)):
            raise NonFiniteResultError(f"non-finite latent for a structure of {len(atoms)} atoms")
        return latent

    @staticmethod
    def energy_std_per_atom(results: Mapping[str, Any], n_atoms: int | None = None) -> float:
        """``sqrt(energy_epistemic_var) / n_atoms`` (eV/atom), the quantity of the energy threshold.

        ``n_atoms`` defaults to the length of ``results["energies_std"]``.
        """
        if n_atoms is None:
            n_atoms = len(results[keys.CALC_ENERGIES_STD])
        return math.sqrt(max(float(results[keys.CALC_ENERGY_EPISTEMIC_VAR]), 0.0)) / max(n_atoms, 1)
