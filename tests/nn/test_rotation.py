"""The latent rotation intervention Q z (docs/method.md section 5)."""

from __future__ import annotations

import torch

from mlip_unc.nn.rotation import RandomRotation


def test_random_rotation_orthogonal_and_reproducible() -> None:
    rot = RandomRotation(5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    q = rot.Q
    torch.testing.assert_close(q @ q.T, torch.eye(5, dtype=torch.float64))
    again = RandomRotation(5, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    torch.testing.assert_close(again.Q, q)
    assert not torch.allclose(RandomRotation(5, seed=8, dtype=torch.float64).Q, q)
    z = torch.randn(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(rot(z), z @ q.T)
    torch.testing.assert_close(rot(z).norm(dim=1), z.norm(dim=1))
    assert "Q" in rot.state_dict()


def test_random_rotation_redraws_only_in_training() -> None:
    rot = RandomRotation(4, seed=0, redraw=True)
    z = torch.randn(2, 4, generator=torch.Generator().manual_seed(2))
    q0 = rot.Q.clone()
    rot(z)
    q1 = rot.Q.clone()
    assert not torch.allclose(q0, q1)
    rot.eval()
    rot(z)
    torch.testing.assert_close(rot.Q, q1)


def test_random_rotation_leaves_global_rng_alone() -> None:
    state = torch.get_rng_state()
    RandomRotation(6, seed=3)(torch.ones(1, 6))
    assert torch.equal(torch.get_rng_state(), state)
