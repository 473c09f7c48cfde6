"""Every results page: short, table first, and every rerun command on it runs.

A page is at most :data:`MAX_LINES` lines with a markdown table line within its first
:data:`TABLE_BY` lines (the long per-row tables live in the JSON or a CSV beside the page).
Every ``python ... benchmarks...`` command a page prints (inline or in a code block) must be in
the ``python -m benchmarks.<module>`` form (``benchmarks`` is not installed, so a path form
``python benchmarks/x.py`` fails on import) and its module's ``main`` must accept the command's
arguments and then ``--help``: the test runs the module as ``__main__`` in this process and stops
it at its argument parser (module import, parser construction, every flag and value), without
running the benchmark: every suite's ``main`` parses with ``ArgumentParser.parse_args``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "benchmarks" / "results"
MAX_LINES = 150
TABLE_BY = 15
PAGES = sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*.md"))

# pages whose writers other people own; strict, so each flips to a failure when its fix lands
OTHERS_LENGTH: dict[str, str] = {}
OTHERS_COMMANDS: dict[str, str] = {}

# runpy runs a module that the package import may already hold: expected here
pytestmark = pytest.mark.filterwarnings("ignore:.*found in sys.modules:RuntimeWarning")

INLINE = re.compile(r"`([^`]+)`")
FENCE = re.compile(r"^```")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


def _param(page: str, xfails: dict[str, str]) -> Any:
    if page in xfails:
        return pytest.param(page, marks=pytest.mark.xfail(strict=True, reason=xfails[page]))
    return page


def commands(text: str) -> list[str]:
    """The benchmark commands a page prints: inline code spans and code-block lines that start
    with ``python`` (after ``VAR=value`` prefixes) and name ``benchmarks``; placeholders such as
    ``benchmarks.<suite>`` are not commands."""
    found: list[str] = []
    fenced, outside = False, []
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif fenced:
            found.append(line.strip())
        else:
            outside.append(line)
    found += [" ".join(span.split()) for span in INLINE.findall("\n".join(outside))]
    out = []
    for cmd in found:
        words = cmd.split()
        while words and ENV.match(words[0]):
            words.pop(0)
        if words and words[0] in ("python", "python3") and "benchmarks" in cmd and "<" not in cmd:
            out.append(cmd)
    return list(dict.fromkeys(out))


def module_and_args(cmd: str) -> tuple[str, list[str]]:
    """``(module, arguments)`` of a ``python -m module args`` command; AssertionError otherwise."""
    words = shlex.split(cmd)
    while ENV.match(words[0]):
        words.pop(0)
    assert len(words) >= 3 and words[1] == "-m", f"not a `python -m benchmarks...` command: {cmd}"
    return words[2], words[3:]


class _Parsed(Exception):
    """Raised in place of the benchmark run once the command's arguments are parsed."""


def parse_then_help(module: str, args: list[str]) -> tuple[str, str]:
    """Run ``module`` as ``__main__`` up to its first ``parse_args``: parse ``args`` (an error
    exits 2), then ``--help`` (exits 0); returns (stdout, stderr) of the parser. A pre-parser's
    ``parse_known_args`` (one option picks the main parser) runs as it would."""
    original = argparse.ArgumentParser.parse_args

    def intercept(self: argparse.ArgumentParser, *a: Any, **k: Any) -> Any:
        original(self, args)
        original(self, ["--help"])
        raise _Parsed  # --help returned instead of exiting: not argparse's help

    out, err = io.StringIO(), io.StringIO()
    saved = sys.argv
    sys.argv = [module, *args]
    argparse.ArgumentParser.parse_args = intercept  # type: ignore[method-assign,assignment]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=False)
    except SystemExit as stop:
        assert stop.code == 0, f"{module} {shlex.join(args)}: exit {stop.code}\n{err.getvalue()}"
    else:
        raise AssertionError(f"{module} ran to its end without parsing arguments")
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
        sys.argv = saved
    assert "usage:" in out.getvalue(), f"{module} --help printed no usage"
    return out.getvalue(), err.getvalue()


@pytest.mark.parametrize("page", [_param(p, OTHERS_LENGTH) for p in PAGES])
def test_page_is_short_and_table_first(page):
    lines = (RESULTS / page).read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"{page}: {len(lines)} lines (at most {MAX_LINES})"
    first = next((n for n, line in enumerate(lines, 1) if line.startswith("|")), None)
    assert first is not None and first <= TABLE_BY, f"{page}: first table line {first}"


@pytest.mark.parametrize("page", [_param(p, OTHERS_COMMANDS) for p in PAGES])
def test_page_commands_run(page):
    for cmd in commands((RESULTS / page).read_text(encoding="utf-8")):
        module, args = module_and_args(cmd)
        parse_then_help(module, args)


def test_commands_are_found_inline_and_in_blocks():
    text = "\n".join(
        [
            "- Command: `OMP_NUM_THREADS=1 python -m benchmarks.scale --x 1` (seed 0)",
            "run `python -m benchmarks.<suite>`; see `mlip-unc flag`",
            "```bash",
            "python -m benchmarks.peers.metatrain --seeds 0",
            "```",
        ]
    )
    assert commands(text) == [
        "python -m benchmarks.peers.metatrain --seeds 0",
        "OMP_NUM_THREADS=1 python -m benchmarks.scale --x 1",
    ]
    assert module_and_args(commands(text)[1]) == ("benchmarks.scale", ["--x", "1"])
    with pytest.raises(AssertionError, match="not a `python -m"):
        module_and_args("python benchmarks/speed.py --out x")


def test_a_wrong_flag_fails_the_parse():
    with pytest.raises(AssertionError, match="exit 2"):
        parse_then_help("benchmarks.speed", ["--no-such-flag"])
    out, _ = parse_then_help("benchmarks.speed", ["--threads", "1"])
    assert "--threads" in out
