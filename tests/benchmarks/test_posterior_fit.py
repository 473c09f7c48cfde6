"""benchmarks.posterior_fit on a tiny trained potential: the refit reproduces the stored
posterior, its share of the training time is recorded, and a rerun skips what is done."""

from __future__ import annotations

import json

import ase.io
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from benchmarks import posterior_fit
from mlip_unc.config import potential_config_from_dict
from mlip_unc.train.potential import train_potential


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fit_time")
    frames = []
    for k in range(20):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.1, seed=k)
        atoms.calc = EMT()
        atoms.calc = SinglePointCalculator(
            atoms, energy=atoms.get_potential_energy(), forces=atoms.get_forces()
        )
        frames.append(atoms)
    ase.io.write(root / "train.xyz", frames[:12] + frames[16:])
    ase.io.write(root / "test.xyz", frames[12:16])
    config = potential_config_from_dict(
        {
            "out": str(root / "run"),
            "dtype": "float64",
            "data": {
                "train": str(root / "train.xyz"),
                "test": str(root / "test.xyz"),
                "valid_fraction": 0.25,
                "r_max": 4.0,
            },
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 8, "num_layers": 2},
                "latent_dim": 6,
                "posterior_probes": 2,
                "posterior_valid_frames": 2,
            },
            "train": {"epochs": 2, "batch_size": 4, "progress": False},
        }
    )
    return train_potential(config).model_path


def test_refit_record_page_and_resume(checkpoint, tmp_path):
    argv = ["--model", f"tiny_cu={checkpoint}:0.5", "--out", str(tmp_path)]
    posterior_fit.main(argv)
    (record,) = [json.loads(x) for x in (tmp_path / posterior_fit.RECORDS).read_text().splitlines()]
    assert record["n_fit_frames"] == 12 and record["width"] == 6
    assert record["fit_share"] == pytest.approx(record["fit_seconds"] / 30.0)
    assert record["probes"] == 2  # the checkpoint's config (no shipped config of that name)
    for key in ("alpha2_forces", "alpha2_energy"):  # the same fit as training made (same probes)
        assert record["refit"][key] == pytest.approx(record["stored"][key], rel=1e-6)
    assert set(record["first_frame_jacobian_seconds"]) == {"forward", "reverse"}
    page = (tmp_path / "posterior_fit.md").read_text()
    assert record["n_valid_frames"] == 2  # the checkpoint's cap, as training fitted
    assert "| tiny_cu | - | gin | shared (6) | 12 (2) + 2 |" in page
    posterior_fit.main(argv)  # done: skipped, the page rewritten from the one record
    assert len((tmp_path / posterior_fit.RECORDS).read_text().splitlines()) == 1
    posterior_fit.main([*argv, "--probes", "0", "--tag", "exact", "--test-frames", "3"])
    exact = json.loads((tmp_path / posterior_fit.RECORDS).read_text().splitlines()[1])
    assert exact["probes"] is None and exact["tag"] == "exact" and record["test"] is None
    assert exact["test"]["n_frames"] == 3 and exact["test"]["mode"] == "auto"
    assert -1 <= exact["test"]["spearman_frame"] <= 1 and exact["test"]["std_over_rmse"] > 0
    assert exact["refit"]["alpha2_forces"] != pytest.approx(record["refit"]["alpha2_forces"])
    assert (
        "| tiny_cu | exact | gin | shared (6) | 12 (exact) + 2 |"
        in (tmp_path / "posterior_fit.md").read_text()
    )


def _record(model: str, command: str, share: float) -> dict:
    return {
        "model": model,
        "backbone": "gin",
        "posterior_basis": "shared",
        "width": 6,
        "fit_seconds": 60.0 * 8 * share,
        "train_minutes": 8,
        "fit_share": share,
        "load_average": [0.3, 0.4, 0.5],
        "command": command,
        "tag": "",
    }


def test_the_page_opens_with_the_latest_run_against_the_target():
    old = _record("a", "run one", 0.05)
    records = [old, _record("a", "run two", 0.02), _record("b", "run two", 0.12)]
    assert posterior_fit.latest_run(records) == records[1:]  # the last command's records only
    section = "\n".join(posterior_fit.latest_section(records))
    assert "`run two`" in section and "run one" not in section
    assert "| a | gin | shared (6) | 9.6 | 8 | 2.0 % | yes |" in section
    assert "| b | gin | shared (6) | 57.6 | 8 | 12.0 % | no |" in section
    assert posterior_fit.latest_section([]) == []
