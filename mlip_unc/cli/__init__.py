"""The ``mlip-unc`` command line: thin, parse -> config -> library call.

Each sub-module owns one group of commands and exposes ``register(app)``.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    no_args_is_help=True,
    add_completion=False,
    help="mlip-unc: Bayesian GNN potentials and property models with cheap, calibrated uncertainty.",
)

_COMMAND_MODULES = ("property", "potential", "active")


def _register_all() -> None:
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(f"mlip_unc.cli.{name}")
        except ModuleNotFoundError as err:  # a command group not built yet
            if err.name != f"mlip_unc.cli.{name}":
                raise
            continue
        module.register(app)


_register_all()


def main() -> None:
    app()
