"""Gaussian observation noise: the aleatoric part of the predictive variance.

As defined in docs/method.md section 2 of this project, y = w^T z + b + eps with
eps ~ N(0, sigma_n^2): sigma_n is either one learned number per target (homoscedastic) or a
second output of the latent through softplus (heteroscedastic). Every noise module maps the
latent to the aleatoric variance, so the models treat both alike::

    noise(z) -> sigma_n^2   (n, out)

The total predictive variance is ``epistemic (from the weight posterior) + noise(z)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mlip_unc.config.enums import Likelihood
from mlip_unc.nn.bayesian import inverse_softplus


class HomoscedasticNoise(nn.Module):
    """Learned input-independent noise.

    Shapes:
        - **input:** z ``(n, d)`` (only its length, dtype and device are used)
        - **output:** variance ``(n, out_features)``
    """

    def __init__(
        self,
        out_features: int = 1,
        *,
        init_std: float = 1.0,
        min_std: float = 1e-3,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if init_std <= min_std:
            raise ValueError(f"init_std ({init_std}) must exceed min_std ({min_std})")
        self.out_features, self.init_std, self.min_std = (
            out_features,
            float(init_std),
            float(min_std),
        )
        self.rho = nn.Parameter(torch.empty(out_features, dtype=dtype, device=device))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.constant_(self.rho, inverse_softplus(self.init_std - self.min_std))

    @property
    def std(self) -> Tensor:  # (out,)
        return F.softplus(self.rho) + self.min_std

    def forward(self, z: Tensor) -> Tensor:
        return self.std.expand(z.shape[0], self.out_features) ** 2


class HeteroscedasticNoise(nn.Module):
    """Input-dependent noise, a linear output of z through softplus.

    Shapes:
        - **input:** z ``(n, in_features)``
        - **output:** variance ``(n, out_features)``
    """

    def __init__(
        self,
        in_features: int,
        out_features: int = 1,
        *,
        init_std: float = 1.0,
        min_std: float = 1e-3,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        if init_std <= min_std:
            raise ValueError(f"init_std ({init_std}) must exceed min_std ({min_std})")
        self.out_features, self.init_std, self.min_std = (
            out_features,
            float(init_std),
            float(min_std),
        )
        self.linear = nn.Linear(in_features, out_features, dtype=dtype, device=device)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.normal_(self.linear.weight, std=0.01)  # start near the homoscedastic init_std
        nn.init.constant_(self.linear.bias, inverse_softplus(self.init_std - self.min_std))

    def forward(self, z: Tensor) -> Tensor:
        return (F.softplus(self.linear(z)) + self.min_std) ** 2


def make_noise(
    kind: Likelihood | str,
    in_features: int,
    out_features: int = 1,
    *,
    init_std: float = 1.0,
    min_std: float = 1e-3,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> HomoscedasticNoise | HeteroscedasticNoise:
    """The noise module for ``kind`` (keyword arguments as in the modules' constructors)."""
    if Likelihood(kind) is Likelihood.HOMOSCEDASTIC:
        return HomoscedasticNoise(
            out_features, init_std=init_std, min_std=min_std, dtype=dtype, device=device
        )
    return HeteroscedasticNoise(
        in_features, out_features, init_std=init_std, min_std=min_std, dtype=dtype, device=device
    )
