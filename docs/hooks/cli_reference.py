"""MkDocs hook: the command-line reference, generated from the ``mlip-unc`` Typer app.

A page that contains the line ``<!-- cli-reference -->`` gets it replaced by one section per
command (groups such as ``property`` recurse): its help text and a table of its options with
type, default and help, read from the same command objects that print ``mlip-unc CMD --help``.
The objects are read by duck typing (``params``, ``list_commands``), so the hook works with
click itself and with the copy of click that recent Typer versions carry.
"""

from __future__ import annotations

from typing import Any

MARKER = "<!-- cli-reference -->"


def _command() -> Any:
    import typer

    from mlip_unc.cli import app

    return typer.main.get_command(app)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _type(param: Any) -> str:
    if getattr(param, "is_flag", False):
        return "flag"
    desc = getattr(param, "type_descriptor", None)  # Typer >= 0.25 carries its own click
    if desc is not None:
        if desc.is_choice:
            name = " \\| ".join(f"`{getattr(c, 'value', c)}`" for c in desc.choices or ())
        else:
            name = param.bare_type()
    else:
        kind = param.type
        choices = getattr(kind, "choices", None)
        name = (
            " \\| ".join(f"`{c}`" for c in choices)
            if choices
            else getattr(kind, "name", str(kind)).lower()
        )
    return f"{name} (repeatable)" if getattr(param, "multiple", False) else name


def _default(param: Any) -> str:
    if param.required:
        return "**required**"
    value = param.default
    if (
        callable(value)
        or value is None
        or value == ()
        or (getattr(param, "is_flag", False) and not value)
    ):
        return ""
    value = getattr(value, "value", value)
    return f"`{value}`"


def _options(cmd: Any) -> list[str]:
    rows = ["| option | type | default | help |", "|---|---|---|---|"]
    for param in cmd.params:
        if param.name == "help":
            continue
        names = ", ".join(f"`{o}`" for o in [*param.opts, *param.secondary_opts])
        help_text = _cell(getattr(param, "help", None) or "")
        envvar = getattr(param, "envvar", None)
        if envvar:
            help_text += f" Environment variable: `{envvar}`."
        rows.append(f"| {names} | {_type(param)} | {_default(param)} | {help_text} |")
    return rows


def _subcommands(cmd: Any) -> list[tuple[str, Any]]:
    """``(name, command)`` of a group's visible commands, in the order ``--help`` lists them."""
    commands = getattr(cmd, "commands", None) or {}
    return [(name, sub) for name, sub in commands.items() if not getattr(sub, "hidden", False)]


def _sections(cmd: Any, path: str, level: int) -> list[str]:
    out = [f"{'#' * level} `{path}`", "", _cell(cmd.help or ""), ""]
    subs = _subcommands(cmd)
    if subs:
        out += [f"Commands: {', '.join(f'`{n}`' for n, _ in subs)}.", ""]
        for name, sub in subs:
            out += _sections(sub, f"{path} {name}", min(level + 1, 4))
        return out
    return out + _options(cmd) + [""]


def render() -> str:
    """The Markdown of every command, as ``mlip-unc CMD --help`` states it."""
    root = _command()
    lines = [
        "Global options (before the command): `-v/--verbose` (debug log messages), "
        "`-q/--quiet` (warnings and errors only; no progress bars).",
        "",
    ]
    subs = _subcommands(root)
    if not subs:
        raise RuntimeError("mlip-unc has no commands: the CLI reference would be empty")
    for name, sub in subs:
        lines += _sections(sub, f"mlip-unc {name}", 2)
    return "\n".join(lines)


def on_page_markdown(markdown: str, **_: Any) -> str:
    """MkDocs event: replace the marker line by the generated reference."""
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())
