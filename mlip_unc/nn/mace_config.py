"""A mace-torch model's constructor arguments as plain data, and back.

mace-torch saves a trained model as a pickled module; this project's checkpoints hold plain data
only (``torch.load(weights_only=True)``). :func:`plain_mace_config` takes mace-torch's own
``extract_config_mace_model`` and writes every value as plain data: block classes and the gate
by their names in ``mace.modules`` (``interaction_classes``, ``readout_classes``,
``gate_dict``), irreps as strings, arrays as (nested) lists. :func:`build_mace_model` is the
inverse: a freshly initialised model of the same architecture, whose weights are then loaded
from a state dict.

Supported: single-head ``ScaleShiftMACE`` models (what ``mace_run_train --model MACE`` writes),
without extra embeddings or cuEquivariance layouts; anything else raises ValueError naming it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from mlip_unc.nn.mace_backbone import import_mace, quiet_scripting

__all__ = ["SUPPORTED_CLASSES", "build_mace_model", "plain_mace_config"]

SUPPORTED_CLASSES = ("ScaleShiftMACE",)
_CLASS_TABLES = {
    "interaction_cls": "interaction_classes",
    "interaction_cls_first": "interaction_classes",
    "readout_cls": "readout_classes",
}
_IRREPS_KEYS = ("hidden_irreps", "MLP_irreps", "edge_irreps")
_ARRAY_KEYS = ("atomic_energies", "atomic_inter_scale", "atomic_inter_shift")


def _is_plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_plain(v) for k, v in value.items())
    return False


def _name_in(table: dict[str, Any], value: Any, what: str) -> str:
    names = [name for name, entry in table.items() if entry is value]
    if not names:
        raise ValueError(
            f"the MACE model's {what} {value!r} is not one of mace-torch's named ones ({sorted(table)})"
        )
    return names[0]


def plain_mace_config(model: nn.Module) -> tuple[str, dict[str, Any]]:
    """``(class name, constructor kwargs as plain data)`` of a mace-torch model.

    Raises:
        ValueError: an unsupported model (class, several heads, extra embeddings, cuEquivariance).
    """
    name = type(model).__name__
    if name not in SUPPORTED_CLASSES:
        raise ValueError(
            f"a {name} cannot be attached: supported MACE models are {list(SUPPORTED_CLASSES)} (mace_run_train's "
            "--model MACE); a TorchScript '*_compiled.model' file is not supported either, pass the plain '.model'"
        )
    modules = import_mace()
    raw = import_mace("mace.tools.scripts_utils").extract_config_mace_model(model)
    if "error" in raw:
        raise ValueError(f"mace-torch cannot extract the config of this {name}: {raw['error']}")
    heads = list(raw.get("heads") or ["Default"])
    if len(heads) != 1:
        raise ValueError(
            f"the MACE model has {len(heads)} heads {heads}; keep one (mace-torch's select_head) first"
        )
    for key in ("cueq_config", "embedding_specs"):
        if raw.get(key) is not None:
            raise ValueError(
                f"MACE models with {key} are not supported; convert or retrain without it"
            )
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _CLASS_TABLES:
            value = _name_in(getattr(modules, _CLASS_TABLES[key]), value, key)
        elif key == "gate":
            value = _name_in(modules.gate_dict, value, "gate")
        elif key in _IRREPS_KEYS:
            value = None if value is None else str(value)
        elif isinstance(value, (np.ndarray, torch.Tensor, np.generic)):
            value = value.tolist()
        if not _is_plain(value):
            raise ValueError(
                f"the MACE model's config entry {key!r} ({type(value).__name__}) is not plain data"
            )
        out[key] = value
    return name, out


def build_mace_model(class_name: str, config: dict[str, Any]) -> nn.Module:
    """A new (randomly initialised) mace-torch model from :func:`plain_mace_config`'s output."""
    if class_name not in SUPPORTED_CLASSES:
        raise ValueError(
            f"unsupported MACE class {class_name!r}; supported: {list(SUPPORTED_CLASSES)}"
        )
    modules = import_mace()
    from e3nn import o3

    kwargs = dict(config)
    for key, table in _CLASS_TABLES.items():
        kwargs[key] = getattr(modules, table)[kwargs[key]]
    kwargs["gate"] = modules.gate_dict[kwargs["gate"]]
    for key in _IRREPS_KEYS:
        if kwargs.get(key) is not None:
            kwargs[key] = o3.Irreps(kwargs[key])
    for key in _ARRAY_KEYS:
        kwargs[key] = np.asarray(kwargs[key], dtype=np.float64)
    with quiet_scripting():
        return getattr(modules, class_name)(**kwargs)
