"""Test-wide settings: tiny models run fastest on one thread (and CI shares 2 cores)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture
def tiny_checkpoint(tmp_path):
    """An untrained tiny Cu potential saved with calibrated uncertainty levels."""
    import torch

    from mlip_unc.models.potential import BayesianPotential, build_backbone

    torch.manual_seed(0)
    backbone = build_backbone(
        "gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1, num_basis=4
    )
    model = BayesianPotential(backbone, [29], 4.0, torch.tensor([-0.01]), init_std=0.3).double()
    path = tmp_path / "tiny.pt"
    model.save(
        path, metadata={"uncertainty_levels": {"max_force_std": 1e-3, "energy_std_per_atom": 1e-3}}
    )
    return path
