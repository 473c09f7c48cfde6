"""Baselines on the same GIN backbone and training code: MC dropout, deep ensemble, MVE, Laplace.

All report the predictive mean and the epistemic / aleatoric variances like
:class:`mlip_unc.models.property.PropertyModel` (standardised units inside, target units
from ``predict``):

- **mve** (mean-variance estimation): deterministic linear mean, heteroscedastic noise;
  epistemic variance 0.
- **mcdropout**: dropout in backbone and head stays on at prediction; T = ``mc_samples``
  passes; epistemic = variance of the T means, aleatoric = mean of the T noise variances.
- **ensemble**: M independently initialised deterministic models trained together (one loss,
  the mean of the members' NLLs; disjoint parameters, so each member follows its own
  gradient); mixture moments: mean of means, epistemic = variance of the means,
  aleatoric = mean of the noise variances.
- **laplace**: MAP training with a deterministic linear head, then the closed-form Gaussian
  posterior of the last layer (weights and bias, full covariance), see :class:`LaplaceHead`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn
from torch_geometric.data import Batch, Data

from mlip_unc import keys
from mlip_unc.config import Method, PropertyConfig
from mlip_unc.models.property import (
    PropertyModel,
    StandardisedModel,
    make_backbone,
    make_noise_module,
    make_rotation,
)

__all__ = [
    "DeterministicHead",
    "LaplaceHead",
    "MCDropoutModel",
    "LaplaceModel",
    "DeepEnsemble",
    "build_baseline",
]

_MC_SEED = 0


@contextlib.contextmanager
def _seeded_rng(seed: int, device: torch.device) -> Iterator[None]:
    """Seed torch's default generator of ``device`` (the one dropout draws from) within the block.

    Dropout takes no ``torch.Generator``, so the default generator is seeded locally: the CPU
    generator (and, on a CUDA device, that device's) is saved on entry and restored on exit,
    leaving the caller's global random state untouched. Same numbers as ``torch.manual_seed``.
    """
    cuda: list[int] = []
    if device.type == "cuda":
        cuda = [device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=cuda):
        torch.random.default_generator.manual_seed(seed)
        for index in cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(seed)
        yield


class DeterministicHead(nn.Module):
    """``Linear(dropout(z))``; ``predictive`` returns the mean and a zero epistemic variance.

    Shapes:
        - **input:** z ``(n, in_features)``
        - **output:** ``(n, out_features)``
    """

    def __init__(
        self,
        in_features: int,
        out_features: int = 1,
        *,
        dropout: float = 0.0,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, out_features, dtype=dtype)
        self.dropout = nn.Dropout(dropout)

    def reset_parameters(self) -> None:
        self.linear.reset_parameters()

    def forward(self, z: Tensor) -> Tensor:
        return self.linear(self.dropout(z))

    def predictive(self, z: Tensor) -> tuple[Tensor, Tensor]:
        mean = self(z)
        return mean, torch.zeros_like(mean)


class LaplaceHead(DeterministicHead):
    """Deterministic linear head with a post-hoc last-layer Laplace (Gaussian) posterior.

    With z~ = [z, 1] and per-example noise variances sigma_n^2 (homoscedastic by default),
    for each target the posterior over theta = [w, b] is N(theta_MAP, Sigma) with::

        Sigma^-1 = lambda I + sum_i z~_i z~_i^T / sigma_n,i^2         (= lambda I + Z^T Z / sigma_n^2)

    This is exact for the linear-Gaussian last layer (the GGN equals the Hessian). The prior
    precision lambda is fitted by maximising the Laplace approximation of the marginal
    likelihood (as laplace-torch's ``marglik``, here on a log-spaced grid of 241 values in
    [1e-6, 1e6] instead of by gradient steps)::

        log p(D | lambda) = const - 1/2 [log det(lambda I + H) - p log lambda + lambda |theta_MAP|^2]

    Predictive epistemic variance: z~^T Sigma z~ (full covariance). Before :meth:`fit` it is 0.
    """

    posterior_cov: Tensor
    prior_precision: Tensor
    fitted: Tensor

    def __init__(
        self, in_features: int, out_features: int = 1, *, dtype: torch.dtype | None = None
    ) -> None:
        super().__init__(in_features, out_features, dtype=dtype)
        p = in_features + 1
        self.register_buffer("posterior_cov", torch.zeros(out_features, p, p, dtype=dtype))
        self.register_buffer("prior_precision", torch.ones(out_features, dtype=dtype))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))

    def predictive(self, z: Tensor) -> tuple[Tensor, Tensor]:
        mean = self(z)
        if not bool(self.fitted):
            return mean, torch.zeros_like(mean)
        zt = torch.cat([z, z.new_ones(z.shape[0], 1)], dim=1)  # (n, p)
        var = torch.einsum("np,opq,nq->no", zt, self.posterior_cov.to(z.dtype), zt)
        return mean, var.clamp_min(0)

    @torch.no_grad()
    def fit(self, z: Tensor, noise_var: Tensor) -> None:
        """Fit lambda and Sigma from training latents ``z (N, d)`` and noise variances ``(N, out)``
        (on the CPU, in float64; the results are copied to the head's device)."""
        z, noise_var = z.detach().cpu(), noise_var.detach().cpu()
        zt = torch.cat([z, z.new_ones(z.shape[0], 1)], dim=1).double()  # (N, p)
        theta = (
            torch.cat([self.linear.weight, self.linear.bias[:, None]], dim=1)
            .detach()
            .cpu()
            .double()
        )  # (out, p)
        p = zt.shape[1]
        grid = torch.logspace(-6, 6, 241, dtype=torch.float64)
        eye = torch.eye(p, dtype=torch.float64)
        for t in range(theta.shape[0]):
            hess = (zt / noise_var[:, t : t + 1].double()).T @ zt  # (p, p)
            hess = 0.5 * (hess + hess.T)
            evals = torch.linalg.eigvalsh(hess).clamp_min(0.0)  # (p,)
            sq = float(theta[t] @ theta[t])
            logml = -0.5 * (
                torch.log(grid[:, None] + evals[None, :]).sum(1) - p * torch.log(grid) + grid * sq
            )
            lam = grid[int(torch.argmax(logml))]
            cov = torch.cholesky_inverse(torch.linalg.cholesky(hess + lam * eye))
            self.posterior_cov[t] = cov.to(self.posterior_cov.dtype)
            self.prior_precision[t] = lam.to(self.prior_precision.dtype)
        self.fitted.fill_(True)


class MCDropoutModel(PropertyModel):
    """PropertyModel whose predictive averages ``mc_samples`` passes with dropout on.

    Batch-norm layers stay in eval mode; the draws use a fixed seed (or one drawn from
    ``generator``) on a locally forked RNG (:func:`_seeded_rng`: torch's global random state is
    untouched), so predictions are reproducible.
    """

    def predictive(
        self, batch: Batch, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        z = self.latent(batch)  # deterministic latent (dropout off in eval mode)
        dropouts = [m for m in self.modules() if isinstance(m, nn.Dropout)]
        modes = [m.training for m in dropouts]
        means, noise = [], []
        seed = (
            _MC_SEED
            if generator is None
            else int(torch.randint(0, 2**31 - 1, (), generator=generator))
        )
        with _seeded_rng(seed, z.device):
            for m in dropouts:
                m.train()
            try:
                for _ in range(self.mc_samples):
                    zs = self.latent(batch)
                    means.append(self.head(zs))
                    noise.append(self.noise(zs))
            finally:
                for m, mode in zip(dropouts, modes, strict=False):
                    m.train(mode)
        draws = torch.stack(means)  # (T, n, out)
        alea = torch.stack(noise).mean(0)
        epi = draws.var(0, unbiased=True) if len(means) > 1 else torch.zeros_like(draws[0])
        mean = draws.mean(0)
        return {
            keys.PREDICTION: mean,
            keys.EPISTEMIC_VAR: epi,
            keys.ALEATORIC_VAR: alea,
            keys.PREDICTION_VAR: epi + alea,
            keys.LATENT: z,
        }


class LaplaceModel(PropertyModel):
    """PropertyModel with a :class:`LaplaceHead`; the posterior is fitted in :meth:`post_fit`."""

    @torch.no_grad()
    def post_fit(self, graphs: Sequence[Data], batch_size: int = 256) -> None:
        was_training = self.training
        self.eval()
        zs, noise = [], []
        graphs = list(graphs)
        for start in range(0, len(graphs), batch_size):
            z = self.latent(
                Batch.from_data_list(graphs[start : start + batch_size]).to(self.y_mean.device)
            )
            zs.append(z)
            noise.append(self.noise(z))
        cast(LaplaceHead, self.head).fit(torch.cat(zs), torch.cat(noise))
        self.train(was_training)


class DeepEnsemble(StandardisedModel):
    """M deterministic :class:`PropertyModel` members; mixture predictive moments.

    Training outputs stack the members: PREDICTION and ALEATORIC_VAR ``(M, n, out)``; LATENT
    is the first member's ``(n, d)``.
    """

    def __init__(self, members: list[PropertyModel], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.members = nn.ModuleList(members)

    def forward(
        self, batch: Batch, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        outs = [m(batch, generator=generator) for m in self.members]
        return {
            keys.LATENT: outs[0][keys.LATENT],
            keys.PREDICTION: torch.stack([o[keys.PREDICTION] for o in outs]),
            keys.ALEATORIC_VAR: torch.stack([o[keys.ALEATORIC_VAR] for o in outs]),
        }

    def predictive(
        self, batch: Batch, *, generator: torch.Generator | None = None
    ) -> dict[str, Tensor]:
        outs = [cast(PropertyModel, m).predictive(batch, generator=generator) for m in self.members]
        means = torch.stack([o[keys.PREDICTION] for o in outs])  # (M, n, out)
        alea = torch.stack([o[keys.ALEATORIC_VAR] for o in outs]).mean(0)
        epi = means.var(0, unbiased=False)  # mixture variance of the means
        return {
            keys.PREDICTION: means.mean(0),
            keys.EPISTEMIC_VAR: epi,
            keys.ALEATORIC_VAR: alea,
            keys.PREDICTION_VAR: epi + alea,
            keys.LATENT: outs[0][keys.LATENT],
        }


def build_baseline(
    config: PropertyConfig,
    *,
    n_targets: int,
    y_mean: Tensor | None,
    y_std: Tensor | None,
    dtype: torch.dtype | None = None,
) -> StandardisedModel:
    """mcdropout | ensemble | mve | laplace for ``config``."""
    m, dtype = config.model, config.train.dtype.torch
    std = {"n_targets": n_targets, "y_mean": y_mean, "y_std": y_std, "dtype": dtype}

    def member(cls: type[PropertyModel], head: nn.Module, **kw: Any) -> PropertyModel:
        return cls(
            make_backbone(config),
            head,
            make_noise_module(config, n_targets),
            rotation=make_rotation(config),
            mc_samples=m.mc_samples,
            **kw,
        )

    if m.method is Method.MVE:
        return member(PropertyModel, DeterministicHead(m.latent_dim, n_targets, dtype=dtype), **std)
    if m.method is Method.MCDROPOUT:
        head = DeterministicHead(m.latent_dim, n_targets, dropout=m.dropout, dtype=dtype)
        return member(MCDropoutModel, head, **std)
    if m.method is Method.LAPLACE:
        return member(LaplaceModel, LaplaceHead(m.latent_dim, n_targets, dtype=dtype), **std)
    if m.method is Method.ENSEMBLE:
        members = [
            member(
                PropertyModel,
                DeterministicHead(m.latent_dim, n_targets, dtype=dtype),
                n_targets=n_targets,
                dtype=dtype,
            )
            for _ in range(m.ensemble_size)
        ]
        return DeepEnsemble(members, **std)
    raise ValueError(f"{m.method.value} is not a baseline")
