"""Potential training on tiny EMT data: loss falls, checkpoints load, resume, KL / N_train."""

import json

import ase
import ase.io
import numpy as np
import pytest
import torch
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc import keys
from mlip_unc.config import potential_config_from_dict as config_from_dict
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.models.committee import Committee
from mlip_unc.models.loading import load_potential
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train import potential as potential_trainer
from mlip_unc.train.potential import run_training, train_potential
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.train.regularizers import EPS, regularizer_term


def _labelled(atoms):
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


def _emt_frames(n=8):
    """Rattled 4-atom fcc cells (Cu, every other one with an Al), plus isolated Cu and Al."""
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        if k % 2:
            atoms[0].symbol = "Al"
        atoms.rattle(0.1, seed=k)
        frames.append(_labelled(atoms))
    isolated = [_labelled(ase.Atoms(s, positions=[[0, 0, 0]])) for s in ("Cu", "Al")]
    return frames, isolated


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("emt")
    frames, isolated = _emt_frames()
    ase.io.write(root / "train.xyz", frames + isolated)
    return root


def _config(data_dir, out, **train):
    return config_from_dict(
        {
            "seed": 0,
            "out": str(out),
            "data": {"train": str(data_dir / "train.xyz"), "valid_fraction": 0.25, "r_max": 4.0},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 8, "num_layers": 1},
                "latent_dim": 4,
            },
            "train": {"epochs": 2, "batch_size": 2, "lr": 0.02, "progress": False, **train},
        }
    )


def test_prepare_data_uses_isolated_frames(data_dir, tmp_path):
    data = prepare_data(_config(data_dir, tmp_path))
    assert (len(data.train), len(data.valid)) == (6, 2)  # the two one-atom frames are references
    cu = _labelled(ase.Atoms("Cu", positions=[[0, 0, 0]])).get_potential_energy()
    assert data.reference_energies[29] == pytest.approx(cu)
    assert data.avg_num_neighbors > 1


def test_training_lowers_loss_and_writes_loadable_checkpoint(data_dir, tmp_path):
    result = train_potential(_config(data_dir, tmp_path / "run", epochs=4))
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert len(history["epochs"]) == 4 and history["n_train"] == 6
    assert history["epochs"][-1]["valid_loss"] < history["initial"]["valid_loss"]
    assert history["epochs"][-1]["train_loss"] < history["epochs"][0]["train_loss"]
    model = BayesianPotential.from_checkpoint(result.model_path)
    data = prepare_data(_config(data_dir, tmp_path))
    out = model(data.valid.graphs[0], uncertainty="exact")
    assert out[keys.FORCES].shape == (4, 3) and torch.isfinite(out[keys.FORCES_VAR]).all()
    assert result.best_epoch == history["best_epoch"] >= 1
    levels = load_checkpoint(result.model_path)["metadata"]["uncertainty_levels"]
    assert (
        levels["max_force_std"] > 0
        and levels["energy_std_per_atom"] > 0
        and levels["n_structures"] == 2
    )


def test_fixed_noise_stays_at_its_initial_value(data_dir, tmp_path):
    """model.learn_noise=false: the noise stds are not trained (a fixed-weight loss)."""
    raw = _config(data_dir, tmp_path / "fixed", epochs=2).to_dict()
    cfg = config_from_dict({**raw, "model": {**raw["model"], "learn_noise": False}})
    data = prepare_data(cfg)
    result = train_potential(cfg, data=data)
    model = BayesianPotential.from_checkpoint(result.model_path)
    assert float(model.energy_noise) == pytest.approx(max(data.energy_std, 1e-3), rel=1e-6)
    assert float(model.force_noise) == pytest.approx(max(data.force_rms, 1e-3), rel=1e-6)
    learned = BayesianPotential.from_checkpoint(
        train_potential(_config(data_dir, tmp_path / "learned", epochs=2)).model_path
    )
    assert float(learned.force_noise) != pytest.approx(max(data.force_rms, 1e-3), rel=1e-3)


def test_kl_divided_by_number_of_training_structures(data_dir, tmp_path, monkeypatch):
    seen = []
    original = potential_trainer.potential_loss

    def spy(*args, **kwargs):
        seen.append((kwargs["n_train"], kwargs["beta"], kwargs["kl"] is not None))
        return original(*args, **kwargs)

    monkeypatch.setattr(potential_trainer, "potential_loss", spy)
    train_potential(_config(data_dir, tmp_path, epochs=1))
    assert seen and all(entry == (6, 1.0, True) for entry in seen)


def test_resume_reaches_the_same_state(data_dir, tmp_path):
    straight = train_potential(_config(data_dir, tmp_path / "a", epochs=2))
    train_potential(_config(data_dir, tmp_path / "b", epochs=1))
    resumed = train_potential(_config(data_dir, tmp_path / "b", epochs=2, resume=True))
    assert len(resumed.history) == 2 and resumed.history[-1]["epoch"] == 2
    a = torch.load(tmp_path / "a" / "last.pt", weights_only=True)["model_state"]
    b = torch.load(tmp_path / "b" / "last.pt", weights_only=True)["model_state"]
    assert all(torch.allclose(a[k], b[k]) for k in a)
    again = train_potential(_config(data_dir, tmp_path / "b", epochs=2, resume=True))
    assert len(again.history) == 2 and again.stop_reason == "epochs"
    assert straight.history[-1]["valid_loss"] == pytest.approx(resumed.history[-1]["valid_loss"])


def test_time_budget_stops(data_dir, tmp_path):
    result = train_potential(_config(data_dir, tmp_path, epochs=50, max_minutes=1e-6))
    assert result.stop_reason == "time" and len(result.history) == 1
    assert result.history[0]["partial"]


def test_map_ensemble_is_a_committee(data_dir, tmp_path):
    cfg = _config(data_dir, tmp_path / "ens", epochs=1, ensemble=2)
    cfg = config_from_dict({**_as_raw(cfg), "model": {**_as_raw(cfg)["model"], "head": "map"}})
    results = run_training(cfg)
    assert [r.model_path.parent.name for r in results] == ["member_0", "member_1"]
    committee = load_potential(tmp_path / "ens")
    assert isinstance(committee, Committee)
    graph = prepare_data(cfg).valid.graphs[0]
    out = committee(graph, uncertainty="energy")
    members = [BayesianPotential.from_checkpoint(r.model_path).eval() for r in results]
    f0, f1 = (m(graph)[keys.FORCES].detach() for m in members)
    assert float((f0 - f1).abs().max()) > 1e-6  # two seeds: different members
    # the population variance of two values a, b is ((a - b) / 2)^2
    torch.testing.assert_close(out[keys.FORCES_VAR], ((f0 - f1) / 2).square())
    torch.testing.assert_close(out[keys.FORCES], (f0 + f1) / 2)
    assert float(members[0].posterior()[1].detach().max()) < 1e-12  # MAP: no posterior width


def _as_raw(cfg):
    return cfg.to_dict()


def test_agl_regularizer_is_logged_at_its_value(data_dir, tmp_path, monkeypatch):
    calls = []

    def spy(kind, z, mu, s2):  # the real term, with the latents it was given
        calls.append((z.detach().double(), s2.detach().double()))
        return regularizer_term(kind, z, mu, s2)

    monkeypatch.setattr(potential_trainer, "regularizer_term", spy)
    raw = _as_raw(_config(data_dir, tmp_path, epochs=1))
    raw["regularizer"] = {"kind": "agl_rayleigh", "lambda_max": 0.5}
    raw["train"]["ema_decay"] = 0.9
    result = train_potential(config_from_dict(raw))
    n_atoms = sum(g.num_nodes for g in prepare_data(config_from_dict(raw)).train.graphs)
    # 6 training frames in 3 batches of 2; lambda = lambda_max from the first step (no warm-up)
    assert len(calls) == 3 and sum(z.shape[0] for z, _ in calls) == n_atoms
    # the Rayleigh quotient z^T diag(s2) z / (z^T z + eps), averaged over atoms, then batches
    rayleigh = [float(((z.square() @ s2) / (z.square().sum(1) + EPS)).mean()) for z, s2 in calls]
    assert result.history[0]["train_regularizer"] == pytest.approx(0.5 * np.mean(rayleigh))
    assert np.isfinite(result.history[0]["valid_loss"])


def test_init_from_fine_tunes_a_checkpoint(data_dir, tmp_path):
    first = train_potential(_config(data_dir, tmp_path / "a", epochs=1))
    raw = _as_raw(_config(data_dir, tmp_path / "b", epochs=1, init_from=str(first.model_path)))
    raw["model"]["latent_dim"] = 7  # ignored: the architecture comes from the checkpoint
    tuned = train_potential(config_from_dict(raw))
    start = BayesianPotential.from_checkpoint(first.model_path)
    assert (
        tuned.history[0]["valid_loss"]
        < json.loads((tmp_path / "a" / "history.json").read_text())["initial"]["valid_loss"]
    )
    assert BayesianPotential.from_checkpoint(tuned.model_path).latent_dim == start.latent_dim == 4


def test_no_validation_split_trains_on_the_training_set(data_dir, tmp_path):
    """data.valid_fraction=0: validation, best model, posterior and levels use the training set."""
    raw = _as_raw(_config(data_dir, tmp_path, epochs=2))
    raw["data"]["valid_fraction"] = 0.0
    result = train_potential(config_from_dict(raw))
    assert result.stop_reason == "epochs" and np.isfinite(result.history[-1]["valid_loss"])
    metadata = load_checkpoint(result.model_path)["metadata"]
    assert metadata["uncertainty_levels"]["n_structures"] == 8  # every multi-atom training frame


def test_a_run_folder_is_never_overwritten_silently(data_dir, tmp_path):
    train_potential(_config(data_dir, tmp_path / "run", epochs=1))
    before = (tmp_path / "run" / "model.pt").read_bytes()
    with pytest.raises(FileExistsError, match="--resume"):
        train_potential(_config(data_dir, tmp_path / "run", epochs=1))
    assert (tmp_path / "run" / "model.pt").read_bytes() == before
    assert (
        train_potential(_config(data_dir, tmp_path / "run", epochs=1, overwrite=True)).stop_reason
        == "epochs"
    )


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_training_writes_a_model_that_predicts_on_the_cpu(data_dir, tmp_path):
    """train.device=cuda: the steps, validation, full-posterior fit and uncertainty levels run on
    the GPU; the untrained model validates as on the CPU; the checkpoint loads on the CPU."""
    cpu = train_potential(_config(data_dir, tmp_path / "cpu", epochs=2))
    gpu = train_potential(_config(data_dir, tmp_path / "gpu", epochs=2, device="cuda"))
    first = json.loads((tmp_path / "gpu" / "history.json").read_text())["initial"]["valid_loss"]
    assert first == pytest.approx(
        json.loads((tmp_path / "cpu" / "history.json").read_text())["initial"]["valid_loss"],
        rel=1e-4,
    )
    assert gpu.history[-1]["valid_loss"] == pytest.approx(cpu.history[-1]["valid_loss"], rel=0.5)
    model = BayesianPotential.from_checkpoint(gpu.model_path)
    out = model(prepare_data(_config(data_dir, tmp_path)).valid.graphs[0], uncertainty="exact")
    assert torch.isfinite(out[keys.FORCES_VAR]).all()
    assert "posterior" in load_checkpoint(gpu.model_path)["metadata"]


def test_stage_two_changes_the_loss_weights_from_its_start(data_dir, tmp_path, monkeypatch):
    """loss.stage_two_start 0.5 over 4 epochs: epochs 1-2 train with the first weights, 3-4 with
    the stage-two ones; validation reports the phase and the best model is a stage-two one."""
    seen = []
    original = potential_trainer.potential_loss

    def spy(nll, weights, **kwargs):
        seen.append(dict(weights))
        return original(nll, weights, **kwargs)

    monkeypatch.setattr(potential_trainer, "potential_loss", spy)
    raw = _config(data_dir, tmp_path, epochs=4).to_dict()
    loss = {**raw["loss"], "stage_two_start": 0.5, "stage_two_energy_weight": 30.0}
    result = train_potential(config_from_dict({**raw, "loss": loss}))
    steps = len(seen) // 4  # 3 batches per epoch (6 structures, batch 2)
    assert [w["energy"] for w in seen] == [1.0] * 2 * steps + [30.0] * 2 * steps
    assert all(w["forces"] == 1.0 for w in seen)
    assert [r["phase"] for r in result.history] == [0, 0, 1, 1] and result.best_epoch >= 3


def test_stage_two_config_is_checked():
    base = {"data": {"train": "x.xyz"}}
    with pytest.raises(ValueError, match="would change nothing"):
        config_from_dict({**base, "loss": {"stage_two_start": 0.8}})
    with pytest.raises(ValueError, match="need loss.stage_two_start"):
        config_from_dict({**base, "loss": {"stage_two_energy_weight": 10}})
    cfg = config_from_dict(
        {**base, "loss": {"stage_two_start": 0.8, "stage_two_forces_weight": 0.5}}
    )
    assert cfg.loss.weights(0.79) == (0, {"energy": 1.0, "forces": 1.0, "stress": 0.0})
    assert cfg.loss.weights(0.8) == (1, {"energy": 1.0, "forces": 0.5, "stress": 0.0})
