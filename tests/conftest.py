"""Test-wide settings: tiny models run fastest on one thread (and CI shares 2 cores)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _one_torch_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
