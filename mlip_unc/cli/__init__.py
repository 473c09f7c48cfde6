"""The ``mlip-unc`` command line: thin, parse -> config -> library call.

Each sub-module owns one group of commands and exposes ``register(app)``; sub-modules import
nothing heavy at module level (torch, the data layer, models load inside the commands), so
``mlip-unc --help`` answers at once. ``-v`` / ``-q`` set the log level of the library's
``logging`` output (INFO by default, on stderr).
"""

from __future__ import annotations

import logging

import typer
from tqdm.auto import tqdm

from mlip_unc.cli import active, attach, potential, property
from mlip_unc.cli._common import Group

app = typer.Typer(
    cls=Group,
    no_args_is_help=True,
    add_completion=False,
    context_settings={"max_content_width": 120, "help_option_names": ["-h", "--help"]},
    help="mlip-unc: Bayesian GNN potentials and property models with cheap, calibrated uncertainty.",
)


class _TqdmHandler(logging.StreamHandler):
    """Log lines on stderr through ``tqdm.write``: a progress bar on the terminal (training
    epochs, MD steps) is cleared for the line and drawn again below it, not broken by it."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 (logging's own convention: never raise from emit)
            self.handleError(record)


@app.callback()
def _root(
    verbose: bool = typer.Option(False, "--verbose", "-v", metavar="", help="Debug log messages."),
    quiet: bool = typer.Option(
        False, "--quiet", "-q", metavar="", help="Warnings and errors only; no progress bars."
    ),
) -> None:
    """Set up logging for every command."""
    level = logging.DEBUG if verbose else logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", force=True, handlers=[_TqdmHandler()])
    logging.getLogger("mlip_unc").setLevel(level)


for _module in (property, potential, active, attach):
    _module.register(app)


def main() -> None:
    app()
