"""A full-covariance last-layer posterior over the energy head (docs/method.md section 3b).

After training, the last-layer prediction-rigidity posterior (LLPR, Bigi et al. 2024)::

    Sigma = (sum_frames Phi Phi^T / sigma_E^2 + sum_frames J J^T / sigma_F^2 + lambda I)^-1

is stored as a factor ``L (d, d)`` with ``Sigma = L^T L``, rows ``sqrt(sigma_k) v_k^T`` sorted by
decreasing eigenvalue ``sigma_k`` of ``Sigma`` (the least constrained directions first), plus
calibration scalars fitted on validation data by NLL (``mlip_unc.posthoc.posterior``):
``alpha_E^2, alpha_F^2`` scale the epistemic energy and force variances (``alpha_r^2`` the
low-rank force variance), ``sigma_e^2`` (per atom) and ``sigma_f^2`` (per component) are the
aleatoric noises::

    Var_epi[E]    = alpha_E^2 ||L Phi||^2                      (free with the forward pass)
    Var_epi[F_ic] = alpha_F^2 sum_k (d(l_k^T Phi)/dr_ic)^2     (k over all d rows: exact;
                                                                the first r rows: low rank)

The low-rank form needs r + 1 vector-Jacobian products (r directions plus the mean forces)
instead of d + 1, and keeps the directions along which the training data constrained the
head least: those where an unfamiliar Jacobian shows up. The stress uses ``alpha_F^2`` too.
The mean prediction is unchanged: the head's posterior mean ``mu``.

Basis (``BayesianPotential.posterior_basis``): ``shared`` is the head's own ``d`` weights with
``Phi = sum_atoms z``; ``per_element`` gives each element its own weight vector, features
``Phi_e = sum_{atoms of element e} z`` (``n_types * d``), posterior mean ``mu`` repeated per
element (so ``sum_e Phi_e . mu = Phi . mu``: the same predictions), and a covariance that lets
a direction be well constrained on one element and free on another. Every formula above holds
with ``Phi`` and ``z`` replaced by the per-element ones (:func:`basis_state`); the low-rank
mode still costs ``r + 1`` vector-Jacobian products, the exact one ``n_types * d + 1``.
How the two bases compare: docs/what-we-tried.md (posterior variants).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mlip_unc import keys
from mlip_unc.models.derivatives import (
    PotentialState,
    forces_and_stress,
    inverse_volume,
)
from mlip_unc.models.potential_uncertainty import (
    UncertaintyMode,
    energy_uncertainty,
    exact_derivatives,
    input_gradients,
    sampled_derivatives,
)
from mlip_unc.uncertainty import moments

if TYPE_CHECKING:  # the mixin's host is an nn.Module (BayesianPotential)
    from torch.nn import Module as _ModuleHost
    from torch_geometric.data.data import BaseData

    from mlip_unc.models.potential import BayesianPotential
else:
    _ModuleHost = object

__all__ = [
    "FullPosterior",
    "FullPosteriorHolder",
    "basis_state",
    "basis_mean",
    "full_energy_uncertainty",
    "full_derivatives",
    "latent_jacobian",
    "latent_probes",
    "diagonal_factor",
    "default_uncertainty_mode",
    "posterior_uncertainty",
    "resolve_mode",
    "sketch_rows",
    "LOWRANK_ATOM_DIRECTIONS",
]


@dataclass
class FullPosterior:
    """Plain view of the posterior buffers of a :class:`BayesianPotential`.

    Attributes:
        factor: ``(D, D)`` rows ``sqrt(sigma_k) v_k``, ``Sigma = factor^T factor`` (``D = n_blocks d``).
        calibration: ``(5,)`` ``[alpha_E^2, alpha_F^2, sigma_e^2, sigma_f^2, alpha_r^2]``;
            ``alpha_r^2`` scales the low-rank force variance (fitted for the model's
            ``posterior_rank`` at fitting time; the truncation keeps a fraction of the exact one).
    """

    factor: Tensor
    calibration: Tensor
    n_blocks: int = 1
    """Weight blocks of the basis: 1 (``shared``) or ``n_types`` (``per_element``); the factor
    is ``(n_blocks d, n_blocks d)``."""

    @property
    def alpha2_energy(self) -> Tensor:
        return self.calibration[0]

    @property
    def alpha2_forces(self) -> Tensor:
        return self.calibration[1]

    @property
    def alpha2_lowrank(self) -> Tensor:
        return self.calibration[4]

    @property
    def energy_noise_var(self) -> Tensor:
        """Per-atom aleatoric energy variance ``sigma_e^2``."""
        return self.calibration[2]

    @property
    def force_noise_var(self) -> Tensor:
        """Per-component aleatoric force variance ``sigma_f^2``."""
        return self.calibration[3]

    @property
    def covariance(self) -> Tensor:
        """``Sigma (d, d)`` before calibration."""
        return self.factor.T @ self.factor


class FullPosteriorHolder(_ModuleHost):
    """The full posterior's buffers and basis on a :class:`~mlip_unc.models.potential.BayesianPotential`
    (a mixin: it reads the model's ``latent_dim``, ``type_map``, ``posterior_basis``, ``dtype`` and
    ``atomic_energies``, and stores ``posterior_factor``, ``posterior_calibration`` as buffers)."""

    # read from the host model
    latent_dim: int
    type_map: list[int]
    posterior_basis: str
    atomic_energies: Tensor  # (n_types,) buffer
    # set by set_full_posterior (buffers)
    posterior_factor: Tensor  # (D, D)
    posterior_calibration: Tensor  # (5,)
    if TYPE_CHECKING:

        @property
        def dtype(self) -> torch.dtype: ...

    @property
    def posterior_blocks(self) -> int:
        """Weight blocks of the full posterior's basis: 1 (shared) or the number of types."""
        return len(self.type_map) if self.posterior_basis == "per_element" else 1

    @property
    def posterior_width(self) -> int:
        """``D = posterior_blocks * latent_dim``, the size of the full posterior's factor."""
        return self.posterior_blocks * self.latent_dim

    @property
    def has_full_posterior(self) -> bool:
        return hasattr(self, "posterior_factor")

    def full_posterior(self) -> FullPosterior | None:
        """The full-covariance posterior and its calibration, or None (the diagonal one)."""
        if not self.has_full_posterior:
            return None
        return FullPosterior(
            self.posterior_factor, self.posterior_calibration, self.posterior_blocks
        )

    def set_full_posterior(self, factor: Tensor, calibration: Tensor) -> None:
        """Attach ``factor (D, D)`` (``Sigma = factor^T factor``, rows by decreasing variance;
        ``D = posterior_width``) and ``calibration``
        ``[alpha_E^2, alpha_F^2, sigma_e^2, sigma_f^2(, alpha_r^2)]`` as buffers (``alpha_r^2``,
        the low-rank scale, defaults to ``alpha_F^2``)."""
        d = self.posterior_width
        if calibration.shape == (4,):
            calibration = torch.cat([calibration, calibration[1:2]])
        if tuple(factor.shape) != (d, d) or tuple(calibration.shape) != (5,):
            raise ValueError(f"expected a ({d}, {d}) factor and 4 or 5 calibration values")
        dtype, device = self.dtype, self.atomic_energies.device  # the head's precision
        self.register_buffer("posterior_factor", factor.detach().to(device, dtype).clone())
        self.register_buffer(
            "posterior_calibration", calibration.detach().to(device, dtype).clone()
        )

    def clear_full_posterior(self) -> None:
        """Back to the variational (diagonal) posterior and the learned noises, e.g. to fine-tune."""
        for name in ("posterior_factor", "posterior_calibration"):
            self._buffers.pop(name, None)


def basis_state(state: PotentialState, n_blocks: int) -> PotentialState:
    """``state`` in a basis of ``n_blocks`` weight blocks: unchanged for 1; for ``n_types``
    blocks the per-element latents ``z_e = onehot(type) (x) z (n_atoms, n_types d)`` and their
    per-graph sums ``Phi_e (n_graphs, n_types d)`` (module docstring)."""
    if n_blocks == 1:
        return state
    n_atoms, d = state.z.shape
    onehot = torch.nn.functional.one_hot(state.atom_type, n_blocks).to(
        state.z.dtype
    )  # (n_atoms, n_blocks)
    z = (onehot[:, :, None] * state.z[:, None, :]).reshape(n_atoms, n_blocks * d)
    phi = z.new_zeros(state.n_graphs, n_blocks * d).index_add(0, state.graph, z)
    return replace(state, z=z, phi=phi)


def basis_mean(mu: Tensor, n_blocks: int) -> Tensor:
    """``(n_blocks d,)`` posterior mean in the basis: the head's ``mu (d,)`` once per block."""
    return mu.repeat(n_blocks)


def full_energy_uncertainty(state: PotentialState, post: FullPosterior) -> dict[str, Tensor]:
    """Energy variances with the full posterior: ENERGY_VAR, ENERGY_EPISTEMIC_VAR,
    ENERGY_ALEATORIC_VAR, KAPPA ``(n_graphs,)``, LOCAL_ENERGY_VAR ``(n_atoms,)``; ``state`` in
    the posterior's basis (:func:`basis_state`)."""
    phi, factor = state.phi, post.factor.to(state.phi.dtype)
    epistemic = post.alpha2_energy * moments.factor_variance(phi, factor)
    n_atoms = torch.bincount(state.graph, minlength=state.n_graphs)
    aleatoric = moments.energy_aleatoric_variance(n_atoms, post.energy_noise_var)
    return {
        keys.ENERGY_VAR: epistemic + aleatoric,
        keys.ENERGY_EPISTEMIC_VAR: epistemic,
        keys.ENERGY_ALEATORIC_VAR: aleatoric,
        keys.LOCAL_ENERGY_VAR: post.alpha2_energy * moments.factor_variance(state.z, factor),
        keys.KAPPA: moments.factor_kappa(phi, factor),
    }


def full_derivatives(
    state: PotentialState,
    mu: Tensor,
    post: FullPosterior,
    *,
    rank: int | None,
    method: str,
    sketch: bool = False,
    base: Tensor | None = None,
) -> dict[str, Tensor]:
    """Mean forces (stress) and their epistemic variances from ``rank`` rows of the factor
    (all ``D`` rows when ``rank`` is None): ``rank + 1`` vector-Jacobian products, or 2 with
    ``sketch`` (:func:`sketch_rows` of the ``rank`` rows); ``state`` and ``mu (D,)`` in the
    posterior's basis (:func:`basis_state`, :func:`basis_mean`); ``base (n_graphs,)`` a
    backbone's own energies, joined to the mean row (:func:`input_gradients`)."""
    factor = post.factor.to(mu.dtype)
    rows = factor if rank is None else factor[: min(int(rank), factor.shape[0])]
    if sketch:
        rows = sketch_rows(rows)  # (1, D)
    weights = torch.cat([mu.detach()[None], rows])  # (r + 1, d)
    grads = input_gradients(state, weights, method, base=base)
    out = forces_and_stress(state, [g[0] for g in grads])
    alpha2 = post.alpha2_forces if rank is None else post.alpha2_lowrank
    out[keys.FORCES_VAR] = alpha2 * grads[0][1:].square().sum(0)  # (n_atoms, 3)
    if state.strain is not None:
        stress_var = grads[1][1:].square().sum(0) * inverse_volume(state).square()[:, None, None]
        out[keys.STRESS_VAR] = alpha2 * stress_var  # (n_graphs, 3, 3)
    return out


def latent_jacobian(
    model: BayesianPotential, batch: BaseData, n_blocks: int = 1, *, method: str = "auto"
) -> tuple[PotentialState, dict[str, Tensor], Tensor]:
    """One forward pass and the position Jacobian of the per-graph latent sums, in a basis of
    ``n_blocks`` weight blocks (:func:`basis_state`).

    ``method``: ``"reverse"`` takes ``D`` vector-Jacobian products (one per feature);
    ``"forward"`` takes ``3 n_max`` Jacobian-vector products (one per atom slot and direction,
    every frame of the batch at once; ``n_max`` = the largest frame), each giving all ``D``
    features; ``"auto"`` picks the one with fewer products and falls back to ``"reverse"`` with a
    warning when the backbone has no forward-mode rule. Molecules of tens of atoms under a
    per-element basis of hundreds of features take 3-8x fewer products in forward mode.

    Returns:
        ``(state, outputs, jac)``: the state in that basis (``phi (n_graphs, D)``), outputs at
        the posterior mean (ENERGY, FORCES: the model's whole prediction, a backbone's own
        energies included) and ``jac (D, n_atoms, 3)`` with
        ``jac[k, a] = dPhi_k(graph of a) / dr_a`` (detached), ``D = n_blocks d``.
    """
    if method not in ("auto", "forward", "reverse"):
        raise ValueError(f"method must be 'auto', 'forward' or 'reverse', got {method!r}")
    with torch.enable_grad():
        state = model._state(batch, forces=True, stress=False)
        mu, _ = model.posterior()
        out = model._energies(state, weights=mu.detach())
        grads = torch.autograd.grad(out[keys.ENERGY].sum(), state.inputs, retain_graph=True)
        out.update(forces_and_stress(state, list(grads)))
        based = basis_state(state, n_blocks)
        width = based.phi.shape[1]
        n_max = int(torch.bincount(state.graph, minlength=state.n_graphs).max())
        jac = None
        if method == "forward" or (method == "auto" and 3 * n_max < width):
            try:
                jac = _forward_jacobian(model, state, n_blocks)
            except (RuntimeError, NotImplementedError) as err:
                if method == "forward":
                    raise
                warnings.warn(
                    f"forward-mode Jacobian failed ({type(err).__name__}: "
                    f"{str(err).splitlines()[0]}); using {width} vector-Jacobian products",
                    RuntimeWarning,
                    stacklevel=2,
                )
        if jac is None:
            eye = torch.eye(width, dtype=based.phi.dtype, device=based.phi.device)
            (jac,) = input_gradients(based, eye, model.gradient_method)[:1]  # (D, n_atoms, 3)
    return based, {k: v.detach() for k, v in out.items()}, jac.detach()


JVP_ATOMS = 3456  # tangents x atoms vmapped at once (jvp_chunk)


def jvp_chunk(n_atoms: int) -> int:
    """Tangents vmapped at once over a batch of ``n_atoms``: at most 64, fewer on large batches so
    that the vmapped activations (tangents x atoms x features) stay small: on a 32-frame 3BPA
    batch, chunks of 64 cost three times as much a frame as chunks of 4, and one tangent at a
    time costs more again (docs/what-we-tried.md, "Sign probes for the 3BPA fit")."""
    return max(1, min(64, JVP_ATOMS // max(n_atoms, 1)))


def _phi_jvps(
    model: BayesianPotential, state: PotentialState, n_blocks: int, tangents: Tensor
) -> Tensor:
    """``(T, n_graphs, D)`` Jacobian-vector products of the per-graph basis sums ``Phi`` along
    the position tangents ``(T, n_atoms, 3)`` (forward-mode AD, in chunks of :func:`jvp_chunk`)."""
    from torch.func import jvp, vmap

    pos, graph = state.inputs[0].detach(), state.graph  # (n_atoms, 3), (n_atoms,)
    chunk = jvp_chunk(pos.shape[0])

    def phi_of(p: Tensor) -> Tensor:  # (n_graphs, D)
        z, _ = model._latents(state.batch, p, state.cell, state.atom_type)
        z = basis_state(replace(state, z=z), n_blocks).z  # (n_atoms, D)
        return z.new_zeros(state.n_graphs, z.shape[1]).index_add(0, graph, z)

    return vmap(lambda t: jvp(phi_of, (pos,), (t,))[1], chunk_size=chunk)(tangents)


def _forward_jacobian(model: BayesianPotential, state: PotentialState, n_blocks: int) -> Tensor:
    """``(D, n_atoms, 3)`` Jacobian of the basis sums ``Phi`` by forward-mode AD: tangent
    ``(j, c)`` moves atom slot ``j`` of every frame along ``c``; frames are independent, so its
    Jacobian-vector product holds column ``(j, c)`` of every frame's Jacobian at once."""
    pos = state.inputs[0].detach()  # (n_atoms, 3)
    graph, n_atoms = state.graph, pos.shape[0]
    counts = torch.bincount(graph, minlength=state.n_graphs)
    slot = torch.arange(n_atoms, device=pos.device) - (torch.cumsum(counts, 0) - counts)[graph]
    n_max = int(counts.max())
    xyz = torch.arange(3, device=pos.device)
    rows = 3 * slot[:, None] + xyz[None, :]  # (n_atoms, 3): the tangent that moves (a, c)
    atoms = torch.arange(n_atoms, device=pos.device)[:, None]
    tangents = pos.new_zeros(3 * n_max, n_atoms, 3)
    tangents[rows, atoms, xyz[None, :]] = 1.0
    out = _phi_jvps(model, state, n_blocks, tangents)  # (3 n_max, G, D)
    jac = out[rows, graph[:, None]]  # (n_atoms, 3, D)
    return jac.permute(2, 0, 1)


def latent_probes(
    model: BayesianPotential,
    batch: BaseData,
    n_blocks: int,
    probes: int,
    *,
    mask: Tensor | None = None,
    generator: torch.Generator | None = None,
) -> tuple[PotentialState, Tensor]:
    """One forward pass and ``probes`` random sketches of each frame's force Jacobian.

    Each probe ``z`` draws a +-1 sign for every atom component (zero on atoms outside ``mask``,
    ``(n_atoms,)`` bool) and one Jacobian-vector product gives ``y_g = J_g z_g`` for every frame
    ``g`` of the batch at once, with ``J_g (D, 3 n_g)`` the Jacobian of ``Phi_g`` (as
    :func:`latent_jacobian`'s ``jac``). Since ``E[z z^T] = I``,
    ``mean_probes y_g y_g^T`` is an unbiased estimate of ``J_g J_g^T``: the force term of the
    posterior precision from ``probes`` products per batch instead of ``min(D, 3 n_max)``.

    Returns ``(state, y)``: the state in the basis (``phi (n_graphs, D)``) and
    ``y (probes, n_graphs, D)`` (detached).
    """
    if probes < 1:
        raise ValueError(f"probes must be >= 1, got {probes}")
    with torch.no_grad():  # Phi only: the products below run their own forward passes
        state = model._state(batch, forces=True, stress=False)
    pos = state.inputs[0].detach()  # (n_atoms, 3)
    signs = torch.randint(0, 2, (probes, *pos.shape), generator=generator).to(pos) * 2 - 1
    if mask is not None:
        signs = signs * mask.to(pos)[None, :, None]
    y = _phi_jvps(model, state, n_blocks, signs)  # (probes, G, D)
    return basis_state(state, n_blocks), y.detach()


LOWRANK_ATOM_DIRECTIONS = 256
"""``auto`` keeps the ``r`` low-rank directions while the largest structure has at most
``LOWRANK_ATOM_DIRECTIONS / r`` atoms, and sketches them above. The cost of ``r + 1`` backward
passes against energy + forces is ``(f + (r + 1) b) / (f + b)`` once the backward ``b`` outweighs
the per-call overhead, so it stays within 2x only on small structures, where the overhead
dominates; on larger ones the sketch's two passes keep it within 2x (the cost at each size:
benchmarks/results/speed.md)."""

SKETCH_SEED = 0
"""Seed of the fixed +-1 signs of the ``sketch`` mode (the same combination on every call)."""


def default_uncertainty_mode(model: torch.nn.Module) -> str:
    """The calculator's and the stored levels' default mode: ``auto`` (calibrated, within 2x
    energy + forces at every size) for a model with a full posterior, ``exact`` otherwise."""
    return "auto" if getattr(model, "has_full_posterior", False) else "exact"


def sketch_rows(rows: Tensor) -> Tensor:
    """``(1, D)`` fixed +-1 combination ``sum_k eps_k l_k`` of the factor's ``rows (r, D)``.

    For any signs, ``(d(sum_k eps_k l_k . Phi)/dr)^2 = sum_k (d(l_k . Phi)/dr)^2 + cross terms``
    whose mean over independent +-1 signs is zero: an unbiased one-product estimate of the
    low-rank variance, so the low-rank scale ``alpha_r^2`` applies unchanged."""
    gen = torch.Generator().manual_seed(SKETCH_SEED)
    signs = torch.randint(0, 2, (rows.shape[0],), generator=gen).to(rows) * 2 - 1  # (r,)
    return (signs @ rows)[None]


def auto_keeps_lowrank(n_max: int, rank: int) -> bool:
    """Whether ``auto`` keeps the ``rank`` low-rank directions for a largest structure of
    ``n_max`` atoms (:data:`LOWRANK_ATOM_DIRECTIONS`), rather than sketching them."""
    return n_max * rank <= LOWRANK_ATOM_DIRECTIONS


def resolve_mode(mode: UncertaintyMode, state: PotentialState, rank: int) -> UncertaintyMode:
    """``auto`` -> LOWRANK or SKETCH for this batch (:func:`auto_keeps_lowrank`); other modes
    unchanged."""
    if mode is not UncertaintyMode.AUTO:
        return mode
    n_max = int(torch.bincount(state.graph, minlength=state.n_graphs).max())
    return UncertaintyMode.LOWRANK if auto_keeps_lowrank(n_max, rank) else UncertaintyMode.SKETCH


def diagonal_factor(s2: Tensor, rank: int | None) -> Tensor:
    """``(r, d)`` factor of a diagonal posterior: ``sqrt(s2)`` on the ``r`` largest-variance axes."""
    order = torch.argsort(s2, descending=True)[: s2.shape[0] if rank is None else int(rank)]
    factor = torch.zeros(order.shape[0], s2.shape[0], dtype=s2.dtype, device=s2.device)
    factor[torch.arange(order.shape[0]), order] = s2[order].sqrt()
    return factor


def posterior_uncertainty(
    model: BayesianPotential,
    state: PotentialState,
    mode: UncertaintyMode,
    *,
    n_samples: int,
    generator: torch.Generator | None,
) -> dict[str, Tensor]:
    """The uncertainty outputs of ``model.forward`` in ``mode`` (not ``none``): energy variances
    (free), and in the gradient modes mean forces (stress) with their epistemic variances,
    from the full posterior when ``model`` has one, else from the diagonal one."""
    mu, s2 = model.posterior()
    post, method = model.full_posterior(), model.gradient_method
    base = getattr(state, "base_energy", None)  # a backbone's own energies (models/backbones.py)
    if base is not None:  # (n_graphs,): their derivatives join the mean forces (stress)
        base = base.new_zeros(state.n_graphs).index_add(0, state.graph, base)
    base_grads = None
    if base is not None and mode is UncertaintyMode.EXACT and state.inputs:
        # the gradient modes take them in their mean row's pass; exact takes Phi's Jacobian only
        base_grads = torch.autograd.grad(
            base.sum(), state.inputs, retain_graph=True, allow_unused=True, materialize_grads=True
        )
    if post is None:
        out = energy_uncertainty(state, s2, model.energy_noise.square())
    else:
        state, mu = basis_state(state, post.n_blocks), basis_mean(mu, post.n_blocks)
        out = full_energy_uncertainty(state, post)
    if mode is UncertaintyMode.EXACT:
        if post is None:
            out.update(exact_derivatives(state, mu, s2, method=method))
        else:
            out.update(full_derivatives(state, mu, post, rank=None, method=method))
    elif mode in (UncertaintyMode.LOWRANK, UncertaintyMode.SKETCH, UncertaintyMode.AUTO):
        sketch = resolve_mode(mode, state, int(model.posterior_rank)) is UncertaintyMode.SKETCH
        if post is None:  # the largest-variance axes of the diagonal posterior, uncalibrated
            ones = torch.ones(5, dtype=mu.dtype, device=mu.device)
            diag = FullPosterior(diagonal_factor(s2.detach(), model.posterior_rank), ones)
            out.update(
                full_derivatives(
                    state, mu, diag, rank=None, method=method, sketch=sketch, base=base
                )
            )
        else:
            out.update(
                full_derivatives(
                    state,
                    mu,
                    post,
                    rank=model.posterior_rank,
                    method=method,
                    sketch=sketch,
                    base=base,
                )
            )
    elif mode is UncertaintyMode.SAMPLED:
        with torch.no_grad():
            if post is None:
                draws = model.head.sample_weights(n_samples, generator=generator)[0][
                    :, 0, :
                ]  # (K, d)
            else:
                eps = torch.randn(
                    n_samples, mu.shape[0], generator=generator, dtype=mu.dtype, device=mu.device
                )
                draws = mu.detach() + post.alpha2_forces.sqrt().to(mu.dtype) * eps @ post.factor.to(
                    mu.dtype
                )
        out.update(sampled_derivatives(state, mu, draws, method=method, base=base))
    if base_grads is not None:
        for key, value in forces_and_stress(state, list(base_grads)).items():
            out[key] = out[key] + value
    return out
