"""Which last-layer posterior ranks force errors best? Post-hoc variants on the trained models of
benchmarks/force_uncertainty.py (issue 11's missed targets, measured rather than guessed).

For each dataset the single Bayesian model of the force-uncertainty benchmark
(``<checkpoints>/<dataset>_single/model.pt``) is loaded once; one pass over its training,
validation, in-domain test and OOD frames stores the position Jacobians of the per-element
latent sums ``Phi_e = sum_{atoms of element e} z_a`` (their sum over elements is the shared
``Phi`` of the model). From those, without retraining, every variant of the full-covariance
posterior of ``mlip_unc.train.posterior`` is evaluated on the same frames:

- basis: ``shared`` (the model's head, d weights) or ``per_element`` (one weight vector per
  element, ``n_elements * d``; same posterior mean, so the same predictions);
- precision: ``energy+forces`` (the default) or ``forces`` only;
- lambda: chosen by the validation force NLL of the exact variance on the grid ``c * mean eig``, ``c`` from 1e-8 (the
  grid until this run) or from 1e-14 (each grid up to 1);
- rank: the r least-constrained directions (``lowrank``, r = 4, 8, 16) or all (``exact``).

Then, on the posterior the model ships (its basis, energy+forces, lambda on the 1e-14 grid), which r
directions the low-rank mode should keep at the same cost (``subspaces``): the least constrained (the
model's choice), the directions that carry the most force variance on the validation or training
frames, half of each, or random rotations of the factor drawn per frame (an unbiased estimate of the
exact variance), r = 4 and 8; the exact variance for reference.

Frame score, error and metrics as in force_uncertainty.md (max over atoms of the force std;
mean |F error|); a bootstrap over in-domain frames gives the spread of the in-domain Spearman.
The cost of ``lowrank`` at each rank (shared basis; a per-element rank r costs the same r
vector-Jacobian products) is timed against plain E+F on the in-domain frames, interleaved.
Results: ``OUT/posterior_variants.{md,json}``; finished datasets are appended to
``OUT/posterior_variants.jsonl`` and skipped when the command is run again.

    python benchmarks/posterior_variants.py --datasets 3bpa,ethanol --threads 1
    python benchmarks/posterior_variants.py --quick --out /tmp/pv_quick
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.loader import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parent))
import force_uncertainty as fu

from mlip_unc import keys
from mlip_unc.atomic import atomic_write_text
from mlip_unc.config import load_potential_config
from mlip_unc.models.full_posterior import latent_jacobian
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.train.posterior import gaussian_scale_fit
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.uncertainty import diagnostics as diag

log = logging.getLogger("posterior_variants")
RANKS = (4, 8, 16, None)  # None: exact
GRIDS = {
    "1e-8": tuple(10.0**k for k in range(-8, 1)),
    "1e-14": tuple(10.0**k for k in range(-14, 1)),
}
PRECISIONS = {"energy+forces": 1.0, "forces": 0.0}
SUBSPACE_RANKS = (4, 8)  # the low-rank subspace study (subspaces)
PROBE_DRAWS = 5
METRICS = (
    "spearman_frame_in_domain",
    "partial_spearman_given_force",
    "auroc_ood",
    "spearman_frame_pooled",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument("--datasets", default="3bpa,ethanol")
    p.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help="folder of <dataset>_single (default: OUT/checkpoints/force_uncertainty)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0, help="seed of the 3BPA split and the bootstrap")
    p.add_argument("--bootstrap", type=int, default=200)
    p.add_argument("--timing-frames", type=int, default=20)
    args = fu.parse_with_quick(p, argv, "tiny EMT Cu model trained here (10 s); needs --out")
    args.datasets = (
        ["cu_emt"] if args.quick else [d.strip().lower() for d in args.datasets.split(",") if d]
    )
    args.checkpoints = args.checkpoints or args.out / "checkpoints" / "force_uncertainty"
    return args


def collect(model: BayesianPotential, dataset: Any) -> list[dict[str, torch.Tensor]]:
    """Per frame: ``jac (n_el * d, n_atoms, 3)`` of the per-element latent sums, the force error
    and the predicted forces ``(n_atoms, 3)`` at the posterior mean (float64), from the model's
    own per-element basis (:func:`~mlip_unc.models.full_posterior.latent_jacobian`)."""
    n_el = len(model.type_map)
    frames = []
    for batch in DataLoader(list(getattr(dataset, "graphs", dataset)), batch_size=8, shuffle=False):
        state, out, jac = latent_jacobian(model, batch, n_el)  # state.phi (n_graphs, n_el d)
        forces = out[keys.FORCES]
        for g in range(state.n_graphs):
            sel = state.graph == g
            frames.append(
                {
                    "jac": jac[:, sel].double(),
                    "phi": state.phi[g].detach().double(),
                    "error": (forces[sel] - batch[keys.FORCES][sel]).double(),
                    "forces": forces[sel].double(),
                    "n_atoms": int(sel.sum()),
                }
            )
    return frames


def to_shared(frames: list[dict[str, torch.Tensor]], n_el: int) -> list[dict[str, torch.Tensor]]:
    """The model's own basis: ``Phi = sum_e Phi_e`` (and its Jacobian)."""
    return [
        {
            **f,
            "jac": f["jac"].reshape(n_el, -1, *f["jac"].shape[1:]).sum(0),
            "phi": f["phi"].reshape(n_el, -1).sum(0),
        }
        for f in frames
    ]


def precision(
    frames: list[dict[str, torch.Tensor]], noise: tuple[float, float], w_energy: float
) -> torch.Tensor:
    """``A = w_E sum Phi Phi^T / (n sigma_e^2) + sum J J^T / sigma_f^2`` over training frames."""
    k = frames[0]["jac"].shape[0]
    a = torch.zeros(k, k, dtype=torch.float64)
    for f in frames:
        j = f["jac"].reshape(k, -1)
        a += j @ j.T / noise[1] ** 2 + w_energy * torch.outer(f["phi"], f["phi"]) / (
            f["n_atoms"] * noise[0] ** 2
        )
    return a


def frame_values(
    frames: list[dict[str, torch.Tensor]], vec: torch.Tensor, sigma: torch.Tensor, rank: int | None
) -> dict[str, Any]:
    """Frame score (max atom force std, raw), error (mean |F err|), max |F_pred|; all components'
    raw variances and errors (for the calibration fit); the ``rank`` least constrained directions
    of ``Sigma = vec diag(sigma) vec^T`` (all when None)."""
    keep = (
        slice(None) if rank is None else slice(0, rank)
    )  # sigma descending: least constrained first
    return row_values(frames, sigma[keep].sqrt()[:, None] * vec.T[keep])


def row_values(
    frames: list[dict[str, torch.Tensor]], rows: torch.Tensor | Callable[[], torch.Tensor]
) -> dict[str, Any]:
    """:func:`frame_values` with the variance ``sum_k (d(rows_k . Phi)/dr)^2`` of the rows ``(r, D)`` of a
    factor, or of rows drawn anew for each frame by ``rows()``."""
    score, error, force, var, err = [], [], [], [], []
    for f in frames:
        v = (
            torch.einsum("kd,dac->kac", rows() if callable(rows) else rows, f["jac"])
            .square()
            .sum(0)
        )  # (n_atoms, 3)
        score.append(float(v.sum(1).sqrt().max()))
        error.append(float(f["error"].norm(dim=1).mean()))
        force.append(float(f["forces"].norm(dim=1).max()))
        var.append(v.reshape(-1))
        err.append(f["error"].reshape(-1))
    return {
        "score": np.array(score),
        "error": np.array(error),
        "force": np.array(force),
        "var": torch.cat(var),
        "err": torch.cat(err),
    }


def bootstrap_spread(score: np.ndarray, error: np.ndarray, n: int, seed: int) -> float:
    """Standard deviation of the in-domain Spearman over ``n`` bootstrap resamples of frames."""
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, score.size, size=(n, score.size))
    return float(np.std([diag.spearman(score[i], error[i]) for i in idx]))


def variants(
    sets: dict[str, list], noise: tuple[float, float], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Every (precision, grid, rank) variant on one basis: metrics on the same frames."""
    rows = []
    for prec, w_e in PRECISIONS.items():
        eig, vec = torch.linalg.eigh(precision(sets["train"], noise, w_e))
        eig = eig.clamp_min(
            0.0
        )  # ascending precision = descending variance: least constrained first
        scale = float(eig.mean())
        for grid_name, grid in GRIDS.items():
            c = choose_lambda(sets["valid"], eig, vec, grid)
            sigma = 1.0 / (eig + c * scale)
            for rank in RANKS:
                val = frame_values(sets["valid"], vec, sigma, rank)
                nll = gaussian_scale_fit(val["err"], val["var"])[2]
                ind, ood = (frame_values(sets[p], vec, sigma, rank) for p in ("test", "ood"))
                ranking = diag.frame_ranking(
                    ind["score"],
                    ind["error"],
                    ind["force"],
                    ood["score"],
                    ood["error"],
                    ood["force"],
                )
                rows.append(
                    {
                        "precision": prec,
                        "grid_floor": grid_name,
                        "rank": rank or "exact",
                        "lambda_over_mean_eig": c,
                        "valid_nll_forces": nll,
                        **{k: ranking[k] for k in METRICS},
                        "spearman_in_domain_bootstrap_std": bootstrap_spread(
                            ind["score"], ind["error"], args.bootstrap, args.seed
                        ),
                    }
                )
    return rows


def choose_lambda(
    valid: list[dict[str, torch.Tensor]], eig: torch.Tensor, vec: torch.Tensor, grid: tuple
) -> float:
    """``c`` of ``lambda = c * mean eig`` with the lowest validation force NLL of the exact variance, as the model."""
    scale = float(eig.mean())
    fits = []
    for c in grid:
        val = frame_values(valid, vec, 1.0 / (eig + c * scale), None)
        fits.append((gaussian_scale_fit(val["err"], val["var"])[2], c))
    return min(fits)[1]


def top_directions(m: torch.Tensor, r: int) -> torch.Tensor:
    """``(r, D)`` unit eigenvectors of the symmetric ``m (D, D)`` with the r largest eigenvalues."""
    e, u = torch.linalg.eigh(m)
    return u[:, torch.argsort(e, descending=True)[:r]].T


def captured_variance(frames: list[dict[str, torch.Tensor]], factor: torch.Tensor) -> torch.Tensor:
    """``(D, D)`` sum over frames of ``(factor J)(factor J)^T``: its top eigenvectors (rotations of the
    factor's rows) carry the most force variance on these frames."""
    return (
        factor @ precision(frames, (1.0, 1.0), 0.0) @ factor.T
    )  # precision: sum J J^T with unit noise


def probe_rows(factor: torch.Tensor, r: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """``(r, D)`` rows: the first ``k`` rows of ``factor (D, D)``, then ``r - k`` orthonormal random
    rotations of the other ``D - k`` rows scaled by ``sqrt((D - k) / (r - k))``, so that the expected
    ``sum_rows (row . x)^2`` is ``||factor x||^2`` for every ``x`` (the exact variance, unbiased)."""
    d = factor.shape[0]
    q, _ = torch.linalg.qr(
        torch.randn(d - k, r - k, generator=gen, dtype=factor.dtype)
    )  # (D - k, r - k)
    return torch.cat([factor[:k], ((d - k) / (r - k)) ** 0.5 * q.T @ factor[k:]])


def subspaces(
    sets: dict[str, list], noise: tuple[float, float], args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Which r directions should the low-rank mode keep? On the shipped posterior (per-element basis as
    given, energy+forces precision, lambda on the 1e-14 grid), each choice of r rotations of the factor
    ``L (D, D)`` (``Sigma = L^T L``, rows by decreasing variance): ``least_constrained`` (the model's:
    the first r rows), ``valid_variance`` / ``train_variance`` (the r directions carrying the most force
    variance on the validation / training frames), ``half_and_half`` (r/2 least constrained, then the
    validation directions orthogonal to them), and random probes (``probes_k`` = the first k rows exactly
    plus r - k orthonormal random rotations of the others, scaled to an unbiased estimate of the exact
    variance, drawn anew for each frame; mean and std over PROBE_DRAWS draws); ``exact`` for reference."""
    eig, vec = torch.linalg.eigh(precision(sets["train"], noise, 1.0))
    eig = eig.clamp_min(0.0)
    c = choose_lambda(sets["valid"], eig, vec, GRIDS["1e-14"])
    factor = (1.0 / (eig + c * float(eig.mean()))).sqrt()[:, None] * vec.T  # (D, D)
    d = factor.shape[0]
    eye = torch.eye(d, dtype=torch.float64)
    ranks = sorted(
        {min(r, d) for r in SUBSPACE_RANKS}
    )  # a tiny model may have fewer than r directions
    valid_g, train_g = (captured_variance(sets[p], factor) for p in ("valid", "train"))
    valid_dirs = {r: top_directions(valid_g, r) for r in ranks}

    def row(choice: str, rank: Any, rows: Any, draws: int = 1) -> dict[str, Any]:
        runs = []
        for k in range(draws):
            gen = torch.Generator().manual_seed(args.seed * 1000 + k)
            val, ind, ood = (
                row_values(sets[p], rows(gen) if draws > 1 else rows)
                for p in ("valid", "test", "ood")
            )
            ranking = diag.frame_ranking(
                ind["score"], ind["error"], ind["force"], ood["score"], ood["error"], ood["force"]
            )
            runs.append(
                {
                    **{m: ranking[m] for m in METRICS},
                    "valid_nll_forces": gaussian_scale_fit(val["err"], val["var"])[2],
                }
            )
        out = {"subspace": choice, "rank": rank, "draws": draws}
        for key in runs[0]:
            values = np.array([r[key] for r in runs])
            out[key], out[f"{key}_std"] = (
                float(values.mean()),
                float(values.std()) if draws > 1 else None,
            )
        return out

    def probes(r: int, k: int):
        return lambda gen: lambda: probe_rows(factor, r, k, gen)

    rows = []
    for r in ranks:
        half = torch.linalg.qr(torch.cat([eye[: r // 2], valid_dirs[r]]).T)[0].T[
            :r
        ]  # (r, D) orthonormal
        for choice, q in (
            ("least_constrained", eye[:r]),
            ("valid_variance", valid_dirs[r]),
            ("train_variance", top_directions(train_g, r)),
            ("half_and_half", half),
        ):
            rows.append(row(choice, r, q @ factor))
        for k in (0, r // 2):
            rows.append(row(f"probes_{k}", r, probes(r, k), PROBE_DRAWS))
    rows.append(row("exact", "exact", factor))
    return rows


def timings(model: BayesianPotential, graphs: list) -> dict[str, float]:
    """Cost of lowrank at each rank and of exact, as ratios to plain E+F (interleaved calls)."""
    rank0 = model.posterior_rank

    def lowrank(rank: int):
        def call(g):
            model.posterior_rank = rank
            return model(g, compute_forces=True, uncertainty="lowrank")

        return call

    calls = {
        "plain": lambda g: model(g, compute_forces=True, uncertainty="none"),
        **{f"lowrank{r}": lowrank(r) for r in RANKS if r},
        "exact": lambda g: model(g, compute_forces=True, uncertainty="exact"),
    }
    ms = fu.time_calls(calls, graphs)
    model.posterior_rank = rank0
    return {k: v / ms["plain"] for k, v in ms.items() if k != "plain"} | {"plain_ms": ms["plain"]}


def run_dataset(name: str, args: argparse.Namespace, steps: fu.Steps, work: Path) -> None:
    if steps.get(f"dataset:{name}") and steps.get(f"subspaces:{name}"):
        return
    split = fu.dataset_split(name, args, work)
    folder = args.checkpoints / f"{name}_single"
    if args.quick and not (folder / "model.pt").is_file():  # the benchmark's own quick model
        fu.main(["--quick", "--out", str(args.out)])
    cfg = load_potential_config(
        folder / "config.yaml", [f"data_root={args.data_root}", f"data.train={split['train']}"]
    )
    data = prepare_data(cfg)  # the model's own train/valid split (config seed)
    model = BayesianPotential.from_checkpoint(folder / "model.pt")
    model.eval()
    loaded = {p: fu.load_frames(split[p], model, split, None) for p in ("test", "ood")}
    log.info(
        "[%s] collecting Jacobians: %d train, %d valid, %d test, %d OOD frames",
        name,
        len(data.train),
        len(data.valid),
        len(loaded["test"]),
        len(loaded["ood"]),
    )
    valid = (
        data.valid if data.valid is not None and len(data.valid) else data.train
    )  # as fit_full_posterior
    per_el = {
        "train": collect(model, data.train),
        "valid": collect(model, valid),
        **{p: collect(model, loaded[p]) for p in ("test", "ood")},
    }
    n_el = len(model.type_map)
    shared = {p: to_shared(f, n_el) for p, f in per_el.items()}
    noise = (float(model.energy_noise.detach()), float(model.force_noise.detach()))
    if not steps.get(f"dataset:{name}"):
        rows = [{"basis": "shared", **r} for r in variants(shared, noise, args)]
        rows += [{"basis": "per_element", **r} for r in variants(per_el, noise, args)]
        cost = timings(model, loaded["test"].graphs[: args.timing_frames])
        steps.add(
            f"dataset:{name}",
            {
                "rows": rows,
                "cost_ratio": cost,
                "n_elements": n_el,
                "latent_dim": model.latent_dim,
                "frames": {p: len(f) for p, f in per_el.items()},
            },
        )
        log.info("[%s] done: %d variants", name, len(rows))
    basis = model.posterior_basis
    rows = subspaces(per_el if basis == "per_element" else shared, noise, args)
    steps.add(f"subspaces:{name}", {"basis": basis, "rows": rows})
    log.info("[%s] done: %d low-rank subspaces (%s basis)", name, len(rows), basis)


def _f(v: Any) -> str:
    if not isinstance(v, float):
        return "n/a" if v is None else str(v)
    return f"{v:.0e}" if v != 0 and abs(v) < 1e-3 else f"{v:.3f}"


def write_markdown(
    steps: fu.Steps, args: argparse.Namespace, path: Path, status: str
) -> dict[str, Any]:
    settings = steps.get("settings")
    reference = {}
    if (ref := args.out / "force_uncertainty.json").is_file():
        reference = json.loads(ref.read_text())
    lines = [
        "# Posterior variants on the force-uncertainty models (post hoc, same frames)",
        "",
        f"Command: `{settings['command']}`",
        "",
        (
            f"Seed {args.seed}; {settings['threads']} torch thread(s); started {settings['started']}, updated "
            f"{time.strftime('%Y-%m-%d %H:%M')}; status: {status}. The models are the `single` checkpoints of "
            "force_uncertainty.md (not retrained); the committee5 reference row is copied from "
            "force_uncertainty.json (same frames, earlier run). spread = bootstrap std of the in-domain Spearman "
            f"({args.bootstrap} resamples of frames). Definitions as in force_uncertainty.md; lambda chosen per "
            "(basis, precision, grid) by the validation force NLL of the exact variance, as in the model."
        ),
        "",
    ]
    out: dict[str, Any] = {"meta": {"command": settings["command"], "status": status}}
    head = [
        "basis",
        "precision",
        "grid_floor",
        "rank",
        "lambda_over_mean_eig",
        *METRICS,
        "spread",
        "valid_nll_forces",
    ]
    for name in args.datasets:
        rec = steps.get(f"dataset:{name}")
        if rec is None:
            continue
        out[name] = rec
        committee = (reference.get(name) or {}).get("committee5") or {}
        lines += [
            f"## {name}",
            "",
            f"Frames: {rec['frames']}; latent_dim {rec['latent_dim']}, {rec['n_elements']} elements.",
            "",
            "committee5 (force_uncertainty.json): "
            + ", ".join(f"{k} {_f(committee.get(k))}" for k in METRICS),
            "",
            "| " + " | ".join(head) + " |",
            "|---" * len(head) + "|",
        ]
        for r in rec["rows"]:
            r = {**r, "spread": r["spearman_in_domain_bootstrap_std"]}
            lines.append("| " + " | ".join(_f(r[k]) for k in head) + " |")
        cost = rec["cost_ratio"]
        lines += [
            "",
            "Cost vs plain E+F (shared basis, same run; per-element rank r costs the same r products): "
            + ", ".join(f"{k} {v:.2f}" for k, v in cost.items() if k != "plain_ms")
            + f" (plain {cost['plain_ms']:.2f} ms).",
            "",
        ]
        if sub := steps.get(f"subspaces:{name}"):
            out[name] = {**rec, "subspaces": sub}
            lines += subspace_lines(sub, committee)
    path.write_text("\n".join(lines) + "\n")
    return out


def subspace_lines(sub: dict[str, Any], committee: dict[str, Any]) -> list[str]:
    """The low-rank subspace table (:func:`subspaces`): one row per choice, each rank r costing r + 1 products."""
    head = ["subspace", "rank", *METRICS, "valid_nll_forces"]
    lines = [
        f"### Which r directions the low-rank mode keeps ({sub['basis']} basis, energy+forces, 1e-14 grid)",
        "",
        "Rows: rotations of the shipped posterior's factor (`subspaces` in the script: least_constrained is the "
        "model's own choice; valid_variance / train_variance keep the directions that carry the most force "
        "variance on those frames; half_and_half r/2 of each; probes_k the first k rows plus random rotations of "
        "the rest, drawn per frame, mean +- std over the draws). Same cost per rank. committee5: "
        + ", ".join(f"{k} {_f(committee.get(k))}" for k in METRICS[:3])
        + ".",
        "",
        "| " + " | ".join(head) + " |",
        "|---" * len(head) + "|",
    ]
    for r in sub["rows"]:
        cells = [str(r["subspace"]), str(r["rank"])]
        for k in head[2:]:
            std = r.get(f"{k}_std")
            cells.append(_f(r[k]) + (f" ± {std:.3f}" if std is not None else ""))
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    command = shlex.join(
        ["python", "benchmarks/posterior_variants.py", *(sys.argv[1:] if argv is None else argv)]
    )
    settings = {
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M"),
        "quick": args.quick,
        "seed": args.seed,
        "budget_minutes": None,
        "overrides": [],
        "threads": args.threads,
    }
    steps = fu.Steps(args.out / "posterior_variants.jsonl", settings)
    with tempfile.TemporaryDirectory(prefix="mlip_unc_pv_") as work:
        for name in args.datasets:
            run_dataset(name, args, steps, Path(work))
            write_markdown(steps, args, args.out / "posterior_variants.md", "partial")
    results = write_markdown(steps, args, args.out / "posterior_variants.md", "complete")
    atomic_write_text(
        args.out / "posterior_variants.json", json.dumps(fu._clean(results), indent=1)
    )
    log.info("results: %s", args.out / "posterior_variants.md")
    return results


if __name__ == "__main__":
    main()
