"""Data-parallel training (torch.distributed, gloo, 2 spawned processes on CPU).

Equivalence: W processes with batch b take the same optimiser steps as one process with batch
W b (the sharding gives batch i of the ranks together = batch i of one process; the gradients
are averaged; the KL is scaled by the global N_train). The Bayesian head's training draw
``mu + std * eps`` differs between the two (each rank draws its own eps), so the runs use a
Bayesian head with ``init_std = 1e-9``: the KL term is fully active (it is large, ~2 per
latent dimension and example) while the draws move energies by ~1e-9 of the latents, far
below the tolerance. Everything runs in float64.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from itertools import islice
from pathlib import Path

import ase
import ase.io
import pytest
import torch
import torch.multiprocessing as mp
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator
from torch_geometric.loader import DataLoader

from mlip_unc.config import potential_config_from_dict
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.train import distributed
from mlip_unc.train import potential as potential_module
from mlip_unc.train.potential import train_potential

RTOL = 1e-6  # float64; the differences come from the summation order and the 1e-9 draws
N_TRAIN = 8  # 10 frames, valid_fraction 0.2


# ---------------------------------------------------------------------- data and configs
def _labelled(atoms: ase.Atoms) -> ase.Atoms:
    atoms.calc = EMT()
    energy, forces = atoms.get_potential_energy(), atoms.get_forces()
    atoms.calc = SinglePointCalculator(atoms, energy=energy, forces=forces)
    return atoms


@pytest.fixture(scope="module")
def data_file(tmp_path_factory) -> Path:
    """10 rattled 4-atom Cu cells (EMT) and the isolated atom (reference energy)."""
    frames = []
    for k in range(10):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True)
        atoms.rattle(0.1, seed=k)
        frames.append(_labelled(atoms))
    path = tmp_path_factory.mktemp("emt_cu") / "train.xyz"
    ase.io.write(path, frames + [_labelled(ase.Atoms("Cu", positions=[[0, 0, 0]]))])
    return path


def _config(data: Path, out: Path, *, batch_size: int, epochs: int, resume: bool = False, **model):
    return potential_config_from_dict(
        {
            "seed": 0,
            "out": str(out),
            "dtype": "float64",
            "data": {"train": str(data), "valid_fraction": 0.2, "r_max": 4.0},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 8, "num_layers": 1},
                "latent_dim": 4,
                "init_std": 1e-9,
                "posterior": "diagonal",
                **model,
            },
            "train": {
                "epochs": epochs,
                "batch_size": batch_size,
                "lr": 0.02,
                "progress": False,
                "resume": resume,
                "lr_schedule": "constant",
            },
        }
    )


def _history(out: Path) -> list[dict]:
    return json.loads((out / "history.json").read_text())["epochs"]


def _losses(out: Path) -> list[float]:
    return [v for e in _history(out) for v in (e["train_loss"], e["valid_loss"])]


# ---------------------------------------------------------------------- spawned workers
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _worker(rank: int, world: int, port: int, jobs: list[tuple[str, dict]]) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    torch.set_num_threads(1)
    with distributed.session() as active:
        assert active and distributed.rank() == rank and distributed.world_size() == world
        for job, kwargs in jobs:
            JOBS[job](rank, **kwargs)


def _spawn(jobs: list[tuple[str, dict]], world: int = 2) -> None:
    """Run ``jobs`` one after the other in ``world`` spawned processes (one start-up for all)."""
    mp.spawn(_worker, args=(world, _free_port(), jobs), nprocs=world, join=True)


def _train_job(
    rank: int,
    *,
    data: str,
    out: str,
    batch_size: int,
    epochs: int,
    resume: bool = False,
    shard_kl: bool = False,
    record: str | None = None,
) -> None:
    """``train_potential`` on this rank; ``record``: write the ``n_train`` of every loss call;
    ``shard_kl``: the bug to catch, the KL scaled by the shard's size instead of N_train."""
    seen: list[int] = []
    original = potential_module.potential_loss

    def loss(*args, n_train, **kw):
        seen.append(n_train)
        return original(
            *args, n_train=n_train // distributed.world_size() if shard_kl else n_train, **kw
        )

    potential_module.potential_loss = loss
    try:
        train_potential(
            _config(Path(data), Path(out), batch_size=batch_size, epochs=epochs, resume=resume)
        )
    finally:
        potential_module.potential_loss = original
    if record is not None:
        Path(f"{record}.rank{rank}.json").write_text(json.dumps({"n_train": seen}))


def _property_kl_job(rank: int, *, record: str) -> None:
    """The property trainer on 2 ranks: ``n_train`` passed to ``negative_elbo``."""
    from torch_geometric.utils import from_smiles

    from mlip_unc.config import PropertyConfig
    from mlip_unc.train import property as property_module

    graphs = []
    for k, smi in enumerate(
        ["C", "CC", "CCC", "CO", "CCO", "CCCO", "CN", "CCN", "c1ccccc1", "CC(=O)O", "CCCl"]
    ):
        g = from_smiles(smi)
        g.y = torch.tensor([[0.3 * g.x.shape[0] + 0.1 * k]])
        graphs.append(g)
    seen: list[int] = []
    original = property_module.negative_elbo

    def elbo(*args, n_train, **kw):
        seen.append(n_train)
        return original(*args, n_train=n_train, **kw)

    property_module.negative_elbo = elbo
    cfg = PropertyConfig.from_dict(
        {
            "model": {"method": "bgnn", "hidden": 8, "layers": 1, "latent_dim": 4},
            "train": {"epochs": 1, "batch_size": 2, "progress": False},
        }
    )
    model = property_module.seeded_model(cfg, graphs[:9])
    try:
        property_module.property_trainer(model, cfg, graphs[:9], graphs[9:]).fit()
    finally:
        property_module.negative_elbo = original
    Path(f"{record}.rank{rank}.json").write_text(json.dumps({"n_train": seen}))


JOBS = {"train": _train_job, "property_kl": _property_kl_job}


# ---------------------------------------------------------------------- tests
@pytest.fixture(scope="module")
def runs(data_file, tmp_path_factory) -> dict[str, Path]:
    """The one-process runs and, in ONE spawn of 2 processes (start-up costs ~10 s), every
    2-process run of the tests below."""
    root = tmp_path_factory.mktemp("runs")
    paths = {
        name: root / name
        for name in ("ref", "ddp", "bug", "two_then_one", "one_then_two", "seen", "pseen")
    }
    train_potential(
        _config(data_file, paths["ref"], batch_size=4, epochs=3)
    )  # one process, batch 4
    train_potential(_config(data_file, paths["one_then_two"], batch_size=4, epochs=2))
    common = {"data": str(data_file), "batch_size": 2}
    _spawn(
        [
            (
                "train",
                {**common, "out": str(paths["ddp"]), "epochs": 3, "record": str(paths["seen"])},
            ),
            ("train", {**common, "out": str(paths["bug"]), "epochs": 1, "shard_kl": True}),
            ("train", {**common, "out": str(paths["two_then_one"]), "epochs": 2}),
            ("train", {**common, "out": str(paths["one_then_two"]), "epochs": 3, "resume": True}),
            ("property_kl", {"record": str(paths["pseen"])}),
        ]
    )
    return paths


def test_two_processes_match_one_process_with_double_batch(runs):
    out = runs["ddp"]
    expected, got = _losses(runs["ref"]), _losses(out)
    assert len(got) == 6 and got == pytest.approx(expected, rel=RTOL, abs=1e-9)
    assert _history(out)[-1]["train_kl_term"] > 1.0  # the KL term is a large part of the loss
    # rank 0 alone wrote the run; the model and the checkpoint carry no `module.` prefix
    assert sorted(p.name for p in out.iterdir()) == [
        "config.yaml",
        "history.json",
        "last.pt",
        "model.pt",
    ]
    for name in ("last.pt", "model.pt"):
        state = load_checkpoint(out / name)["model_state"]
        assert not any(k.startswith("module.") for k in state)


def test_kl_uses_the_global_training_set_size(runs):
    for rank in (0, 1):
        seen = json.loads(Path(f"{runs['seen']}.rank{rank}.json").read_text())["n_train"]
        assert (
            seen == [N_TRAIN] * 6
        )  # every loss on both ranks: 2 batches per epoch and rank, 3 epochs
        seen = json.loads(Path(f"{runs['pseen']}.rank{rank}.json").read_text())["n_train"]
        assert (
            seen == [9] * 3
        )  # property trainer, 9 molecules: 5 per rank (one padded), batches of 2


def test_equivalence_check_catches_kl_scaled_by_the_shard(runs):
    got, expected = _losses(runs["bug"]), _losses(runs["ref"])[:2]
    assert got[0] != pytest.approx(
        expected[0], rel=1e-2
    )  # KL / (N/2): the train loss is off at once


def test_resume_across_process_counts(runs, data_file):
    # 2 processes (batch 2) for 2 epochs, then 1 process (batch 4) continues to epoch 3
    out = runs["two_then_one"]
    assert len(_history(out)) == 2
    train_potential(_config(data_file, out, batch_size=4, epochs=3, resume=True))
    assert _losses(out) == pytest.approx(_losses(runs["ref"]), rel=RTOL, abs=1e-9)
    # 1 process for 2 epochs, then 2 processes continued to epoch 3 (in the fixture's spawn)
    assert _losses(runs["one_then_two"]) == pytest.approx(_losses(runs["ref"]), rel=RTOL, abs=1e-9)


# ---------------------------------------------------------------------- one process: unchanged
def test_without_torchrun_variables_nothing_changes(monkeypatch):
    for key in distributed.ENV_VARS:
        monkeypatch.delenv(key, raising=False)
    with distributed.session() as active:
        assert not active and not distributed.launched()
        assert (distributed.rank(), distributed.world_size(), distributed.is_main()) == (0, 1, True)
    assert not torch.distributed.is_initialized()
    grads = [torch.nn.Parameter(torch.ones(3))]
    grads[0].grad = torch.full((3,), 2.0)
    distributed.average_gradients(grads)
    assert grads[0].grad.tolist() == [2.0, 2.0, 2.0]
    assert distributed.all_reduce_sum([1.5, 2]) == [1.5, 2.0] and distributed.broadcast_object(
        {"a": 1}
    ) == {"a": 1}
    # one process: the batches of DataLoader(shuffle=True, generator) as before, same generator
    # state after a full epoch and after one broken off (the core's time budget), torch's RNG untouched
    data = list(range(11))
    for stop in (None, 2):
        old_rng, new_rng = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
        old = DataLoader(data, batch_size=3, shuffle=True, generator=old_rng)
        new = DataLoader(
            data,
            batch_size=3,
            sampler=distributed.ShardSampler(11, 0, 1, new_rng),
            generator=new_rng,
        )
        global_rng = torch.get_rng_state()
        got, expected = ([b.tolist() for b in islice(loader, stop)] for loader in (new, old))
        assert got == expected and len(got) == (stop or 4) and len(new) == len(old) == 4
        assert torch.equal(old_rng.get_state(), new_rng.get_state())
        assert torch.equal(torch.get_rng_state(), global_rng)


def test_shard_indices_pad_and_interleave():
    order = [7, 3, 5, 1, 9]
    shards = [distributed.shard_indices(order, r, 2) for r in range(2)]
    assert shards == [
        [7, 5, 9],
        [3, 1, 7],
    ]  # padded with the first entry; same length on every rank
    assert distributed.shard_indices(order, 0, 1) == order
    assert distributed.shard_indices([4], 2, 3) == [4]
    with pytest.raises(ValueError):
        distributed.shard_indices(order, 2, 2)


def test_help_does_not_import_torch_distributed():
    code = (
        "import sys; from typer.testing import CliRunner; from mlip_unc.cli import app; "
        "r = CliRunner().invoke(app, ['train', '--help']); assert r.exit_code == 0, r.output; "
        "print('torch.distributed' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"


# ---------------------------------------------------------------------- torchrun, end to end
@pytest.mark.slow
def test_torchrun_cli_potential_and_property(data_file, tmp_path):
    """``torchrun --nproc_per_node 2 mlip-unc train`` and ``... property train``: rank 0 alone
    reports and writes; the models load. (~1 min: two torchrun start-ups of 2 processes.)"""
    exe = Path(sys.executable).parent
    torchrun = [
        str(exe / "torchrun"),
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
        "--no-python",
        str(exe / "mlip-unc"),
        "-q",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for key in distributed.ENV_VARS:
        env.pop(key, None)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        json.dumps(_config(data_file, tmp_path / "pot", batch_size=2, epochs=2).to_dict())
    )
    run = subprocess.run(
        [*torchrun, "train", "-c", str(cfg), "--threads", "1"],
        env=env,
        capture_output=True,
        check=False,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("model: ") == 1  # rank 0 only
    assert len(_history(tmp_path / "pot")) == 2 and (tmp_path / "pot" / "model.pt").is_file()

    csv = tmp_path / "mols.csv"
    smiles = [
        "C",
        "CC",
        "CCC",
        "CCCC",
        "CO",
        "CCO",
        "CCCO",
        "CN",
        "CCN",
        "CCCN",
        "c1ccccc1",
        "CC(=O)O",
        "CCCl",
        "OCCO",
        "C=C",
        "CC#N",
        "CS",
        "CCS",
        "C1CCCCC1",
        "Cc1ccccc1",
    ]
    csv.write_text(
        "smiles,y\n" + "".join(f"{s},{0.3 * len(s) + 0.05 * k}\n" for k, s in enumerate(smiles))
    )
    run = subprocess.run(
        [
            *torchrun,
            "property",
            "train",
            "--out",
            str(tmp_path / "prop"),
            "--data",
            str(csv),
            "--target-column",
            "y",
            "--epochs",
            "2",
            "--set",
            "train.batch_size=4",
            "--set",
            "model.hidden=8",
        ],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("train_seconds") == 1  # rank 0's table only
    assert (tmp_path / "prop" / "model.pt").is_file() and (
        tmp_path / "prop" / "metrics.json"
    ).is_file()
