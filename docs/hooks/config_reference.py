"""MkDocs hook: the configuration reference, generated from the pydantic models at build time.

A page that contains the line ``<!-- config-reference -->`` gets it replaced by one table per
config section: every key with its type, default and one line of description. The walk is
generic: it follows every field whose type is (or contains) a pydantic ``BaseModel``, so new
sections and typed option models appear without editing this file.

Descriptions come from ``Field(description=...)`` when set, else from the ``Attributes:``
section of the class docstrings (Google style; ``a, b: text`` and ``a: text; b: text`` entries
are both understood), else from the first line of a nested model's own docstring. A key
without any description is logged as a warning, which ``mkdocs build --strict`` turns into a
failure: the reference cannot silently fall behind the code.
"""

from __future__ import annotations

import enum
import inspect
import json
import logging
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

MARKER = "<!-- config-reference -->"

# (title, import path of the root model, the command that reads it)
ROOTS: tuple[tuple[str, str, str], ...] = (
    ("Potential training", "mlip_unc.config.potential:PotentialConfig", "mlip-unc train --config"),
    (
        "Property models",
        "mlip_unc.config.property:PropertyConfig",
        "mlip-unc property train --config",
    ),
    (
        "Active learning",
        "mlip_unc.config.active:ActiveLearningConfig",
        "mlip-unc active-learn --config",
    ),
)

log = logging.getLogger("mkdocs.hooks.config_reference")


@dataclass(frozen=True)
class Row:
    """One key of a section: dotted path, type, default (as YAML would spell it), one line."""

    key: str
    type: str
    default: str
    description: str


@dataclass(frozen=True)
class Table:
    """One config section (a pydantic model at a dotted path)."""

    path: str
    model: type[BaseModel]
    rows: tuple[Row, ...]


def _import(spec: str) -> type[BaseModel]:
    module, _, name = spec.partition(":")
    obj = getattr(__import__(module, fromlist=[name]), name)
    if not (isinstance(obj, type) and issubclass(obj, BaseModel)):
        raise TypeError(f"{spec} is not a pydantic model")
    return obj


def _clean(text: str) -> str:
    """One line of Markdown from docstring text (reST roles and double backticks undone)."""
    text = re.sub(r":(?:class|func|mod|meth|attr|data):`~?([^`]+)`", r"`\1`", text)
    text = text.replace("``", "`")
    return " ".join(text.split())


def _first_sentence(text: str) -> str:
    text = _clean(text)
    match = re.search(r"(?<=\.)\s+(?=[A-Z])", text)
    sentence = text if match is None else text[: match.start()]
    return sentence.rstrip(";").replace("|", "\\|")


def _attribute_docs(model: type[BaseModel]) -> dict[str, str]:
    """``{field: text}`` from the ``Attributes:`` sections of the model's classes (MRO)."""
    fields = set(model.model_fields)
    docs: dict[str, str] = {}
    for cls in reversed(model.__mro__):
        doc = inspect.getdoc(cls) if cls.__dict__.get("__doc__") else None
        if not doc or "Attributes:" not in doc:
            continue
        block = doc.split("Attributes:", 1)[1]
        entries: list[tuple[list[str], str]] = []
        indent: int | None = None
        for line in block.splitlines():
            if not line.strip():
                continue
            width = len(line) - len(line.lstrip())
            if indent is None:
                indent = width
            if width < indent:
                break  # the section ended
            head = re.match(r"\s*([A-Za-z_][\w]*(?:\s*,\s*[A-Za-z_][\w]*)*)\s*:\s*(.*)", line)
            if width == indent and head:
                entries.append(([n.strip() for n in head.group(1).split(",")], head.group(2)))
            elif entries:
                entries[-1] = (entries[-1][0], entries[-1][1] + " " + line.strip())
        for names, text in entries:
            for part_names, part in _split_inline(names, text, fields):
                for name in part_names:
                    if name in fields:
                        docs[name] = part
    return docs


def _split_inline(names: list[str], text: str, fields: set[str]) -> Iterator[tuple[list[str], str]]:
    """``a: x; b, c: y`` -> ``(["a"], "x"), (["b", "c"], "y")`` when b and c are fields."""
    pattern = re.compile(r";\s*([A-Za-z_]\w*(?:\s*(?:,|/)\s*[A-Za-z_]\w*)*)\s*:\s+")
    start, current = 0, names
    for match in pattern.finditer(text):
        group = [n.strip() for n in re.split(r"[,/]", match.group(1))]
        if not all(n in fields for n in group):
            continue
        yield current, text[start : match.start()]
        start, current = match.end(), group
    yield current, text[start:]


def _models_in(annotation: Any) -> list[type[BaseModel]]:
    """The pydantic models inside ``annotation`` (``X``, ``X | None``, ``A | B``, ...)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation] if annotation.model_fields else []  # a bare base: no table
    found: list[type[BaseModel]] = []
    for arg in typing.get_args(annotation):
        for model in _models_in(arg):
            if model not in found:
                found.append(model)
    return found


def _type_name(annotation: Any) -> str:
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(f"`{m.value}`" for m in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        args = tuple(  # Annotated[Model, ...] (SerializeAsAny, ...) reads as the model
            typing.get_args(a)[0] if typing.get_origin(a) is typing.Annotated else a for a in args
        )
        models = [a.__name__ for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        rest = [_type_name(a) for a in args if getattr(a, "__name__", None) not in models]
        if len(models) > 1:  # a union of option models: one table each below
            return " \\| ".join([f"section ({' / '.join(models)})", *rest])
        return " \\| ".join(_type_name(a) for a in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple, set, dict):
        inner = ", ".join("..." if a is Ellipsis else _type_name(a) for a in args)
        return f"{origin.__name__}[{inner}]" if inner else origin.__name__
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation).replace("typing.", ""))


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, BaseModel):
        return "(section defaults)"
    if isinstance(value, (tuple, list, dict)):
        return json.dumps(value, default=str)  # YAML flow style reads the same
    return str(value)


def _default(info: Any) -> str:
    if info.default is not PydanticUndefined:
        return f"`{_yaml(info.default)}`"
    if info.default_factory is not None:
        return f"`{_yaml(info.default_factory())}`"
    return "**required**"


def tables(root: type[BaseModel], prefix: str = "", label: str | None = None) -> list[Table]:
    """Every section under ``root`` (itself first), depth first, each key with one line.

    A key whose type holds several models (a union of option models) gets one table per
    model, labelled with the model's name.
    """
    docs = _attribute_docs(root)
    rows: list[Row] = []
    nested: list[tuple[str, type[BaseModel], bool]] = []
    for name, info in root.model_fields.items():
        key = f"{prefix}{name}"
        models = _models_in(info.annotation)
        text = info.description or docs.get(name)
        if models and not info.description:  # a section: its own docstring says what it is
            text = (inspect.getdoc(models[0]) or "").split("\n\n")[0] or text
        line = _first_sentence(text or "")
        if not line:
            log.warning("config reference: %s.%s has no description", root.__name__, name)
        rows.append(Row(key, _type_name(info.annotation), _default(info), line))
        nested.extend((key, model, len(models) > 1) for model in models)
    path = label or prefix.rstrip(".") or root.__name__
    out = [Table(path, root, tuple(rows))]
    for key, model, several in nested:
        out.extend(tables(model, f"{key}.", f"{key} ({model.__name__})" if several else None))
    return out


def render() -> str:
    """The Markdown of the whole reference (every root of :data:`ROOTS`)."""
    parts: list[str] = []
    for title, spec, command in ROOTS:
        root = _import(spec)
        parts.append(
            f"## {title}\n\n`{command} FILE.yaml` reads these keys "
            f"(`{root.__module__}.{root.__name__}`).\n"
        )
        for table in tables(root):
            heading = "Top level" if table.model is root else f"`{table.path}`"
            summary = _first_sentence((inspect.getdoc(table.model) or "").split("\n\n")[0])
            parts.append(f"### {title}: {heading}\n\n{summary}\n")
            parts.append("| key | type | default | description |\n|---|---|---|---|")
            parts.extend(
                f"| `{r.key}` | {r.type} | {r.default} | {r.description} |" for r in table.rows
            )
            parts.append("")
    return "\n".join(parts)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: replace the marker line by the generated reference."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
