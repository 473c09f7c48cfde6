"""Uncertainty-driven exploration: MD biased towards high epistemic energy variance.

:class:`BiasedCalculator` wraps an :class:`~mlip_unc.calculator.UncertaintyCalculator` and
adds a bias energy that depends on the model's closed-form epistemic energy variance
``s2 = sigma_E^2`` (``energy_epistemic_var``: ``Phi^T S Phi``, calibrated when the model holds a
full posterior), so MD drifts into configurations the model knows least::

    variance:  E_bias = -k s2                                  F_bias = k ds2/dr
    udd:       E_bias = A [exp(-s2 / (N B^2)) - 1]             F_bias = A/(N B^2) exp(-s2/(N B^2)) ds2/dr

``N`` = number of atoms. ``variance`` is the plain form (``k``: ``strength`` in 1/eV); it is
unbounded below, so a large ``k`` can pull a structure apart. ``udd`` is the uncertainty-driven
dynamics form of Kulichenko et al., Nat. Comput. Sci. 3, 230 (2023), as implemented in apax
(``UncertaintyDrivenDynamics``, with its ensemble-size factor 1 for one Bayesian model):
bounded, ``-A <= E_bias <= 0`` (``A``: ``strength`` in eV, ``B``: ``width`` in eV/atom^(1/2)), and
its force fades once ``s2 >> N B^2``, so it cannot run away. For small ``s2`` it equals the
variance form with ``k = A / (N B^2)``.

``s2`` is a differentiable function of the positions inside the model (the latents ``Phi``
are), so the bias force costs one extra forward pass (the energy mode) and one backward pass;
the bias stress, when asked, comes from the same backward pass (strain derivative, as the
model's own stress: ``(1/V) dE_bias/d(strain)``, ASE sign).

Results: ``energy``, ``free_energy``, ``forces`` (and ``stress``) are the BIASED values (what
the integrator needs, consistent with each other); ``energy_unbiased``, ``forces_unbiased``,
``stress_unbiased``, ``energies_unbiased`` (per atom) keep the model's own, ``energy_bias``,
``forces_bias``, ``stress_bias`` the bias; every uncertainty result (``energy_epistemic_var``,
``max_force_std``, ``flag``, ...) is the wrapped calculator's, unchanged. With ``strength = 0``
no extra pass is run and the results equal the wrapped calculator's bit for bit.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import numpy as np
import torch
from ase import Atoms
from ase.calculators.calculator import (
    Calculator,
    PropertyNotImplementedError,
    all_changes,
)
from ase.stress import full_3x3_to_voigt_6_stress
from torch import Tensor
from torch_geometric.data import Batch

from mlip_unc import keys
from mlip_unc.config.enums import MDBias
from mlip_unc.data.graphs import atoms_to_graph
from mlip_unc.data.typemap import TypeMap
from mlip_unc.models.derivatives import differentiable_inputs, graph_index

__all__ = ["BIAS_KINDS", "BiasError", "BiasedCalculator", "bias_energy", "biased_calculator"]

BIAS_KINDS = tuple(kind.value for kind in MDBias)  # none, variance, udd
_EXTRA = (
    "energy_unbiased",
    "forces_unbiased",
    "stress_unbiased",
    "energy_bias",
    "forces_bias",
    "stress_bias",
)


class BiasError(ValueError):
    """A bias that cannot be applied: unknown kind, bad parameters, a non-differentiable variance."""


def check_bias(kind: str, strength: float, width: float | None) -> None:
    """Raise :class:`BiasError` for an unknown ``kind`` or parameters it cannot use."""
    if kind not in BIAS_KINDS:
        raise BiasError(f"bias must be one of {BIAS_KINDS}, got {kind!r}")
    if not (math.isfinite(strength) and strength >= 0):
        raise BiasError(f"bias strength must be a finite number >= 0, got {strength!r}")
    if kind == "udd" and not (width is not None and math.isfinite(width) and width > 0):
        raise BiasError(f"the udd bias needs a width B > 0 (eV/atom^(1/2)), got {width!r}")


def bias_energy(
    s2: Tensor, n_atoms: int, kind: str, strength: float, width: float | None = None
) -> Tensor:
    """``E_bias`` (eV) of the epistemic energy variance ``s2`` (eV^2, any shape): module docstring."""
    if kind == "variance":
        return -strength * s2
    if kind == "udd":
        if width is None:
            raise BiasError("the udd bias needs a width B > 0 (eV/atom^(1/2)), got None")
        return strength * torch.expm1(-s2 / (n_atoms * float(width) ** 2))
    if kind == "none":
        return torch.zeros_like(s2)
    raise BiasError(f"bias must be one of {BIAS_KINDS}, got {kind!r}")


class BiasedCalculator(Calculator):
    """An uncertainty calculator plus a bias on its epistemic energy variance (module docstring).

    Args:
        base: the wrapped :class:`~mlip_unc.calculator.UncertaintyCalculator` (a single
            ``BayesianPotential``: a committee's variance is not differentiable here).
        kind: ``"variance"``, ``"udd"`` or ``"none"`` (pass-through).
        strength: ``k`` (1/eV) for ``variance``, ``A`` (eV) for ``udd``; >= 0.
        width: ``B`` (eV/atom^(1/2)) for ``udd``.

    Attributes ``thresholds``, ``uncertainty_levels``, ``uncertainty``, ``metadata``, ``model``
    are the base calculator's; ``n_bias_calls`` counts the extra model passes.
    """

    def __init__(
        self,
        base: Any,
        kind: str = "variance",
        strength: float = 0.0,
        width: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        check_bias(kind, float(strength), width)
        self.base = base
        self.kind, self.strength, self.width = (
            kind,
            float(strength),
            None if width is None else float(width),
        )
        props = [p for p in base.implemented_properties if p != "energies"]
        self.implemented_properties = [*props, "energies_unbiased", *_EXTRA]
        self._type_map = TypeMap.from_list(base.model.type_map)
        self.n_bias_calls = 0
        self._cache: dict[str, Any] = {}

    # the base calculator's configuration, read by the active-learning loop and the monitor
    thresholds = property(lambda self: self.base.thresholds)
    uncertainty_levels = property(lambda self: self.base.uncertainty_levels)
    uncertainty = property(lambda self: self.base.uncertainty)
    metadata = property(lambda self: self.base.metadata)
    model = property(lambda self: self.base.model)
    energy_std_per_atom = property(lambda self: self.base.energy_std_per_atom)

    @property
    def active(self) -> bool:
        """Whether a bias is applied (``kind`` not ``none`` and ``strength > 0``)."""
        return self.kind != "none" and self.strength > 0

    def calculate(
        self,
        atoms: Atoms | None = None,
        properties: list[str] | None = None,
        system_changes: list[str] = all_changes,
    ) -> None:
        Calculator.calculate(self, atoms, properties, system_changes)
        if system_changes:
            self._cache = {}
        structure = self.atoms
        if structure is None:
            raise BiasError("BiasedCalculator.calculate: no structure given")
        periodic = bool(structure.pbc.all())
        if properties is None:
            properties = [p for p in self.implemented_properties if "stress" not in p or periodic]
        unknown = [p for p in properties if p not in self.implemented_properties]
        if unknown:
            raise PropertyNotImplementedError(
                f"{unknown} not available from this biased calculator"
            )
        want_forces = any(
            p.startswith("forces") for p in properties
        )  # forces, forces_unbiased, forces_bias
        want_stress = any(p.startswith("stress") for p in properties)
        base_props = {p for p in properties if p in self.base.implemented_properties} | {"energy"}
        base_props |= {"forces"} if want_forces else set()
        base_props |= {"stress"} if want_stress else set()
        base_props |= {"energies"} if "energies_unbiased" in properties else set()
        self.base.calculate(structure, sorted(base_props), system_changes)
        res = dict(self.base.results)
        if "energies" in res:
            res["energies_unbiased"] = res.pop("energies")
        for name in ("energy", "forces", "stress"):
            if name in res:
                res[f"{name}_unbiased"] = res[name]
        # biased wherever the base computed them (an uncertainty request brings forces along)
        bias = self._cached_bias(forces="forces" in res, stress="stress" in res)
        res["energy"] = res["free_energy"] = res["energy"] + bias["energy"]
        res["energy_bias"] = bias["energy"]
        for name in ("forces", "stress"):
            if name in bias:
                res[name] = res[name] + bias[name]
                res[f"{name}_bias"] = bias[name]
        self.results = res

    def _cached_bias(self, *, forces: bool, stress: bool) -> dict[str, Any]:
        """The bias at the current atoms, computed once per structure (again only for more parts)."""
        if not (
            self._cache
            and (not forces or "forces" in self._cache)
            and (not stress or "stress" in self._cache)
        ):
            self._cache = self._bias(forces=forces, stress=stress)
        return self._cache

    def _bias(self, *, forces: bool, stress: bool) -> dict[str, Any]:
        """``{"energy": float, "forces": (n, 3), "stress": (6,)}`` of the bias (zeros when inactive)."""
        structure = self.atoms
        if structure is None:
            raise BiasError("BiasedCalculator: no structure to bias")
        n = len(structure)
        if not self.active:
            out: dict[str, Any] = {"energy": 0.0}
            if forces:
                out["forces"] = np.zeros((n, 3))
            if stress:
                out["stress"] = np.zeros(6)
            return out
        model = self.base.model
        dtype, device = next(model.parameters()).dtype, self.base.device
        batch = Batch.from_data_list(
            [atoms_to_graph(structure, float(model.r_max), self._type_map, dtype=dtype)]
        )
        batch = batch.to(device)  # coincident atoms were refused by the base calculator already
        self.n_bias_calls += 1
        with torch.enable_grad():
            graph = graph_index(batch)
            cell = batch[keys.CELL].reshape(-1, 3, 3)
            pos, cell_strained, inputs, _ = differentiable_inputs(
                batch[keys.POSITIONS], cell, graph, 1, forces=True, stress=stress
            )
            inputs_batch = copy.copy(batch)
            inputs_batch[keys.POSITIONS], inputs_batch[keys.CELL] = pos, cell_strained
            s2 = model(inputs_batch, compute_forces=False, uncertainty="energy")[
                keys.ENERGY_EPISTEMIC_VAR
            ]  # (1,)
            if not s2.requires_grad:
                raise BiasError(
                    f"the energy variance of {type(model).__name__} is not differentiable with respect "
                    "to the positions (a committee detaches its members); bias a BayesianPotential"
                )
            energy = bias_energy(s2, n, self.kind, self.strength, self.width).sum()
            grads = (
                torch.autograd.grad(energy, inputs, allow_unused=True, materialize_grads=True)
                if forces or stress
                else []
            )
        out = {"energy": float(energy.detach())}
        if forces:
            out["forces"] = -grads[0].detach().to(torch.float64).cpu().numpy().reshape(n, 3)
        if stress:
            full = (
                grads[1].detach().to(torch.float64).cpu().numpy().reshape(3, 3)
                / structure.get_volume()
            )
            out["stress"] = full_3x3_to_voigt_6_stress(full)
        if not all(np.all(np.isfinite(v)) for v in out.values()):
            from mlip_unc.calculator import NonFiniteResultError

            raise NonFiniteResultError(
                f"non-finite bias for a structure of {n} atoms ({structure.get_chemical_formula()})"
            )
        return out


def biased_calculator(calc: Any, settings: Any) -> Any:
    """``calc`` wrapped in a :class:`BiasedCalculator` per ``settings`` (an
    :class:`~mlip_unc.config.MDSettings`: ``bias``, ``bias_strength``, ``bias_width``), or
    ``calc`` itself when ``settings.bias`` is ``none``."""
    kind = getattr(settings, "bias", "none")
    if kind == "none":
        return calc
    return BiasedCalculator(calc, kind, settings.bias_strength, settings.bias_width)
