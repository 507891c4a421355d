"""The fleet benchmark's table, plot and 1,000-node projection, from its results (tests/bench/bench_fleet.py).

    python tests/bench/fleet_report.py RESULT.json [--before BEFORE.json] [--svg docs/images/fleet_scale.svg]

Prints the Markdown section (docs/benchmarks.md's "Fleet scaling") and writes the plot: controller CPU seconds per node
against the fleet's size, one line per playbook (dashed: the same playbook before, when given).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

KINDS = (("cleanup", "gpu_cleanup.yml, engines running", "#2f80ed"), ("cleanup_idle", "gpu_cleanup.yml, nothing to stop", "#56ccf2"),
         ("check", "switch_engine.yml --check", "#f2994a"), ("switch", "switch_engine.yml, rolling (1, 10 %)", "#27ae60"))


def kind(row: dict) -> str | None:
    """A default-settings row's kind (forks 25, pipelining, linear strategy); None for the variants."""
    if row["forks"] != 25 or not row["pipelining"] or row.get("mitogen"):
        return None
    if row["playbook"] == "gpu_cleanup.yml":
        return "cleanup" if row.get("engines_stopped") else "cleanup_idle"
    return "check" if "--check" in row["args"] else "switch"


def series(runs: list[dict]) -> dict[str, dict[int, dict]]:
    found: dict[str, dict[int, dict]] = {}
    for row in runs:
        name = kind(row)
        if name and row["ok"]:
            found.setdefault(name, {}).setdefault(row["nodes"], row)  # the first of its size (the switch to vLLM)
    return found


def slope(points: dict[int, dict], key: str = "cpu_s") -> float | None:
    """Controller seconds each node adds, from the two largest sizes."""
    sizes = sorted(points)
    if len(sizes) < 2:
        return None
    small, large = sizes[-2], sizes[-1]
    return (points[large][key] - points[small][key]) / (large - small)


def svg(after: dict, before: dict, path: Path) -> None:
    width, height, left, bottom, top, right = 720, 360, 60, 40, 20, 230
    sizes = sorted({n for points in after.values() for n in points} | {n for points in before.values() for n in points})
    peak = max([row["cpu_per_node_s"] for points in [*after.values(), *before.values()] for row in points.values()] + [0.5])

    def x(n: int) -> float:
        return left + (width - left - right) * (sizes.index(n) / max(1, len(sizes) - 1))

    def y(value: float) -> float:
        return height - bottom - (height - bottom - top) * value / peak

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">',
             '<rect width="100%" height="100%" fill="white"/>',
             f'<line x1="{left}" y1="{height - bottom}" x2="{width - right}" y2="{height - bottom}" stroke="#333"/>',
             f'<line x1="{left}" y1="{top}" x2="{left}" y2="{height - bottom}" stroke="#333"/>',
             f'<text x="{left}" y="{height - 8}">nodes</text>',
             f'<text x="6" y="{top + 4}" transform="rotate(-90 14 {top + 60})">controller CPU s per node</text>']
    for n in sizes:
        parts.append(f'<text x="{x(n) - 8:.0f}" y="{height - bottom + 16}">{n}</text>')
    for step in range(0, 6):
        value = peak * step / 5
        parts.append(f'<text x="{left - 40}" y="{y(value) + 4:.0f}">{value:.1f}</text>')
        parts.append(f'<line x1="{left}" y1="{y(value):.0f}" x2="{width - right}" y2="{y(value):.0f}" stroke="#eee"/>')
    legend = 0
    for name, label, colour in KINDS:
        for points, dash, suffix in ((before.get(name), ' stroke-dasharray="5,4"', " (before)"), (after.get(name), "", "")):
            if not points:
                continue
            line = " ".join(f"{x(n):.0f},{y(points[n]['cpu_per_node_s']):.1f}" for n in sorted(points))
            parts.append(f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
            legend_y = top + 14 + 16 * legend
            parts.append(f'<line x1="{width - right + 10}" y1="{legend_y - 4}" x2="{width - right + 30}" y2="{legend_y - 4}" '
                         f'stroke="{colour}" stroke-width="2"{dash}/>')
            parts.append(f'<text x="{width - right + 34}" y="{legend_y}">{label}{suffix}</text>')
            legend += 1
    parts.append("</svg>")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(parts) + "\n")


def table(result: dict, before: dict | None) -> list[str]:
    lines = ["| playbook | nodes | forks | pipelining | strategy | wall s | controller CPU s | CPU s per node | largest process MiB | "
             "process tree PSS MiB |", "|---|---|---|---|---|---|---|---|---|---|"]
    for label, document in (("before", before), ("", result)):
        for row in (document or {}).get("runs", []):
            name = row["playbook"] + (" --check" if "--check" in row["args"] else " (rolling)" if row["playbook"] == "switch_engine.yml" else
                                      " (engines running)" if row.get("engines_stopped") else "")
            lines.append(f"| {label + ': ' if label else ''}{name} | {row['nodes']} | {row['forks']} | {'on' if row['pipelining'] else 'off'} | "
                         f"{'mitogen_linear' if row.get('mitogen') else 'linear'} | {row['wall_s']} | {row['cpu_s']} | {row['cpu_per_node_s']} | "
                         f"{row['largest_process_mib']} | {row['tree_pss_mib']}{'' if row['ok'] else ' FAILED'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("result", type=Path)
    parser.add_argument("--before", type=Path, action="append", default=[])
    parser.add_argument("--svg", type=Path)
    args = parser.parse_args()
    result = json.loads(args.result.read_text())
    before = {"runs": [row for path in args.before for row in json.loads(path.read_text())["runs"]]} if args.before else None
    after_series, before_series = series(result["runs"]), series((before or {}).get("runs", []))
    if args.svg:
        svg(after_series, before_series, args.svg)
    print("\n".join(table(result, before)))
    print()
    for name, label, _colour in KINDS:
        points = after_series.get(name)
        if points:
            per_node = slope(points)
            largest = max(points)
            projection = (points[largest]["cpu_s"] + per_node * (1000 - largest)) if per_node is not None else None
            print(f"- {label}: {points[largest]['cpu_per_node_s']} s per node at {largest} nodes"
                  + (f", {per_node:.3f} s each node adds; 1,000 nodes projected at {projection / 60:.1f} min of controller CPU"
                     f" ({projection / 60 / (result.get('cpu_count') or 1):.1f} min of wall on {result.get('cpu_count')} cores, CPU-bound)"
                     if per_node is not None else ""))


if __name__ == "__main__":
    main()
