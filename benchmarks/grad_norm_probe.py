"""How large is the training loss's gradient norm against ``train.grad_clip``? (issue 12)

Loads a trained potential and the config it was trained with, draws ``--batches`` training
mini-batches (the config's batch size, seed 0) and prints the norm of the gradient of the
training loss (``PotentialTask.loss``: the weighted learned-noise NLL + KL / N_train, one
posterior draw) over all trainable parameters, next to the config's clip threshold.

    python benchmarks/grad_norm_probe.py --config configs/ethanol_mace.yaml \\
        --model runs/probe_ew_mace_emawarm/ew_0.01/model.pt --out benchmarks/results
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import torch
from torch_geometric.loader import DataLoader

from mlip_unc.atomic import atomic_write_text
from mlip_unc.config.potential import load_potential_config
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.core import Step
from mlip_unc.train.potential import PotentialTask
from mlip_unc.train.potential_data import prepare_data


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--out", type=Path, default=None, help="write grad_norm_probe.{json,md} here")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    config = load_potential_config(args.config, ["data.test=null", *args.overrides])
    data = prepare_data(config)
    task = PotentialTask(config, data, Path("/nonexistent"))
    trained = BayesianPotential.from_checkpoint(args.model)
    task.model.load_state_dict(trained.state_dict())
    task.model.train()
    generator = torch.Generator().manual_seed(0)
    loader = DataLoader(
        data.train.graphs, batch_size=config.train.batch_size, shuffle=True, generator=generator
    )
    norms = []
    for k, batch in zip(range(args.batches), loader, strict=False):
        step = Step(epoch=float(k) / len(loader), generator=torch.Generator().manual_seed(k))
        loss, _ = task.loss(batch, step)
        task.model.zero_grad()
        loss.backward()
        grads = [q.grad.detach().reshape(-1) for q in task.model.parameters() if q.grad is not None]
        norms.append(float(torch.cat(grads).norm()))
    clip = config.train.grad_clip
    result = {
        "command": shlex.join(
            ["python", "benchmarks/grad_norm_probe.py", *(sys.argv[1:] if argv is None else argv)]
        ),
        "config": str(args.config),
        "model": str(args.model),
        "grad_clip": clip,
        "norms": norms,
        "median": float(np.median(norms)),
        "min": min(norms),
        "max": max(norms),
        "fraction_clipped": None if clip is None else float(np.mean([n > clip for n in norms])),
    }
    text = (
        f"# Training-loss gradient norm\n\nCommand: `{result['command']}`\n\n{len(norms)} training batches: "
        f"median {result['median']:.3g}, min {result['min']:.3g}, max {result['max']:.3g}; "
        f"train.grad_clip of the config: {clip}"
        + (
            ""
            if clip is None
            else f" (exceeded by {100 * result['fraction_clipped']:.0f} % of the batches)"
        )
        + ".\n"
    )
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out / "grad_norm_probe.json", json.dumps(result, indent=1))
        atomic_write_text(args.out / "grad_norm_probe.md", text)
    return result


if __name__ == "__main__":
    main()
