"""Reproducible training: the schedule follows epochs, so machine load cannot change the model.

The cosine schedule and the loss's stage two read the training progress; with
``train.schedule_clock: epochs`` (the default) it counts epochs and ``train.max_minutes`` only
stops the run. ``schedule_clock: wall`` (the larger of the epoch and wall-time fractions) stays
available for comparisons at equal wall time.
"""

from __future__ import annotations

import json
import subprocess
import sys

import ase
import ase.io
import pytest
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc.config import ScheduleClock, TrainCoreConfig
from mlip_unc.config import potential_config_from_dict as config_from_dict
from mlip_unc.train.core import Trainer
from mlip_unc.train.potential import train_potential
from mlip_unc.train.potential_data import prepare_data

_LOSS_KEYS = ("train_loss", "valid_loss", "lr")


def _labelled(atoms: ase.Atoms) -> ase.Atoms:
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


@pytest.fixture(scope="module")
def train_file(tmp_path_factory):
    frames = []
    for k in range(8):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.1, seed=k)
        frames.append(_labelled(atoms))
    path = tmp_path_factory.mktemp("emt") / "train.xyz"
    ase.io.write(path, frames)
    return path


def _config(train_file, out, **train):
    """A tiny GIN with a cosine schedule, a stage two and a time budget (that never runs out)."""
    return config_from_dict(
        {
            "seed": 3,
            "out": str(out),
            "data": {"train": str(train_file), "valid_fraction": 0.25, "r_max": 4.0},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 8, "num_layers": 1},
                "latent_dim": 4,
            },
            "loss": {"stage_two_start": 0.5, "stage_two_energy_weight": 10.0},
            "train": {
                "epochs": 3,
                "batch_size": 2,
                "lr": 0.02,
                "lr_schedule": "cosine",
                "max_minutes": 30.0,
                "progress": False,
                **train,
            },
        }
    )


def _losses(out) -> list[tuple[float, ...]]:
    history = json.loads((out / "history.json").read_text())
    return [tuple(epoch[k] for k in _LOSS_KEYS) for epoch in history["epochs"]]


def test_same_config_and_seed_train_the_same_model_beside_a_busy_process(train_file, tmp_path):
    """A CPU-bound process beside the second run slows it down; the losses stay identical to
    the last bit (under the wall-clock schedule, any difference in timing changes the
    learning rate of every step)."""
    cfg = _config(train_file, tmp_path / "quiet")
    data = prepare_data(cfg)
    train_potential(cfg, data=data)
    burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        train_potential(cfg.updated(out=str(tmp_path / "busy")), data=data)
    finally:
        burner.kill()
        burner.wait()
    quiet, busy = _losses(tmp_path / "quiet"), _losses(tmp_path / "busy")
    assert len(quiet) == 3 and quiet == busy
    assert quiet[-1][2] < quiet[0][2]  # the cosine schedule did decay the learning rate


class _Task:
    """The smallest task: one parameter, two examples, progress recorded per step."""

    metric_key = "valid_loss"

    def __init__(self) -> None:
        import torch

        self.model = torch.nn.Linear(1, 1)
        self.progress: list[float] = []

    def train_data(self):
        import torch

        return [torch.ones(1)] * 2

    def loss(self, batch, step):
        self.progress.append(step.progress)
        return (self.model(batch.reshape(-1, 1)) ** 2).mean(), {}

    def validate(self):
        return {"valid_loss": 1.0}

    def signature(self):
        return {}


@pytest.mark.parametrize("clock", list(ScheduleClock))
def test_progress_counts_epochs_unless_the_wall_clock_is_asked_for(clock, monkeypatch):
    """Pretend 45 s of the 60 s budget have gone (a slow machine): ``epochs`` ignores the
    clock, ``wall`` jumps ahead to 3/4 of the schedule (a budget-limited run ends it)."""
    opts = TrainCoreConfig(
        epochs=4,
        batch_size=1,
        lr_schedule="cosine",
        max_minutes=1.0,
        schedule_clock=clock,
        progress=False,
    )
    task = _Task()
    trainer = Trainer(task, opts, seed=0)
    monkeypatch.setattr(trainer, "elapsed", lambda: 45.0)  # seconds
    trainer.fit()
    epochs = [k / 8 for k in range(8)]  # 4 epochs of 2 batches
    if clock is ScheduleClock.EPOCHS:
        assert task.progress == pytest.approx(epochs)
    else:
        assert task.progress == pytest.approx([max(e, 0.75) for e in epochs])
