"""What an on-the-fly active-learning run hands back and writes for a person to read: the
result, ``report.md`` (one row per model update) and ``updates.png``."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlip_unc.atomic_write import atomic_write_text
from mlip_unc.config import ActiveLearningConfig

__all__ = ["OnTheFlyResult", "write_report"]


@dataclass
class OnTheFlyResult:
    """What :func:`run_on_the_fly` returns.

    Attributes:
        rows: one dict per model (row 0: the seed model; the last, with ``refit: true``, the
            final model trained from scratch when ``final_refit``), see :func:`run_on_the_fly`.
        model: the final model's checkpoint.
        ended: ``completed`` (``final_ps`` at the top temperature without a label) or
            ``budget`` (``max_calls`` spent).
        calls: oracle calls spent on labels (seed and validation sets included).
    """

    rows: list[dict[str, Any]]
    model: Path
    ended: str
    calls: int


def write_report(result: OnTheFlyResult, out: Path, config: ActiveLearningConfig) -> Path:
    """``out/report.md`` (the updates as a table) and ``out/updates.png`` (validation force
    MAE and MD temperature against oracle calls)."""
    from matplotlib.figure import Figure

    from mlip_unc.active.report import markdown_table

    rows = result.rows
    fig = Figure(figsize=(7, 3.2))
    ax = fig.add_subplot(1, 2, 1)
    ax.plot([r["calls"] for r in rows], [1000 * r["valid_force_mae"] for r in rows], "o-")
    ax.set(xlabel="oracle calls", ylabel="validation force MAE (meV/A)")
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.step([r["md_ps"] for r in rows], [r["temperature"] for r in rows], where="post")
    ax2.set(xlabel="MD time (ps)", ylabel="temperature (K)")
    fig.tight_layout()
    fig.savefig(out / "updates.png", dpi=110)
    shown = [
        {
            "update": "refit" if r.get("refit") else r["update"],
            "oracle calls": r["calls"],
            "MD (ps)": round(r["md_ps"], 2),
            "T (K)": r["temperature"],
            "training frames": r["n_train"],
            "flagged": r.get("n_flagged"),
            "labelled": r.get("n_labelled"),
            "rescue": r.get("rescue"),
            "valid force MAE (meV/Å)": round(1000 * r["valid_force_mae"], 1),
            "valid energy MAE (meV)": round(1000 * r["valid_energy_mae"], 1),
            "threshold": r["threshold"],
            "geometry stops": r["geometry_stops"],
        }
        for r in rows
    ]
    text = (
        f"# On-the-fly active learning: {out}\n\n"
        f"Ended: **{result.ended}** after {result.calls} oracle calls (trigger "
        f"`{config.on_the_fly.trigger}`, budget {config.on_the_fly.max_calls}); final model "
        f"`{result.model}`. Validation: the fixed set of {config.seed_set.valid_frames if config.seed_set else 'given'} frames; "
        "threshold: of the trigger score (eV/Å for uncertainty and forces).\n\n"
        + markdown_table(shown)
        + "\n\n![updates](updates.png)\n"
    )
    path = out / "report.md"
    atomic_write_text(path, text)
    return path
