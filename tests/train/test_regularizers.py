"""AGL and intervention terms (docs/method.md sections 5 and 6)."""

from __future__ import annotations

import pytest
import torch

from mlip_unc.train import regularizers as reg
from mlip_unc.train.regularizers import LambdaSchedule, RegularizerKind


def _inputs(
    seed: int = 0, n: int = 16, d: int = 6
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64, requires_grad=True)
    mu = torch.randn(d, generator=g, dtype=torch.float64, requires_grad=True)
    s2 = (torch.rand(d, generator=g, dtype=torch.float64) + 0.1).requires_grad_(True)
    return z, mu, s2


@pytest.mark.parametrize("kind", [k for k in RegularizerKind if k is not RegularizerKind.NONE])
def test_gradients_reach_z_only(kind: RegularizerKind) -> None:
    z, mu, s2 = _inputs()
    term = reg.regularizer_term(kind, z, mu, s2)
    assert term.shape == ()
    term.backward()
    assert (
        z.grad is not None and bool(torch.isfinite(z.grad).all()) and float(z.grad.abs().sum()) > 0
    )
    assert mu.grad is None and s2.grad is None


def test_none_kind_and_unknown_kind() -> None:
    z, mu, s2 = _inputs()
    assert float(reg.regularizer_term("none", z, mu, s2)) == 0.0
    with pytest.raises(ValueError):
        reg.regularizer_term("sparsity", z, mu, s2)


def test_agl_rayleigh_minimised_on_lowest_variance_axis() -> None:
    s2 = torch.tensor([0.5, 0.1, 0.9, 0.3], dtype=torch.float64)
    z_low = torch.tensor([[0.0, 3.0, 0.0, 0.0], [0.0, -0.2, 0.0, 0.0]], dtype=torch.float64)
    assert float(reg.agl_rayleigh(z_low, s2)) == pytest.approx(0.1, rel=1e-6)
    g = torch.Generator().manual_seed(1)
    z_rand = torch.randn(500, 4, generator=g, dtype=torch.float64)
    assert float(reg.agl_rayleigh(z_rand, s2)) > 0.1
    assert float(reg.agl_rayleigh(5.0 * z_rand, s2)) == pytest.approx(
        float(reg.agl_rayleigh(z_rand, s2))
    )
    assert float(reg.anti_alignment(z_rand, s2)) == pytest.approx(
        -float(reg.agl_rayleigh(z_rand, s2))
    )


def test_agl_rayleigh_descent_moves_z_to_low_variance_axis() -> None:
    s2 = torch.tensor([0.5, 0.1, 0.9, 0.3], dtype=torch.float64)
    z = torch.randn(
        8, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64
    ).requires_grad_(True)
    opt = torch.optim.SGD([z], lr=2.0)
    for _ in range(300):
        opt.zero_grad()
        reg.agl_rayleigh(z, s2).backward()
        opt.step()
    assert float(reg.agl_rayleigh(z.detach(), s2)) < 0.11


def test_agl_mean_zero_on_s_inverse_mu() -> None:
    _, mu, s2 = _inputs()
    z = torch.stack([c * mu.detach() / s2.detach() for c in (0.5, -2.0)])
    assert float(reg.agl_mean(z, mu, s2)) == pytest.approx(0.0, abs=1e-6)
    z_rand, _, _ = _inputs(seed=3)
    assert 0.0 < float(reg.agl_mean(z_rand.detach(), mu, s2)) <= 1.0


def test_isotropy_penalty() -> None:
    signs = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0], [1.0, 1.0, -1.0]])
    assert float(reg.isotropy_penalty(signs)) == pytest.approx(0.0, abs=1e-12)
    z = torch.randn(64, 3, generator=torch.Generator().manual_seed(4)) * torch.tensor(
        [3.0, 1.0, 0.1]
    )
    assert float(reg.isotropy_penalty(z)) > 0.5
    assert float(reg.isotropy_penalty(10.0 * z)) == pytest.approx(
        float(reg.isotropy_penalty(z)), rel=1e-5
    )


def test_decorrelation_matches_covariance() -> None:
    z = _inputs(n=32, d=4)[0].detach()
    cov = torch.cov(z.T)
    expected = (cov**2).sum() - (torch.diagonal(cov) ** 2).sum()
    assert float(reg.decorrelation(z)) == pytest.approx(float(expected))
    diag_only = torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    assert float(reg.decorrelation(diag_only)) == pytest.approx(0.0)
    assert float(reg.decorrelation(z[:1])) == 0.0


def test_lambda_schedule() -> None:
    sched = LambdaSchedule(warmup_epochs=30, ramp_epochs=30, lam_max=2.0)
    assert [sched(e) for e in (0, 29, 30, 45, 60, 150)] == [0.0, 0.0, 0.0, 1.0, 2.0, 2.0]
    assert LambdaSchedule(5, 0, 1.5)(5) == 1.5
    with pytest.raises(ValueError):
        LambdaSchedule(-1, 0, 1.0)
