"""Probe: an AL run's labels trained from scratch at several loss.energy_weight; E and F MAE
on the reference sets. args: system config, run round dir (retrained/), seed dir, weights."""
import sys
import time
from pathlib import Path

import numpy as np
from ase.io import read

from mlip_unc.active.training import train_model
from mlip_unc.calculator import UncertaintyCalculator
from mlip_unc.config import load_active_config

config_path, run_dir, seed_dir = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
weights = [float(w) for w in sys.argv[4].split(",")]
extra = sys.argv[5:]
train = read(run_dir / "train.xyz", ":")
valid = read(run_dir / "valid.xyz", ":")
for w in weights:
    config = load_active_config(config_path, [f"training.loss.energy_weight={w}", *extra])
    out = Path(f"/tmp/probe/ew_{config_path.stem}_{w}_{'_'.join(extra)}")
    t = time.process_time()
    model = train_model(train, valid, config.training, out, seed=0, refit_offsets=config.refit_offsets)
    cpu = time.process_time() - t
    calc = UncertaintyCalculator(model, uncertainty="energy")
    row = []
    for f in sorted(seed_dir.glob("test_*.xyz")):
        fr = read(f, ":")
        e, fm = [], []
        for a in fr:
            b = a.copy(); b.calc = calc
            e.append(abs(b.get_potential_energy() - a.get_potential_energy()))
            fm.append(np.abs(b.get_forces() - a.get_forces()).mean())
        row.append(f"{f.stem[5:]}: F {1000*np.mean(fm):.0f} E {1000*np.mean(e):.0f}")
    print(f"energy_weight {w} {extra} cpu {cpu:.0f}s | " + " | ".join(row), flush=True)
