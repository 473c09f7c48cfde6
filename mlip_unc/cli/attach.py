"""``mlip-unc attach``: uncertainty for a MACE model trained with mace-torch; thin, parse -> library.

mlip-unc attach --model trained.model --data train.xyz --out unc.pt
"""

from __future__ import annotations

from enum import Enum
from pathlib import Path

import typer

from mlip_unc.cli._common import fail, require_files, set_threads, threads_option, user_errors
from mlip_unc.config.enums import PosteriorBasis


class AttachDType(str, Enum):
    """Precision of the attached model (float64 reproduces the MACE model to rounding)."""

    FLOAT64 = "float64"
    FLOAT32 = "float32"


def register(app: typer.Typer) -> None:
    app.command(
        "attach",
        help="Fit the uncertainty of a trained MACE model post hoc (its predictions unchanged).",
    )(attach)


def attach(
    model: Path = typer.Option(
        ..., "--model", "-m", help="mace-torch model file (.model); unpickled: trusted files only."
    ),
    data: Path = typer.Option(
        ..., "--data", "-d", help="Training structures with energies and forces (extxyz, ...)."
    ),
    out: Path = typer.Option(
        ..., "--out", "-o", help="Output checkpoint (loads in UncertaintyCalculator)."
    ),
    valid: Path | None = typer.Option(
        None, "--valid", help="Validation structures (default: a split of --data)."
    ),
    valid_fraction: float = typer.Option(
        0.1, "--valid-fraction", help="Held-out fraction of --data without --valid."
    ),
    energy_key: str | None = typer.Option(
        None, "--energy-key", help="Energy label name (default: standard names)."
    ),
    forces_key: str | None = typer.Option(
        None, "--forces-key", help="Forces label name (default: standard names)."
    ),
    index: str = typer.Option(":", "--index", help="ASE-style frame selection, e.g. 0:500."),
    dtype: AttachDType = typer.Option(
        AttachDType.FLOAT64, "--dtype", help="Precision of the attached model."
    ),
    posterior_rank: int = typer.Option(
        4, "--posterior-rank", help="Directions of the lowrank uncertainty mode."
    ),
    posterior_basis: PosteriorBasis = typer.Option(
        PosteriorBasis.SHARED,
        "--posterior-basis",
        help="Weight space of the posterior: shared (MACE's features) or per_element (one "
        "weight vector per element; exact fit up to n_types x the products per structure).",
    ),
    max_train: int = typer.Option(
        200, "--max-train", help="Training structures the posterior sees (random; 0: all)."
    ),
    max_valid: int = typer.Option(
        100, "--max-valid", help="Validation structures that calibrate it (0: all)."
    ),
    batch_size: int = typer.Option(8, "--batch-size", help="Structures per batch while fitting."),
    posterior_probes: int = typer.Option(
        0,
        "--posterior-probes",
        min=0,
        help="Random sign probes per batch that sketch the training structures' force precision "
        "(forward-mode products; a fraction of the exact fit's time; 0: exact).",
    ),
    seed: int = typer.Option(0, "--seed", help="Seed of the validation split."),
    overwrite: bool = typer.Option(
        False, "--overwrite", metavar="", help="Replace an existing OUT."
    ),
    threads: int = threads_option(),
) -> None:
    """Keep the MACE model's energies and forces; fit the last-layer posterior on its features.

    Calibrated so that the epistemic std/RMSE is 1 on the validation structures in every mode;
    a model whose features cannot carry a calibrated posterior is refused with the measured
    reason (docs/guides/attach-calibration.md)."""
    require_files(
        (model, "mace-torch model file"), (data, "structure file"), (valid, "--valid file")
    )
    import torch

    from mlip_unc.posthoc.attach import attach_uncertainty

    set_threads(threads)
    try:
        result = attach_uncertainty(
            model,
            data,
            out,
            valid_path=valid,
            valid_fraction=valid_fraction,
            energy_key=energy_key,
            forces_key=forces_key,
            index=index,
            dtype=getattr(torch, dtype.value),
            posterior_rank=posterior_rank,
            posterior_basis=posterior_basis.value,
            max_train=max_train,
            max_valid=max_valid,
            batch_size=batch_size,
            seed=seed,
            posterior_probes=posterior_probes,
            overwrite=overwrite,
        )
    except user_errors(FileExistsError, ImportError) as err:
        fail(err)
    errors, post = result.mace_errors, result.posterior
    typer.echo(
        f"model: {result.path} (posterior on {result.n_fit} of {result.n_train} training structures, calibrated on "
        f"{result.n_valid}; MACE force MAE "
        f"{1e3 * errors['forces_mae_eV_A']:.1f} meV/A, energy MAE {1e3 * errors['energy_mae_eV_atom']:.2f} meV/atom; "
        f"calibrated alpha_F^2 {post['alpha2_forces']:.3g}, validation force NLL {post['valid_nll_forces']:.3f})"
    )
