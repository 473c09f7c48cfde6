"""Time of the full-posterior fit against the training it follows.

For each trained checkpoint given, the posterior fit runs again with this code, exactly as
``finalize_checkpoint`` runs it after training (the config stored in the checkpoint: its
training frames, its validation frames and ``train.valid_batch_size``; at most
``model.posterior_max_frames`` training frames, taken from the shipped ``configs/NAME.yaml``
when NAME names one, so that the table shows what the shipped config does now), and its wall time is set against the training wall time of that
checkpoint (``--train-minutes``: the budget the run trained under). The rebuilt posterior is
compared with the stored one (``lambda`` and the calibration scalars), so a faster fit that fits
something else shows. Each checkpoint is one JSON record in ``OUT/posterior_fit.jsonl`` (skipped
when present); the page ``OUT/posterior_fit.md`` is written from all records.

    python -m benchmarks.posterior_fit --model NAME=PATH/model.pt:MINUTES [--model ...] --threads 1
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common.pages import environment
from benchmarks.common.records import append_jsonl, read_jsonl
from mlip_unc.config import PotentialConfig, load_potential_config
from mlip_unc.config.loader import validate
from mlip_unc.models.full_posterior import latent_jacobian
from mlip_unc.models.loading import load_potential
from mlip_unc.posthoc.posterior import fit_full_posterior, random_subset
from mlip_unc.train.potential_data import prepare_data

REPO = Path(__file__).resolve().parents[1]
RECORDS = "posterior_fit.jsonl"
COMPARED = (
    "lambda_over_mean_eig",
    "alpha2_forces",
    "alpha2_lowrank",
    "alpha2_energy",
    "valid_nll_forces",
    "valid_nll_forces_lowrank",
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model",
        action="append",
        default=[],
        metavar="NAME=PATH:MINUTES",
        help="a trained checkpoint and the wall minutes it trained (repeatable)",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--tag", default="", help="labels this run's records (a rerun under other conditions)"
    )
    p.add_argument(
        "--probes",
        type=int,
        default=None,
        help="sign probes of the training frames' force precision instead of the shipped "
        "config's model.posterior_probes (0: exact)",
    )
    p.add_argument(
        "--test-frames",
        type=int,
        default=0,
        help="score the refitted posterior on at most this many of the checkpoint's test frames",
    )
    p.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results")
    p.add_argument("--report-only", action="store_true")
    return p.parse_args(argv)


def _spec(text: str) -> tuple[str, Path, float]:
    name, rest = text.split("=", 1)
    path, minutes = rest.rsplit(":", 1)
    return name, Path(path), float(minutes)


def _jacobian_seconds(model: Any, graphs: list) -> dict[str, float]:
    """Wall seconds of the Jacobian of the first frame, forward and reverse mode."""
    from torch_geometric.data import Batch

    batch = Batch.from_data_list(graphs[:1])
    out = {}
    for method in ("forward", "reverse"):
        start = time.perf_counter()
        latent_jacobian(model, batch, model.posterior_blocks, method=method)
        out[method] = time.perf_counter() - start
    return out


def test_quality(model: Any, data: Any, limit: int) -> dict[str, Any] | None:
    """The refitted posterior on the checkpoint's test frames (at most ``limit``), default mode:
    frame Spearman of max sigma_F against the max force error, and std/RMSE per component."""
    from benchmarks.common.force_frames import prediction_values
    from mlip_unc.evaluation.predictions import predict
    from mlip_unc.models.full_posterior import default_uncertainty_mode
    from mlip_unc.uncertainty.calibration import spearman_corr

    if data.test is None or not limit:
        return None
    frames = random_subset(list(data.test.graphs), limit, 0)
    mode = default_uncertainty_mode(model)
    values = prediction_values(predict(model, frames, uncertainty=mode, batch_size=8), mode)
    return {
        "mode": mode,
        "n_frames": len(frames),
        "spearman_frame": float(spearman_corr(values["score"], values["error"], nan_policy="omit")),
        "std_over_rmse": values["std_over_rmse"],
    }


def measure(
    name: str, path: Path, train_minutes: float, probes: int | None = None, test_frames: int = 0
) -> dict[str, Any]:
    """Refit the posterior of ``path`` as training does (``probes``: instead of the shipped
    config's, 0 = exact); its wall time and what it found."""
    model = load_potential(path)
    payload = torch.load(path, map_location="cpu", weights_only=True)
    stored = payload["metadata"].get("posterior", {})
    raw = payload["metadata"].get("training_config")
    if raw is None:
        raise SystemExit(f"{path}: no training config stored in the checkpoint")
    config = validate(PotentialConfig, raw)
    data = prepare_data(config)
    path_shipped = REPO / "configs" / f"{name}.yaml"
    shipped = (
        load_potential_config(path_shipped, ["data_root=/nonexistent"])
        if path_shipped.is_file()
        else config
    )
    fit_on = random_subset(data.train.graphs, shipped.model.posterior_max_frames, config.seed)
    batch_size = config.train.valid_batch_size
    n_probes = shipped.model.posterior_probes if probes is None else (probes or None)
    jac = _jacobian_seconds(model, fit_on)
    load = list(os.getloadavg())  # as the JSONL reads back: the page is the same either way
    start = time.perf_counter()
    summary = fit_full_posterior(
        model,
        fit_on,
        data.valid,
        batch_size=batch_size,
        probes=n_probes,
        seed=config.seed,
        valid_force_frames=shipped.model.posterior_valid_frames,
    )
    seconds = time.perf_counter() - start
    quality = test_quality(model, data, test_frames)
    return {
        "model": name,
        "checkpoint": str(path),
        "backbone": config.model.backbone.value,
        "posterior_basis": config.model.posterior_basis.value,
        "width": int(model.posterior_width),
        "max_atoms": int(max(int(g.num_nodes) for g in fit_on)),
        "n_fit_frames": len(fit_on),
        "probes": n_probes,
        "n_valid_frames": summary.get("n_valid_force_frames") or len(data.valid or []),
        "fit_seconds": seconds,
        "train_minutes": train_minutes,
        "fit_share": seconds / (60.0 * train_minutes),
        "config_max_minutes": float(shipped.train.max_minutes or train_minutes),
        "stored_fit_seconds": stored.get("fit_seconds"),
        "first_frame_jacobian_seconds": jac,
        "refit": {k: summary.get(k) for k in COMPARED},
        "stored": {k: stored.get(k) for k in COMPARED},
        "load_average": load,
        "test": quality,
    }


def _shipped_minutes(record: dict[str, Any]) -> float:
    """``train.max_minutes`` of the shipped config named like the record (records made before
    the field was stored), else the record's training minutes."""
    path = REPO / "configs" / f"{record['model']}.yaml"
    if path.is_file():
        return float(load_potential_config(path, ["data_root=/nonexistent"]).train.max_minutes)
    return float(record["train_minutes"])


TARGET = 0.10  # the fit, an add-on to training, should take at most 10 % of the training it follows


def latest_run(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records of the last command (one process: its ratios compare like with like; the
    command line holds the tag)."""
    if not records:
        return []
    return [r for r in records if r.get("command") == records[-1].get("command")]


def latest_section(records: list[dict[str, Any]]) -> list[str]:
    """The page's first table: the latest run only, each model against the 10 % target."""
    run = latest_run(records)
    if not run:
        return []
    loads = ", ".join(f"{r['load_average'][0]:.2f}" for r in run)
    lines = [
        "## The latest run",
        "",
        f"`{run[-1].get('command', '')}` ({run[-1].get('date') or 'date not recorded'}); "
        f"1-min load at the start of each fit: {loads}.",
        "",
        "| model | backbone | basis (width) | fit s | training min | fit / training | <= 10 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in run:
        lines.append(
            f"| {r['model']} | {r['backbone']} | {r['posterior_basis']} ({r['width']}) | "
            f"{r['fit_seconds']:.1f} | {r['train_minutes']:g} | {100 * r['fit_share']:.1f} % | "
            f"{'yes' if r['fit_share'] <= TARGET else 'no'} |"
        )
    return [*lines, "", "## Every run", ""]


def write_page(records: list[dict[str, Any]], out: Path) -> None:
    lines = [
        "# Full-posterior fit time against training time",
        "",
        *latest_section(records),
        "| model | run | backbone | basis (width) | training frames (probes) + validation frames | largest frame | fit s | training min | fit / training | fit / the config's max_minutes | 1-min load at the start | stored fit s (code that trained it) | Jacobian of one frame (older records: of the first batch): forward / reverse s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in records:
        jac = r.get("first_frame_jacobian_seconds") or r["first_batch_jacobian_seconds"]
        stored = r["stored_fit_seconds"]
        minutes = r.get("config_max_minutes") or _shipped_minutes(r)
        config_share = r["fit_seconds"] / (60.0 * minutes)
        lines.append(
            f"| {r['model']} | {r.get('tag') or '-'} | {r['backbone']} | "
            f"{r['posterior_basis']} ({r['width']}) | "
            f"{r['n_fit_frames']} ({r.get('probes') or 'exact'}) + {r['n_valid_frames']} | "
            f"{r['max_atoms']} | {r['fit_seconds']:.1f} | "
            f"{r['train_minutes']:g} | {100 * r['fit_share']:.1f} % | "
            f"{100 * config_share:.1f} % ({minutes:g} min) | "
            f"{r['load_average'][0]:.2f} | "
            f"{'n/a' if stored is None else f'{stored:.0f}'} | "
            f"{jac['forward']:.2f} / {jac['reverse']:.2f} |"
        )
    lines += [
        "",
        "The refit runs the fit exactly as training does (`finalize_checkpoint`: "
        "`train.valid_batch_size`, at most `model.posterior_max_frames` training frames and "
        "`model.posterior_valid_frames` validation frames for the forces (the energy calibration "
        "reads all of them) as the shipped config of that name "
        "sets them now, and its `model.posterior_probes`: the training frames' force precision "
        "from that many random sign probes per batch, the validation frames exact). Target: fit / training <= 10 % (`TARGET`). The Jacobian "
        "column times one batch both ways; the fit uses the mode with fewer products "
        "(`latent_jacobian(method='auto')`).",
        "",
        "Refit against stored posterior (lambda / mean eig, alpha_F^2, alpha_r^2, alpha_E^2, "
        "validation force NLL of the exact and the low-rank mode):",
        "",
    ]
    for r in records:
        pairs = ", ".join(
            f"{k} {r['refit'][k]:.3g} vs {r['stored'][k]:.3g}"
            for k in COMPARED
            if r["refit"].get(k) is not None and r["stored"].get(k) is not None
        )
        test = r.get("test")
        scored = (
            f"; test ({test['n_frames']} frames, {test['mode']}): frame Spearman "
            f"{test['spearman_frame']:.3f}, std/RMSE {test['std_over_rmse']:.2f}"
            if test
            else ""
        )
        lines.append(
            f"- {r['model']} ({r.get('tag') or '-'}): {pairs}{scored}; "
            f"load average {r['load_average']}"
        )
    env = environment()
    lines += ["", "Commands:", ""]
    lines += [f"    {c}" for c in dict.fromkeys(r.get("command", "") for r in records)]
    lines += ["", f"Versions: {env}"]
    (out / "posterior_fit.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    path = args.out / RECORDS
    records = read_jsonl(path) if path.is_file() else []
    if not args.report_only:
        done = {(r["model"], r.get("tag", "")) for r in records}
        command = shlex.join(
            [Path(sys.executable).name, "-m", "benchmarks.posterior_fit", *(argv or sys.argv[1:])]
        )
        for text in args.model:
            name, ckpt, minutes = _spec(text)
            if (name, args.tag) in done:
                continue
            record = {
                **measure(name, ckpt, minutes, args.probes, args.test_frames),
                "tag": args.tag,
                "command": command,
                "date": time.strftime("%Y-%m-%d %H:%M"),
            }
            append_jsonl(path, record)
            records.append(record)
            print(
                f"{name}: fit {record['fit_seconds']:.1f} s = {100 * record['fit_share']:.1f} % of training",
                flush=True,
            )
    write_page(records, args.out)


if __name__ == "__main__":
    main()
