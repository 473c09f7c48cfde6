"""Lines of benchmarks/ against lines of mlip_unc/: the harness should stay at most half the package.

Counts the non-blank lines of every ``*.py`` file under each folder (comments and docstrings
count; blank lines do not; the physical line counts are printed beside them) and prints the
ratio. With ``--max-ratio R`` it exits 1 when the non-blank ratio is above R; without it, it only
prints (how .ci/run calls it until the target is met).

    python .ci/line_budget.py                  # print
    python .ci/line_budget.py --max-ratio 0.5  # the issue's target: fail above it
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def count(folder: Path) -> tuple[int, int]:
    """(non-blank lines, physical lines) of the ``*.py`` files under ``folder``."""
    non_blank = physical = 0
    for path in sorted(folder.rglob("*.py")):
        lines = path.read_text(encoding="utf-8").splitlines()
        physical += len(lines)
        non_blank += sum(1 for line in lines if line.strip())
    return non_blank, physical


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-ratio", type=float, default=None, help="exit 1 above this ratio")
    p.add_argument("--harness", type=Path, default=REPO / "benchmarks")
    p.add_argument("--package", type=Path, default=REPO / "mlip_unc")
    args = p.parse_args(argv)
    (bench, bench_phys), (pkg, pkg_phys) = count(args.harness), count(args.package)
    ratio = bench / pkg
    print(
        f"non-blank lines: {args.harness.name}/ {bench}, {args.package.name}/ {pkg}, "
        f"ratio {ratio:.3f} (physical: {bench_phys} / {pkg_phys} = {bench_phys / pkg_phys:.3f})"
    )
    if args.max_ratio is not None and ratio > args.max_ratio:
        print(f"above --max-ratio {args.max_ratio:g}: {bench - int(args.max_ratio * pkg)} too many")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
