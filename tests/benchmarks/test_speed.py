"""benchmarks/speed/suite.py: the timing bookkeeping (known values), the part merge and the report."""

import json

import pytest

from benchmarks.speed import suite as speed


def _row(speed, model, system, row, ms):
    r = speed.Row(model, system, 9, row, lambda: None)
    r.ms = list(ms)
    return r


def test_ratios_are_to_the_same_groups_e_plus_f():
    rows = [
        _row(speed, "gin", "a", "E+F", [10, 20, 30]),
        _row(speed, "gin", "a", "E+F+exact", [40, 40, 90]),
        _row(speed, "gin", "b", "E+F", [5, 5, 5]),
        _row(speed, "gin", "b", "committee5", [25, 30, 20]),
    ]
    out = {(e["system"], e["row"]): e for e in speed.summarise(rows)}
    assert out["a", "E+F"]["ratio"] == 1.0 and out["a", "E+F"]["ratio_paired"] == 1.0
    assert out["a", "E+F+exact"]["ms_median"] == 40 and out["a", "E+F+exact"][
        "ratio"
    ] == pytest.approx(2.0)
    assert out["a", "E+F+exact"]["ratio_paired"] == pytest.approx(3.0)  # median of 4, 2, 3
    assert out["b", "committee5"]["ratio"] == pytest.approx(5.0)  # not divided by group a's E+F
    assert (
        out["a", "E+F+exact"]["ms_q25"] == pytest.approx(40.0)
        and out["a", "E+F+exact"]["repeats"] == 3
    )


def test_every_row_is_timed_once_per_round_in_rotated_order():
    calls = []
    rows = [speed.Row("m", "s", 1, name, (lambda n=name: calls.append(n))) for name in "abc"]
    speed.time_rows(rows, repeats=4, warmup=2)
    assert calls[:6] == ["a", "a", "b", "b", "c", "c"]  # warm-up, untimed
    rounds = [calls[6 + 3 * k : 9 + 3 * k] for k in range(4)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds) and len({tuple(r) for r in rounds}) > 1
    assert all(len(r.ms) == 4 for r in rows)


def _entry(model_rows, command):
    meta = {
        "command": command,
        "python": "py",
        "started": "t0",
        "finished": "t1",
        "load_avg_start": [1, 1, 1],
        "load_avg_end": [2, 2, 2],
        "threads": 1,
        "repeats": 3,
        "warmup": 1,
        "versions": {},
        "weights": "untrained",
        "quick": False,
        "systems": {"s": {"formula": "H2", "source": "x", "periodic": False, "n_atoms": 2}},
        "skipped": {},
    }
    calls = [
        {
            "model": m,
            "system": "s",
            "n_atoms": 2,
            "row": r,
            "ms_median": ms,
            "ms_q25": ms,
            "ms_q75": ms,
            "ratio": ratio,
            "ratio_paired": ratio,
            "repeats": 3,
        }
        for m, r, ms, ratio in model_rows
    ]
    return {"meta": meta, "calls": calls}


def test_parts_merge_and_render(tmp_path):
    path = tmp_path / "speed.json"
    main = _entry(
        [("equivariant", "E+F", 10.0, 1.0), ("equivariant", "E+F+exact", 50.0, 5.0)], "python main"
    )
    path.write_text(json.dumps(speed.merge(path, "main", main)))
    mace = _entry([("equivariant", "E+F", 12.0, 1.0), ("mace", "E+F", 30.0, 1.0)], "python mace")
    merged = speed.merge(path, "mace", mace)
    assert set(merged["parts"]) == {"main", "mace"} and merged["parts"]["main"] == main
    md = speed.setup.render(merged)
    assert "- Part `main` (status: complete): `python main`" in md
    assert "- Part `mace` (status: complete): `python mace`" in md
    lines = md.splitlines()
    header = next(line for line in lines if line.startswith("| part | model |"))
    assert header.split(" | ")[4:] == ["E+F ms", "E+F+exact", "x native equivariant E+F |"]
    assert "| main | equivariant | s | 2 | 10.00 | 5.00 |  |" in lines  # E+F ms, x E+F
    assert "| mace | mace | s | 2 | 30.00 |  | 2.50 |" in lines  # 30 / the native 12 ms
    assert md.index("| main | equivariant |") < md.index("## Run")  # the tables first
    (calls,) = speed.setup.tables(merged)  # every row, beside the page
    assert calls.name in md and len(calls.rows) == 4
    assert ["mace", "mace", "s", 2, "E+F", "30.00", "30.00-30.00", "1.00", "1.00", "2.50"] in [
        list(r) for r in calls.rows
    ]
