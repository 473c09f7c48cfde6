"""BayesianPotential: a backbone's per-atom latents under a Bayesian linear energy head.

As defined in docs/method.md section 3 of this project (not the paper's code)::

    E = sum_a ( w^T z~_a + b_{Z_a} ),   w ~ q(w) = N(mu, diag(s2)),   Phi = sum_a z~_a
    z~_a = z_a - z_iso(Z_a)

``b`` are deterministic per-element offsets (buffers). ``z_iso(Z)`` is the backbone's latent of
an isolated atom of element ``Z`` (the same backbone run on one atom without neighbours), so an
isolated atom gets exactly its offset ``b_Z`` with zero epistemic variance, whatever the
backbone (species embeddings make ``z_iso`` non-zero otherwise). Switch it off with
``isolated_reference=False`` for a backbone that cannot run on edge-less graphs.

Forces are ``-dE/dr`` by autograd; stress is ``(1/V) dE/d(strain)`` (ASE sign) for periodic
graphs with a non-zero volume and 0 otherwise (:mod:`mlip_unc.models.derivatives`).
Uncertainty modes (:class:`UncertaintyMode`) add the closed-form energy variances, and the
exact or sampled force/stress variances (:mod:`mlip_unc.models.potential_uncertainty`).
The backbone follows the contract of :mod:`mlip_unc.models.backbones`; checkpoints are plain
data (:mod:`mlip_unc.models.potential_checkpoint`).
"""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlip_unc import keys
from mlip_unc.models.backbones import (
    BACKBONES,
    Backbone,
    BackboneState,
    build_backbone,
    isolated_atoms_batch,
)
from mlip_unc.models.checkpoint import save_checkpoint
from mlip_unc.models.derivatives import (
    PotentialState,
    atom_types,
    differentiable_inputs,
    forces_and_stress,
    graph_index,
    num_graphs,
)
from mlip_unc.models.full_posterior import FullPosteriorHolder, posterior_uncertainty
from mlip_unc.models.potential_checkpoint import (
    potential_config,
    potential_from_checkpoint,
    potential_payload,
)
from mlip_unc.models.potential_uncertainty import UncertaintyMode, noise_variances
from mlip_unc.models.sampling import sample_forward
from mlip_unc.nn.bayesian import BayesianLinear, inverse_softplus

if TYPE_CHECKING:
    from torch_geometric.data.data import BaseData

# Re-exported for importers that predate the split: models.backbones, models.potential_uncertainty.
__all__ = ["BayesianPotential", "UncertaintyMode", "Backbone", "BACKBONES", "build_backbone"]


class BayesianPotential(FullPosteriorHolder, nn.Module):
    """Interatomic potential with a Bayesian linear energy head on per-atom latents.

    Args:
        backbone: module following the backbone contract (:mod:`mlip_unc.models.backbones`).
        type_map: atomic numbers of the species, in ``atom_type`` order.
        r_max: neighbour-list cutoff of the graphs (Angstrom); must be >= ``backbone.r_max``.
        atomic_energies: ``(n_types,)`` per-element energy offsets ``b`` (eV), deterministic
            buffers; zeros if omitted.
        prior_std: prior std ``sigma_p`` of the head weights.
        init_std: initial posterior std of the head weights.
        energy_noise: initial per-atom energy noise ``sigma_e`` (eV/atom). The per-atom noises
            are independent, so the energy's aleatoric variance is ``n_atoms * sigma_e^2``
            (its std grows like ``sqrt(n_atoms)``).
        force_noise: initial force noise ``sigma_f`` (eV/Angstrom), per component.
        learn_noise: make ``sigma_e`` and ``sigma_f`` learnable (softplus-parametrised).
        isolated_reference: subtract the isolated-atom latent ``z_iso(Z)`` (module docstring).
        gradient_method: ``"auto"``, ``"batched"`` or ``"loop"``: how the d (exact) or K+1
            (sampled) vector-Jacobian products are run (see
            :func:`mlip_unc.uncertainty.moments.linear_gradients`; batched is the faster on
            small structures, the loop needs the least memory).
        full_posterior: hold a full-covariance last-layer posterior (buffers; set by
            :meth:`set_full_posterior`, fitted by ``mlip_unc.posthoc.posterior``).
        posterior_rank: directions of the ``lowrank`` uncertainty mode.
        posterior_basis: ``"shared"`` or ``"per_element"``: the weight space of the full
            posterior (:mod:`mlip_unc.models.full_posterior`).
    """

    z_to_index: Tensor  # (max Z + 1,) buffer: atomic number -> atom_type, -1 if absent

    def __init__(
        self,
        backbone: nn.Module,
        type_map: list[int],
        r_max: float,
        atomic_energies: Tensor | None = None,
        *,
        prior_std: float = 1.0,
        init_std: float = 0.1,
        energy_noise: float = 0.01,
        force_noise: float = 0.1,
        learn_noise: bool = True,
        isolated_reference: bool = True,
        gradient_method: str = "auto",
        full_posterior: bool = False,
        posterior_rank: int = 4,
        posterior_basis: str = "shared",
    ) -> None:
        super().__init__()
        latent_dim = getattr(backbone, "latent_dim", None)
        if not isinstance(latent_dim, int):
            raise TypeError("the backbone needs an int attribute 'latent_dim'")
        backbone_r_max = getattr(backbone, "r_max", None)
        if backbone_r_max is not None and backbone_r_max > r_max + 1e-12:
            raise ValueError(
                f"the backbone's cutoff ({backbone_r_max}) exceeds the graphs' r_max ({r_max}); "
                "neighbours between the two radii would be missing"
            )
        if gradient_method not in ("auto", "loop", "batched"):
            raise ValueError(f"unknown gradient_method {gradient_method!r}")
        self.backbone = backbone
        self.type_map = [int(z) for z in type_map]
        if len(set(self.type_map)) != len(self.type_map):
            raise ValueError(f"type_map has repeated elements: {self.type_map}")
        self.r_max = float(r_max)
        self.latent_dim = int(latent_dim)
        self.isolated_reference = bool(isolated_reference)
        self.gradient_method = gradient_method
        self._noise_config = {
            "energy_noise": float(energy_noise),
            "force_noise": float(force_noise),
            "learn_noise": bool(learn_noise),
        }
        self.head = BayesianLinear(
            self.latent_dim, 1, bias=False, prior_std=prior_std, init_std=init_std
        )
        n_types = len(self.type_map)
        if atomic_energies is None:
            atomic_energies = torch.zeros(n_types)
        if not (isinstance(atomic_energies, Tensor) and atomic_energies.is_floating_point()):
            atomic_energies = torch.as_tensor(
                atomic_energies, dtype=torch.float64
            )  # keep precision
        atomic_energies = atomic_energies.detach().reshape(-1)
        if atomic_energies.shape[0] != n_types:
            raise ValueError(
                f"atomic_energies has {atomic_energies.shape[0]} entries for {n_types} types"
            )
        self.register_buffer("atomic_energies", atomic_energies.clone())  # (n_types,) eV
        z_to_index = torch.full((max(self.type_map) + 1,), -1, dtype=torch.long)
        z_to_index[torch.tensor(self.type_map)] = torch.arange(n_types)
        self.register_buffer("z_to_index", z_to_index, persistent=False)
        rho_e = torch.tensor(inverse_softplus(energy_noise))
        rho_f = torch.tensor(inverse_softplus(force_noise))
        if learn_noise:
            self.energy_noise_rho = nn.Parameter(rho_e)
            self.force_noise_rho = nn.Parameter(rho_f)
        else:
            self.register_buffer("energy_noise_rho", rho_e)
            self.register_buffer("force_noise_rho", rho_f)
        self._iso_cache: tuple[Any, Tensor] | None = None
        self.posterior_rank = int(posterior_rank)
        self.posterior_basis = str(getattr(posterior_basis, "value", posterior_basis))
        if self.posterior_basis not in ("shared", "per_element"):
            raise ValueError(
                f"posterior_basis must be 'shared' or 'per_element', got {posterior_basis!r}"
            )
        if full_posterior:
            width = self.posterior_width
            self.set_full_posterior(
                torch.zeros(width, width, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
            )

    def reset_parameters(self) -> None:
        """Re-initialise the backbone (if it can), the head and the noise scales."""
        reset = getattr(self.backbone, "reset_parameters", None)
        if reset is not None:
            reset()
        self.head.reset_parameters()
        with torch.no_grad():
            self.energy_noise_rho.fill_(inverse_softplus(self._noise_config["energy_noise"]))
            self.force_noise_rho.fill_(inverse_softplus(self._noise_config["force_noise"]))

    def extra_repr(self) -> str:
        return (
            f"type_map={self.type_map}, r_max={self.r_max}, latent_dim={self.latent_dim}, "
            f"isolated_reference={self.isolated_reference}"
        )

    # ------------------------------------------------------------------ posterior and noise
    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight_mu.dtype

    def posterior(self) -> tuple[Tensor, Tensor]:
        """Head posterior ``(mu (d,), s2 (d,))`` (live tensors; detach for metrics)."""
        return self.head.weight_mu[0], self.head.weight_var[0]

    def kl(self) -> Tensor:
        """KL(q || p) of the head weights (closed form)."""
        return self.head.kl()

    @property
    def energy_noise(self) -> Tensor:
        """Per-atom energy noise std ``sigma_e`` (eV/atom)."""
        return F.softplus(self.energy_noise_rho)

    @property
    def force_noise(self) -> Tensor:
        """Force noise std ``sigma_f`` per component (eV/Angstrom)."""
        return F.softplus(self.force_noise_rho)

    @property
    def noise_config(self) -> dict[str, Any]:
        """The noise constructor arguments ``energy_noise``, ``force_noise``, ``learn_noise``."""
        return dict(self._noise_config)

    def noise_variances(self, batch: BaseData) -> dict[str, Tensor]:
        """Aleatoric variances: ``{ENERGY: (n_graphs,) n_atoms sigma_e^2, FORCES: (n_atoms, 3)}``
        (the calibrated noises when a full posterior is attached)."""
        post = self.full_posterior()
        if post is not None:
            dtype = self.dtype
            return noise_variances(
                batch, post.energy_noise_var.to(dtype), post.force_noise_var.to(dtype)
            )
        return noise_variances(batch, self.energy_noise.square(), self.force_noise.square())

    def atom_types(self, batch: BaseData) -> Tensor:
        """``(n_atoms,)`` ``atom_type`` in this model's type map (from ``atomic_numbers`` when present)."""
        return atom_types(batch, self.z_to_index, self.type_map)

    # ------------------------------------------------------------------ latents
    def _isolated_batch(self) -> Any:
        return isolated_atoms_batch(
            self.type_map, dtype=self.dtype, device=self.atomic_energies.device
        )

    def isolated_latents(self) -> Tensor:
        """``z_iso (n_types, d)``: the backbone's latents of isolated atoms of each species.

        In training mode they are recomputed (differentiable) at every call; in eval mode they
        are cached, detached, until a backbone parameter or buffer changes.
        """
        if self.training:
            return self.backbone(self._isolated_batch())
        tensors = list(self.backbone.parameters()) + list(self.backbone.buffers())
        key = (
            self.dtype,
            str(self.atomic_energies.device),
            tuple((id(t), t._version) for t in tensors),
        )
        if self._iso_cache is None or self._iso_cache[0] != key:
            with torch.no_grad():
                self._iso_cache = (key, self.backbone(self._isolated_batch()).detach())
        return self._iso_cache[1]

    def _latents(
        self, batch: BaseData, pos: Tensor, cell: Tensor, atom_type: Tensor
    ) -> tuple[Tensor, Tensor | None]:
        """``z~ (n_atoms, d)``: the backbone on ``batch`` with the given (strained) geometry, and its
        own per-atom energies ``(n_atoms,)`` or None (``latents_and_energies``, models/backbones.py)."""
        inputs = copy.copy(batch)
        inputs[keys.POSITIONS] = pos
        inputs[keys.CELL] = cell
        inputs[keys.ATOM_TYPE] = atom_type
        if getattr(batch, keys.CELL_SHIFT, None) is None:
            inputs[keys.CELL_SHIFT] = pos.new_zeros(batch[keys.EDGE_INDEX].shape[1], 3)
        both = getattr(self.backbone, "latents_and_energies", None)
        z, base = (
            both(inputs) if both is not None else (self.backbone(inputs), None)
        )  # (n_atoms, d)
        if z.shape != (pos.shape[0], self.latent_dim):
            raise ValueError(
                f"the backbone returned {tuple(z.shape)}, expected "
                f"({pos.shape[0]}, {self.latent_dim})"
            )
        if self.isolated_reference:
            z = z - self.isolated_latents().to(z.dtype)[atom_type]
        return z, base

    def _state(self, batch: BaseData, *, forces: bool, stress: bool) -> PotentialState:
        """Positions (and strain) as differentiable inputs, latents and per-graph sums."""
        graph = graph_index(batch)
        n_graphs = num_graphs(batch, graph)
        pos = batch[keys.POSITIONS].to(self.dtype)
        cell = getattr(batch, keys.CELL, None)
        cell = (
            pos.new_zeros(n_graphs, 3, 3) if cell is None else cell.to(self.dtype).reshape(-1, 3, 3)
        )
        pos, cell_strained, inputs, strain = differentiable_inputs(
            pos, cell, graph, n_graphs, forces=forces, stress=stress
        )
        atom_type = self.atom_types(batch)
        z, base = self._latents(
            batch, pos, cell_strained, atom_type
        )  # (n_atoms, d), (n_atoms,) or None
        phi = z.new_zeros(n_graphs, self.latent_dim).index_add_(0, graph, z)  # (n_graphs, d)
        return BackboneState(
            batch=batch,
            graph=graph,
            n_graphs=n_graphs,
            inputs=inputs,
            strain=strain,
            cell=cell,
            atom_type=atom_type,
            z=z,
            phi=phi,
            base_energy=base,
        )

    def _energies(self, state: PotentialState, *, weights: Tensor) -> dict[str, Tensor]:
        """Per-atom and total energies for head weights ``(d,)`` or per atom ``(n_atoms, d)``."""
        z = state.z
        offsets = self.atomic_energies.to(z.dtype)[state.atom_type]  # (n_atoms,)
        latent_part = z @ weights if weights.dim() == 1 else (z * weights).sum(-1)
        base = getattr(
            state, "base_energy", None
        )  # the backbone's own energies (models/backbones.py)
        atomic = (
            latent_part + offsets if base is None else latent_part + offsets + base
        )  # (n_atoms,)
        energy = atomic.new_zeros(state.n_graphs).index_add_(0, state.graph, atomic)
        return {
            keys.ENERGY: energy,
            keys.ATOMIC_ENERGIES: atomic,
            keys.NODE_LATENT: z,
            keys.LATENT: state.phi,
        }

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        batch: BaseData,
        *,
        compute_forces: bool = True,
        compute_stress: bool = False,
        uncertainty: UncertaintyMode | str = UncertaintyMode.NONE,
        n_samples: int = 4,
        generator: torch.Generator | None = None,
        training: bool = False,
    ) -> dict[str, Tensor]:
        """Energies (and forces, stress, uncertainties) of a PyG graph or batch.

        Args:
            batch: graph(s) with the fields of :mod:`mlip_unc.keys` (``pos``, ``edge_index``,
                ``atomic_numbers`` or ``atom_type``, and ``cell``/``cell_shift``/``pbc`` for
                periodic ones).
            compute_forces: add FORCES (one backward pass). Exact and sampled modes always
                return forces (they come free with the variances).
            compute_stress: add STRESS (and STRESS_VAR in exact/sampled modes).
            uncertainty: a :class:`UncertaintyMode`.
            n_samples: posterior draws K of the sampled mode (>= 2).
            generator: random generator for the sampled mode and for ``training=True``.
            training: draw one weight sample per graph (reparameterised, so gradients reach
                mu and rho) and keep the graph of forces/stress for the loss; see
                :meth:`sample_forward`.

        Returns:
            always ENERGY (n_graphs,), ATOMIC_ENERGIES (n_atoms,), NODE_LATENT (n_atoms, d),
            LATENT (n_graphs, d); FORCES (n_atoms, 3) and STRESS (n_graphs, 3, 3) when asked;
            ENERGY_VAR, ENERGY_EPISTEMIC_VAR, ENERGY_ALEATORIC_VAR (n_graphs,),
            LOCAL_ENERGY_VAR (n_atoms,), KAPPA (n_graphs,) in every mode but "none";
            FORCES_VAR (n_atoms, 3) and, with stress, STRESS_VAR (n_graphs, 3, 3) in the
            exact and sampled modes (epistemic only; add ``noise_variances`` for the total).
        """
        mode = UncertaintyMode(uncertainty)
        if training:
            return self.sample_forward(
                batch,
                generator=generator,
                compute_forces=compute_forces,
                compute_stress=compute_stress,
                uncertainty=mode,
            )
        needs_grad = mode in (
            UncertaintyMode.EXACT,
            UncertaintyMode.SAMPLED,
            UncertaintyMode.LOWRANK,
            UncertaintyMode.SKETCH,
            UncertaintyMode.AUTO,
        )
        compute_forces = compute_forces or needs_grad
        if mode is UncertaintyMode.SAMPLED and n_samples < 2:
            raise ValueError(f"the sampled mode needs n_samples >= 2, got {n_samples}")
        with torch.set_grad_enabled(torch.is_grad_enabled() or compute_forces or compute_stress):
            state = self._state(batch, forces=compute_forces, stress=compute_stress)
            mu, s2 = self.posterior()
            out = self._energies(state, weights=mu)
            if mode is not UncertaintyMode.NONE:
                out.update(
                    posterior_uncertainty(
                        self, state, mode, n_samples=n_samples, generator=generator
                    )
                )
            if keys.FORCES not in out and (compute_forces or compute_stress):
                grads = torch.autograd.grad(
                    out[keys.ENERGY].sum(), state.inputs, allow_unused=True, materialize_grads=True
                )
                out.update(forces_and_stress(state, list(grads)))
        return out

    def forward_kept(
        self, batch: BaseData, *, compute_stress: bool = False
    ) -> tuple[dict[str, Tensor], PotentialState]:
        """Energies, forces (stress) and the free energy uncertainties, with the autograd graph
        of the forward pass kept in the returned state, so that :meth:`uncertainty_from_state`
        adds the force (stress) uncertainties later without a second forward pass.

        Returns:
            (the outputs of ``forward(batch, uncertainty="energy")`` with FORCES (and STRESS),
            the state for :meth:`uncertainty_from_state`).
        """
        with torch.enable_grad():
            state = self._state(batch, forces=True, stress=compute_stress)
            mu, _ = self.posterior()
            out = self._energies(state, weights=mu)
            out.update(
                posterior_uncertainty(
                    self, state, UncertaintyMode.ENERGY, n_samples=2, generator=None
                )
            )
            grads = torch.autograd.grad(
                out[keys.ENERGY].sum(),
                state.inputs,
                retain_graph=True,  # kept for uncertainty_from_state
                allow_unused=True,
                materialize_grads=True,
            )
            out.update(forces_and_stress(state, list(grads)))
        return out, state

    def uncertainty_from_state(
        self,
        state: PotentialState,
        uncertainty: UncertaintyMode | str,
        *,
        n_samples: int = 4,
        generator: torch.Generator | None = None,
    ) -> dict[str, Tensor]:
        """The uncertainty outputs of ``forward(..., uncertainty=uncertainty)`` from the state of
        :meth:`forward_kept` (its graph is used up: call once per state)."""
        with torch.enable_grad():
            return posterior_uncertainty(
                self, state, UncertaintyMode(uncertainty), n_samples=n_samples, generator=generator
            )

    def sample_forward(
        self,
        batch: BaseData,
        *,
        generator: torch.Generator | None = None,
        compute_forces: bool = True,
        compute_stress: bool = False,
        uncertainty: UncertaintyMode | str = UncertaintyMode.NONE,
    ) -> dict[str, Tensor]:
        """Training forward: one reparameterised weight draw per graph (see
        :func:`mlip_unc.models.sampling.sample_forward`)."""
        return sample_forward(
            self,
            batch,
            generator=generator,
            compute_forces=compute_forces,
            compute_stress=compute_stress,
            uncertainty=uncertainty,
        )

    # ------------------------------------------------------------------ checkpoints
    def config(self) -> dict[str, Any]:
        """Everything needed to rebuild the model, as plain data (see :func:`potential_config`)."""
        return potential_config(self)

    def to_checkpoint(self) -> dict[str, Any]:
        """``{"kind": "potential", "config": ..., "model_state": ...}`` (plain data only)."""
        return potential_payload(self)

    def save(self, path: str | os.PathLike, **extra: Any) -> None:
        """Write :meth:`to_checkpoint` (plus ``extra`` entries) atomically to ``path``."""
        save_checkpoint(path, {**self.to_checkpoint(), **extra})

    @classmethod
    def from_checkpoint(
        cls,
        source: dict[str, Any] | str | os.PathLike,
        *,
        map_location: str | torch.device = "cpu",
        allow_incomplete: bool = False,
    ) -> BayesianPotential:
        """Rebuild from a :meth:`to_checkpoint` payload or a checkpoint file (weights_only load);
        a training run's model that was never finalised is refused with how to finish it
        (``allow_incomplete``: accepted, :func:`~mlip_unc.models.potential_checkpoint.incomplete_reason`)."""
        return potential_from_checkpoint(
            cls, source, map_location=map_location, allow_incomplete=allow_incomplete
        )
