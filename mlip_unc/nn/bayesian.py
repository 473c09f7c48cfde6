"""Mean-field Gaussian Bayesian output layers (Bayes-by-Backprop).

As defined in docs/method.md section 2 of this project:

    y = w^T z + b,   q(w) = N(mu, diag(s^2)),  s = softplus(rho),   p(w) = N(0, sigma_p^2 I)

    E[y | z]   = mu^T z + mu_b
    Var[y | z] = z^T S z + s_b^2            (epistemic part; the likelihood adds the noise)

Training draws outputs with the local reparameterisation trick (one draw per example) or
with Flipout (one shared weight perturbation, decorrelated by random signs). Prediction uses
the closed form, no sampling.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlip_unc.config.enums import Estimator
from mlip_unc.uncertainty.moments import latent_variance


def inverse_softplus(x: float) -> float:
    """rho such that softplus(rho) = x (x > 0)."""
    if x <= 0:
        raise ValueError(f"a standard deviation must be positive, got {x}")
    return x + math.log(-math.expm1(-x))


def gaussian_kl(mu: Tensor, std: Tensor, prior_std: float) -> Tensor:
    """Closed-form KL( N(mu, std^2) || N(0, prior_std^2) ), summed over all entries."""
    var_ratio = (std / prior_std) ** 2
    return 0.5 * (var_ratio + (mu / prior_std) ** 2 - 1.0 - torch.log(var_ratio)).sum()


class BayesianLinear(nn.Module):
    """A linear layer with a mean-field Gaussian posterior over weights and bias.

    Args:
        in_features: latent width d.
        out_features: number of outputs.
        bias: learn a Bayesian bias (Gaussian posterior as for the weights).
        prior_std: sigma_p of the zero-mean Gaussian prior.
        init_std: initial posterior std of every weight. The default (0.1) keeps the
            predictive variance visible at the start; older libraries started at
            softplus(-5) ~ 0.007, where the epistemic term is negligible and rarely recovers.
        estimator: ``"local"`` or ``"flipout"`` for training-time sampling.

    Shapes:
        - **input:** z ``(n, in_features)``
        - **output:** ``(n, out_features)``; ``predictive`` returns mean and variance of that shape.
    """

    bias_mu: nn.Parameter | None
    bias_rho: nn.Parameter | None

    def __init__(
        self,
        in_features: int,
        out_features: int = 1,
        *,
        bias: bool = True,
        prior_std: float = 1.0,
        init_std: float = 0.1,
        estimator: Estimator | str = Estimator.LOCAL,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if prior_std <= 0:
            raise ValueError(f"prior_std must be positive, got {prior_std}")
        self.in_features = in_features
        self.out_features = out_features
        self.prior_std = float(prior_std)
        self.init_std = float(init_std)
        self.estimator = Estimator(estimator)
        factory: dict[str, Any] = {"dtype": dtype, "device": device}
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.weight_rho = nn.Parameter(torch.empty(out_features, in_features, **factory))
        if bias:
            self.bias_mu = nn.Parameter(torch.empty(out_features, **factory))
            self.bias_rho = nn.Parameter(torch.empty(out_features, **factory))
        else:
            self.register_parameter("bias_mu", None)
            self.register_parameter("bias_rho", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        nn.init.uniform_(self.weight_mu, -bound, bound)
        nn.init.constant_(self.weight_rho, inverse_softplus(self.init_std))
        if self.bias_mu is not None and self.bias_rho is not None:
            nn.init.zeros_(self.bias_mu)
            nn.init.constant_(self.bias_rho, inverse_softplus(self.init_std))

    # ------------------------------------------------------------------ posterior
    @property
    def weight_std(self) -> Tensor:  # (out, in)
        return F.softplus(self.weight_rho)

    @property
    def weight_var(self) -> Tensor:  # (out, in) | diagonal of S per output
        return self.weight_std**2

    @property
    def bias_std(self) -> Tensor | None:  # (out,)
        return None if self.bias_rho is None else F.softplus(self.bias_rho)

    def _bias_mean(self, like: Tensor) -> Tensor:
        return like.new_zeros(self.out_features) if self.bias_mu is None else self.bias_mu

    def _bias_var(self, like: Tensor) -> Tensor:
        std = self.bias_std
        return like.new_zeros(self.out_features) if std is None else std**2

    def kl(self) -> Tensor:
        """KL(q || p) summed over weights and bias, in closed form."""
        total = gaussian_kl(self.weight_mu, self.weight_std, self.prior_std)
        bias_std = self.bias_std
        if self.bias_mu is not None and bias_std is not None:
            total = total + gaussian_kl(self.bias_mu, bias_std, self.prior_std)
        return total

    # ------------------------------------------------------------------ prediction
    def predictive(self, z: Tensor) -> tuple[Tensor, Tensor]:
        """Closed-form predictive mean and epistemic variance, no sampling.

        Returns ``(mean, var)``, each ``(n, out)``: mean = z mu^T + mu_b,
        var = (z*z) s^2^T + s_b^2.
        """
        mean = z @ self.weight_mu.T + self._bias_mean(z)
        var = latent_variance(z, self.weight_var) + self._bias_var(z)
        return mean, var

    def forward(
        self, z: Tensor, *, sample: bool | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        """One draw per example when sampling (default: in training mode), else the mean."""
        sample = self.training if sample is None else sample
        if not sample:
            return z @ self.weight_mu.T + self._bias_mean(z)
        if self.estimator is Estimator.LOCAL:
            mean, var = self.predictive(z)
            eps = torch.randn(mean.shape, generator=generator, dtype=z.dtype, device=z.device)
            return mean + var.clamp_min(0).sqrt() * eps
        return self._flipout(z, generator)

    def _flipout(self, z: Tensor, generator: torch.Generator | None) -> Tensor:
        opts: dict[str, Any] = {"generator": generator, "dtype": z.dtype, "device": z.device}
        delta_w = self.weight_std * torch.randn(self.weight_mu.shape, **opts)  # (out, in)
        sign_in = torch.randint(0, 2, z.shape, generator=generator, device=z.device).to(z.dtype)
        sign_out = torch.randint(
            0, 2, (z.shape[0], self.out_features), generator=generator, device=z.device
        ).to(z.dtype)
        sign_in, sign_out = 2 * sign_in - 1, 2 * sign_out - 1
        out = z @ self.weight_mu.T + ((z * sign_in) @ delta_w.T) * sign_out
        bias = self._bias_mean(z)
        bias_std = self.bias_std
        if bias_std is not None:
            eps_b = torch.randn((z.shape[0], self.out_features), **opts)
            bias = bias + bias_std * eps_b
        return out + bias

    def sample_weights(
        self, n_samples: int, *, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Draw whole weight sets: ``w (n_samples, out, in)``, ``b (n_samples, out)``."""
        opts: dict[str, Any] = {
            "generator": generator,
            "dtype": self.weight_mu.dtype,
            "device": self.weight_mu.device,
        }
        w = self.weight_mu + self.weight_std * torch.randn(
            (n_samples, *self.weight_mu.shape), **opts
        )
        b_mean = self._bias_mean(self.weight_mu)
        b_std = self._bias_var(self.weight_mu).sqrt()
        b = b_mean + b_std * torch.randn((n_samples, self.out_features), **opts)
        return w, b

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias_mu is not None}, prior_std={self.prior_std}, "
            f"estimator={self.estimator.value}"
        )


class BayesianMLP(nn.Module):
    """A head whose every dense layer is Bayesian (the "full-BNN" of TFP's DenseVariational).

    The predictive moments have no closed form; ``predictive`` estimates them by Monte Carlo
    over ``n_samples`` weight draws (local reparameterisation, one draw per example and layer).

    Shapes:
        - **input:** z ``(n, in_features)``
        - **output:** ``(n, out_features)``
    """

    def __init__(
        self,
        in_features: int,
        hidden: tuple[int, ...] = (32,),
        out_features: int = 1,
        *,
        prior_std: float = 1.0,
        init_std: float = 0.1,
        estimator: Estimator | str = Estimator.LOCAL,
        activation: type[nn.Module] = nn.SiLU,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        widths = (in_features, *hidden, out_features)
        self.layers = nn.ModuleList(
            BayesianLinear(
                a,
                b,
                prior_std=prior_std,
                init_std=init_std,
                estimator=estimator,
                dtype=dtype,
                device=device,
            )
            for a, b in zip(widths[:-1], widths[1:], strict=False)
        )
        self.activation = activation()
        self.in_features = in_features
        self.out_features = out_features

    def reset_parameters(self) -> None:
        for layer in self.layers:
            cast(BayesianLinear, layer).reset_parameters()

    def kl(self) -> Tensor:
        layers = [cast(BayesianLinear, layer) for layer in self.layers]
        return sum((layer.kl() for layer in layers), start=layers[0].weight_mu.new_zeros(()))

    def forward(
        self, z: Tensor, *, sample: bool | None = None, generator: torch.Generator | None = None
    ) -> Tensor:
        h = z
        for k, layer in enumerate(self.layers):
            h = layer(h, sample=sample, generator=generator)
            if k < len(self.layers) - 1:
                h = self.activation(h)
        return h

    @torch.no_grad()
    def predictive(
        self, z: Tensor, *, n_samples: int = 100, generator: torch.Generator | None = None
    ) -> tuple[Tensor, Tensor]:
        """Monte Carlo predictive mean and epistemic variance, each ``(n, out)``."""
        draws = torch.stack([self(z, sample=True, generator=generator) for _ in range(n_samples)])
        return draws.mean(0), draws.var(0, unbiased=True)
