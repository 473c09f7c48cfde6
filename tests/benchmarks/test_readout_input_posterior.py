"""benchmarks/readout_input_posterior.py: a last-layer posterior over the readout's input features."""

import argparse
import json

import pytest
import torch
from benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("readout_input_posterior")


def test_quick_rows_jacobians_and_resume(bench, tmp_path):
    summary = bench.main(["--quick", "--out", str(tmp_path)])
    run = tmp_path / "run"
    (r,) = summary["runs"]
    assert summary["status"] == "complete"
    model = bench.BayesianPotential.from_checkpoint(
        run / "checkpoints/force_uncertainty/cu_emt_single/model.pt"
    )
    model.eval()
    n_el, d, c = len(model.type_map), model.latent_dim, r["readout_input_width"]
    widths = {(row["features"], row["rank"]): row["width"] for row in r["rows"]}
    assert (
        widths[("z", 4)] == n_el * d
        and widths[("x", "exact")] == n_el * c
        and widths[("z+x", 8)] == n_el * (d + c)
    )
    assert len(r["rows"]) == len(bench.FEATURES) * len(bench.RANKS)
    for row in r["rows"]:
        assert row["lines"]["committee5"]["all"] == all(
            row["lines"]["committee5"][k]["met"] for k in bench.cf.LINES
        )
        assert row["std_over_rmse"] > 0
    # the forward-mode Jacobian of the z block is the model's own (reverse-mode, per element) one
    work = tmp_path / "split"
    work.mkdir()
    split = bench.fu.dataset_split("cu_emt", argparse.Namespace(data_root=tmp_path, seed=0), work)
    graphs = list(bench.fu.load_frames(split["ood"], model, split, 3).graphs)
    reader = bench.ReadoutInput(model)
    ours = bench.collect(model, reader, graphs)
    theirs = bench.pv.collect(model, graphs)
    for a, b in zip(ours, theirs, strict=False):
        z_block = a["jac"][:, :d].reshape(n_el * d, *a["jac"].shape[2:])
        torch.testing.assert_close(z_block, b["jac"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a["phi"][:, :d].reshape(-1), b["phi"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(a["error"], b["error"], rtol=1e-4, atol=1e-5)
        assert a["jac"][:, d:].abs().sum() > 0  # x moves with the positions too
    steps = [
        json.loads(x)["step"]
        for x in (run / "readout_input_posterior.jsonl").read_text().splitlines()
    ]
    bench.main(["--quick", "--out", str(tmp_path)])  # again: nothing computed a second time
    again = [
        json.loads(x)["step"]
        for x in (run / "readout_input_posterior.jsonl").read_text().splitlines()
    ]
    assert [s for s in again if not s.startswith("invocation:")] == [
        s for s in steps if not s.startswith("invocation:")
    ]
    assert "| z+x | 8 |" in (tmp_path / "readout_input_posterior.md").read_text()
