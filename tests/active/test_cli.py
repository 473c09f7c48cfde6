import csv

import ase.io
import numpy as np
from ase.build import bulk
from typer.testing import CliRunner

from mlip_unc.cli import app

runner = CliRunner()


def test_md_nve_writes_log_traj_plot_and_flags(tmp_path, tiny_checkpoint):
    start = bulk("Cu", cubic=True, a=3.61)
    ase.io.write(tmp_path / "start.xyz", start)
    out = tmp_path / "md"
    result = runner.invoke(
        app,
        [
            "md",
            "--model",
            str(tiny_checkpoint),
            "--structure",
            str(tmp_path / "start.xyz"),
            "--ensemble",
            "nve",
            "--temperature",
            "300",
            "--steps",
            "10",
            "--timestep",
            "0.5",
            "--interval",
            "5",
            "--out",
            str(out),
            "--max-force-std",
            "0.5",
            "--relative",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = list(csv.DictReader((out / "md.csv").open()))
    assert [r["step"] for r in rows] == ["0", "5", "10"]
    assert len(ase.io.read(out / "md.traj", ":")) == 3 and (out / "md.png").stat().st_size > 0
    flagged = ase.io.read(out / "flagged.xyz", ":") if (out / "flagged.xyz").stat().st_size else []
    assert len(flagged) == sum(int(r["flag"]) for r in rows) >= 1  # 0.5x the level is exceeded


def test_md_relative_threshold_without_levels_is_a_clear_error(tmp_path):
    from mlip_unc.models.potential import BayesianPotential, build_backbone

    backbone = build_backbone("gin", num_types=1, r_max=4.0, hidden=8, latent_dim=4, num_layers=1)
    BayesianPotential(backbone, [29], 4.0).double().save(tmp_path / "m.pt")
    ase.io.write(tmp_path / "s.xyz", bulk("Cu", cubic=True))
    result = runner.invoke(
        app,
        [
            "md",
            "-m",
            str(tmp_path / "m.pt"),
            "-s",
            str(tmp_path / "s.xyz"),
            "--max-force-std",
            "2",
            "--relative",
            "--out",
            str(tmp_path / "o"),
        ],
    )
    assert result.exit_code == 1 and "uncertainty_levels" in result.output


def test_flag_top_k_diverse_and_threshold(tmp_path, tiny_checkpoint):
    frames = []
    for k in range(6):
        atoms = bulk("Cu", cubic=True, a=3.61)
        atoms.rattle(0.02 * (k + 1), seed=k)
        frames.append(atoms)
    ase.io.write(tmp_path / "cand.xyz", frames)
    out = tmp_path / "sel.xyz"
    result = runner.invoke(
        app,
        [
            "flag",
            "-m",
            str(tiny_checkpoint),
            "-d",
            str(tmp_path / "cand.xyz"),
            "--top-k",
            "2",
            "--diverse",
            "latent",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    chosen = ase.io.read(out, ":")
    assert len(chosen) == 2 and chosen[0].info["max_force_std"] == max(
        a.info["max_force_std"] for a in ase.io.read(out, ":")
    )
    result = runner.invoke(
        app,
        [
            "flag",
            "-m",
            str(tiny_checkpoint),
            "-d",
            str(tmp_path / "cand.xyz"),
            "--threshold",
            "0",
            "--metric",
            "energy_std_per_atom",
            "--out",
            str(out),
            "--overwrite",
        ],
    )
    assert result.exit_code == 0, result.output
    scores = [a.info["energy_std_per_atom"] for a in ase.io.read(out, ":")]
    assert len(scores) == 6 and np.all(np.diff(scores) <= 0)
    result = runner.invoke(
        app,
        [
            "flag",
            "-m",
            str(tiny_checkpoint),
            "-d",
            str(tmp_path / "cand.xyz"),
            "--diverse",
            "latent",
        ],
    )
    assert result.exit_code == 1 and "give --top-k" in result.output


def test_active_module_imports_nothing_heavy():
    import subprocess
    import sys

    heavy = ("torch", "mlip_unc.data", "mlip_unc.calculator", "mlip_unc.active")
    code = f"import sys, mlip_unc.cli.active; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_active_learn_config_errors_name_the_key(tmp_path):
    config = tmp_path / "al.yaml"
    config.write_text(
        "structures: {bulk: Cu, cubic: true}\nbootstrap: {frames: 2}\nmd: {temp: 300}\n"
    )
    result = runner.invoke(app, ["active-learn", "-c", str(config), "--out", str(tmp_path / "al")])
    assert result.exit_code == 1 and "md.temp: unknown key" in result.output
    result = runner.invoke(
        app,
        [
            "active-learn",
            "--config",
            str(config),
            "--set",
            "md={}",
            "--set",
            "thresholds.max_force=2",
            "--out",
            str(tmp_path / "al"),
        ],
    )
    assert (
        result.exit_code == 1
        and "thresholds: unknown threshold keys ['max_force']" in result.output
    )
    assert not (tmp_path / "al").exists()
