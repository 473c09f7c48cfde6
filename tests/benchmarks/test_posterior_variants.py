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
        graph.forces, graph.has_forces = (
            torch.zeros(4, 3, dtype=torch.float64),
            torch.ones(1, dtype=torch.bool),
        )
        graphs.append(graph)
    frames = bench.collect(model, graphs)
    shared = bench.to_shared(frames, len(model.type_map))
    _state, out, jac = latent_jacobian(model, graphs[0])
    assert torch.allclose(shared[0]["jac"], jac.double(), atol=1e-5)
    assert torch.allclose(shared[0]["forces"], out["forces"].double(), atol=1e-5)
    # the exact variance with Sigma = I is the squared norm of the Jacobian per component
    d = jac.shape[0]
    values = bench.frame_values(
        shared[:1], torch.eye(d, dtype=torch.float64), torch.ones(d, dtype=torch.float64), None
    )
    assert torch.allclose(values["var"], jac.double().square().sum(0).reshape(-1))


@pytest.mark.slow
def test_quick_run_writes_every_variant(bench, tmp_path):
    results = bench.main(["--quick", "--out", str(tmp_path), "--bootstrap", "20"])
    rows = results["cu_emt"]["rows"]
    assert len(rows) == 2 * len(bench.PRECISIONS) * len(bench.GRIDS) * len(bench.RANKS)
    assert (
        json.loads((tmp_path / "posterior_variants.json").read_text())["meta"]["status"]
        == "complete"
    )
    assert "| per_element |" in (tmp_path / "posterior_variants.md").read_text()


def _random_frames(n: int, d: int, gen: torch.Generator) -> list[dict]:
    frames = []
    for _ in range(n):
        n_atoms = 5
        jac = torch.randn(d, n_atoms, 3, generator=gen, dtype=torch.float64)
        frames.append(
            {
                "jac": jac,
                "phi": torch.randn(d, generator=gen, dtype=torch.float64),
                "error": torch.randn(n_atoms, 3, generator=gen, dtype=torch.float64) * 0.1,
                "forces": torch.randn(n_atoms, 3, generator=gen, dtype=torch.float64),
                "n_atoms": n_atoms,
            }
        )
    return frames


def test_probe_rows_are_an_unbiased_estimate_of_the_exact_variance(bench):
    gen = torch.Generator().manual_seed(0)
    d = 7
    factor = torch.randn(d, d, generator=gen, dtype=torch.float64)
    x = torch.randn(d, 4, generator=gen, dtype=torch.float64)
    exact = (factor @ x).square().sum(0)  # (4,)
    for k in (0, 2):
        rows = bench.probe_rows(factor, 4, k, gen)
        assert rows.shape == (4, d)
        assert torch.allclose(rows[:k], factor[:k])
        mean = torch.stack(
            [(bench.probe_rows(factor, 4, k, gen) @ x).square().sum(0) for _ in range(4000)]
        ).mean(0)
        assert torch.allclose(mean, exact, rtol=0.05)
    # a rank-d rotation keeps the whole variance, whatever the rotation
    q = torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=torch.float64))[0]
    assert torch.allclose((q.T @ factor @ x).square().sum(0), exact)


def test_subspace_study_rows(bench):
    gen = torch.Generator().manual_seed(1)
    d = 10
    sets = {
        p: _random_frames(n, d, gen)
        for p, n in (("train", 30), ("valid", 8), ("test", 8), ("ood", 8))
    }
    args = bench.parse_args(["--out", "/tmp/unused", "--seed", "0"])
    rows = bench.subspaces(sets, (0.1, 0.1), args)
    choices = {(r["subspace"], r["rank"]) for r in rows}
    for r in bench.SUBSPACE_RANKS:
        assert {
            ("least_constrained", r),
            ("valid_variance", r),
            ("probes_0", r),
            (f"probes_{r // 2}", r),
        } <= choices
    assert ("exact", "exact") in choices
    probe = next(r for r in rows if r["subspace"] == "probes_0")
    assert probe["draws"] == bench.PROBE_DRAWS and probe["spearman_frame_in_domain_std"] is not None
    assert all(-1.0 <= r["spearman_frame_in_domain"] <= 1.0 for r in rows)
