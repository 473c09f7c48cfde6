"""Latent-posterior alignment of the force Jacobian on 3BPA (docs/method.md s.3b, 4).

Model: the single Bayesian model of benchmarks/force_uncertainty.py (``<checkpoints>/3bpa_single``)
with its own full-covariance last-layer posterior ``Sigma = L^T L`` (stored factor, shared basis,
d = latent_dim) times its stored calibration (``alpha_F^2`` for forces, ``alpha_E^2`` for Phi).
Per force row ``g = dPhi/dr_ac`` (d,), ``Sigma = sum_k lam_k v_k v_k^T``, ``s2 = tr Sigma / d``:
``V = g^T Sigma g``, ``||g||^2``, ``kappa = V / (||g||^2 s2)`` (``log V = log||g||^2 + log s2 +
log kappa``), ``rho_F`` = Spearman over k of (mean over rows of ``(v_k^T g)^2``, ``lam_k``), the
share of ``||g||^2`` on the d/4 smallest-``lam`` directions; the same for the energy latents Phi,
and for uniformly random directions (the random-rotation reference: E kappa = 1, share d/4 / d).
Sets: the model's training frames, the in-domain test frames and the OOD frames of
force_frames.dataset_split. Frame scores ranked against the frame force error and by OOD
AUROC. Sweep: the precision refitted on nested random subsets of the training frames
(:func:`precision`, the model's noises and lambda), on the in-domain test rows.
Results: ``OUT/force_lpa.{json,md,png}`` (the page and its figure:
:mod:`~benchmarks.paper.force_lpa_page`).

    python -m benchmarks.paper.force_lpa --threads 1
    python -m benchmarks.paper.force_lpa --quick --out /tmp/force_lpa_quick
"""

from __future__ import annotations

import argparse
import json
import logging
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch_geometric.loader import DataLoader

from benchmarks.common import force_frames as ff
from benchmarks.paper import force_lpa_page as page
from mlip_unc import keys
from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.config import load_potential_config
from mlip_unc.evaluation.evaluate import frame_table, predict
from mlip_unc.models.checkpoint import load_checkpoint
from mlip_unc.models.full_posterior import latent_jacobian
from mlip_unc.models.loading import load_potential
from mlip_unc.models.potential import BayesianPotential
from mlip_unc.posthoc.posterior import gaussian_scale_fit
from mlip_unc.train.potential_data import prepare_data
from mlip_unc.train.text_files import json_safe
from mlip_unc.uncertainty import alignment, density, moments
from mlip_unc.uncertainty import diagnostics as diag

log = logging.getLogger("force_lpa")
FRACTIONS = (0.10, 0.25, 0.50, 0.75, 1.00)
DRAWS = 50_000  # random directions of the reference


def precision(
    frames: list[dict[str, torch.Tensor]], noise: tuple[float, float], w_energy: float
) -> torch.Tensor:
    """``A = w_E sum Phi Phi^T / (n sigma_e^2) + sum J J^T / sigma_f^2`` over training frames.

    Each frame holds ``jac`` (latent, n_atoms, 3), ``phi`` (latent,) and ``n_atoms``; the result
    is the (latent, latent) float64 precision of the last layer's weights without the prior.
    """
    k = frames[0]["jac"].shape[0]
    a = torch.zeros(k, k, dtype=torch.float64)
    for f in frames:
        j = f["jac"].reshape(k, -1)
        a += j @ j.T / noise[1] ** 2 + w_energy * torch.outer(f["phi"], f["phi"]) / (
            f["n_atoms"] * noise[0] ** 2
        )
    return a


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data-root", type=Path, default=None, help="default: $MLIP_UNC_DATA or ../shared/data"
    )
    p.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        help="folder of 3bpa_single (default: benchmarks/results/checkpoints/force_uncertainty)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--seed", type=int, default=0, help="seed of the nested training subsets of the sweep"
    )
    p.add_argument(
        "--report-only", action="store_true", help="only rewrite OUT/force_lpa.md from its JSON"
    )
    args = ff.parse_with_quick(p, argv, "tiny EMT Cu model trained here (seconds); needs --out")
    if args.quick:  # where force_frames.train puts the quick model
        args.checkpoints = args.out / "checkpoints" / "force_uncertainty"
    args.checkpoints = args.checkpoints or ff.RESULTS / "checkpoints" / "force_uncertainty"
    return args


def jacobians(model: BayesianPotential, dataset: Any, batch_size: int) -> list[dict[str, Any]]:
    """Per frame, in the layout of ``posterior_variants.collect`` + ``to_shared`` (float64; in the
    basis of the model's posterior, ``D = d`` shared, ``n_elements * d`` per element): ``jac
    (D, n_atoms, 3)``, ``phi (D,)``, ``error``/``forces (n_atoms, 3)``, ``n_atoms``. From
    ``latent_jacobian``, the function of the model's own posterior fit (d + 1 products per batch;
    ``collect``'s per-element basis costs n_elements * d), in its batches and order."""
    frames = []
    for batch in DataLoader(
        list(getattr(dataset, "graphs", dataset)), batch_size=batch_size, shuffle=False
    ):
        state, out, jac = latent_jacobian(
            model, batch, model.full_posterior().n_blocks
        )  # the posterior's basis
        for g in range(state.n_graphs):
            sel = state.graph == g
            frames.append(
                {
                    "jac": jac[:, sel].double(),
                    "phi": state.phi[g].detach().double(),
                    "error": (out[keys.FORCES][sel] - batch[keys.FORCES][sel]).double(),
                    "forces": out[keys.FORCES][sel].double(),
                    "n_atoms": int(sel.sum()),
                }
            )
    return frames


def force_rows(frames: list[dict[str, Any]]) -> tuple[torch.Tensor, np.ndarray]:
    """``G (M, d)``, one row per (atom, Cartesian) in atom-major order, and the frame of each row."""
    rows = [f["jac"].reshape(f["jac"].shape[0], -1).T for f in frames]
    return torch.cat(rows), np.repeat(np.arange(len(frames)), [r.shape[0] for r in rows])


def row_stats(x: torch.Tensor, factor: torch.Tensor, alpha2: float) -> dict[str, Any]:
    """Per row of ``x (n, d)`` under ``alpha2 * L^T L``: ``V`` (direct, ``alpha2 ||L x||^2``), ``norm2``,
    ``kappa`` (in the eigenbasis), the low-variance fraction; and the set's summary (rows x = 0 dropped)."""
    _, sv, vh = torch.linalg.svd(
        factor.double()
    )  # Sigma = vh^T diag(sv^2) vh, stabler than eigh(Sigma)
    lam = alpha2 * sv.square()  # (d,)
    proj = x @ vh.T  # (n, d) coordinates in Sigma's eigenbasis
    split = alignment.three_factor_split(proj, lam)
    var = alpha2 * moments.factor_variance(x, factor.double())  # (n,)
    keep = split.norm2 > 0
    lowfrac = alignment.low_variance_energy_fraction(proj[keep], lam, max(1, lam.shape[0] // 4))
    log_v, log_n, log_k = var[keep].log(), split.norm2[keep].log(), split.kappa[keep].log()
    log_s2 = float(split.mean_s2.log())
    summary = {
        "n_rows": int(x.shape[0]),
        "n_zero_rows": int((~keep).sum()),
        "mean_log_V": float(log_v.mean()),
        "median_log_V": float(log_v.median()),
        "mean_log_norm2": float(log_n.mean()),
        "median_log_norm2": float(log_n.median()),
        "mean_s2": float(split.mean_s2),
        "log_mean_s2": log_s2,
        "mean_log_kappa": float(log_k.mean()),
        "median_log_kappa": float(log_k.median()),
        "mean_kappa": float(split.kappa[keep].mean()),
        "frac_kappa_below_1": float((split.kappa[keep] < 1).double().mean()),
        "rho": alignment.rho_lpa(proj[keep], lam),
        "low_variance_fraction": float(lowfrac.mean()),
        "mean_log_U_perm": float(log_n.mean()) + log_s2,
    }
    summary["identity_residual"] = (
        summary["mean_log_V"] - summary["mean_log_U_perm"] - summary["mean_log_kappa"]
    )
    return {
        "summary": summary,
        "V": var.numpy(),
        "norm2": split.norm2.numpy(),
        "kappa": split.kappa.numpy(),
        "keep": keep.numpy(),
        "split": (split.norm2[keep], split.mean_s2, split.kappa[keep]),
    }


def random_directions(factor: torch.Tensor, seed: int) -> dict[str, Any]:
    """KAPPA_KEYS of DRAWS uniformly random directions under ``Sigma`` (what a random rotation of its
    eigenbasis gives any row; scale-free), and their kappas."""
    d = factor.shape[1]
    u = torch.randn(DRAWS, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    s = row_stats(u, factor, 1.0)
    return {**{k: s["summary"][k] for k in page.KAPPA_KEYS}, "draws": DRAWS, "kappa": s["kappa"]}


def frame_scores(
    frames: list[dict[str, Any]], stats: dict[str, Any], frame_of: np.ndarray
) -> dict[str, np.ndarray]:
    """Frame scores (SCORES), frame error (mean |F_pred - F_true| over atoms) and max |F_pred|."""
    n, keep = len(frames), stats["keep"]
    atom_frame = frame_of[::3]  # rows are (atom, Cartesian), atom-major
    return {
        "max_atom_std": diag.per_frame(diag.atom_force_std(stats["V"]), atom_frame, n),
        "mean_log_kappa": diag.per_frame(
            np.log(stats["kappa"][keep]), frame_of[keep], n, how="mean"
        ),
        "mean_log_norm2": diag.per_frame(
            np.log(stats["norm2"][keep]), frame_of[keep], n, how="mean"
        ),
        "error": np.array([float(f["error"].norm(dim=1).mean()) for f in frames]),
        "force": np.array([float(f["forces"].norm(dim=1).max()) for f in frames]),
    }


def sigma_factor(
    frames: list[dict[str, Any]], noise: tuple[float, float], lam: float
) -> torch.Tensor:
    """The model's fit (mlip_unc.posthoc.posterior) at a fixed ``lambda``: ``L`` with rows
    ``sqrt(sigma_k) v_k``, ``sigma_k = 1 / (eig_k(A) + lambda)``, ``A`` = posterior_variants.precision."""
    eig, vec = torch.linalg.eigh(precision(frames, noise, 1.0))
    return (1.0 / (eig.clamp_min(0.0) + lam)).sqrt()[:, None] * vec.T


def sweep(
    sets: dict[str, list], noise: tuple[float, float], lam: float, alpha2: float, seed: int
) -> tuple[list[dict[str, Any]], torch.Tensor]:
    """Nested random subsets of the training frames (FRACTIONS, ``seed``): s2 and the mean logs on the
    in-domain test rows (fixed ``lambda`` and ``alpha_F^2``), and ``alpha_F^2`` refitted on the
    validation rows (as the model's fit; for reference). Returns the rows and the 100 % factor."""
    order = np.random.default_rng(seed).permutation(len(sets["train"]))
    test_rows, valid_rows = force_rows(sets["test"])[0], force_rows(sets["valid"])[0]
    valid_err = torch.cat([f["error"].reshape(-1) for f in sets["valid"]])
    rows, factor = [], None
    for frac in FRACTIONS:
        n = max(1, round(frac * len(order)))
        factor = sigma_factor([sets["train"][k] for k in sorted(order[:n])], noise, lam)
        s = row_stats(test_rows, factor, alpha2)["summary"]
        ref = random_directions(factor, seed)["mean_log_kappa"]
        refit = gaussian_scale_fit(valid_err, moments.factor_variance(valid_rows, factor))[0]
        rows.append(
            {
                "fraction": frac,
                "n_frames": n,
                **{
                    k: s[k]
                    for k in (
                        "mean_s2",
                        "log_mean_s2",
                        "mean_log_V",
                        "mean_log_norm2",
                        "mean_log_kappa",
                        "median_log_kappa",
                        "frac_kappa_below_1",
                    )
                },
                "random_mean_log_kappa": ref,
                "alpha2_forces_valid_refit": refit,
            }
        )
        log.info(
            "[sweep] %3.0f %% (%d frames): log s2 %.3f, mean log kappa %.3f",
            100 * frac,
            n,
            s["log_mean_s2"],
            s["mean_log_kappa"],
        )
    return rows, factor


def reproduction(
    model_factor: torch.Tensor, refit: torch.Tensor, test_rows: torch.Tensor
) -> dict[str, float]:
    """The 100 % refit against the model's stored Sigma (both uncalibrated)."""
    a, b = model_factor.T @ model_factor, refit.T @ refit
    va, vb = (
        moments.factor_variance(test_rows, model_factor),
        moments.factor_variance(test_rows, refit),
    )
    ka, kb = (
        row_stats(test_rows, f, 1.0)["summary"]["mean_log_kappa"] for f in (model_factor, refit)
    )
    return {
        "rel_frobenius": float((a - b).norm() / a.norm()),
        "trace_ratio": float(b.trace() / a.trace()),
        "max_abs_log_V_diff_test_rows": float((vb.log() - va.log()).abs().max()),
        "median_abs_log_V_diff_test_rows": float((vb.log() - va.log()).abs().median()),
        "mean_log_kappa_diff_test_rows": kb - ka,
    }


def quick_checkpoint(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The quick model of force_uncertainty.py (EMT Cu, configs/tiny_emt.yaml), single model only."""
    fargs = argparse.Namespace(  # force_uncertainty's --quick settings
        data_root=args.data_root, seed=0, out=args.out, budget_minutes=10.0 / 60.0, overrides=[]
    )
    split = ff.dataset_split("cu_emt", fargs, work)
    if not (args.checkpoints / "cu_emt_single" / "model.pt").is_file():
        settings = {
            "command": "force_lpa --quick",
            "quick": True,
            "seed": fargs.seed,
            "overrides": [],
            "budget_minutes": fargs.budget_minutes,
        }
        ff.train("cu_emt", split, fargs, ff.Steps(work / "steps.jsonl", settings), 1)
    return split


def load_sets(
    args: argparse.Namespace, work: Path
) -> tuple[BayesianPotential, dict[str, Any], dict[str, list]]:
    name = "cu_emt" if args.quick else "3bpa"
    folder = args.checkpoints / f"{name}_single"
    if args.quick:
        split = quick_checkpoint(args, work)
    else:
        for path in (
            folder / "model.pt",
            folder / "config.yaml",
            *(
                args.data_root / "structures" / "3BPA" / f
                for f in ("train_300K.xyz", "train_mixedT.xyz")
            ),
        ):
            if not path.is_file():
                raise SystemExit(
                    f"not found: {path} (checkpoint: benchmarks/force_uncertainty.py; data: --data-root)"
                )
        seed = load_potential_config(folder / "config.yaml", [f"data_root={args.data_root}"]).seed
        split = ff.dataset_split(
            name, argparse.Namespace(data_root=args.data_root, seed=seed), work
        )
    cfg = load_potential_config(
        folder / "config.yaml", [f"data_root={args.data_root}", f"data.train={split['train']}"]
    )
    data = prepare_data(
        cfg
    )  # the model's own train/valid split (config seed), as posterior_variants
    payload = load_checkpoint(folder / "model.pt", kind="potential")
    model = BayesianPotential.from_checkpoint(payload).eval()
    if model.full_posterior() is None or "lambda" not in (payload.get("metadata") or {}).get(
        "posterior", {}
    ):
        raise SystemExit(
            f"{folder / 'model.pt'} has no fitted full posterior (model.posterior: full)"
        )
    valid = (
        data.valid if data.valid is not None and len(data.valid) else data.train
    )  # as fit_full_posterior
    datasets = {
        "train": data.train,
        "valid": valid,
        **{p: ff.load_frames(split[p], model, split, None) for p in ("test", "ood")},
    }
    sets = {}
    for part, dataset in datasets.items():
        start = time.monotonic()
        sets[part] = jacobians(model, dataset, cfg.train.valid_batch_size)
        log.info(
            "[%s] %d frames: Jacobians in %.0f s", part, len(sets[part]), time.monotonic() - start
        )
    meta = {
        "checkpoint": _shown(folder / "model.pt"),
        "split_seed": cfg.seed,
        "posterior_fit": payload["metadata"]["posterior"],
        "baselines": baseline_scores(datasets, args.checkpoints / f"{name}_committee5"),
    }
    return model, meta, sets


def _shown(path: Path) -> str:
    """``path`` relative to the repository when inside it (no machine-specific prefix in results)."""
    try:
        return str(path.resolve().relative_to(ff.REPO))
    except ValueError:
        return str(path)


def baseline_scores(datasets: dict[str, Any], committee_dir: Path) -> dict[str, Any]:
    """Frame scores that need no posterior, on the test and OOD frames: the committee's max atom
    force std (``committee_dir``, the MAP committee of force_uncertainty.py; absent in --quick)
    and the mean distance to the ``KNN_K`` nearest training frames in the interatomic-distance
    descriptor (mlip_unc.uncertainty.density). The latent kNN distance uses Phi (analyse)."""
    positions = {
        p: [g[keys.POSITIONS].detach().double().numpy() for g in getattr(d, "graphs", d)]
        for p, d in datasets.items()
    }
    desc = {p: density.structure_descriptor(x) for p, x in positions.items()}
    k = min(page.KNN_K, len(desc["train"]))
    out: dict[str, Any] = {
        p: {"descriptor_knn": density.descriptor_knn_distance(desc[p], desc["train"], k=k)}
        for p in ("test", "ood")
    }
    out["knn_k"] = k
    if not (committee_dir / "ensemble.json").is_file():
        out["committee_note"] = f"no committee at {_shown(committee_dir)}: its row is left out"
        return out
    committee = load_potential(committee_dir)
    for part in ("test", "ood"):
        start = time.monotonic()
        pred = predict(committee, datasets[part], uncertainty="exact", batch_size=8)
        out[part]["committee5"] = frame_table(pred)["forces_max_std"]
        log.info(
            "[%s] committee of %d: %.0f s", part, len(committee.members), time.monotonic() - start
        )
    out["committee"] = _shown(committee_dir)
    return out


def analyse(
    model: BayesianPotential, meta: dict[str, Any], sets: dict[str, list], seed: int
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """The result's numbers, and the kappa of every (nonzero) force row per set for the plot."""
    post, fit = model.full_posterior(), meta["posterior_fit"]
    factor = (
        post.factor.detach().double()
    )  # (D, D), Sigma = L^T L before calibration (D: the posterior's basis)
    alpha_f, alpha_e = float(post.alpha2_forces), float(post.alpha2_energy)
    out: dict[str, Any] = {
        "posterior": {
            "source": "model's full posterior (stored factor L, Sigma = L^T L), times the stored calibration",
            "latent_dim": int(factor.shape[1]),
            "alpha2_forces": alpha_f,
            "alpha2_energy": alpha_e,
            "lambda": fit["lambda"],
            "lambda_over_mean_eig": fit.get("lambda_over_mean_eig"),
            "noise_energy": float(model.energy_noise.detach()),
            "noise_forces": float(model.force_noise.detach()),
            "low_variance_directions": max(1, int(factor.shape[1]) // 4),
        }
    }
    eig = torch.linalg.svdvals(
        factor
    ).square()  # (d,) eigenvalues of Sigma (uncalibrated), descending
    out["posterior"].update(
        sigma_eig_max=float(eig[0]),
        sigma_eig_min=float(eig[-1]),
        one_over_lambda=1.0 / fit["lambda"],
        trace_share_top4=float(eig[:4].sum() / eig.sum()),
    )
    ref = random_directions(factor, seed)
    out["random_direction"] = {k: v for k, v in ref.items() if k != "kappa"}
    forces, energy, splits, ranking = {}, {}, {"forces": {}, "energy": {}}, {}
    scores, kappas = {}, {"random direction": ref["kappa"]}
    phi_train = torch.stack([f["phi"] for f in sets["train"]])
    for part in page.SETS:
        rows, frame_of = force_rows(sets[part])
        stats = row_stats(rows, factor, alpha_f)
        forces[part], splits["forces"][part] = stats["summary"], stats["split"]
        scores[part] = frame_scores(sets[part], stats, frame_of)
        if part in meta["baselines"]:
            phi = torch.stack([f["phi"] for f in sets[part]])
            scores[part].update(
                meta["baselines"][part],
                latent_knn=density.latent_knn_distance(
                    phi, phi_train, k=meta["baselines"]["knn_k"]
                ),
            )
        kappas[page.NAMES[part]] = stats["kappa"][stats["keep"]]
        e_stats = row_stats(torch.stack([f["phi"] for f in sets[part]]), factor, alpha_e)
        energy[part], splits["energy"][part] = e_stats["summary"], e_stats["split"]
        log.info(
            "[%s] force rows %d: mean log kappa %.3f; energy mean log kappa %.3f",
            part,
            forces[part]["n_rows"],
            forces[part]["mean_log_kappa"],
            energy[part]["mean_log_kappa"],
        )
    decomposition = {}
    for kind, per in splits.items():
        decomposition[kind] = {}
        for a, b in (("train", "test"), ("test", "ood")):
            dec = alignment.log_variance_decomposition(per[a], per[b])
            decomposition[kind][f"{a}->{b}"] = {**dec.as_dict(), "dominant": dec.dominant}
    for key in (k for k in page.SCORES if k in scores["test"]):
        row = diag.frame_ranking(
            *(scores["test"][k] for k in (key, "error", "force")),
            *(scores["ood"][k] for k in (key, "error", "force")),
        )
        ranking[key] = {k: row[k] for k in page.RANK_KEYS}
    noise = (out["posterior"]["noise_energy"], out["posterior"]["noise_forces"])
    sweep_rows, refit = sweep(sets, noise, fit["lambda"], alpha_f, seed)
    check = reproduction(factor, refit, force_rows(sets["test"])[0])
    check["alpha2_forces_refit_over_stored"] = sweep_rows[-1]["alpha2_forces_valid_refit"] / alpha_f
    out.update(
        frames={p: len(f) for p, f in sets.items()},
        forces=forces,
        energy=energy,
        decomposition=decomposition,
        ranking=ranking,
        sweep=sweep_rows,
        reproduction=check,
        baselines={k: v for k, v in meta["baselines"].items() if k not in page.SETS},
    )
    return out, kappas


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report_only:
        result = json.loads((args.out / "force_lpa.json").read_text())
        atomic_write_text(args.out / "force_lpa.md", page.write_markdown(result))
        return result
    torch.set_num_threads(args.threads)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    command = shlex.join(
        ["python", "-m", "benchmarks.paper.force_lpa", *(sys.argv[1:] if argv is None else argv)]
    )
    started = time.strftime("%Y-%m-%d %H:%M:%S")
    with tempfile.TemporaryDirectory(prefix="mlip_unc_flpa_") as work:
        model, meta, sets = load_sets(args, Path(work))
    numbers, kappas = analyse(model, meta, sets, args.seed)
    result = json_safe(
        {
            "command": command,
            "seed": args.seed,
            "quick": args.quick,
            "threads": args.threads,
            "data_root": None if args.quick else str(args.data_root),
            "checkpoint": meta["checkpoint"],
            "split_seed": meta["split_seed"],
            "started": started,
            **numbers,
            "finished": time.strftime("%Y-%m-%d %H:%M:%S"),
        }
    )
    atomic_write_text(args.out / "force_lpa.json", json.dumps(result, indent=1))
    atomic_write_text(
        args.out / "force_lpa.md", page.write_markdown(result)
    )  # the JSON's numbers, as markdown_section
    page.plot(result, kappas, args.out / "force_lpa.png")
    log.info("results: %s", args.out / "force_lpa.md")
    return result


if __name__ == "__main__":
    main()
