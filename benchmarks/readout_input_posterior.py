"""Does a last-layer posterior over the readout's input features catch what the latent's misses?

The shipped posterior (LLPR, per element) lives on the latent ``z``: the last hidden layer of the
per-atom readout MLP, whose input ``x`` is the concatenated 0e scalars of every interaction layer.
On 3BPA it separates the hotter frames of train_mixedT 0.02-0.04 worse (OOD AUROC) than a committee
of the same architecture (benchmarks/results/force_uncertainty_routes/). A readout ensemble on
``x`` did worse still (issue 11's thirteenth-session note); this probe asks the cheaper question
of whether the novelty of ``x``'s position Jacobian, weighed by a Laplace posterior, adds to that
of ``z``'s. Features per element ``e`` (sums over its atoms, as the shipped basis):

- ``z``: ``Phi_e = sum z_a`` (the shipped posterior's features; must reproduce posterior_variants.py);
- ``x``: ``X_e = sum x_a`` (a linear skip readout from the interaction scalars, weights zero at the
  posterior mean: the predictions do not change);
- ``z+x``: both, one joint posterior.

For each: precision ``sum Phi Phi^T / (n sigma_e^2) + sum J J^T / sigma_f^2`` over the training frames
(the model's learned noises, as posterior_variants.py), lambda on the 1e-14 grid by the validation
force NLL of the exact variance, then rank 4, 8 (least constrained directions) and exact. A rank r
costs r + 1 vector-Jacobian products whatever the features (cost not timed here: the same as the
shipped lowrank mode at that rank). The Jacobians are taken with ``torch.func.jacfwd`` (one
forward-mode pass per frame, 3 N tangents); the model's own ``x`` is read with a forward hook on its
readout. std/RMSE: the exact or low-rank variance scaled by ``alpha^2`` and the noise fitted on the
validation frames (gaussian_scale_fit), on the in-domain frames. Lines against committee A (the
run's committee5) and B (committee_floor) where trained.

Steps go to ``RUN/readout_input_posterior.jsonl``, results to ``OUT/readout_input_posterior.{md,json}``.

    python benchmarks/readout_input_posterior.py --runs R1 R2 R3 --out benchmarks/results/readout_input_posterior
    python benchmarks/readout_input_posterior.py --quick --out /tmp/rip_quick
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.func import jacfwd
from torch_geometric.loader import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import committee_floor as cf
import force_uncertainty as fu
import posterior_variants as pv

from mlip_unc import keys
from mlip_unc.atomic import atomic_write_text
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.posterior import gaussian_scale_fit
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.uncertainty import diagnostics as diag

log = logging.getLogger("readout_input_posterior")
FEATURES = ("z", "x", "z+x")
RANKS = (4, 8, None)  # None: exact


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--runs", nargs="*", type=Path, default=[], help="force_uncertainty.py --out folders"
    )
    p.add_argument("--dataset", default="3bpa")
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--threads", type=int, default=1)
    args = fu.parse_with_quick(
        p,
        argv,
        "a quick force_uncertainty run on tiny EMT Cu data made here, then this; needs --out",
    )
    if args.quick:
        args.dataset = "cu_emt"
    if not args.runs and not args.quick:
        p.error("give --runs (or --quick)")
    return args


class ReadoutInput:
    """The per-atom input ``x (n_atoms, c)`` of ``model.backbone.readout``, read by a forward hook
    during :meth:`features` (the isolated-atom pass of the model is told apart by its atom count)."""

    def __init__(self, model: BayesianPotential) -> None:
        if not isinstance(getattr(model.backbone, "readout", None), torch.nn.Module):
            raise ValueError(
                f"{type(model.backbone).__name__} has no readout module to read its input from"
            )
        self.model, self.seen = model, []
        model.backbone.readout.register_forward_hook(
            lambda _m, inputs, _o: self.seen.append(inputs[0])
        )
        self.x_iso = None
        if model.isolated_reference:  # x of each isolated atom, subtracted as z_iso is from z
            self.seen.clear()
            with torch.no_grad():
                model.backbone(model._isolated_batch())
            self.x_iso = self.seen[-1].detach()

    def features(self, batch: Any, pos: torch.Tensor) -> torch.Tensor:
        """``(n_el, d + c)`` per-element sums of ``[z, x]`` of one frame at positions ``pos (n_atoms, 3)``."""
        model, types = self.model, self.model.atom_types(batch)
        self.seen.clear()
        cell = getattr(batch, keys.CELL, None)  # fixed: only the positions are differentiated
        cell = pos.new_zeros(1, 3, 3) if cell is None else cell.to(pos.dtype).reshape(-1, 3, 3)
        z, _ = model._latents(batch, pos, cell, types)  # (n_atoms, d)
        x = next(t for t in self.seen if t.shape[0] == pos.shape[0])  # (n_atoms, c)
        if self.x_iso is not None:
            x = x - self.x_iso.to(x.dtype)[types]
        onehot = torch.nn.functional.one_hot(types, len(model.type_map)).to(
            z.dtype
        )  # (n_atoms, n_el)
        return onehot.T @ torch.cat([z, x], dim=-1)


def collect(
    model: BayesianPotential, reader: ReadoutInput, dataset: Any
) -> list[dict[str, torch.Tensor]]:
    """Per frame (posterior_variants.collect's layout, float64): ``jac (n_el, d + c, n_atoms, 3)``,
    ``phi (n_el, d + c)``, the force error and the predicted forces at the posterior mean."""
    frames = []
    for graph in getattr(dataset, "graphs", dataset):
        batch = next(iter(DataLoader([graph], batch_size=1)))
        pos = batch[keys.POSITIONS].to(model.dtype)
        jac = jacfwd(lambda p, b=batch: reader.features(b, p))(pos)  # (n_el, d + c, n_atoms, 3)
        with torch.no_grad():
            phi = reader.features(batch, pos)
        out = model(batch, compute_forces=True)
        forces = out[keys.FORCES].detach()
        frames.append(
            {
                "jac": jac.detach().double(),
                "phi": phi.double(),
                "forces": forces.double(),
                "error": (forces - batch[keys.FORCES]).double(),
                "n_atoms": int(pos.shape[0]),
            }
        )
    return frames


def select(
    frames: list[dict[str, torch.Tensor]], which: str, d: int
) -> list[dict[str, torch.Tensor]]:
    """``frames`` in one feature set (``z``: the first d of each element block, ``x``: the rest,
    ``z+x``: all), flattened to posterior_variants' ``jac (D, n_atoms, 3)`` and ``phi (D,)``."""
    cols = {"z": slice(0, d), "x": slice(d, None), "z+x": slice(None)}[which]
    return [
        {
            **f,
            "jac": f["jac"][:, cols].reshape(-1, *f["jac"].shape[2:]),
            "phi": f["phi"][:, cols].reshape(-1),
        }
        for f in frames
    ]


def feature_rows(sets: dict[str, list], noise: tuple[float, float]) -> list[dict[str, Any]]:
    """One row per (features, rank): lambda, validation NLL, ranking metrics, std/RMSE."""
    rows = []
    for which in FEATURES:
        part = {p: select(f, which, sets["d"]) for p, f in sets.items() if p != "d"}
        eig, vec = torch.linalg.eigh(pv.precision(part["train"], noise, 1.0))
        eig = eig.clamp_min(0.0)  # ascending precision: least constrained first
        c = pv.choose_lambda(part["valid"], eig, vec, pv.GRIDS["1e-14"])
        sigma = 1.0 / (eig + c * float(eig.mean()))
        for rank in RANKS:
            val = pv.frame_values(part["valid"], vec, sigma, rank)
            alpha2, noise2, nll = gaussian_scale_fit(val["err"], val["var"])
            ind, ood = (pv.frame_values(part[p], vec, sigma, rank) for p in ("test", "ood"))
            ranking = diag.frame_ranking(
                ind["score"], ind["error"], ind["force"], ood["score"], ood["error"], ood["force"]
            )
            std = float(
                (alpha2 * ind["var"] + noise2).mean().sqrt() / ind["err"].square().mean().sqrt()
            )
            rows.append(
                {
                    "features": which,
                    "rank": rank or "exact",
                    "width": int(vec.shape[0]),
                    "lambda_over_mean_eig": c,
                    "valid_nll_forces": nll,
                    "std_over_rmse": std,
                    **{k: ranking[k] for k in pv.METRICS},
                }
            )
    return rows


def evaluate(
    run: Path,
    settings: argparse.Namespace,
    steps: fu.Steps,
    args: argparse.Namespace,
    split: dict[str, Any],
) -> None:
    name = args.dataset
    if steps.get(f"features:{name}"):
        return
    folder = run / "checkpoints" / "force_uncertainty" / f"{name}_single"
    model = BayesianPotential.from_checkpoint(folder / "model.pt")
    model.eval()
    reader = ReadoutInput(model)
    data = prepare_data(
        fu.train_config(split, settings, folder, 1)
    )  # the run's training / validation split
    valid = (
        data.valid if data.valid is not None and len(data.valid) else data.train
    )  # as fit_full_posterior
    sources = {
        "train": data.train,
        "valid": valid,
        "test": fu.load_frames(split["test"], model, split, None),
        "ood": fu.load_frames(split["ood"], model, split, None),
    }
    t0 = time.perf_counter()
    sets: dict[str, Any] = {p: collect(model, reader, d) for p, d in sources.items()}
    log.info(
        "[%s] Jacobians of %s frames in %.0f s",
        run,
        {p: len(f) for p, f in sets.items()},
        time.perf_counter() - t0,
    )
    sets["d"] = model.latent_dim
    noise = (float(model.energy_noise.detach()), float(model.force_noise.detach()))
    rows = feature_rows(sets, noise)
    steps.add(
        f"features:{name}",
        {
            "rows": rows,
            "frames": {p: len(f) for p, f in sets.items() if p != "d"},
            "readout_input_width": int(sets["train"][0]["jac"].shape[1]) - model.latent_dim,
            "jacobian_seconds": time.perf_counter() - t0,
        },
    )


def run_summary(run: Path, args: argparse.Namespace) -> dict[str, Any] | None:
    name, path = args.dataset, run / "readout_input_posterior.jsonl"
    if not path.is_file():
        return None
    settings = cf.run_settings(run, args)
    rec = fu.Steps(path, cf.floor_settings(settings)).get(f"features:{name}")
    if rec is None:
        return None
    entry = json.loads((run / "force_uncertainty.json").read_text())[name]
    refs = {"committee5": entry["committee5"]}
    if (b := cf.committee_b_row(run, args)) is not None:
        refs["committee5_b"] = b
    rows = [
        {**r, "lines": {ref: cf.lines_met(r, row) for ref, row in refs.items()}}
        for r in rec["rows"]
    ]
    return {
        "run": str(run),
        "seed": settings.seed,
        "default": entry[entry["default"]],
        "references": refs,
        "baselines": cf.baseline_rows(entry),
        "rows": rows,
        "frames": rec["frames"],
        "readout_input_width": rec["readout_input_width"],
    }


def write_markdown(summary: dict[str, Any], path: Path) -> None:
    f3 = fu._f3
    lines = [
        f"# Last-layer posterior over the readout's input features, {summary['dataset']}",
        "",
        f"Commands: {'; '.join(f'`{c}`' for c in summary['commands'])} (updated {summary['updated']}; "
        f"status {summary['status']}).",
        "",
        (
            "Per run of benchmarks/force_uncertainty.py, its single model, post hoc (benchmarks/readout_input_posterior.py "
            "docstring): z = the shipped latent's per-element features (recomputed here; the default row is the run's "
            "own lowrank row), x = the readout's input (the interaction layers' scalars), z+x = both in one posterior. "
            "A rank r costs the same r + 1 vector-Jacobian products whatever the features (rank 4: the default's cost). "
            "force_magnitude (|F_pred|) and latent_distance are the run's own baseline rows on the same frames. "
            "Lines: issue 11's three ranking lines against committee A (the run's committee5) and B."
        ),
        "",
        "| run | seed | features | rank | width | valid NLL | in-domain | partial | AUROC OOD | std/RMSE "
        "| ranking lines vs A | ranking lines vs B |",
        "|---" * 12 + "|",
    ]

    for r in summary["runs"]:
        d = r["default"]
        lines.append(
            f"| {r['run']} | {r['seed']} | default (shipped lowrank) | 4 | | | {f3(d['spearman_frame_in_domain'])} | "
            f"{f3(d['partial_spearman_given_force'])} | {f3(d['auroc_ood'])} | {f3(d.get('std_over_rmse'))} | "
            f"{cf.verdict(cf.lines_met(d, r['references']['committee5']))} | "
            f"{cf.verdict(cf.lines_met(d, r['references']['committee5_b'])) if 'committee5_b' in r['references'] else ''} |"
        )
        for name, ref in {
            **r["references"],
            **r["baselines"],
        }.items():  # committees, then |F_pred| and latent distance
            lines.append(
                f"| {r['run']} | {r['seed']} | {name} | | | | {f3(ref['spearman_frame_in_domain'])} | "
                f"{f3(ref['partial_spearman_given_force'])} | {f3(ref['auroc_ood'])} | {f3(ref.get('std_over_rmse'))} | | |"
            )
        for row in r["rows"]:
            lines.append(
                f"| {r['run']} | {r['seed']} | {row['features']} | {row['rank']} | {row['width']} | "
                f"{row['valid_nll_forces']:.4f} | {f3(row['spearman_frame_in_domain'])} | "
                f"{f3(row['partial_spearman_given_force'])} | {f3(row['auroc_ood'])} | {f3(row['std_over_rmse'])} | "
                f"{cf.verdict(row['lines'].get('committee5'))} | {cf.verdict(row['lines'].get('committee5_b'))} |"
            )
    lines += [
        "",
        "Means over runs (in-domain / partial / OOD AUROC; runs meeting the three ranking lines against A, B):",
    ]
    for which in FEATURES:
        for rank in (*RANKS[:-1], "exact"):
            rows = [
                x
                for r in summary["runs"]
                for x in r["rows"]
                if x["features"] == which and x["rank"] == rank
            ]
            if rows:
                means = [float(np.mean([x[k] for x in rows])) for k in cf.LINES]
                met = [
                    sum(bool(x["lines"].get(ref, {}).get("all")) for x in rows)
                    for ref in ("committee5", "committee5_b")
                ]
                lines.append(
                    f"- {which}, rank {rank}: {' / '.join(f'{m:.3f}' for m in means)}; "
                    f"{met[0]} and {met[1]} of {len(rows)}"
                )
    atomic_write_text(path, "\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> dict[str, Any] | None:
    return cf.score_runs(
        parse_args(argv), argv, "readout_input_posterior", evaluate, run_summary, write_markdown
    )


if __name__ == "__main__":
    main()
