"""Markdown and PNG reports of MD runs, active-learning rounds and the demo.

Plots use ``matplotlib.figure.Figure`` directly (no pyplot state, no display needed).
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from mlip_unc import keys

__all__ = [
    "fmt",
    "markdown_table",
    "read_md_log",
    "plot_md_log",
    "plot_rounds",
    "write_rounds_report",
    "plot_demo",
    "write_demo_report",
]


def fmt(value: Any, digits: int = 4) -> str:
    """A compact number for tables: ``0.0123``, ``1.23e-05``, ``-``, ``yes``."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            return "-"
        magnitude = abs(float(value))
        if value != 0 and (magnitude < 1e-3 or magnitude >= 1e5):
            return f"{value:.{digits - 1}e}"
        return f"{value:.{digits}g}"
    return str(value)


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """A GitHub markdown table of ``rows`` (dicts); ``columns`` default to the first row's keys."""
    if not rows:
        return "(no rows)\n"
    columns = list(columns or rows[0].keys())
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def read_md_log(path: str | Path) -> dict[str, np.ndarray]:
    """The monitor's CSV as ``{column: float array}``."""
    with Path(path).open() as handle:
        rows = list(csv.DictReader(handle))
    if not rows:
        return {}
    return {k: np.asarray([float(r[k]) for r in rows]) for k in rows[0]}


def plot_md_log(
    log: Mapping[str, np.ndarray] | str | Path,
    path: str | Path,
    *,
    threshold: float | None = None,
    reference: float | None = None,
    title: str = "",
) -> Path:
    """PNG of max force std, per-atom energy std and energies against MD time.

    Args:
        log: the monitor's columns (or its CSV path).
        threshold: absolute max-force-std threshold drawn as a dashed line.
        reference: the training-set (validation) max-force-std level, drawn dotted.
    """
    from matplotlib.figure import Figure

    data = read_md_log(log) if isinstance(log, (str, Path)) else log
    t = data["time_ps"] if np.isfinite(data["time_ps"]).all() else data["step"]
    xlabel = "time (ps)" if t is data["time_ps"] else "step"
    fig = Figure(figsize=(7, 6.5), layout="constrained")
    ax_f, ax_e, ax_u = fig.subplots(3, 1, sharex=True)
    ax_f.plot(t, data[keys.CALC_MAX_FORCE_STD], color="C3", label="max force std")
    ax_f.plot(t, data["mean_force_std"], color="C1", alpha=0.7, label="mean force std")
    if threshold is not None:
        ax_f.axhline(threshold, ls="--", color="k", lw=1, label="threshold")
    if reference is not None:
        ax_f.axhline(reference, ls=":", color="C2", lw=1.5, label="training level")
    flagged = data["flag"] > 0
    if flagged.any():
        ax_f.scatter(
            t[flagged],
            data[keys.CALC_MAX_FORCE_STD][flagged],
            s=12,
            color="k",
            zorder=3,
            label="flagged",
        )
    ax_f.set_ylabel("eV/Å")
    ax_f.legend(fontsize=7, loc="upper left")
    ax_e.plot(t, data[keys.CALC_ENERGY_STD_PER_ATOM] * 1000, color="C0")
    ax_e.set_ylabel("epistemic E std\n(meV/atom)")
    ax_u.plot(t, data["epot"] - data["epot"][0], label="E_pot")
    ax_u.plot(t, data["etot"] - data["epot"][0], label="E_tot")
    ax_u.set_ylabel("energy − E_pot(0) (eV)")
    ax_u.set_xlabel(xlabel)
    ax_u.legend(fontsize=7)
    return _save(fig, path, title)


def _save(fig: Any, path: str | Path, title: str) -> Path:
    """Give ``fig`` its title and write it as a PNG."""
    if title:
        fig.suptitle(title)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


def plot_rounds(rows: Sequence[Mapping[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """PNG of held-out errors and uncertainty levels per active-learning round."""
    from matplotlib.figure import Figure

    r = [row["round"] for row in rows]
    fig = Figure(figsize=(7, 3.2), layout="constrained")
    ax_err, ax_n = fig.subplots(1, 2)
    for key, label in (
        ("test_force_rmse", "test force RMSE"),
        ("test_mean_max_force_std", "test mean max force std"),
        ("level_max_force_std", "validation max force std"),
    ):
        values = [row.get(key) for row in rows]
        if any(v is not None and math.isfinite(v) for v in values):
            ax_err.plot(r, [np.nan if v is None else v for v in values], "o-", label=label)
    ax_err.set_xlabel("round")
    ax_err.set_ylabel("eV/Å")
    ax_err.legend(fontsize=7)
    ax_n.bar(
        [x - 0.2 for x in r],
        [row.get("n_train", 0) for row in rows],
        width=0.4,
        label="training set",
    )
    ax_n.bar(
        [x + 0.2 for x in r], [row.get("n_flagged", 0) for row in rows], width=0.4, label="flagged"
    )
    ax_n.set_xlabel("round")
    ax_n.set_ylabel("structures")
    ax_n.legend(fontsize=7)
    return _save(fig, path, title)


_ROUND_COLUMNS = (
    "round",
    "n_train",
    "n_md_frames",
    "n_flagged",
    "n_labelled",
    "n_dropped",
    "oracle_calls",
    "test_energy_mae_per_atom",
    "test_force_rmse",
    "test_mean_max_force_std",
    "level_max_force_std",
    "level_energy_std_per_atom",
    "threshold_max_force_std",
)


def oracle_calls_in_all(rows: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """A run's labels, from its rows: ``labels`` (the last model's ``oracle_calls``, the starting
    training and validation data included, plus the labels of its own round when that round
    ended the run without training), of them ``dropped`` (the oracle failed, or over
    ``max_label_force``), and ``audit`` labels (never trained on)."""
    last = rows[-1] if rows else {}
    labels = int(last.get("oracle_calls") or 0)
    labels += int(last.get("n_labelled") or 0) + int(last.get("n_dropped") or 0)
    audit = sum(int(row.get("audit_calls") or 0) for row in rows)
    dropped = sum(int(row.get("n_dropped") or 0) for row in rows)
    return {"labels": labels, "dropped": dropped, "audit": audit}


def write_rounds_report(
    rows: Sequence[Mapping[str, Any]], out_dir: str | Path, *, title: str = "Active learning"
) -> Path:
    """``report.md`` and ``rounds.png`` in ``out_dir``; returns the markdown path."""
    out_dir = Path(out_dir)
    png = plot_rounds(rows, out_dir / "rounds.png", title=title)
    columns = [c for c in _ROUND_COLUMNS if any(c in row for row in rows)]
    text = [
        f"# {title}\n",
        "Per round: MD with the current model, frames flagged by uncertainty, labelled by the "
        "oracle, added to the training set, model fine-tuned. Errors on the held-out test set "
        "are those of the model *at the start* of the round (round k = after k retrainings). "
        "Units: eV/atom (energy), eV/Å (forces and force stds).\n",
        markdown_table(rows, columns),
        "\n`oracle_calls`: labels spent on that model's training data, dropped ones included. "
        + calls_sentence(oracle_calls_in_all(rows)),
        f"\n![rounds]({png.name})\n",
    ]
    md = out_dir / "report.md"
    md.write_text("\n".join(text))
    return md


def calls_sentence(calls: Mapping[str, int]) -> str:
    """One sentence of :func:`oracle_calls_in_all`'s counts."""
    audit = f", and {calls['audit']} audit labels (never trained on)" if calls["audit"] else ""
    return (
        f"Labels spent on training data in all: {calls['labels']}, the starting training and "
        f"validation data included ({calls['dropped']} dropped: the oracle failed, or over "
        f"selection.max_label_force){audit}; the test set's are not counted."
    )


def _stages(numbers: Mapping[str, Any]) -> list[tuple[str, str]]:
    stages = [("before", "before"), ("after", "after AL")]
    return stages + ([("control", "control")] if numbers.get("control") else [])


def plot_demo(numbers: Mapping[str, Any], path: str | Path) -> Path:
    """PNG: force RMSE, mean max force std and energy std on the validation set (training
    temperature) and the hot test set, for the models before/after retraining (and control)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9, 3.2), layout="constrained")
    axes = fig.subplots(1, 3)
    groups, labels = ("valid", "hot"), ("validation\n(training T)", "hot test")
    stages = _stages(numbers)
    width = 0.8 / len(stages)
    x = np.arange(len(groups))
    panels = (
        ("force_rmse", "force RMSE (eV/Å)", 1.0),
        ("mean_max_force_std", "mean max force std (eV/Å)", 1.0),
        ("mean_energy_std_per_atom", "epistemic energy std (meV/atom)", 1000.0),
    )
    colours = {"before": "C3", "after": "C0", "control": "C7"}
    for ax, (key, title, scale) in zip(axes, panels, strict=False):
        for k, (stage, label) in enumerate(stages):
            values = [scale * numbers[stage][g][key] for g in groups]
            ax.bar(
                x + (k - (len(stages) - 1) / 2) * width,
                values,
                width=width,
                color=colours[stage],
                label=label,
            )
        ax.set_xticks(x, labels, fontsize=8)
        ax.set_title(title, fontsize=9)
    axes[0].legend(fontsize=7)
    path = Path(path)
    fig.savefig(path, dpi=110)
    return path


_STAGE_TEXT = {
    "before": ("first model", "trained on the training-temperature data"),
    "after": (
        "after active learning",
        "the first model trained on with the labelled flagged frames added",
    ),
    "control": ("control", "the first model trained on as long, training-temperature data only"),
}


def write_demo_report(
    numbers: Mapping[str, Any], out_dir: str | Path, *, md_plot: Path | None = None
) -> Path:
    """``report.md`` and ``demo.png`` of ``mlip-unc demo`` in ``out_dir``."""
    out_dir = Path(out_dir)
    png = plot_demo(numbers, out_dir / "demo.png")
    temps = numbers["temperatures"]
    rows = []
    for group, label in (
        ("valid", f"validation, {temps['train']:.0f} K"),
        ("hot", f"held-out test, {temps['hot']:.0f} K"),
    ):
        for stage, _ in _stages(numbers):
            m = numbers[stage][group]
            rows.append(
                {
                    "set": label,
                    "model": _STAGE_TEXT[stage][0],
                    "frames": m["n"],
                    "force RMSE (eV/Å)": m["force_rmse"],
                    "energy MAE (meV/atom)": 1e3 * m["energy_mae_per_atom"],
                    "mean max force std (eV/Å)": m["mean_max_force_std"],
                    "energy std (meV/atom)": 1e3 * m["mean_energy_std_per_atom"],
                    "flagged": m["flagged_fraction"],
                }
            )
    checks = "\n".join(
        f"- {k.replace('_', ' ')}: **{'yes' if v else 'no'}**" for k, v in numbers["checks"].items()
    )
    models = "\n".join(f"- *{_STAGE_TEXT[k][0]}*: {_STAGE_TEXT[k][1]}" for k, _ in _stages(numbers))
    thr = numbers["thresholds"]
    e_thr = thr[keys.CALC_ENERGY_STD_PER_ATOM]
    rel_valid = numbers["before"]["valid"]["relative_force_std"]
    rel_hot = numbers["before"]["hot"]["relative_force_std"]
    ratio = rel_hot / rel_valid if rel_valid else float("nan")
    ratio_text = f"{fmt(ratio)}x" if math.isfinite(ratio) else "ratio undefined"
    rel_reading = (
        "The std grows faster than the force on the unfamiliar frames: the flag carries information "
        "beyond the force magnitude (the full-covariance posterior over rich latents, docs/method.md s.3b)."
        if ratio > 1.5
        else "Nearly equal ratios: the std is close to a fixed fraction of the force here, so hot frames are "
        "flagged mainly because their forces are larger (a rank-one latent Jacobian, docs/method.md s.3b)."
    )
    md_line = f"\n![MD at high temperature](md_hot/{md_plot.name})\n" if md_plot is not None else ""
    stop = (
        f", stopped after {numbers['md_steps_done']} steps" if numbers["md_stopped_early"] else ""
    )
    text = f"""# mlip-unc demo: uncertainty-driven active learning (EMT copper)

EMT plays the role of DFT. A Bayesian potential trained on {numbers["n_train"]} frames of
{numbers["n_atoms"]}-atom fcc Cu at {temps["train"]:.0f} K drove Langevin MD at {temps["hot"]:.0f} K, far
outside its data. The monitor flagged {numbers["n_flagged"]} of {numbers["n_md_frames"]} logged frames{stop}
(thresholds: max force std > {fmt(thr["max_force_std"])} eV/Å or epistemic energy std >
{fmt(1e3 * e_thr) if e_thr else "-"} meV/atom, i.e. multiples of the validation levels stored in the
checkpoint); {numbers["n_labelled"]} of them ({numbers["n_dropped"]} dropped as unphysical) were
labelled with EMT and the model was trained on with {numbers["n_train_after"]} training frames.
The hot test set is an independent EMT trajectory, never used in training; "flagged" is the
fraction of its frames over each model's own thresholds.

Models:
{models}

{markdown_table(rows)}
Checks (measured):
{checks}

Definitions: max force std = max over atoms of sqrt(sum over x, y, z of the epistemic force
variance), in the calculator's mode ({numbers.get("uncertainty_mode", "exact")}); energy std = sqrt(epistemic energy variance) / n_atoms. The
training level is the validation-set mean: max force std {fmt(numbers["training_level_max_force_std"])} eV/Å,
energy std {fmt(1e3 * (numbers["training_level_energy_std_per_atom"] or float("nan")))} meV/atom.
Compare "after active learning" with "control" to separate the effect of the new data from the effect of
training longer (the posterior keeps contracting while training goes on).

What the force std follows here: with the first model, the mean max force std over the force
RMS of the set is
{fmt(rel_valid)} on the validation frames and {fmt(rel_hot)} on the hot frames ({ratio_text}).
{rel_reading}

![before and after]({png.name})
{md_line}
Timings (s): {", ".join(f"{k} {v:.0f}" for k, v in numbers["timings_s"].items())}; total {numbers["seconds"]:.0f}.
Files: `data/` (EMT frames), `initial/`, `retrained/`, `control/` (training runs), `md_hot/`
(MD log, trajectory, flagged frames, plot), `numbers.json`, `model.pt` (final model:
`UncertaintyCalculator("model.pt")`).
"""
    md = out_dir / "report.md"
    md.write_text(text)
    return md
