"""Data-parallel scaling of the potential trainer: training throughput for 1, 2 and 4 processes.

A fixed dataset made on the spot (``--structures`` rattled 32-atom fcc Cu cells labelled with
ASE's EMT, seed ``--seed``), a small GIN potential, and a FIXED GLOBAL batch (``--batch``
structures per optimiser step, split evenly over the processes), so every row takes the same
optimiser steps (strong scaling). Each row spawns its processes (torch.multiprocessing,
gloo, one torch thread each), runs one untimed warm-up epoch on ``--batch`` structures, then
times one epoch over the whole set (``steps`` optimiser steps) on rank 0 between two barriers
of all ranks: ``structures_per_s`` = structures trained / seconds. Validation is not timed.

``--ddp`` adds a row with the model wrapped in ``torch.nn.parallel.DistributedDataParallel``
(instead of the trainer's own all-reduce after ``backward``) at the largest process count
that does not exceed the cores, for the choice documented in ``mlip_unc/train/distributed.py``.

More processes than CPU cores oversubscribe the machine: the JSON's ``machine`` says how many
cores there were, and such rows measure contention, not scaling.

    python -m benchmarks.scale.train --processes 1 2 4 --ddp
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import socket
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ase.io
import torch
import torch.multiprocessing as mp
from ase.build import bulk
from ase.calculators.emt import EMT
from ase.calculators.singlepoint import SinglePointCalculator

from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.config import potential_config_from_dict
from mlip_unc.train import distributed
from mlip_unc.train.core import Trainer
from mlip_unc.train.potential import PotentialTask
from mlip_unc.train.potential_data import prepare_data

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"


def make_data(path: Path, n: int, seed: int) -> None:
    """``n`` rattled 2x2x2 cubic Cu cells (32 atoms) with EMT energies and forces, and the atom."""
    frames = []
    for k in range(n):
        atoms = bulk("Cu", "fcc", a=3.6, cubic=True).repeat(2)
        atoms.rattle(0.05, seed=seed * 100_000 + k)
        atoms.calc = EMT()
        e, f = atoms.get_potential_energy(), atoms.get_forces()
        atoms.calc = SinglePointCalculator(atoms, energy=e, forces=f)
        frames.append(atoms)
    iso = ase.Atoms("Cu", positions=[[0, 0, 0]])
    iso.calc = EMT()
    e = iso.get_potential_energy()
    iso.calc = SinglePointCalculator(iso, energy=e, forces=[[0.0, 0.0, 0.0]])
    ase.io.write(path, frames + [iso])


def _config(data: Path, batch: int, seed: int):
    return potential_config_from_dict(
        {
            "seed": seed,
            "out": str(data.parent / "unused"),
            "dtype": "float32",
            "data": {"train": str(data), "valid_fraction": 0.0, "r_max": 4.0},
            "model": {
                "backbone": "gin",
                "backbone_kwargs": {"hidden": 32, "num_layers": 2},
                "latent_dim": 16,
                "posterior": "diagonal",
            },
            "train": {"epochs": 2, "batch_size": batch, "lr": 0.005, "progress": False},
        }
    )


class _DDP(torch.nn.parallel.DistributedDataParallel):
    """DDP that passes attribute look-ups (``kl``, ``posterior``, ...) to the wrapped model."""

    def __getattr__(self, name: str) -> Any:
        if name == "module":
            return super().__getattr__(name)
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(self.module, name)


def _worker(
    rank: int, world: int, port: int, data: str, batch: int, seed: int, ddp: bool, result: str
) -> None:
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    with distributed.session():
        config = _config(Path(data), batch // world, seed)
        prepared = prepare_data(config)
        task = PotentialTask(config, prepared, Path(data).parent)
        if ddp:  # the wrapper's hooks average the gradients; the trainer's all-reduce is skipped
            task.model = _DDP(task.model)
            distributed.average_gradients = lambda params: None
        trainer = Trainer(task, config.train, seed=seed, out=None)
        graphs = prepared.train.graphs
        task.train_data = lambda: graphs[:batch]  # warm-up epoch: one step
        trainer.train_epoch()
        task.train_data = lambda: graphs
        torch.distributed.barrier()
        t0 = time.perf_counter()
        record = trainer.train_epoch()
        torch.distributed.barrier()
        seconds = time.perf_counter() - t0
        if rank == 0:
            steps = -(-len(graphs) // batch)
            Path(result).write_text(
                json.dumps(
                    {
                        "processes": world,
                        "mode": "ddp_wrapper" if ddp else "allreduce",
                        "global_batch": batch,
                        "batch_per_process": batch // world,
                        "structures": len(graphs),
                        "steps": steps,
                        "seconds": seconds,
                        "structures_per_s": len(graphs) / seconds,
                        "train_loss": record["train_loss"],
                    }
                )
            )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run(processes: int, data: Path, batch: int, seed: int, ddp: bool) -> dict[str, Any]:
    if batch % processes:
        raise SystemExit(f"--batch {batch} is not a multiple of {processes} processes")
    result = data.parent / f"row_{processes}_{int(ddp)}.json"
    args = (processes, _free_port(), str(data), batch, seed, ddp, str(result))
    mp.spawn(
        _worker, args=args, nprocs=processes, join=True
    )  # 1 process: a group of one, no collectives
    return json.loads(result.read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--structures", type=int, default=200)
    parser.add_argument(
        "--batch", type=int, default=8, help="global batch (structures per optimiser step)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--ddp", action="store_true", help="also time the DistributedDataParallel wrapper"
    )
    parser.add_argument("--out", type=Path, default=RESULTS / "scale_train.json")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "cu.xyz"
        make_data(data, args.structures, args.seed)
        plan = [(p, False) for p in args.processes]
        if args.ddp:
            plan.append((max([q for q in args.processes if 1 < q <= cores] or [2]), True))
        for p, ddp in plan:
            rows.append(run(p, data, args.batch, args.seed, ddp=ddp))
            print(json.dumps(rows[-1]), flush=True)
            _write(
                args, rows, cores, complete=len(rows) == len(plan)
            )  # a partial run leaves partial results
    print(f"wrote {args.out}")


def _write(
    args: argparse.Namespace, rows: list[dict[str, Any]], cores: int, *, complete: bool
) -> None:
    base = next(
        (r["structures_per_s"] for r in rows if r["processes"] == 1 and r["mode"] == "allreduce"),
        None,
    )
    for r in rows:
        r["speedup"] = None if base is None else r["structures_per_s"] / base
        r["oversubscribed"] = r["processes"] > cores
    report = {
        "command": "python -m benchmarks.scale.train " + shlex.join(sys.argv[1:]),
        "seed": args.seed,
        "machine": f"{cores} CPU cores ({platform.machine()}, {platform.system()}); rows with more processes "
        "than cores oversubscribe them and measure contention, not scaling",
        "load_average_at_end": list(os.getloadavg()),
        "setup": f"{args.structures} rattled 32-atom EMT Cu cells, GIN hidden 32 x 2 layers, latent 16, float32, "
        f"global batch {args.batch}, gloo, 1 torch thread per process, one timed epoch",
        "torch": torch.__version__,
        "complete": complete,
        "rows": rows,
    }
    atomic_write_text(args.out, json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
