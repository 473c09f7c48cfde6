"""Probe (issue 40): does a per-element posterior basis help the MACE backbone's sigma_F?

One MACE-backbone model per data set (configs/<name>_mace.yaml, the rows' seed-0 split and 8-min
budget, trained by benchmarks.peers.mace_rows.train_backbone), then the full posterior fitted
twice on the same weights: the config's shared basis and ``per_element``, each at rank 4 (the
config's). Scored on the MACE users' rows' frames
by force_uncertainty.row_metrics. Appends one JSON line per (data set, variant) to
runs/probe_basis/results.jsonl.

    .venv-mace/bin/python scratch/mace_basis.py 3bpa
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import logging

import torch

from benchmarks import force_uncertainty as fu
from benchmarks.peers import mace_rows as mr

name = sys.argv[1]
logging.basicConfig(level=logging.INFO, format="%(message)s")
work = Path("runs/probe_basis")
torch.set_num_threads(1)
base = ["--datasets", name, "--parts", "backbone", "--work", str(work), "--threads", "1"]
args = mr.parse_args(base)
args.deadline, args.notes = None, []
steps = fu.Steps(
    work / f"steps_{name}.jsonl",
    {
        "command": " ".join(sys.argv),
        "quick": False,
        "seed": 0,
        "budget_minutes": 8.0,
        "overrides": [],
    },
)
(work / name).mkdir(parents=True, exist_ok=True)
out = mr.train_backbone(name, args, steps)
results = work / "results.jsonl"
done = (
    {(r["name"], r["variant"]) for r in map(json.loads, results.read_text().splitlines())}
    if results.is_file()
    else set()
)

from mlip_unc.models.committee import load_potential
from mlip_unc.train.potential import finalize_checkpoint
from mlip_unc.train.potential_data import prepare_data

for basis in ("shared", "per_element"):
    vdir = out.parent / f"fit_{basis}"
    vdir.mkdir(exist_ok=True)
    shutil.copy(out / "model.pt", vdir / "model.pt")
    vargs = mr.parse_args([*base, "--set", f"model.posterior_basis={basis}"])
    vargs.deadline, vargs.notes = None, []
    config = fu.train_config(mr.backbone_split(name, vargs), vargs, vdir, 1)
    t = time.perf_counter()
    if not (vdir / "fitted").is_file():
        finalize_checkpoint(vdir / "model.pt", config, prepare_data(config))
        (vdir / "fitted").write_text(f"{time.perf_counter() - t:.1f}")
    fit_s = float((vdir / "fitted").read_text())
    model = load_potential(vdir / "model.pt")
    split = fu.dataset_split(name, args, work / name)
    sets = {
        p: fu.load_frames(split["test" if p == "in" else "ood"], model, split, None)
        for p in ("in", "ood")
    }
    for mode in ("lowrank",):
        variant = f"{basis}:{mode}"
        if (name, variant) in done:
            continue
        t = time.perf_counter()
        vals = {p: fu.frame_values(model, d, mode, args) for p, d in sets.items()}
        row = fu.row_metrics(vals["in"], vals["ood"], None)
        rec = {
            "name": name,
            "variant": variant,
            "fit_s": fit_s,
            "eval_s": time.perf_counter() - t,
            "load": os.getloadavg()[0],
            **row,
        }
        print(json.dumps(rec), flush=True)
        with results.open("a") as f:
            f.write(json.dumps(rec) + "\n")
