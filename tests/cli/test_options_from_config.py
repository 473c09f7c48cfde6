"""One set of names for each option: the command line's choices are the config enums, and the
Literals of the active-learning config (mlip_unc/config/active.py) name the same values."""

from __future__ import annotations

import typing

import pytest
import typer

from mlip_unc import keys
from mlip_unc.cli import app
from mlip_unc.config import ActiveLearningConfig
from mlip_unc.config.active import MDSettings, SelectionSettings
from mlip_unc.config.enums import (
    ForceUncertaintyMode,
    MDBias,
    MDEnsemble,
    SplitKind,
    UncertaintyMode,
)
from mlip_unc.config.property import DATASET_NAMES


def _values(enum: type) -> list[str]:
    return [member.value for member in enum]


def _literal(model: type, field: str) -> list[str]:
    return list(typing.get_args(model.model_fields[field].annotation))


def _choices(command: str, option: str) -> list[str]:
    """The values an option accepts (Typer >= 0.25 describes them itself, older uses click's);
    ``command`` may name a sub-command (``property train``)."""
    node = typer.main.get_command(app)
    for name in command.split():
        node = node.commands[name]  # type: ignore[attr-defined]
    params = node.params
    (param,) = [p for p in params if option in p.opts]
    desc = getattr(param, "type_descriptor", None)
    choices = desc.choices if desc is not None else param.type.choices
    return [getattr(c, "value", c) for c in choices]


@pytest.mark.parametrize(
    ("command", "option", "enum"),
    [
        ("eval", "--uncertainty", UncertaintyMode),
        ("md", "--uncertainty", ForceUncertaintyMode),
        ("flag", "--uncertainty", ForceUncertaintyMode),
        ("md", "--ensemble", MDEnsemble),
        ("md", "--bias", MDBias),
        ("property train", "--split", SplitKind),
    ],
)
def test_command_line_choices_are_the_config_enums(command, option, enum):
    assert _choices(command, option) == _values(enum)


def test_the_active_learning_config_names_the_same_values():
    assert set(_literal(MDSettings, "ensemble")) == set(_values(MDEnsemble))
    assert set(_literal(MDSettings, "bias")) == set(_values(MDBias))
    assert set(_literal(ActiveLearningConfig, "uncertainty")) == set(_values(ForceUncertaintyMode))
    assert set(keys.UNCERTAINTY_SCORES) <= set(_literal(SelectionSettings, "metric"))
    assert set(_choices("flag", "--metric")) == set(keys.UNCERTAINTY_SCORES)


def test_the_known_datasets_are_named_once():
    from mlip_unc.data.molecules import MOLECULENET_NAMES

    group = typer.main.get_command(app)
    params = group.commands["property"].commands["train"].params  # type: ignore[attr-defined]
    (dataset,) = [p for p in params if "--dataset" in p.opts]
    assert "|".join(DATASET_NAMES) in dataset.help
    assert set(MOLECULENET_NAMES) < set(DATASET_NAMES)


def test_the_library_tuples_are_the_enums():
    from mlip_unc.active.biased_md import BIAS_KINDS
    from mlip_unc.calculator import UNCERTAINTY_MODES

    assert BIAS_KINDS == tuple(_values(MDBias))
    assert set(UNCERTAINTY_MODES) == set(_values(UncertaintyMode))
    assert set(_values(ForceUncertaintyMode)) < set(_values(UncertaintyMode))
