"""Probe (issue 40): ``mlip-unc attach --posterior-basis per_element`` against the default shared
basis on the same mace-torch model (the MACE users' rows' ethanol seed-0 model, trained by
``benchmarks.peers.mace_rows`` in runs/mace_rows_ethanol), scored on the rows' frames.
Appends to runs/probe_basis/results.jsonl.

    PYTHONPATH=. .venv-mace/bin/python scratch/attach_basis.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from benchmarks import force_uncertainty as fu
from benchmarks.peers import mace_rows as mr
from mlip_unc.models.committee import load_potential

torch.set_num_threads(1)
work = Path("runs/mace_rows_ethanol").resolve()
model = work / "ethanol" / "mace_torch_seed0" / "mace.model"
args = mr.parse_args(["--datasets", "ethanol", "--work", str(work)])
train = mr.mace_spec("ethanol", args)["train"]
results = Path("runs/probe_basis/results.jsonl")
for basis in ("shared", "per_element"):
    out = Path(f"runs/probe_basis/ethanol_attach_{basis}.pt")
    start = time.perf_counter()
    if not out.is_file():
        cmd = [
            str(Path(sys.executable).parent / "mlip-unc"),
            "attach",
            "--model",
            str(model),
            "--data",
            str(train),
            "--out",
            str(out),
            "--threads",
            "1",
            "--posterior-basis",
            basis,
        ]
        subprocess.run(cmd, check=True)
    seconds = time.perf_counter() - start
    pot = load_potential(out)
    split = fu.dataset_split("ethanol", args, Path("runs/probe_basis/ethanol"))
    sets = {
        p: fu.load_frames(split["test" if p == "in" else "ood"], pot, split, None)
        for p in ("in", "ood")
    }
    vals = {p: fu.frame_values(pot, d, "lowrank", args) for p, d in sets.items()}
    meta = torch.load(out, weights_only=True)["metadata"]["posterior"]
    rec = {
        "name": "ethanol",
        "variant": f"attach_{basis}:lowrank",
        "attach_s": seconds,
        "valid_nll_forces": meta.get("valid_nll_forces"),
        "load": os.getloadavg()[0],
        **fu.row_metrics(vals["in"], vals["ood"], None),
    }
    print(json.dumps(rec), flush=True)
    with results.open("a") as f:
        f.write(json.dumps(rec) + "\n")
