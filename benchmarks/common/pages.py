"""The footer every results page ends with: how, when and where its numbers were made.

A page shows its tables first; :func:`run_section` then gives the command, the date, the
machine (with its load average when recorded) and the package versions, and points to the
suite's JSON for the rest of the provenance (every command, per-run settings and notes).
:func:`environment` is what a suite records in its JSON when it measures. A page prints a
recorded command through :func:`rerun_command`, in the form that runs today. Sections that
benchmarks/peers write onto a suite's page (:data:`PEER_SECTION`) are kept by a rewrite
(:func:`peer_sections`, :func:`replace_section`) or moved to pages of their own
(:func:`move_peer_sections`).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

VERSIONED = ("mlip-unc", "torch", "e3nn", "ase", "mace-torch")
MOVED = {  # scripts recorded before they became packages or moved into one
    "benchmarks/speed.py": "benchmarks.speed",
    "benchmarks/scale.py": "benchmarks.scale",
    "benchmarks/scale_train.py": "benchmarks.scale.train",
    "benchmarks/reliability.py": "benchmarks.reliability",
    "benchmarks/paper_study.py": "benchmarks.paper.study",
    "benchmarks/paper_study_summary.py": "benchmarks.paper.summary",
    "benchmarks/paper_study_optimum.py": "benchmarks.paper.optimum",
    "benchmarks/force_lpa.py": "benchmarks.paper.force_lpa",
}


def rerun_command(command: str) -> str:
    """A recorded command in the form that runs today.

    Commands recorded as ``python benchmarks/x.py ARGS`` fail now (``benchmarks`` is not an
    installed package, so a script's ``from benchmarks...`` import fails): they become
    ``python -m benchmarks.x ARGS``, under the module's present name (:data:`MOVED`). The
    arguments are kept as recorded (the JSON keeps the command itself); any other command is
    returned unchanged.
    """
    words = command.split(" ")
    for i, word in enumerate(words[:-1]):
        script = words[i + 1]
        if (
            word in ("python", "python3")
            and script.startswith("benchmarks/")
            and script.endswith(".py")
        ):
            module = MOVED.get(script, script[: -len(".py")].replace("/", "."))
            return " ".join([*words[: i + 1], "-m", module, *words[i + 2 :]])
    return command


def versions() -> dict[str, str]:
    """Python and the installed versions of the packages in :data:`VERSIONED` (those present)."""
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def environment() -> dict[str, Any]:
    """Machine, CPU count, 1/5/15-min load average and versions, as recorded beside results."""
    return {
        "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
        "load_avg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
        "versions": versions(),
        "executable": sys.executable,
    }


def run_section(
    commands: str | Sequence[str],
    *,
    date: str | None,
    json_name: str,
    machine: str | None = None,
    load_avg: Sequence[float] | str | None = None,
    versions: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
) -> list[str]:
    """Markdown lines of the ``## Run`` footer; fields that were not recorded are left out.

    Args:
        commands: the command that wrote the page, or all commands of a resumed run (the
            first and the last are shown; the JSON keeps every one).
        date: when the numbers were made (as recorded).
        json_name: the suite's JSON file, named as where the full provenance lives.
        machine, load_avg, versions: as recorded by :func:`environment` (or the suite).
        extra: further short lines (one sentence each).
    """
    cmds = [rerun_command(c) for c in ([commands] if isinstance(commands, str) else commands)]
    lines = ["## Run", ""]
    if len(cmds) == 1:
        lines.append(f"- Command: `{cmds[0]}`")
    elif cmds:
        lines.append(f"- Commands: {len(cmds)}, first `{cmds[0]}`, last `{cmds[-1]}`")
    if date:
        lines.append(f"- Date: {date}")
    if machine:
        lines.append(f"- Machine: {machine}")
    if load_avg:
        load = load_avg if isinstance(load_avg, str) else " / ".join(f"{x:g}" for x in load_avg)
        lines.append(f"- Load average: {load}")
    if versions:
        lines.append("- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items()))
    lines += [f"- {line}" for line in extra]
    lines.append(f"- Full provenance (every command, settings, per-run notes): `{json_name}`")
    return lines


PEER_SECTION = re.compile(
    r"<!-- peers/(?P<name>[\w.-]+): begin.*?-->.*?<!-- peers/(?P=name): end -->", re.DOTALL
)


def peer_sections(path: Path) -> str:
    """The sections that benchmarks/peers keeps on the page ``path`` between
    ``<!-- peers/NAME: begin ...-->`` and ``<!-- peers/NAME: end -->``, each after a blank line:
    a suite appends them when it rewrites its page, so that the rewrite keeps them."""
    text = path.read_text() if path.is_file() else ""
    return "".join(f"\n{m.group(0)}\n" for m in PEER_SECTION.finditer(text))


def replace_section(
    path: Path, begin: str, end: str, lines: list[str], *, before: str | None = None
) -> None:
    """Put ``lines`` between the markers ``begin`` and ``end`` on the page ``path``: in place of
    an earlier section, else before the line ``before`` (when the page has it), else at the end;
    the rest of the page stays as it is."""
    text = path.read_text() if path.is_file() else ""
    block = "\n".join([begin, *lines, end])
    if begin in text and end in text:
        head, rest = text.split(begin, 1)
        text = head + block + rest.split(end, 1)[1]
    elif before is not None and before in text:
        head, rest = text.split(before, 1)
        text = head + block + "\n\n" + before + rest
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    path.write_text(text)


PEER_TITLE = re.compile(r"^## (?P<title>.+)$", re.MULTILINE)


def peer_page(path: Path, name: str) -> Path:
    """Where the peer section ``name`` of the page ``path`` lives: ``<page>_NAME.md`` beside it."""
    return path.with_name(f"{path.stem}_{name.replace('.', '_')}.md")


def move_peer_sections(path: Path, by: str) -> list[tuple[str, str]]:
    """Move the sections that other scripts write onto ``path`` (between ``<!-- peers/NAME:
    begin ...-->`` and ``<!-- peers/NAME: end -->``, benchmarks/peers) to their own pages beside it
    (:func:`peer_page`; a section on ``path`` replaces the one on its page: it is newer), so
    that the page stays short; ``[(title, file name)]`` of every peer page there, for the links.
    A peer page is the section as written, under a title line and a link back (``by``: the
    script that moved it, where the native rows are)."""
    text = path.read_text() if path.is_file() else ""
    for match in PEER_SECTION.finditer(text):
        name = match.group("name")
        peer_page(path, name).write_text(
            f"# {path.stem}: peer section `{name}`\n\n"
            f"Written by benchmarks/peers ({name}) onto [{path.name}]({path.name}), moved here by "
            f"{by} (the native rows are there).\n\n{match.group(0)}\n"
        )
    out = []
    for page in sorted(path.parent.glob(f"{path.stem}_*.md")):
        if section := PEER_SECTION.search(page.read_text()):
            title = PEER_TITLE.search(section.group(0))
            out.append((title.group("title") if title else section.group("name"), page.name))
    return out
