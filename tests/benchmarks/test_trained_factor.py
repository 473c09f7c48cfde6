"""benchmarks/trained_factor.py: a low-rank factor trained end to end with the predictive NLL."""

import json

import pytest
import torch
from benchmark_scripts import load_benchmark
from torch_geometric.loader import DataLoader

from mlip_unc import keys
from mlip_unc.models.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("trained_factor")


@pytest.fixture(scope="module")
def quick(bench, tmp_path_factory):
    out = tmp_path_factory.mktemp("tf")
    return out, bench.main(["--quick", "--out", str(out)])


def test_quick_run_rows_lines_and_resume(bench, quick):
    out, summary = quick
    run = out / "run"
    (r,) = summary["runs"]
    assert summary["status"] == "complete" and r["rank"] == 4
    assert set(r["rows"]) == {
        "default",
        "committee5",
        "force_magnitude",
        "latent_distance",
        "trained_factor",
        "trained_factor_llpr",
    }
    entry = json.loads((run / "force_uncertainty.json").read_text())["cu_emt"]
    for row in (
        "committee5",
        "force_magnitude",
        "latent_distance",
    ):  # the run's own rows, same frames
        assert r["rows"][row] == entry[row]
    assert r["rows"]["trained_factor"]["cost_ratio"] == pytest.approx(
        r["cost_ms"]["lowrank"] / r["cost_ms"]["none"]
    )
    for key, lines in r["lines"].items():
        assert lines["all"] == all(lines[k]["met"] for k in bench.cf.LINES), key
    steps = [json.loads(x)["step"] for x in (run / "trained_factor.jsonl").read_text().splitlines()]
    assert "train:cu_emt:4" in steps and "eval:cu_emt:trained_factor_llpr" in steps
    assert "| trained_factor |" in (out / "trained_factor.md").read_text()
    bench.main(["--quick", "--out", str(out)])  # again: nothing trained or evaluated a second time
    again = [json.loads(x)["step"] for x in (run / "trained_factor.jsonl").read_text().splitlines()]
    assert [s for s in again if not s.startswith("invocation:")] == [
        s for s in steps if not s.startswith("invocation:")
    ]


def test_attached_factor_is_what_was_trained(bench, quick):
    """The lowrank mode of the loaded model gives the variances the training loss used, and the
    checkpoints are plain data (the factor beside the model, not inside it)."""
    out, _ = quick
    folder = out / "run" / "checkpoints" / "force_uncertainty" / "cu_emt_trained_factor4"
    saved = load_checkpoint(folder / bench.FACTOR_FILE)  # weights_only load
    assert saved["factor"].shape[0] == 4
    assert "trained_factor" not in load_checkpoint(folder / "model.pt")["model_state"]
    model = bench.trained_model(folder, 4)
    batch = next(iter(DataLoader(model_frames(out, model, bench), batch_size=3)))
    got = model(batch, compute_forces=True, uncertainty="lowrank")
    ref, epistemic = bench.factor_forward(
        model, batch, saved["factor"].to(model.dtype), model.posterior_blocks
    )
    torch.testing.assert_close(got[keys.FORCES_VAR], epistemic[keys.FORCES].detach())
    torch.testing.assert_close(got[keys.ENERGY_EPISTEMIC_VAR], epistemic[keys.ENERGY].detach())
    torch.testing.assert_close(got[keys.FORCES], ref[keys.FORCES].detach())
    assert float(epistemic[keys.FORCES].max()) > 0.0


def test_the_loss_trains_the_factor(bench, quick):
    out, _ = quick
    model = bench.trained_model(
        out / "run" / "checkpoints" / "force_uncertainty" / "cu_emt_trained_factor4", 4
    )
    factor = torch.nn.Parameter(model.full_posterior().factor[:4].to(model.dtype).clone())
    batch = next(iter(DataLoader(model_frames(out, model, bench), batch_size=3)))
    _, epistemic = bench.factor_forward(
        model, batch, factor, model.posterior_blocks, create_graph=True
    )
    epistemic[keys.FORCES].sum().backward()
    assert factor.grad is not None and float(factor.grad.abs().sum()) > 0.0
    # a rank-one factor with zero rows gives exactly zero variance
    _, zero = bench.factor_forward(model, batch, torch.zeros_like(factor), model.posterior_blocks)
    assert (
        float(zero[keys.FORCES].detach().abs().max()) == 0.0
        and float(zero[keys.ENERGY].detach().abs().max()) == 0.0
    )


def model_frames(out, model, bench):
    """Three rattled Cu cells (unlabelled) as graphs of ``model``."""
    from ase.build import bulk

    from mlip_unc.data import StructureDataset, TypeMap

    frames = [bulk("Cu", "fcc", a=3.6, cubic=True).repeat((2, 1, 1)) for _ in range(3)]
    for k, atoms in enumerate(frames):
        atoms.rattle(0.05, seed=50 + k)
    return StructureDataset.from_atoms(
        frames, model.r_max, TypeMap.from_list(model.type_map), dtype=model.dtype
    ).graphs
