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
graphs with a non-zero volume and 0 otherwise. Uncertainty modes (:class:`UncertaintyMode`)
add the closed-form energy variances, and the exact or sampled force/stress variances
(:mod:`mlip_unc.uncertainty.moments`).

**Backbone contract.** Any ``nn.Module`` with

- an int attribute ``latent_dim`` (= d),
- ``forward(batch) -> z (n_atoms, latent_dim)``: invariant per-atom latents, computed from
  ``batch.pos``, ``batch.cell``, ``batch.cell_shift``, ``batch.edge_index``, ``batch.batch`` and
  ``batch.atom_type`` with :func:`mlip_unc.data.neighbours.edge_vectors` (never from
  precomputed edge vectors), so that the potential can differentiate with respect to positions
  and strain;
- optionally ``r_max`` (checked against the potential's), ``reset_parameters()``, and, for
  checkpoints, ``backbone_name`` (a key of :data:`BACKBONES`) and ``config() -> dict`` of
  constructor kwargs.

This is how a frozen external backbone (e.g. a MACE model's per-atom features) can sit under
the Bayesian head.
"""

from __future__ import annotations

import copy
import os
from enum import Enum
from typing import Any, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.data import Data

from mlip_unc import keys
from mlip_unc.nn.bayesian import BayesianLinear, inverse_softplus
from mlip_unc.nn.equivariant import EquivariantBackbone
from mlip_unc.nn.geometric_gin import GeometricGIN
from mlip_unc.train.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from mlip_unc.uncertainty import moments

__all__ = [
    "Backbone",
    "BACKBONES",
    "build_backbone",
    "UncertaintyMode",
    "BayesianPotential",
]


@runtime_checkable
class Backbone(Protocol):
    """Per-atom invariant latents from a graph batch (see the module docstring)."""

    latent_dim: int

    def __call__(self, batch: Any) -> Tensor:  # (n_atoms, latent_dim)
        ...


BACKBONES: dict[str, type[nn.Module]] = {"gin": GeometricGIN, "equivariant": EquivariantBackbone}


def build_backbone(name: str, **kwargs: Any) -> nn.Module:
    """Build a registered backbone from plain data: ``"gin"`` or ``"equivariant"``."""
    try:
        cls = BACKBONES[name]
    except KeyError:
        raise ValueError(f"unknown backbone {name!r}; known: {sorted(BACKBONES)}") from None
    return cls(**kwargs)


class UncertaintyMode(str, Enum):
    """Which uncertainties :meth:`BayesianPotential.forward` adds to the mean predictions."""

    NONE = "none"
    """Means only (energy, per-atom energies, forces/stress when asked)."""
    ENERGY = "energy"
    """Closed-form energy variances from the forward pass alone (no extra backward):
    total, epistemic ``Phi^T S Phi``, aleatoric ``n_atoms sigma_e^2``, per-atom ``z^T S z``,
    and the alignment factor kappa."""
    SAMPLED = "sampled"
    """ENERGY plus force (and stress) variances from ``n_samples`` posterior weight draws that
    share the single forward pass: one vector-Jacobian product per draw (plus one for the
    mean forces), unbiased sample variance."""
    EXACT = "exact"
    """ENERGY plus exact force (and stress) variances ``sum_k s_k^2 (dPhi_k/dr)^2``:
    d vector-Jacobian products (one per latent coordinate; the mean forces come free),
    serving every graph of the batch."""


class BayesianPotential(nn.Module):
    """Interatomic potential with a Bayesian linear energy head on per-atom latents.

    Args:
        backbone: module following the backbone contract (module docstring).
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
            :func:`mlip_unc.uncertainty.moments.linear_gradients`; batched measured fastest
            here, the loop needs the least memory).
    """

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
    ) -> None:
        super().__init__()
        if not isinstance(getattr(backbone, "latent_dim", None), int):
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
        self.latent_dim = int(backbone.latent_dim)
        self.isolated_reference = bool(isolated_reference)
        self.gradient_method = gradient_method
        self._noise_config = {
            "energy_noise": float(energy_noise), "force_noise": float(force_noise),
            "learn_noise": bool(learn_noise),
        }
        self.head = BayesianLinear(
            self.latent_dim, 1, bias=False, prior_std=prior_std, init_std=init_std
        )
        n_types = len(self.type_map)
        if atomic_energies is None:
            atomic_energies = torch.zeros(n_types)
        if not (isinstance(atomic_energies, Tensor) and atomic_energies.is_floating_point()):
            atomic_energies = torch.as_tensor(atomic_energies, dtype=torch.float64)  # keep precision
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

    def reset_parameters(self) -> None:
        """Re-initialise the backbone (if it can), the head and the noise scales."""
        if hasattr(self.backbone, "reset_parameters"):
            self.backbone.reset_parameters()
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

    def noise_variances(self, batch) -> dict[str, Tensor]:
        """Aleatoric variances: ``{ENERGY: (n_graphs,) n_atoms sigma_e^2, FORCES: (n_atoms, 3)}``."""
        graph = self._graph_index(batch)
        n_atoms = torch.bincount(graph, minlength=self._num_graphs(batch, graph))
        forces = self.force_noise.square().expand(graph.shape[0], 3)
        return {
            keys.ENERGY: moments.energy_aleatoric_variance(n_atoms, self.energy_noise.square()),
            keys.FORCES: forces,
        }

    # ------------------------------------------------------------------ batch helpers
    @staticmethod
    def _graph_index(batch) -> Tensor:
        graph = getattr(batch, keys.BATCH, None)
        if graph is None:
            pos = batch[keys.POSITIONS]
            graph = torch.zeros(pos.shape[0], dtype=torch.long, device=pos.device)
        return graph

    @staticmethod
    def _num_graphs(batch, graph: Tensor) -> int:
        n = getattr(batch, "num_graphs", None)
        if isinstance(n, int):
            return n
        cell = getattr(batch, keys.CELL, None)
        if cell is not None:
            return cell.reshape(-1, 3, 3).shape[0]
        return int(graph.max().item()) + 1 if graph.numel() else 1

    def atom_types(self, batch) -> Tensor:
        """``atom_type`` in this model's type map (from ``atomic_numbers`` when present)."""
        numbers = getattr(batch, keys.ATOMIC_NUMBERS, None)
        if numbers is None:
            return batch[keys.ATOM_TYPE]
        numbers = numbers.reshape(-1)
        if numbers.numel() and int(numbers.max()) >= self.z_to_index.shape[0]:
            raise ValueError(f"element {int(numbers.max())} is not in the type map {self.type_map}")
        types = self.z_to_index[numbers]
        if (types < 0).any():
            missing = sorted(set(numbers[types < 0].tolist()))
            raise ValueError(f"elements {missing} are not in the type map {self.type_map}")
        return types

    # ------------------------------------------------------------------ latents
    def _isolated_batch(self) -> Data:
        n, device, dtype = len(self.type_map), self.atomic_energies.device, self.dtype
        return Data(
            pos=torch.zeros(n, 3, dtype=dtype, device=device),
            atom_type=torch.arange(n, device=device),
            atomic_numbers=torch.tensor(self.type_map, device=device),
            edge_index=torch.zeros(2, 0, dtype=torch.long, device=device),
            cell_shift=torch.zeros(0, 3, dtype=dtype, device=device),
            cell=torch.zeros(n, 3, 3, dtype=dtype, device=device),
            pbc=torch.zeros(n, 3, dtype=torch.bool, device=device),
            num_atoms=torch.ones(n, dtype=torch.long, device=device),
            batch=torch.arange(n, device=device),
        )

    def isolated_latents(self) -> Tensor:
        """``z_iso (n_types, d)``: the backbone's latents of isolated atoms of each species.

        In training mode they are recomputed (differentiable) at every call; in eval mode they
        are cached, detached, until a backbone parameter or buffer changes.
        """
        if self.training:
            return self.backbone(self._isolated_batch())
        tensors = list(self.backbone.parameters()) + list(self.backbone.buffers())
        key = (self.dtype, str(self.atomic_energies.device), tuple((id(t), t._version) for t in tensors))
        if self._iso_cache is None or self._iso_cache[0] != key:
            with torch.no_grad():
                self._iso_cache = (key, self.backbone(self._isolated_batch()).detach())
        return self._iso_cache[1]

    def _latents(self, batch, pos: Tensor, cell: Tensor, atom_type: Tensor) -> Tensor:
        inputs = copy.copy(batch)
        inputs[keys.POSITIONS] = pos
        inputs[keys.CELL] = cell
        inputs[keys.ATOM_TYPE] = atom_type
        if getattr(batch, keys.CELL_SHIFT, None) is None:
            inputs[keys.CELL_SHIFT] = pos.new_zeros(batch[keys.EDGE_INDEX].shape[1], 3)
        z = self.backbone(inputs)  # (n_atoms, d)
        if z.shape != (pos.shape[0], self.latent_dim):
            raise ValueError(
                f"the backbone returned {tuple(z.shape)}, expected "
                f"({pos.shape[0]}, {self.latent_dim})"
            )
        if self.isolated_reference:
            z = z - self.isolated_latents().to(z.dtype)[atom_type]
        return z

    # ------------------------------------------------------------------ forward
    def forward(
        self,
        batch,
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
                batch, generator=generator, compute_forces=compute_forces,
                compute_stress=compute_stress, uncertainty=mode,
            )
        needs_grad = mode in (UncertaintyMode.EXACT, UncertaintyMode.SAMPLED)
        compute_forces = compute_forces or needs_grad
        if mode is UncertaintyMode.SAMPLED and n_samples < 2:
            raise ValueError(f"the sampled mode needs n_samples >= 2, got {n_samples}")
        with torch.set_grad_enabled(torch.is_grad_enabled() or compute_forces or compute_stress):
            state = self._state(batch, forces=compute_forces, stress=compute_stress)
            mu, s2 = self.posterior()
            out = self._energies(state, weights=mu)
            if mode is not UncertaintyMode.NONE:
                out.update(self._energy_uncertainty(state, s2))
            if mode is UncertaintyMode.EXACT:
                eye = torch.eye(self.latent_dim, dtype=mu.dtype, device=mu.device)
                grads = self._gradients(state, eye)
                out.update(self._derivatives(state, [torch.tensordot(mu, g, dims=1) for g in grads]))
                out.update(self._derivative_variances(state, grads, s2=s2))
            elif mode is UncertaintyMode.SAMPLED:
                with torch.no_grad():
                    w, _ = self.head.sample_weights(n_samples, generator=generator)
                weights = torch.cat([mu.detach()[None], w[:, 0, :]])  # (K+1, d)
                grads = self._gradients(state, weights)
                out.update(self._derivatives(state, [g[0] for g in grads]))
                out.update(self._derivative_variances(state, [g[1:] for g in grads], s2=None))
            elif compute_forces or compute_stress:
                grads = torch.autograd.grad(
                    out[keys.ENERGY].sum(), state["inputs"], allow_unused=True, materialize_grads=True
                )
                out.update(self._derivatives(state, list(grads)))
        return out

    def sample_forward(
        self,
        batch,
        *,
        generator: torch.Generator | None = None,
        compute_forces: bool = True,
        compute_stress: bool = False,
        uncertainty: UncertaintyMode | str = UncertaintyMode.NONE,
    ) -> dict[str, Tensor]:
        """Training forward: one reparameterised weight draw per graph.

        ``w_g = mu + s * eps_g`` for each graph g (independent across the graphs of the batch;
        one shared draw per graph keeps energy and forces consistent), ``E_g = w_g^T Phi_g +
        offsets``, forces/stress by one backward pass with ``create_graph=True``, so the loss
        trains mu, rho (through the forces too) and the backbone. ``uncertainty`` may be
        "none" or "energy" (differentiable closed-form energy variances, e.g. for alignment
        regularisers).
        """
        mode = UncertaintyMode(uncertainty)
        if mode not in (UncertaintyMode.NONE, UncertaintyMode.ENERGY):
            raise ValueError(
                f"sample_forward supports uncertainty 'none' or 'energy', not {mode.value!r}"
            )
        with torch.enable_grad():
            state = self._state(batch, forces=compute_forces, stress=compute_stress)
            mu, s2 = self.posterior()
            n_graphs = state["n_graphs"]
            eps = torch.randn(
                (n_graphs, self.latent_dim), generator=generator, dtype=mu.dtype, device=mu.device
            )
            weights = mu + self.head.weight_std[0] * eps  # (n_graphs, d), reparameterised
            out = self._energies(state, weights=weights[state["graph"]])
            if mode is UncertaintyMode.ENERGY:
                out.update(self._energy_uncertainty(state, s2))
            if compute_forces or compute_stress:
                grads = torch.autograd.grad(
                    out[keys.ENERGY].sum(), state["inputs"], create_graph=True,
                    allow_unused=True, materialize_grads=True,
                )
                out.update(self._derivatives(state, list(grads)))
        return out

    # ------------------------------------------------------------------ forward pieces
    def _state(self, batch, *, forces: bool, stress: bool) -> dict[str, Any]:
        """Positions (and strain) as differentiable inputs, latents and per-graph sums."""
        graph = self._graph_index(batch)
        n_graphs = self._num_graphs(batch, graph)
        pos = batch[keys.POSITIONS].to(self.dtype)
        cell = getattr(batch, keys.CELL, None)
        cell = pos.new_zeros(n_graphs, 3, 3) if cell is None else cell.to(self.dtype).reshape(-1, 3, 3)
        inputs: list[Tensor] = []
        if forces or stress:
            if not pos.requires_grad:
                pos = pos.detach().requires_grad_(True)
            inputs.append(pos)
        strain = None
        if stress:
            strain = pos.new_zeros(n_graphs, 3, 3, requires_grad=True)
            inputs.append(strain)
            sym = 0.5 * (strain + strain.transpose(-1, -2))  # (n_graphs, 3, 3)
            pos = pos + torch.einsum("ni,nij->nj", pos, sym[graph])
            cell_strained = cell + torch.bmm(cell, sym)
        else:
            cell_strained = cell
        atom_type = self.atom_types(batch)
        z = self._latents(batch, pos, cell_strained, atom_type)  # (n_atoms, d)
        phi = z.new_zeros(n_graphs, self.latent_dim).index_add_(0, graph, z)  # (n_graphs, d)
        return {
            "graph": graph, "n_graphs": n_graphs, "inputs": inputs, "strain": strain,
            "cell": cell, "atom_type": atom_type, "z": z, "phi": phi, "batch": batch,
        }

    def _energies(self, state: dict[str, Any], *, weights: Tensor) -> dict[str, Tensor]:
        """Per-atom and total energies for head weights ``(d,)`` or per atom ``(n_atoms, d)``."""
        z = state["z"]
        offsets = self.atomic_energies.to(z.dtype)[state["atom_type"]]  # (n_atoms,)
        latent_part = z @ weights if weights.dim() == 1 else (z * weights).sum(-1)
        atomic = latent_part + offsets  # (n_atoms,)
        energy = atomic.new_zeros(state["n_graphs"]).index_add_(0, state["graph"], atomic)
        return {
            keys.ENERGY: energy,
            keys.ATOMIC_ENERGIES: atomic,
            keys.NODE_LATENT: z,
            keys.LATENT: state["phi"],
        }

    def _energy_uncertainty(self, state: dict[str, Any], s2: Tensor) -> dict[str, Tensor]:
        phi, graph = state["phi"], state["graph"]
        epistemic = moments.energy_variance(phi, s2)
        n_atoms = torch.bincount(graph, minlength=state["n_graphs"])
        aleatoric = moments.energy_aleatoric_variance(n_atoms, self.energy_noise.square())
        return {
            keys.ENERGY_VAR: epistemic + aleatoric,
            keys.ENERGY_EPISTEMIC_VAR: epistemic,
            keys.ENERGY_ALEATORIC_VAR: aleatoric,
            keys.LOCAL_ENERGY_VAR: moments.local_energy_variance(state["z"], s2),
            keys.KAPPA: moments.alignment_kappa(phi, s2),
        }

    def _gradients(self, state: dict[str, Any], weights: Tensor) -> list[Tensor]:
        """``d(Phi @ w_k).sum() / d inputs`` for each row of ``weights (K, d)``."""
        grads = moments.linear_gradients(
            state["phi"], state["inputs"], weights, method=self.gradient_method
        )
        return list(grads)

    def _inverse_volume(self, state: dict[str, Any]) -> Tensor:
        """``1/V`` for periodic graphs with a non-zero volume, 0 otherwise ``(n_graphs,)``."""
        cell = state["cell"]
        volume = torch.linalg.det(cell).abs()  # (n_graphs,)
        pbc = getattr(state["batch"], keys.PBC, None)
        periodic = volume > 0
        if pbc is not None:
            periodic = periodic & pbc.reshape(-1, 3).any(-1)
        return torch.where(periodic, 1.0 / torch.where(periodic, volume, torch.ones_like(volume)), 0.0)

    def _derivatives(self, state: dict[str, Any], grads: list[Tensor]) -> dict[str, Tensor]:
        """FORCES/STRESS from the gradients of the energy w.r.t. [pos, (strain)]."""
        out: dict[str, Tensor] = {keys.FORCES: -grads[0]}
        if state["strain"] is not None:
            out[keys.STRESS] = grads[1] * self._inverse_volume(state)[:, None, None]
        return out

    def _derivative_variances(
        self, state: dict[str, Any], grads: list[Tensor], *, s2: Tensor | None
    ) -> dict[str, Tensor]:
        """Exact (``s2`` given, grads ``(d, ...)``) or sampled (grads ``(K, ...)``) variances."""
        var = (lambda g: moments.gradient_variance(g, s2)) if s2 is not None else moments.sample_variance
        out = {keys.FORCES_VAR: var(grads[0])}
        if state["strain"] is not None:
            out[keys.STRESS_VAR] = var(grads[1]) * self._inverse_volume(state).square()[:, None, None]
        return out

    # ------------------------------------------------------------------ checkpoints
    def config(self) -> dict[str, Any]:
        """Everything needed to rebuild the model, as plain data."""
        name = getattr(self.backbone, "backbone_name", None)
        if name not in BACKBONES or not hasattr(self.backbone, "config"):
            raise ValueError(
                f"cannot checkpoint backbone {type(self.backbone).__name__}: only registered "
                f"backbones ({sorted(BACKBONES)}) with a config() can be rebuilt from plain data"
            )
        return {
            "backbone": {"name": name, "kwargs": self.backbone.config()},
            "type_map": list(self.type_map),
            "r_max": self.r_max,
            "atomic_energies": self.atomic_energies.tolist(),
            "head": {"prior_std": self.head.prior_std, "init_std": self.head.init_std},
            "noise": dict(self._noise_config),
            "isolated_reference": self.isolated_reference,
            "gradient_method": self.gradient_method,
            "dtype": str(self.dtype).removeprefix("torch."),
        }

    def to_checkpoint(self) -> dict[str, Any]:
        """``{"kind": "potential", "config": ..., "model_state": ...}`` (plain data only)."""
        state = {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}
        return {"kind": "potential", "config": self.config(), "model_state": state}

    def save(self, path: str | os.PathLike, **extra: Any) -> None:
        """Write :meth:`to_checkpoint` (plus ``extra`` entries) atomically to ``path``."""
        save_checkpoint(path, {**self.to_checkpoint(), **extra})

    @classmethod
    def from_checkpoint(
        cls, source: dict[str, Any] | str | os.PathLike, *, map_location: str | torch.device = "cpu"
    ) -> BayesianPotential:
        """Rebuild from a :meth:`to_checkpoint` payload or a checkpoint file (weights_only load)."""
        if isinstance(source, dict):
            payload = source
            if payload.get("kind") != "potential":
                raise CheckpointError(
                    f"payload holds a {payload.get('kind')!r} model, expected 'potential'"
                )
        else:
            payload = load_checkpoint(source, map_location=map_location, kind="potential")
        cfg = payload["config"]
        backbone = build_backbone(cfg["backbone"]["name"], **cfg["backbone"]["kwargs"])
        model = cls(
            backbone,
            cfg["type_map"],
            cfg["r_max"],
            torch.tensor(cfg["atomic_energies"], dtype=torch.float64),
            prior_std=cfg["head"]["prior_std"],
            init_std=cfg["head"]["init_std"],
            isolated_reference=cfg["isolated_reference"],
            gradient_method=cfg.get("gradient_method", "auto"),
            **cfg["noise"],
        )
        model.to(getattr(torch, cfg.get("dtype", "float32")))
        model.load_state_dict(payload["model_state"])
        return model.to(map_location)
