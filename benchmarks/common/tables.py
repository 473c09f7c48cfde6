"""Long tables of a results page, kept beside it as CSV files and linked from it.

A page shows its headline tables; the tables of every row go to ``<page>_<what>.csv`` in the
same folder, with the cells formatted as a page would show them (the numbers move, they are
not re-measured or re-rounded). :func:`write_page` writes the page and its CSV files together.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mlip_unc.atomic_write import atomic_write_text


@dataclass
class Table:
    """A table with a file name: ``rows`` hold the cells as the page would show them."""

    name: str
    header: Sequence[str]
    rows: list[Sequence[str]] = field(default_factory=list)

    def markdown(self) -> list[str]:
        """The table as markdown lines."""
        lines = ["| " + " | ".join(self.header) + " |", "|" + "---|" * len(self.header)]
        return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in self.rows]

    def csv_text(self) -> str:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(self.header)
        writer.writerows(self.rows)
        return buffer.getvalue()

    def link(self, what: str) -> str:
        """One markdown line that names the file and its row count."""
        return f"{what}: [`{self.name}`]({self.name}) ({len(self.rows)} rows)."


def read_csv(path: Path) -> list[dict[str, str]]:
    """The rows of a CSV file written by :func:`write_page`, as dicts by column name."""
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def write_page(path: Path, text: str, tables: Sequence[Table] = ()) -> Path:
    """Write the page ``path`` and each table as ``path.parent / table.name`` (atomically)."""
    for table in tables:
        atomic_write_text(path.parent / table.name, table.csv_text())
    atomic_write_text(path, text)
    return path
