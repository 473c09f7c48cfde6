"""Probe: energy residuals of an AL model on its training frames and the reference sets;
what a least-absolute-deviation (LAD) offset refit would give instead of least squares."""
import sys
from pathlib import Path

import numpy as np
from ase.io import read

from mlip_unc.calculator import UncertaintyCalculator


def energies(calc, frames):
    out = []
    for a in frames:
        a = a.copy()
        a.calc = calc
        out.append(a.get_potential_energy())
    return np.array(out)


def lad(counts, r, iters=100):
    w = np.ones(len(r))
    for _ in range(iters):
        sw = np.sqrt(w)
        d = np.linalg.lstsq(counts * sw[:, None], r * sw, rcond=None)[0]
        w = 1.0 / np.maximum(np.abs(r - counts @ d), 1e-6)
    return d


model_dir = Path(sys.argv[1])
seed_dir = Path(sys.argv[2])
calc = UncertaintyCalculator(model_dir / "model.pt", uncertainty="energy")
train = read(model_dir / "train.xyz", ":")
zs = sorted({z for a in train for z in a.numbers})
C = np.array([[np.sum(a.numbers == z) for z in zs] for a in train], float)
E = np.array([a.get_potential_energy() for a in train])
r = E - energies(calc, train)
print("train residuals (eV): mean %.3f median %.3f min %.3f max %.3f" % (r.mean(), np.median(r), r.min(), r.max()))
print("train |F_ref| max per frame (eV/A):", np.round(sorted(np.abs(a.get_forces()).max() for a in train)[-8:], 1))
d = lad(C, r)
print("LAD shift per element:", dict(zip(zs, np.round(d, 5))))
for f in sorted(seed_dir.glob("test_*.xyz")):
    fr = read(f, ":")
    Ct = np.array([[np.sum(a.numbers == z) for z in zs] for a in fr], float)
    Et = np.array([a.get_potential_energy() for a in fr])
    p = energies(calc, fr)
    print(f"{f.stem:20s} E MAE LS {1000*np.abs(Et-p).mean():8.0f} meV  LAD {1000*np.abs(Et-p-Ct@d).mean():8.0f} meV  median-res-shift {1000*np.abs(Et-p-np.median(Et-p)).mean():6.0f}")
