"""benchmarks/posterior_variants.py: its Jacobians agree with the model's own (fast), and the
--quick run writes every variant (slow)."""

import json

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("posterior_variants")


def test_per_element_jacobians_sum_to_the_models_and_give_its_forces(bench):
    from ase.build import bulk

    from mlip_unc.data import TypeMap, atoms_to_graph
    from mlip_unc.models.backbones import build_backbone
    from mlip_unc.models.full_posterior import latent_jacobian
    from mlip_unc.models.potential import BayesianPotential

    types = TypeMap.from_list([13, 29])
    torch.manual_seed(0)
    backbone = build_backbone("gin", num_types=2, r_max=4.0, latent_dim=6, hidden=8, num_layers=2)
    model = BayesianPotential(backbone, types.to_list(), 4.0).double().eval()
    graphs = []
    for seed in range(2):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms[1].symbol = "Al"
        atoms.rattle(0.08, seed=seed)
        graph = atoms_to_graph(atoms, 4.0, types, dtype=torch.float64)
        graph.forces, graph.has_forces = torch.zeros(4, 3, dtype=torch.float64), torch.ones(1, dtype=torch.bool)
        graphs.append(graph)
    frames = bench.collect(model, graphs)
    shared = bench.to_shared(frames, len(model.type_map))
    _state, out, jac = latent_jacobian(model, graphs[0])
    assert torch.allclose(shared[0]["jac"], jac.double(), atol=1e-5)
    assert torch.allclose(shared[0]["forces"], out["forces"].double(), atol=1e-5)
    # the exact variance with Sigma = I is the squared norm of the Jacobian per component
    d = jac.shape[0]
    values = bench.frame_values(shared[:1], torch.eye(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64), None)
    assert torch.allclose(values["var"], jac.double().square().sum(0).reshape(-1))


@pytest.mark.slow
def test_quick_run_writes_every_variant(bench, tmp_path):
    results = bench.main(["--quick", "--out", str(tmp_path), "--bootstrap", "20"])
    rows = results["cu_emt"]["rows"]
    assert len(rows) == 2 * len(bench.PRECISIONS) * len(bench.GRIDS) * len(bench.RANKS)
    assert json.loads((tmp_path / "posterior_variants.json").read_text())["meta"]["status"] == "complete"
    assert "| per_element |" in (tmp_path / "posterior_variants.md").read_text()
