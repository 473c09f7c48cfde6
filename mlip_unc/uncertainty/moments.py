"""Closed-form and sampled predictive moments of a Bayesian linear energy head.

As defined in docs/method.md sections 2-4 of this project. With per-atom latents ``z_a``,
``Phi = sum_a z_a`` per graph and a mean-field posterior ``w ~ N(mu, diag(s2))``::

    E = w^T Phi                    Var[E]   = Phi^T S Phi
    F = -J^T w,  J = dPhi/dr       Var[F_i] = sum_k s2_k (dPhi_k / dr_i)^2
    sigma = (1/V) dE/d(strain)     Var[sigma] = sum_k s2_k ((1/V) dPhi_k / d(strain))^2

Every function is pure: tensors in, tensors out. The gradient helpers take the graph's
``Phi (n_graphs, d)`` and the differentiable inputs (positions, strain); graphs of a batch are
independent, so one backward pass of ``Phi[:, k].sum()`` serves all graphs at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "latent_variance",
    "energy_aleatoric_variance",
    "alignment_kappa",
    "factor_variance",
    "factor_kappa",
    "latent_gradients",
    "linear_gradients",
    "gradient_variance",
    "sample_variance",
    "exact_force_variance",
    "sampled_force_variance",
]


def latent_variance(z: Tensor, s2: Tensor) -> Tensor:
    """Analytic variance ``z^T S z`` of ``w^T z`` under ``w ~ N(mu, S)``, ``S = diag(s2)``.

    The one implementation of this formula in the package (docs/method.md s.2-4): the
    epistemic ``Var[E] = Phi^T S Phi`` of graph latents, the per-atom view ``z_a^T S z_a``
    (not a decomposition of ``Var[E]``), the latent part ``U(z)`` of the LPA metrics and the
    closed-form variance of a Bayesian linear layer with several outputs.

    Shapes:
        - **z:** ``(..., d)``
        - **s2:** ``(d,)`` -> **output:** ``(...)``; or ``(n_out, d)`` (one row of variances
          per output) -> **output:** ``(..., n_out)``
    """
    return (z * z) @ (s2 if s2.dim() == 1 else s2.T)


def energy_aleatoric_variance(num_atoms: Tensor, sigma_e2: Tensor) -> Tensor:
    """Homoscedastic per-atom noise, independent across atoms: ``n_atoms * sigma_e^2``.

    Shapes:
        - **num_atoms:** ``(n_graphs,)``; **sigma_e2:** scalar; **output:** ``(n_graphs,)``
    """
    return num_atoms.to(sigma_e2.dtype) * sigma_e2


def alignment_kappa(z: Tensor, s2: Tensor) -> Tensor:
    """Alignment factor ``kappa(z) = (u^T S u) / mean(s2)``, ``u = z / |z|`` (docs/method.md s.4).

    ``kappa = 1`` is no alignment (the expectation under a random permutation of the
    posterior axes), ``kappa < 1`` latent-posterior alignment; ``z^T S z = |z|^2 mean(s2) kappa``.

    Convention: ``kappa(0) = 1``. A zero latent (e.g. an isolated atom, or a structure whose
    latent equals the isolated-atom reference) has no direction and so carries no alignment
    information; it gets the neutral value, which keeps every output finite. Differentiable
    (the gradient at ``z = 0`` is 0).

    Shapes:
        - **z:** ``(n, d)``; **s2:** ``(d,)``; **output:** ``(n,)``
    """
    norm2 = (z * z).sum(-1)  # (n,)
    ratio = latent_variance(z, s2) / (norm2 * s2.mean()).clamp_min(torch.finfo(z.dtype).tiny)
    return torch.where(norm2 > 0, ratio, torch.ones_like(ratio))


def factor_variance(z: Tensor, factor: Tensor) -> Tensor:
    """Analytic variance ``z^T Sigma z = |L z|^2`` of ``w^T z`` under a full covariance
    ``Sigma = L^T L`` given by its factor ``L`` (docs/method.md s.3b). With
    ``L = diag(sqrt(s2))`` it equals :func:`latent_variance`.

    Shapes:
        - **z:** ``(..., d)``; **factor:** ``(r, d)``; **output:** ``(...)``
    """
    return (z @ factor.T).square().sum(-1)


def factor_kappa(z: Tensor, factor: Tensor) -> Tensor:
    """Alignment factor in the eigenbasis of ``Sigma = L^T L`` (docs/method.md s.4):
    ``kappa = (u^T Sigma u) / (tr Sigma / d)``, ``u = z / |z|``; ``kappa(0) = 1`` as in
    :func:`alignment_kappa`, which it equals for a diagonal ``Sigma``.

    Shapes:
        - **z:** ``(n, d)``; **factor:** ``(r, d)``; **output:** ``(n,)``
    """
    norm2 = (z * z).sum(-1)  # (n,)
    mean_var = factor.square().sum() / z.shape[-1]  # tr(Sigma) / d
    ratio = factor_variance(z, factor) / (norm2 * mean_var).clamp_min(torch.finfo(z.dtype).tiny)
    return torch.where(norm2 > 0, ratio, torch.ones_like(ratio))


def _grads(
    output: Tensor, inputs: Sequence[Tensor], *, retain_graph: bool, create_graph: bool
) -> tuple[Tensor, ...]:
    grads = torch.autograd.grad(
        output,
        inputs,
        retain_graph=retain_graph,
        create_graph=create_graph,
        allow_unused=True,
        materialize_grads=True,
    )
    return grads


BATCHED_MAX_ROWS = 100
"""Largest first input (atoms) for which ``method="auto"`` batches the backward passes."""


def linear_gradients(
    phi: Tensor,
    inputs: Sequence[Tensor],
    weights: Tensor,
    *,
    method: str = "auto",
    create_graph: bool = False,
    retain_graph: bool = False,
) -> tuple[Tensor, ...]:
    """Gradients of ``(Phi @ w_k).sum()`` with respect to each input, for every row ``w_k``.

    Args:
        phi: ``(n_graphs, d)`` graph latents, differentiable in ``inputs``.
        inputs: tensors to differentiate with respect to (e.g. positions, strain).
        weights: ``(K, d)`` weight vectors.
        method: ``"loop"`` (K backward passes with ``retain_graph``; least memory),
            ``"batched"`` (one vmapped backward, ``is_grads_batched=True``; about K times the
            backward memory) or ``"auto"`` (batched below :data:`BATCHED_MAX_ROWS` rows of the
            first input, the loop above; batched falls back to the loop with a warning if an
            operation has no batching rule). Batching pays on small structures, where the
            per-pass overhead dominates; on large ones it holds K copies of every backward
            buffer and is memory-bound, so the loop is faster there (timings:
            docs/what-we-tried.md, "Force uncertainty within 2x E+F at every size").
        create_graph: keep the graph of the gradients (for training losses).
        retain_graph: keep the forward graph after the last pass.

    Returns:
        one tensor per input, ``(K, *input.shape)``.
    """
    n_weights = weights.shape[0]
    if not phi.requires_grad:  # latents independent of every input (and frozen)
        return tuple(x.new_zeros((n_weights, *x.shape)) for x in inputs)
    if method == "auto" and (not inputs or inputs[0].shape[0] > BATCHED_MAX_ROWS):
        method = "loop"
    if method == "auto":
        try:
            return linear_gradients(
                phi, inputs, weights, method="batched", create_graph=create_graph, retain_graph=True
            )
        except (RuntimeError, NotImplementedError) as err:
            warnings.warn(
                f"batched gradients failed ({type(err).__name__}: {str(err).splitlines()[0]}); "
                "using one backward pass per weight vector",
                RuntimeWarning,
                stacklevel=2,
            )
            method = "loop"
    if method == "batched":
        outputs = phi @ weights.T  # (n_graphs, K)
        grad_outputs = torch.eye(n_weights, dtype=phi.dtype, device=phi.device)  # (K, K)
        grad_outputs = grad_outputs.unsqueeze(1).expand(n_weights, *outputs.shape)
        grads = torch.autograd.grad(
            outputs,
            inputs,
            grad_outputs=grad_outputs,
            is_grads_batched=True,
            retain_graph=retain_graph,
            create_graph=create_graph,
            allow_unused=True,
            materialize_grads=True,
        )
        # torch materialises unused inputs' gradients without the batch axis: restore it
        return tuple(
            g if g.dim() == x.dim() + 1 else x.new_zeros((n_weights, *x.shape))
            for g, x in zip(grads, inputs, strict=False)
        )
    if method != "loop":
        raise ValueError(f"unknown gradient method {method!r} (use 'loop', 'batched' or 'auto')")
    per_weight = []
    for k in range(n_weights):
        last = k == n_weights - 1
        per_weight.append(
            _grads(
                (phi @ weights[k]).sum(),
                inputs,
                retain_graph=retain_graph or create_graph or not last,
                create_graph=create_graph,
            )
        )
    return tuple(torch.stack([g[n] for g in per_weight]) for n in range(len(inputs)))


def latent_gradients(
    phi: Tensor, inputs: Sequence[Tensor], *, method: str = "auto", retain_graph: bool = False
) -> tuple[Tensor, ...]:
    """Jacobian rows ``d(Phi[:, k].sum()) / d input`` for ``k = 1..d`` (d vector-Jacobian products).

    Returns:
        one tensor per input, ``(d, *input.shape)``.
    """
    eye = torch.eye(phi.shape[-1], dtype=phi.dtype, device=phi.device)
    return linear_gradients(phi, inputs, eye, method=method, retain_graph=retain_graph)


def gradient_variance(jacobian: Tensor, s2: Tensor) -> Tensor:
    """``sum_k s2_k * jacobian[k]**2``: the exact variance of ``jacobian^T w`` under ``q(w)``.

    Shapes:
        - **jacobian:** ``(d, *shape)``; **s2:** ``(d,)``; **output:** ``shape``
    """
    return torch.tensordot(s2, jacobian * jacobian, dims=1)


def sample_variance(draws: Tensor) -> Tensor:
    """Unbiased variance over the first axis (``K >= 2`` draws)."""
    if draws.shape[0] < 2:
        raise ValueError(f"a sample variance needs at least 2 draws, got {draws.shape[0]}")
    return draws.var(dim=0, unbiased=True)


def exact_force_variance(phi: Tensor, pos: Tensor, s2: Tensor, *, method: str = "auto") -> Tensor:
    """Exact epistemic ``Var[F_i,c] = sum_k s2_k (dPhi_k / dr_ic)^2``.

    Shapes:
        - **phi:** ``(n_graphs, d)``; **pos:** ``(n_atoms, 3)``; **s2:** ``(d,)``
        - **output:** ``(n_atoms, 3)``
    """
    (jac,) = latent_gradients(phi, [pos], method=method)
    return gradient_variance(jac, s2)


def sampled_force_variance(
    phi: Tensor, pos: Tensor, w_samples: Tensor, *, method: str = "auto"
) -> Tensor:
    """Unbiased sample variance of ``F_k = -d(Phi @ w_k).sum() / dr`` over weight draws.

    Shapes:
        - **phi:** ``(n_graphs, d)``; **pos:** ``(n_atoms, 3)``; **w_samples:** ``(K, d)``
        - **output:** ``(n_atoms, 3)``
    """
    (grads,) = linear_gradients(phi, [pos], w_samples, method=method)
    return sample_variance(grads)
