"""benchmarks/results stays a set of pages, not a model zoo: at most 10 MB in all."""

from __future__ import annotations

from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
BUDGET_BYTES = 10_000_000


def test_results_fit_the_budget():
    # checkpoints/ and dot-files (locks) are git-ignored run outputs, not results
    sizes = {
        p: p.stat().st_size
        for p in RESULTS.rglob("*")
        if p.is_file()
        and "checkpoints" not in p.relative_to(RESULTS).parts
        and not p.name.startswith(".")
    }
    total = sum(sizes.values())
    largest = sorted(sizes.items(), key=lambda kv: -kv[1])[:5]
    assert total <= BUDGET_BYTES, f"benchmarks/results holds {total:,} bytes; largest: {largest}"


def test_save_png_writes_a_small_palette_image(tmp_path):
    from matplotlib.figure import Figure
    from PIL import Image

    from benchmarks.common.figures import save_png

    fig = Figure(figsize=(4, 3))
    fig.subplots().plot([0, 1, 2], [0, 1, 4], "o-")
    path = save_png(fig, tmp_path / "f.png")
    image = Image.open(path)
    assert image.mode == "P" and image.size == (400, 300)
