"""The page section of part ``size`` (:mod:`benchmarks.speed.size_part`) of speed.md."""

from __future__ import annotations

from typing import Any

from benchmarks.common.format import fmt
from benchmarks.common.pages import rerun_command
from benchmarks.common.tables import Table

NOT_MEASURED = "not measured"
QUIET_LOAD = 0.5  # the issue's quiet machine: 1-min load average below this at the start


def _x(value: Any) -> str:
    return fmt(value) if value is not None else "n/a"


def _mib(value: Any) -> str:
    return f"{value:.0f}" if value is not None else "n/a"


def _by_key(group: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {rec["key"]: rec for rec in group["rows"]}


def _ratio_to_ours(group: dict[str, Any], key: str) -> str:
    rec = _by_key(group).get(key)
    return NOT_MEASURED if rec is None else _x(rec["x_ours_ef"])


def _within(*recs: dict[str, Any] | None, target: float = 2.0) -> str:
    """yes / no: every record at most ``target`` x ours E+F (n/a when one is missing)."""
    if any(r is None or r["x_ours_ef"] is None for r in recs):
        return "n/a"
    return "yes" if all(r["x_ours_ef"] <= target for r in recs) else "no"


def headline(entry: dict[str, Any]) -> list[str]:
    """The default σ_F mode in both orders against ours E+F, its floor, mace beside it."""
    default = entry["meta"]["default_mode"]
    lines = [
        f"### The default mode (`{default}`) against plain energy + forces",
        "",
        "| threads | system | atoms | ours E+F ms | default, README order | default, reverse order "
        "| <= 2x in both orders | floor (f + K b)/(f + b) | K | mace E+F | mace committee5 "
        "| default / mace E+F |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for g in entry["groups"]:
        rows = _by_key(g)
        ef, readme = rows.get("ours E+F"), rows.get(f"ours {default} README")
        reverse = rows.get(f"ours {default} reverse")
        lines.append(
            f"| {g['threads']} | {g['system']} | {g['n_atoms']} | "
            f"{fmt(ef['ms_median'], '{:.1f}') if ef else 'n/a'} | "
            f"{_ratio_to_ours(g, f'ours {default} README')} | "
            f"{_ratio_to_ours(g, f'ours {default} reverse')} | {_within(readme, reverse)} | "
            f"{_x(readme.get('floor')) if readme else 'n/a'} | "
            f"{readme['vectors'] if readme else 'n/a'} | "
            f"{_ratio_to_ours(g, 'mace E+F')} | {_ratio_to_ours(g, 'mace committee5')} | "
            f"{_x(readme['x_mace_ef']) if readme else 'n/a'} |"
        )
    return lines + [
        "",
        "Columns after the first E+F time are times x ours E+F of the same system, thread count "
        "and run (the last: x mace E+F); floor: what the method allows, one forward and K "
        "backward vectors against one forward and one backward; not measured: the reason is "
        "in the table of every row.",
        "",
    ]


ROWS_CSV, FLOOR_CSV, MD_CSV = "speed_size_rows.csv", "speed_size_floor.csv", "speed_size_md.csv"


def rows_table(entry: dict[str, Any]) -> Table:
    """Every row of every system at every thread count (a skipped row: its reason)."""
    table = Table(
        ROWS_CSV,
        (
            "threads", "system", "atoms", "row", "ms (median)", "IQR ms", "calls", "x ours E+F",
            "x mace E+F", "floor", "K", "peak MiB", "added MiB", "not measured",
        ),
    )  # fmt: skip
    default = entry["meta"]["default_mode"]
    for g in entry["groups"]:
        where = (g["threads"], g["system"], g["n_atoms"])
        for r in g["rows"]:
            label = r["key"] + (" (default)" if r["default"] and r["mode"] == default else "")
            table.rows.append(
                (
                    *where, label, f"{r['ms_median']:.1f}", f"{r['ms_q25']:.1f}-{r['ms_q75']:.1f}",
                    r["calls"], _x(r["x_ours_ef"]), _x(r["x_mace_ef"]), _x(r.get("floor")),
                    r["vectors"], _mib(r["peak_mib"]), _mib(r["added_mib"]), "",
                )
            )  # fmt: skip
        for key, why in g["skipped"].items():
            table.rows.append((*where, key, *[""] * 9, f"{NOT_MEASURED}: {why}"))
    return table


def floor_table(entry: dict[str, Any]) -> Table:
    """Graph, forward, one-vector and batched K-vector backward times per system."""
    table = Table(
        FLOOR_CSV,
        (
            "threads", "system", "atoms", "graph ms", "forward ms", "backward, 1 vector, ms",
            "batched backward of K vectors, ms (K)", "(f + b_K)/(f + b)",
        ),
    )  # fmt: skip
    for g in (g for g in entry["groups"] if g["floor_ms"]):
        t = g["floor_ms"]
        ks = sorted(int(name.split("_")[1]) for name in t if name.startswith("backward_"))
        f = t["graph"] + t["forward"]
        batched = "; ".join(f"{t[f'backward_{k}']:.1f} ({k})" for k in ks) or "n/a"
        measured = "; ".join(
            f"{(f + t[f'backward_{k}']) / (f + t['backward']):.2f} ({k})" for k in ks
        )
        table.rows.append(
            (
                g["threads"], g["system"], g["n_atoms"], f"{t['graph']:.1f}", f"{t['forward']:.1f}",
                f"{t['backward']:.1f}", batched, measured or "n/a",
            )
        )  # fmt: skip
    return table


def floor_note(entry: dict[str, Any]) -> list[str]:
    return [
        "f = graph build + forward (latents in the posterior's basis, what a call runs before its "
        "first backward); b = one backward vector; K = the backward vectors one call of the "
        "mode asks `torch.autograd.grad` for (counted during the timed calls: the mean forces "
        "and the σ directions); b_K = `mlip_unc.uncertainty.moments.linear_gradients` with K "
        "weight rows and the model's gradient method, as the modes run it (measured for "
        "K <= 64 where E+F takes under "
        f"{entry['meta']['settings']['warmup_below_s']:g} s: at 10,000 atoms only f and b, "
        "for time). The calculator's own work (conversions, σ from the gradients) is outside "
        "the floor.",
        "",
    ]


def md_table(entry: dict[str, Any]) -> Table:
    """MD throughput rows (ASE Langevin, 0.5 fs, σ read after every step)."""
    table = Table(
        MD_CSV,
        (
            "threads", "system", "atoms", "row", "steps", "steps/s", "time per step x ours E+F",
            "not measured",
        ),
    )  # fmt: skip
    for g in (g for g in entry["groups"] if g["md"]):
        for r in g["md"]:
            where = (g["threads"], g["system"], g["n_atoms"], r["row"])
            if "skipped" in r:
                table.rows.append((*where, "", "", "", f"{NOT_MEASURED}: {r['skipped']}"))
            else:
                table.rows.append(
                    (*where, r["steps"], f"{r['steps_per_s']:.2f}", _x(r.get("x_ours_ef_time")), "")
                )
    return table


def size_tables(entry: dict[str, Any]) -> list[Table]:
    """The part's tables of every row, kept beside the page."""
    return [rows_table(entry), floor_table(entry), md_table(entry)]


def size_limits(entry: dict[str, Any], prefix: str) -> list[str]:
    """Up to which size the rows ``prefix*`` were measured, per thread count and kind, and why
    not beyond (the first skip)."""
    out = []
    kinds = dict.fromkeys(g["kind"] for g in entry["groups"])
    for threads in entry["meta"]["threads"]:
        for kind in kinds:
            groups = [g for g in entry["groups"] if g["threads"] == threads and g["kind"] == kind]
            done = [
                g["n_atoms"] for g in groups if any(r["key"].startswith(prefix) for r in g["rows"])
            ]
            skipped = [
                (g["n_atoms"], why)
                for g in groups
                for k, why in g["skipped"].items()
                if k.startswith(prefix)
            ]
            text = f"measured up to {max(done)} atoms" if done else NOT_MEASURED
            if skipped:
                text += f"; at {skipped[0][0]} atoms {skipped[0][1]}"
            out.append(f"{kind}, {threads} thread(s): {text}")
    return out


def limits(entry: dict[str, Any]) -> list[str]:
    """The size limits of the exact mode (always stated), of the default mode and of the mace
    rows (where one of them was skipped)."""
    m = entry["meta"]
    width = m["posterior"]["width"]
    lines = [
        f"Exact mode (a reference: it scales as atoms x {width + 1} backward vectors, the "
        f"{m['posterior']['basis']} basis of width {width}): "
        + "; ".join(size_limits(entry, "ours exact"))
        + "."
    ]
    for prefix, label in (
        (f"ours {m['default_mode']} ", f"Default mode `{m['default_mode']}`"),
        ("mace E+F", "mace E+F"),
        ("mace committee5", "mace committee5"),
    ):
        if prefix.startswith("mace") and m["mace_missing"]:
            continue  # said once, in the models' note
        if any(k.startswith(prefix) for g in entry["groups"] for k in g["skipped"]):
            lines.append(f"{label}: " + "; ".join(size_limits(entry, prefix)) + ".")
    return lines


def notes(entry: dict[str, Any]) -> list[str]:
    m = entry["meta"]
    s = m["settings"]
    post = m["posterior"]
    return [
        'Rows: ours E+F = `UncertaintyCalculator(uncertainty="none")`, `get_forces()`; '
        f"ours <mode> = every mode of `UncertaintyMode` but `none` ({', '.join(m['modes'])}; "
        f"the calculator's default `{m['default_mode']}` marked), asked in the README's order "
        '(`get_forces()` then `get_property("max_force_std")`, `energy_std` for the energy '
        "mode) and in the reverse order; mace E+F / mace committee5 = mace-torch's "
        "`MACECalculator` on one / five untrained models (`get_forces()`; the committee then "
        "`forces_comm`, the members' forces whose spread is σ). On periodic systems every "
        "call also computes the stress (both calculators do).",
        "",
        "Timing: wall time of the `get_*` calls, each on a new structure (positions moved by "
        f"{1e-4:g} A), after one warm-up call when a call is predicted under "
        f"{s['warmup_below_s']:g} s; at most {s['repeats']} timed calls per row, fewer when "
        f"they would take over {s['row_budget_s']:g} s (at least one: at 10,000 atoms one "
        "call for most rows, so those medians are single calls; ours E+F and the default mode, "
        "which the <= 2x column reads, get a warm-up and at least "
        f"{s.get('verdict_calls', 1)} timed calls at every size, and up to "
        f"{s.get('verdict_repeats', s['repeats'])} within the budget); the rows of a system are "
        "timed in interleaved rounds, rotated, so load drifts hit all rows alike. A row is skipped "
        "where one call is predicted (its time and memory at the previous size, scaled by "
        f"the atom count) to take over {s['max_call_s']:g} s or to add more than "
        f"{s['memory_fraction']:g} x the memory available then.",
        "",
        *[line for text in limits(entry) for line in (text, "")],
        "Memory: peak resident set (VmHWM) of a row's first warm-up call (a row without a "
        "warm-up: its first timed call), reset before it through /proc/self/clear_refs after "
        "malloc_trim, so that each row's peak is its own in one process; peak = the process's "
        "(all models loaded), added = peak minus the resident set just before the call. The "
        "other timed calls run without this probe"
        + ("" if m.get("probe_untimed") else " (NOT in this run: every call was probed)")
        + ": a call after a heap trim faults its memory in again, which doubled the time of "
        "a 12-atom call of the default mode, and a user's MD loop does not trim."
        + ("" if m["memory_probe"] else " NOT AVAILABLE on this machine (n/a)."),
        "",
        "Models: untrained (the cost of a call does not depend on the weights' values): ours "
        "= the model section of configs/3bpa_equivariant.yaml over H C N O Cu with a random "
        f"full posterior ({post['basis']} basis, rank {post['rank']}, gradient method "
        f"{post['gradient_method']}); mace = mace-torch ScaleShiftMACE of the accuracy "
        "benchmark's sizes, float32."
        + (f" mace rows: {NOT_MEASURED} ({m['mace_missing']})." if m["mace_missing"] else ""),
        "",
        "Systems: "
        + "; ".join(f"{k}: {v['formula']} ({v['source']})" for k, v in m["systems"].items())
        + ".",
        "",
        f"GPU rows: {NOT_MEASURED} (this part runs on the CPU only).",
        "",
    ]


def run_lines(entry: dict[str, Any]) -> list[str]:
    m = entry["meta"]
    wall = m.get("wall_s")
    return [
        "### Run (part `size`)",
        "",
        f"- Command: `{rerun_command(m['command'])}`, with `{m['python']}`; status: {m.get('status', 'n/a')}",
        f"- Date: {m['started']} - {m.get('finished', 'unfinished')}"
        + (f"; wall time of the whole part {wall / 60:.1f} min" if wall else ""),
        f"- Machine: {m['cpu']}, {m['cpu_count']} CPUs; torch threads {m['threads']}; "
        f"load average (1, 5, 15 min) {m['load_avg_start']} at the start"
        + (
            f" ({m['load_avg_models_built']} once the models were built)"
            if "load_avg_models_built" in m
            else ""
        )
        + f", {m.get('load_avg_end', m.get('load_avg_last', 'n/a'))} at the end",
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in m["versions"].items()),
        "",
    ]


def render_size(entry: dict[str, Any]) -> list[str]:
    """Markdown lines of the part ``size`` section."""
    m = entry["meta"]
    lines = [
        "## Calculator cost from 10 to 10,000 atoms (part `size`)",
        "",
        "All rows from one process and one run"
        + (" (QUICK mode: tiny models and systems, not a measurement)" if m["quick"] else "")
        + f"; load average {m['load_avg_start']} at the start: "
        + (
            "a quiet machine (1-min load < 0.5)."
            if m["load_avg_start"][0] < QUIET_LOAD
            else f"NOT a quiet machine (1-min load >= {QUIET_LOAD:g}): the times are not a measurement."
        ),
        "",
    ]
    rows, floor, md = size_tables(entry)
    lines += headline(entry)
    lines += [
        "- " + rows.link("Every row, every thread count (times, ratios, floor, memory)"),
        "- " + floor.link("The floor: forward and backward times of our model"),
        "- " + md.link("MD throughput (ASE Langevin, 0.5 fs, σ read after every step)"),
        "",
        *floor_note(entry),
        *notes(entry),
        *run_lines(entry),
    ]
    return lines
