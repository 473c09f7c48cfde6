"""Helpers shared by the command modules (light: no torch at import).

Every command checks what it can without torch first (input files exist, a checkpoint looks like
one, option values are in range), so a mistake is reported at once; the library (and torch)
is imported afterwards, inside the command.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any, NoReturn

import typer
from typer.core import TyperGroup

#: ``--threads`` of every command: one thread is the fastest for small models and gives the
#: same numbers whatever the machine's core count; 0 leaves torch's default (all cores).
DEFAULT_THREADS = 1
THREADS_HELP = (
    "torch CPU threads (0: torch's default, all cores). One, the default, is the fastest for "
    "small models and gives the same numbers on any machine."
)
DEVICE_HELP = (
    "Shortcut for train.device: cpu (default), cuda, cuda:N or auto (a GPU when one is visible)."
)
MODEL_DEVICE_HELP = "Where the model runs: cpu (default), cuda or cuda:N."
#: ``md`` and ``flag`` without a threshold flag structures above this multiple of the
#: validation-set level stored in the checkpoint (``Thresholds(relative=True)``).
DEFAULT_RELATIVE_THRESHOLD = 3.0


class Group(TyperGroup):
    """A command group whose ``-h/--help`` (and its commands') shows no ``<bool>`` type: typer
    gives the help flag one, where every other flag here has ``metavar=""``."""

    def get_help_option(self, ctx: Any) -> Any:
        return _untyped(super().get_help_option(ctx))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command = super().get_command(ctx, cmd_name)
        if command is not None:  # its help option is built once, with the names it inherits
            _untyped(command.get_help_option(ctx))
        return command


def _untyped(option: Any) -> Any:
    if option is not None:
        option.metavar = ""
    return option


def threads_option(extra_help: str = "") -> Any:
    """The ``--threads`` option, with the same default in every command."""
    return typer.Option(DEFAULT_THREADS, "--threads", min=0, help=THREADS_HELP + extra_help)


def fail(err: BaseException | str) -> NoReturn:
    """One line on stderr, exit code 1."""
    typer.echo(f"error: {err}", err=True)
    raise typer.Exit(code=1)


def interrupted(err: KeyboardInterrupt, *, finalise: bool) -> NoReturn:
    """Ctrl-C during training: one line on stderr (what is left, how to resume or, with
    ``finalise``, finish the best model so far), exit code 130."""
    epoch = getattr(err, "epoch", None)  # TrainingInterrupted: the epochs last.pt holds
    line = str(err) or "interrupted before training started: nothing was written"
    if epoch:
        line += "; --resume (with the same options) continues it"
        if finalise:
            line += f", --resume --set train.epochs={epoch} finalises the best model so far"
    typer.echo(line, err=True)
    raise typer.Exit(code=130)


def user_errors(*extra: type[BaseException]) -> tuple[type[BaseException], ...]:
    """Exceptions that are the user's input, reported in one line (imported on demand), and
    the command's ``extra`` ones."""
    from mlip_unc.config import ConfigError
    from mlip_unc.data.errors import DataError
    from mlip_unc.models.checkpoint import CheckpointError
    from mlip_unc.nn.extras import MissingDependencyError

    return (
        ConfigError,
        DataError,
        CheckpointError,
        MissingDependencyError,  # an optional extra: its message holds the pip command
        FileNotFoundError,
        ValueError,
        *extra,
    )


def require_files(*items: tuple[Path | None, str]) -> None:
    """Fail at once on an input ``(path, what)`` that does not exist (``None``: not given)."""
    from mlip_unc.config.loader import not_found  # no torch: errors print at once

    for path, what in items:
        if path is not None and not path.exists():
            fail(not_found(path, what))


def same_file(path: Path, other: Path) -> bool:
    """Whether both exist and are one file (links and relative spellings included)."""
    return path.exists() and other.exists() and os.path.samefile(path, other)


def require_new_outputs(
    outputs: Iterable[tuple[Path | None, str]], inputs: Iterable[Path | None], *, overwrite: bool
) -> None:
    """Fail at once on an output ``(path, option)`` (``None``: not given) that is one of the
    ``inputs`` (always: writing it would destroy the data being read) or that exists without
    ``overwrite`` (an earlier run's output)."""
    sources = [path for path in inputs if path is not None]
    for path, option in outputs:
        if path is None or not path.exists():
            continue
        for source in sources:
            if same_file(path, source):
                fail(
                    f"{option} '{path}' is the input '{source}': writing it would destroy the "
                    f"data being read (--overwrite does not allow this); choose another {option}"
                )
        if not overwrite:
            fail(
                f"{option} '{path}' already exists; choose another {option} or replace it "
                "with --overwrite"
            )


def require_checkpoints(paths: Iterable[Path], *, run_folders: bool = False) -> None:
    """Fail at once (no torch) on a checkpoint that is missing or of another format.

    ``run_folders``: a folder stands for its ``model.pt`` (or, for a committee run, its
    ``member_*/model.pt``), as the commands that take run folders read it.
    """
    from mlip_unc.models.checkpoint import CheckpointError, check_checkpoint_file

    for path in paths:
        files = [path]
        if run_folders and path.is_dir():
            files = sorted(path.glob("member_*/model.pt")) or [path / "model.pt"]
        try:
            for file in files:
                check_checkpoint_file(file)
        except CheckpointError as err:
            fail(err)


def require_device(device: str) -> None:
    """Fail in one line on a ``--device`` that cannot run here (CUDA named when it is missing)."""
    from mlip_unc.models.devices import require_available

    try:
        require_available(device, name="--device")
    except ValueError as err:
        fail(err)


def set_threads(threads: int) -> None:
    """Application-level choice (the library never touches the thread count)."""
    if threads > 0:
        import torch

        torch.set_num_threads(threads)


def quiet() -> bool:
    """True when ``-q`` was given (progress bars off)."""
    return logging.getLogger("mlip_unc").getEffectiveLevel() > logging.INFO
