"""Pure loss functions: the Gaussian NLL and the negative ELBO (docs/method.md sections 2-3).

Property models, per mini-batch::

    loss = mean NLL over the batch + kl_weight(epoch) * KL(q || p) / N_train

Potentials (one posterior weight draw per batch, ``training=True``, so the epistemic spread
enters through the sampling and the likelihood variances are the noise only)::

    loss = w_E NLL_E + w_F NLL_F + w_S NLL_S + kl_weight(epoch) * KL / N_train  (+ lambda R(z))

* ``NLL_E`` is per-atom normalised: the residual is (E_pred - E) / n_atoms with the variance
  the model gives it (its aleatoric energy variance / n_atoms^2); a structure's term counts
  once (``per_atom=False``) or once per atom (``per_atom=True``, n_atoms x that NLL), averaged
  over the structures that carry an energy.
* ``NLL_F`` sums over the 3 n_atoms force components of a structure (the proper likelihood
  of its forces) and averages over the structures that carry forces.
* ``NLL_S`` sums over the 9 stress components, averaged over structures with a stress.
* ``N_train`` is the number of training examples: molecules or structures (not batches, not
  atoms).

The energy/force balance (``loss.energy_count``, ``mlip_unc.config.potential.LossConfig``):
counted per structure (the plain likelihood; with unit weights and beta = 1 the loss is then
the negative ELBO per training structure), the energy carries 1 / (3 n_atoms + 1) of a
structure's terms, so in large periodic cells the forces outweigh it and the learned energy
noise can grow until the energy is ignored. Counted per atom, a structure's energy term is
n_atoms times its per-structure NLL (per atom n_atoms / sigma_e^2: larger cells' energies
weigh more; MACE weighs every structure's per-atom residual alike), which keeps the energy in
large cells but, for one small molecule, lets it dominate the first epochs and slows force
learning. The default ``auto`` takes ``atom`` for periodic training data and for sizes spread
more than twofold, ``structure`` otherwise.
The force NLL is summed, not averaged, over components: averaging would down-weight the forces
3 n_atoms-fold against the energy and the KL.
Shapes are those of :mod:`mlip_unc.keys`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from mlip_unc import keys

__all__ = [
    "gaussian_nll_terms",
    "gaussian_nll",
    "kl_weight",
    "kl_term",
    "negative_elbo",
    "masked_mean",
    "energy_nll",
    "forces_nll",
    "stress_nll",
    "likelihood_terms",
    "potential_loss",
]

_HALF_LOG_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_nll_terms(residual: Tensor, var: Tensor) -> Tensor:
    """Elementwise Gaussian negative log-likelihood ``0.5 log(2 pi var) + r^2 / (2 var)``:
    the one implementation of the formula in the package's training code."""
    return _HALF_LOG_2PI + 0.5 * torch.log(var) + 0.5 * residual**2 / var


def gaussian_nll(mean: Tensor, var: Tensor, target: Tensor) -> Tensor:
    """Mean Gaussian NLL of ``target`` under N(mean, var), NaN targets (missing labels) ignored.

    ``mean`` and ``var`` may carry leading dimensions (e.g. ensemble members ``(M, n, out)``)
    over which ``target`` ``(n, out)`` broadcasts. Returns a scalar; 0 when every target is
    missing.
    """
    target = target.expand_as(mean)
    mask = ~torch.isnan(target)
    if not bool(mask.any()):
        return mean.sum() * 0.0
    diff = torch.where(mask, mean - target, torch.zeros_like(mean))
    var = torch.where(mask, var, torch.ones_like(var))
    return (gaussian_nll_terms(diff, var) * mask).sum() / mask.sum()


def kl_weight(epoch: float, *, beta: float, warmup_epochs: float = 0) -> float:
    """The KL weight at the fractional epoch ``epoch``: ``beta * min(1, epoch / warmup)``.

    One convention for every task: a linear ramp from 0, evaluated every optimiser step
    (``epoch = completed epochs + batch / n_batches``); ``beta`` throughout when
    ``warmup_epochs`` is 0.
    """
    if warmup_epochs <= 0:
        return float(beta)
    return float(beta) * min(1.0, max(float(epoch), 0.0) / warmup_epochs)


def kl_term(kl: Tensor, beta: float, n_train: int) -> Tensor:
    """``beta * KL / N_train`` with N_train the number of training examples."""
    if n_train < 1:
        raise ValueError(f"n_train must be >= 1, got {n_train}")
    return beta * kl / n_train


def negative_elbo(
    nll: Tensor, kl: Tensor, *, n_train: int, beta: float = 1.0
) -> tuple[Tensor, Tensor]:
    """``(loss, kl_term)`` with ``kl_term = beta * KL / n_train`` and ``loss = nll + kl_term``.

    ``n_train`` is the number of training examples (the KL is per data set, the NLL per example).
    """
    term = kl_term(kl, beta, n_train)
    return nll + term, term


def masked_mean(values: Tensor, mask: Tensor) -> Tensor:
    """Mean of ``values`` over the rows where ``mask`` (leading dimension) is True; 0 if none.

    Args:
        values: (n, ...) elementwise terms.
        mask: (n,) bool.
    """
    mask = mask.reshape(-1).to(torch.bool)
    if not bool(mask.any()):
        return values.sum() * 0.0  # keeps the graph and dtype
    return values[mask].mean()


def energy_nll(
    energy_pred: Tensor,
    energy_true: Tensor,
    num_atoms: Tensor,
    var: Tensor,
    mask: Tensor | None = None,
    *,
    per_atom: bool = False,
) -> Tensor:
    """Per-atom normalised energy NLL, mean over labelled structures.

    The residual is ``(E_pred - E) / n`` with the variance the model assigns to it,
    ``var / n^2`` (``var`` is the total-energy noise variance, ``n sigma_e^2`` for independent
    per-atom noise), so its NLL is the total-energy NLL shifted by the constant ``log n`` and
    the learned noise stays consistent with ``ENERGY_ALEATORIC_VAR``. With ``per_atom`` a
    structure's term is ``n`` times that NLL (the per-atom energy loss; module docstring), so
    the energy keeps its share against the force term, which also grows with ``n``.

    Args:
        energy_pred, energy_true: (n_graphs,) total energies, eV.
        num_atoms: (n_graphs,) atoms per structure.
        var: () or (n_graphs,) noise variance of the total energy, eV^2.
        mask: (n_graphs,) bool, structures with an energy label (None = all).
        per_atom: count each structure's term once per atom (``loss.energy_count: atom``).
    """
    n = num_atoms.to(energy_pred.dtype)
    residual = (energy_pred - energy_true) / n  # (n_graphs,) eV/atom
    terms = gaussian_nll_terms(residual, var.expand_as(residual) / n**2)  # (n_graphs,)
    terms = n * terms if per_atom else terms
    return masked_mean(terms, torch.ones_like(terms, dtype=torch.bool) if mask is None else mask)


def forces_nll(
    forces_pred: Tensor,
    forces_true: Tensor,
    var: Tensor,
    graph: Tensor,
    mask: Tensor | None = None,
    n_graphs: int | None = None,
) -> Tensor:
    """Force NLL summed over the 3 n_atoms components of each structure, mean over structures.

    The sum is the proper likelihood of a structure's forces, so that with the energy term
    (one observation per structure) and ``KL / N_train`` (N_train structures) the loss is the
    negative ELBO per structure.

    Args:
        forces_pred, forces_true: (n_atoms, 3), eV/A.
        var: () or broadcastable to (n_atoms, 3), noise variance, (eV/A)^2.
        graph: (n_atoms,) structure index of each atom.
        mask: (n_graphs,) bool, structures with forces (None = all).
        n_graphs: number of structures (default: ``graph.max() + 1``).
    """
    terms = gaussian_nll_terms(forces_pred - forces_true, var.expand_as(forces_pred)).sum(
        1
    )  # (n_atoms,)
    n_graphs = int(graph.max()) + 1 if n_graphs is None else n_graphs
    per_graph = terms.new_zeros(n_graphs).index_add_(0, graph, terms)  # (n_graphs,)
    return masked_mean(
        per_graph,
        torch.ones(n_graphs, dtype=torch.bool, device=terms.device) if mask is None else mask,
    )


def stress_nll(
    stress_pred: Tensor, stress_true: Tensor, var: Tensor, mask: Tensor | None = None
) -> Tensor:
    """Stress NLL summed over the 9 components of each structure, mean over labelled ones.

    Args:
        stress_pred, stress_true: (n_graphs, 3, 3), eV/A^3.
        var: () or broadcastable to (n_graphs, 3, 3), noise variance.
        mask: (n_graphs,) bool.
    """
    terms = gaussian_nll_terms(stress_pred - stress_true, var.expand_as(stress_pred)).sum(
        (1, 2)
    )  # (n_graphs,)
    mask = (
        torch.ones(terms.shape[0], dtype=torch.bool, device=terms.device) if mask is None else mask
    )
    return masked_mean(terms, mask)


def likelihood_terms(
    out: Mapping[str, Tensor],
    batch: Mapping[str, Tensor],
    noise: Mapping[str, Tensor],
    *,
    use_stress: bool = False,
    energy_per_atom: bool = False,
) -> dict[str, Tensor]:
    """The NLL terms ``{"energy", "forces"[, "stress"]}`` of one batch.

    Args:
        out: model outputs (``ENERGY`` (n_graphs,), ``FORCES`` (n_atoms, 3), ``STRESS``).
        batch: PyG batch with labels, ``NUM_ATOMS``, ``HAS_*`` flags and ``BATCH``.
        noise: noise variances keyed by ``ENERGY`` (n_graphs,) total-energy variance,
            ``FORCES`` (n_atoms, 3) and, with stress, ``STRESS`` (() or (n_graphs, 3, 3)), as
            ``BayesianPotential.noise_variances`` returns them.
        use_stress: include the stress term.
        energy_per_atom: the energy term counted once per atom (:func:`energy_nll`).
    """
    has_e = batch[keys.HAS_ENERGY].reshape(-1)
    has_f = batch[keys.HAS_FORCES].reshape(-1)
    n_graphs = has_e.shape[0]
    terms = {
        "energy": energy_nll(
            out[keys.ENERGY],
            batch[keys.ENERGY],
            batch[keys.NUM_ATOMS],
            noise[keys.ENERGY],
            has_e,
            per_atom=energy_per_atom,
        ),
        "forces": forces_nll(
            out[keys.FORCES],
            batch[keys.FORCES],
            noise[keys.FORCES],
            batch[keys.BATCH],
            has_f,
            n_graphs,
        ),
    }
    if use_stress:
        terms["stress"] = stress_nll(
            out[keys.STRESS],
            batch[keys.STRESS],
            noise[keys.STRESS],
            batch[keys.HAS_STRESS].reshape(-1),
        )
    return terms


def potential_loss(
    nll_terms: Mapping[str, Tensor],
    weights: Mapping[str, float],
    *,
    kl: Tensor | None = None,
    beta: float = 1.0,
    n_train: int = 1,
    regularizer: Tensor | None = None,
    lam: float = 0.0,
) -> dict[str, Tensor]:
    """Combine the terms: ``{"loss", "nll", "kl_term", "regularizer"}`` (scalars).

    Args:
        nll_terms: from :func:`likelihood_terms`.
        weights: ``{"energy": w_E, "forces": w_F, "stress": w_S}`` (missing = 0).
        kl: KL(q || p) of the head (None for a deterministic/MAP model).
        beta, n_train: the KL is scaled by ``beta / n_train``.
        regularizer, lam: optional latent term and its weight.
    """
    zero = next(iter(nll_terms.values())).new_zeros(())
    nll = sum((weights.get(name, 0.0) * value for name, value in nll_terms.items()), zero)
    kl_part = zero if kl is None else kl_term(kl, beta, n_train)
    reg_part = zero if regularizer is None or lam == 0.0 else lam * regularizer
    return {
        "loss": nll + kl_part + reg_part,
        "nll": nll,
        "kl_term": kl_part,
        "regularizer": reg_part,
    }
