"""Helpers shared by the command modules (light: no torch at import)."""

from __future__ import annotations

import logging
from typing import NoReturn

import typer

THREADS_HELP = "torch CPU threads (0: torch's default). Small models run fastest on one thread."
DEVICE_HELP = (
    "Shortcut for train.device: cpu (default), cuda, cuda:N or auto (a GPU when one is visible)."
)


def fail(err: BaseException) -> NoReturn:
    """One line on stderr, exit code 1."""
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(code=1)


def user_errors() -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's input, reported in one line (imported on demand)."""
    from mlip_unc.config import ConfigError
    from mlip_unc.data.errors import DataError
    from mlip_unc.models.checkpoint import CheckpointError

    return (ConfigError, DataError, CheckpointError, FileNotFoundError, ValueError)


def set_threads(threads: int) -> None:
    """Application-level choice (the library never touches the thread count)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


def quiet() -> bool:
    """True when ``-q`` was given (progress bars off)."""
    return logging.getLogger("mlip_unc").getEffectiveLevel() > logging.INFO
