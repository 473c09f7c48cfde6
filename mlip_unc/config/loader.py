"""The one way YAML becomes a validated config: read, ``--set`` overrides, ``${...}``, validate.

Every command reads its configuration the same way::

    raw = load_raw("configs/x.yaml")                   # a mapping, nothing validated yet
    raw = apply_overrides(raw, ["train.epochs=3"])      # --set a.b=c, values parsed as YAML
    raw = apply_values(raw, {"train.seed": 1})          # a command's shortcut flags, typed
    cfg = validate(PotentialConfig, raw)                # ${...} resolved, types checked

Errors are :class:`ConfigError` whose message starts with the dotted key at fault
(``train.batch_size: Input should be greater than 0 (got 0)``); unknown keys are rejected
with a suggestion of the closest known one.

``${dotted.key}`` in a string value is replaced by the value at that key of the same file;
``${data_root}`` is the top-level ``data_root`` or, when that is null or absent, the
environment variable ``MLIP_UNC_DATA`` or ``../shared/data``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, ValidationError

__all__ = [
    "DATA_ROOT_ENV",
    "ConfigError",
    "NestedConfigError",
    "Section",
    "default_data_root",
    "not_found",
    "load_raw",
    "apply_overrides",
    "apply_values",
    "interpolate",
    "validate",
    "validate_nested",
    "config_to_dict",
]

DATA_ROOT_ENV = "MLIP_UNC_DATA"
T = TypeVar("T", bound=BaseModel)


class ConfigError(ValueError):
    """An invalid configuration; the message starts with the dotted key at fault."""


class NestedConfigError(ValueError):
    """Raised by a validator that validates a sub-section itself (its model chosen by another
    key): the message starts with the key inside the sub-section, and :func:`validate` puts the
    sub-section's dotted key in front."""


def validate_nested(schema: type[T], raw: Any) -> T:
    """``schema`` validated from ``raw`` inside a field validator; errors become
    :class:`NestedConfigError` with the same wording as :func:`validate`'s."""
    if isinstance(raw, schema):
        return raw
    if isinstance(raw, BaseModel):
        raw = config_to_dict(raw)
    if not isinstance(raw, Mapping):
        raise NestedConfigError(f": expected a mapping, got {type(raw).__name__}")
    try:
        return schema.model_validate(dict(raw))
    except ValidationError as err:
        raise NestedConfigError("." + _message(schema, err.errors()[0])) from None


class Section(BaseModel):
    """Base of every config section: frozen, unknown keys rejected, defaults validated."""

    model_config = ConfigDict(frozen=True, extra="forbid", validate_default=True)

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of str/int/float/bool/list/None (JSON, YAML and weights-only safe)."""
        return config_to_dict(self)

    def updated(self: T, **changes: Any) -> T:
        """A validated copy with ``changes`` applied (``model_copy`` skips validation)."""
        return validate(type(self), {**config_to_dict(self), **changes}, resolve=False)


def config_to_dict(config: BaseModel) -> dict[str, Any]:
    """Plain, YAML/JSON/checkpoint-friendly dict (Enums become their values)."""
    return config.model_dump(mode="json")


# ================================================================ reading
def default_data_root() -> str:
    """``$MLIP_UNC_DATA`` when set, else ``../shared/data`` (relative to the working dir)."""
    return os.environ.get(DATA_ROOT_ENV) or str(Path("..") / "shared" / "data")


def not_found(path: object, what: str = "structure file") -> str:
    """The message of a missing input file; under the data root (``$MLIP_UNC_DATA``, default
    ``../shared/data``, where the shipped configs read their data) it says how to point the root
    at the data instead of naming only a path the user never wrote."""
    return f"{what} not found: '{path}'{_data_root_hint(path)}"


def _data_root_hint(path: object) -> str:
    root = Path(default_data_root())
    try:
        Path(str(path)).resolve().relative_to(root.resolve())
    except ValueError:
        return ""
    if os.environ.get(DATA_ROOT_ENV):
        source = f"${DATA_ROOT_ENV}"
    else:
        source = f"the default, as ${DATA_ROOT_ENV} is not set"
    state = "does not hold it" if root.is_dir() else "does not exist"
    return (
        f"; the data root '{root}' ({source}) {state}: set {DATA_ROOT_ENV} to the folder that "
        "holds the data (structures/, moleculenet/)"
    )


def load_raw(path: str | os.PathLike) -> dict[str, Any]:
    """The YAML (or JSON) file as a mapping, nothing validated."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: '{path}'")
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as err:
        raise ConfigError(f"config file '{path}' is not valid YAML: {err}") from None
    if raw is None:
        raise ConfigError(f"config file '{path}' is empty")
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config file '{path}': expected a mapping at the top level")
    return dict(raw)


# ================================================================ overrides
def _deep_copy(raw: Mapping) -> dict:
    return {k: _deep_copy(v) if isinstance(v, Mapping) else v for k, v in raw.items()}


def _qualify(key: str, schema: type[BaseModel] | None) -> str:
    """``epochs`` -> ``train.epochs`` when exactly one section of ``schema`` has that field."""
    if schema is None or "." in key or key in schema.model_fields:
        return key
    owners = [
        name
        for name, f in schema.model_fields.items()
        if (cls := _model_class(f.annotation)) is not None and key in cls.model_fields
    ]
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    if len(owners) > 1:
        raise ConfigError(
            f"{key}: ambiguous override, write one of {[f'{o}.{key}' for o in owners]}"
        )
    raise ConfigError(f"{key}: unknown key")


def _slot(out: dict[str, Any], key: str, schema: type[BaseModel] | None) -> tuple[dict, str]:
    """The mapping of ``out`` that holds dotted ``key`` (sections created as needed) and the
    key's last part."""
    parts = _qualify(key, schema).split(".")
    node = out
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"{key}: '{part}' is not a section")
        node = child
    return node, parts[-1]


def apply_overrides(
    raw: Mapping[str, Any], overrides: Sequence[str], schema: type[BaseModel] | None = None
) -> dict[str, Any]:
    """A copy of ``raw`` with ``a.b=c`` overrides (values parsed as YAML: ``null``, ``[1, 2]``).

    With ``schema``, a bare key (``epochs=3``) is accepted when exactly one section has it.
    """
    out = _deep_copy(raw)
    for item in overrides:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{item}: an override must look like key=value")
        node, last = _slot(out, key.strip(), schema)
        node[last] = yaml.safe_load(text) if text.strip() else None
    return out


def apply_values(
    raw: Mapping[str, Any], values: Mapping[str, Any], schema: type[BaseModel] | None = None
) -> dict[str, Any]:
    """A copy of ``raw`` with each dotted key of ``values`` set to its value as it is.

    The shortcut flags of a command set their keys this way: their values are already typed,
    and a file name or a column name must not be read as YAML (``2020``, ``null``, ``a: b``).
    Keys are as in :func:`apply_overrides`.
    """
    out = _deep_copy(raw)
    for key, value in values.items():
        node, last = _slot(out, key, schema)
        node[last] = value
    return out


# ================================================================ interpolation
_REF = re.compile(r"\$\{([A-Za-z_][\w.]*)\}")


def _lookup(root: Mapping, dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            raise KeyError(dotted)
        node = node[part]
    return node


def interpolate(raw: Mapping[str, Any]) -> dict[str, Any]:
    """Replace ``${dotted.key}`` in string values (references may nest, 10 levels at most)."""
    root = dict(raw)
    if "data_root" in root and root["data_root"] is None:
        root["data_root"] = default_data_root()
    lookup_root = {"data_root": default_data_root(), **root}

    def resolve(value: Any, key: str, depth: int = 0) -> Any:
        if isinstance(value, Mapping):
            return {k: resolve(v, f"{key}.{k}" if key else str(k), depth) for k, v in value.items()}
        if isinstance(value, list):
            return [resolve(v, f"{key}[{i}]", depth) for i, v in enumerate(value)]
        if not isinstance(value, str) or "${" not in value:
            return value
        if depth > 10:
            raise ConfigError(f"{key}: circular ${{...}} reference")

        def sub(match: re.Match) -> str:
            try:
                target = _lookup(lookup_root, match.group(1))
            except KeyError:
                raise ConfigError(f"{key}: unknown reference ${{{match.group(1)}}}") from None
            return str(resolve(target, match.group(1), depth + 1))

        return _REF.sub(sub, value)

    return resolve(root, "")


# ================================================================ validation
def _model_class(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel class inside ``annotation`` (``X``, ``X | None``), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation) if get_origin(annotation) is not None else ():
        found = _model_class(arg)
        if found is not None:
            return found
    return None


def _field_path(schema: type[BaseModel], loc: Sequence[Any]) -> tuple[str, type[BaseModel] | None]:
    """Dotted key of a pydantic error location (union type tags dropped) and the model that
    owns its last part."""
    parts: list[str] = []
    cls: type[BaseModel] | None = schema
    owner: type[BaseModel] | None = schema
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif cls is not None:  # after a leaf field, the rest are type tags ('float', ...)
            owner = cls
            parts.append(str(item))
            field = cls.model_fields.get(str(item))
            cls = None if field is None else _model_class(field.annotation)
    return ".".join(parts), owner


_KEYED = re.compile(r"^([\w.\[\]]+): ")


def _message(schema: type[BaseModel], err: Mapping[str, Any]) -> str:
    key, owner = _field_path(schema, err["loc"])
    nested = (err.get("ctx") or {}).get("error")
    if isinstance(nested, NestedConfigError):  # its message continues the key
        return f"{key}{nested}"
    msg = str(err["msg"]).removeprefix("Value error, ").removeprefix("Assertion failed, ")
    if err["type"] == "extra_forbidden":
        names = list(owner.model_fields) if owner is not None else []
        close = difflib.get_close_matches(key.rsplit(".", 1)[-1], names, n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else f"; known keys: {names}"
        return f"{key}: unknown key{hint}"
    if err["type"] == "missing":
        return f"{key}: required key is missing"
    keyed = _KEYED.match(msg)
    if not key or (keyed and keyed.group(1).startswith(key)):
        return msg  # a cross-field check: its message names its keys
    shown = err.get("input")
    got = (
        ""
        if isinstance(shown, (Mapping, list)) or err["type"] == "model_type"
        else f" (got {shown!r})"
    )
    return f"{key}: {msg}{got}"


def validate(schema: type[T], raw: Any, *, resolve: bool = True) -> T:
    """``schema`` validated from ``raw`` (``${...}`` resolved first); :class:`ConfigError` on failure."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: expected a mapping at the top level, got {type(raw).__name__}")
    data = interpolate(raw) if resolve else dict(raw)
    try:
        return schema.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_message(schema, err.errors()[0])) from None
