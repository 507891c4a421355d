# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""A run's JSON report (docs/reports.md) as one self-contained HTML page: inline SVG and CSS, nothing fetched.

The page holds the rollout's timeline (a row per node, a bar per phase on one time axis, failures marked, the nodes
serving over time above it), the GPU grid (node x GPU, memory before and after, what held each GPU and what was
killed - in each cell's tooltip and in a list per node), the summary and the run's parameters. It stays legible from
3 nodes to hundreds: rows and labels shrink with the node count, long lists fold away.
"""

from __future__ import annotations

import html
from datetime import datetime

from ansible_collections.gpufleet.serving.plugins.module_utils import _results as results
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _reports

# phase -> (colour, label); the order is the legend's
PHASES = {
    "preflight": ("#9aa5b1", "preflight"),
    "prewarm": ("#c3cad3", "prewarm"),
    "stage": ("#d5dbe1", "stage"),
    "leave_rotation": ("#f0b429", "leave rotation"),
    "cutover": ("#4f4f4f", "cutover start"),
    "drain": ("#2f80ed", "drain"),
    "teardown": ("#eb5757", "teardown"),
    "bring_up": ("#27ae60", "bring-up"),
    "replace": ("#828282", "model replaced (in the downtime)"),
    "answer_check": ("#0b7285", "answer check"),
    "restart": ("#c92a2a", "cold restart (woken engine answered otherwise)"),
    "verify": ("#56ccf2", "verify"),
    "rollback": ("#9b51e0", "rollback"),
    "join_rotation": ("#f2c94c", "join rotation"),
    "soak": ("#b7e4c7", "soak (serving, watched)"),
}
QUIET_PHASES = ("lease", "discover", "backup", "plan", "boot")  # drawn thin and grey: bookkeeping, no disruption
FAILED_RESULTS = results.NOT_DONE
RESULT_COLOURS = {"switched": "#27ae60", "unchanged": "#6fcf97", "would_switch": "#2f80ed", "ok": "#27ae60",
                  "rolled_back": "#f2994a", "preflight_failed": "#f2c94c", "rollback_failed": "#b00020", "failed": "#eb5757",
                  "unreachable": "#b00020", "not_reached": "#bdbdbd"}
ROW_MARK = "#0b1f33"  # the timeline's per-node strip; no other element of the page has this colour
DIRTY_STROKE = ' stroke="#b00020" stroke-width="1.5"'
WIDTH = 1180
LABEL_WIDTH = 150
CSS = """
body{font:13px/1.4 system-ui,-apple-system,'Segoe UI',sans-serif;margin:16px 24px;color:#1f2933;background:#fff}
h1{font-size:20px;margin:0 0 4px}h2{font-size:16px;margin:22px 0 6px}
.meta{color:#52606d;margin-bottom:10px}.meta b{color:#1f2933}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #d9e2ec;padding:2px 8px;text-align:left;vertical-align:top}
th{background:#f0f4f8}.num{text-align:right}.bad{color:#b00020;font-weight:600}
.legend span{display:inline-block;margin-right:14px}.legend i{display:inline-block;width:12px;height:12px;margin-right:4px;vertical-align:-1px}
details{margin:2px 0}summary{cursor:pointer}svg text{font-family:system-ui,sans-serif}
"""


def _e(value) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _epoch(value) -> float | None:
    if value in (None, ""):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return None


def _row_height(count: int) -> int:
    return 20 if count <= 30 else 12 if count <= 80 else 7


def _page(title: str, body: list[str]) -> str:
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>" + _e(title) + "</title>"
            "<style>" + CSS + "</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


# --- the timeline -------------------------------------------------------------------------------------------------------
def _order(hosts: dict) -> list[str]:
    def first_start(name):
        phases = hosts[name].get("phases") or []
        return (phases[0]["start"] if phases else float("inf"), name)
    return sorted(hosts, key=first_start)


def timeline(document: dict) -> str:
    """SVG: the nodes serving over time, then a row per node with a bar per phase."""
    hosts = document.get("hosts") or {}
    names = _order(hosts)
    starts = [phase["start"] for report in hosts.values() for phase in report.get("phases") or []]
    ends = [phase["start"] + phase["seconds"] for report in hosts.values() for phase in report.get("phases") or []]
    if not starts:
        return "<p>No node ran a phase in this run (nothing to draw).</p>"
    origin = min(starts)
    span = max(max(ends) - origin, 1.0)
    plot = WIDTH - LABEL_WIDTH - 20
    row = _row_height(len(names))
    font = max(7, min(12, row - 6))
    serving_height = 60
    top = serving_height + 30
    height = top + row * len(names) + 24

    def x(seconds: float) -> float:
        return LABEL_WIDTH + plot * seconds / span

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" role="img" '
             f'aria-label="rollout timeline of {len(names)} nodes">']
    parts += _serving_curve(document, origin, span, x, serving_height)
    parts += _axis(span, x, top - 4, height - 20)
    for index, name in enumerate(names):
        report = hosts[name]
        y = top + index * row
        failed = report.get("result") in FAILED_RESULTS
        colour = RESULT_COLOURS.get(report.get("result"), "#1f2933")
        if index % 2:
            parts.append(f'<rect x="0" y="{y}" width="{WIDTH}" height="{row}" fill="#f7f9fb"/>')
        # a strip in a colour nothing else uses, one per node (the rendering test counts them), then the result's colour
        parts.append(f'<rect class="node" x="2" y="{y + 1}" width="3" height="{max(row - 2, 3)}" fill="{ROW_MARK}"/>')
        parts.append(f'<rect x="6" y="{y + 1}" width="5" height="{max(row - 2, 3)}" fill="{colour}">'
                     f'<title>{_e(name)}: {_e(report.get("result"))}</title></rect>')
        if row >= 10 or index % 10 == 0:  # a dense timeline names every tenth row; every bar names its node on hover
            parts.append(f'<text x="14" y="{y + row - (row - font) / 2 - 1:.1f}" font-size="{font}" '
                         f'fill="{"#b00020" if failed else "#1f2933"}">{_e(name)}</text>')
        out = report.get("out_of_rotation")
        if out and out[0] is not None:
            left, back = out[0] - origin, (out[1] if out[1] is not None else origin + span) - origin
            parts.append(f'<rect x="{x(left):.1f}" y="{y + 1}" width="{max(x(back) - x(left), 1):.1f}" height="{row - 2}" '
                         f'fill="none" stroke="#f0b429" stroke-dasharray="3 2"><title>{_e(name)}: out of rotation '
                         f'{back - left:.1f} s</title></rect>')
        for phase in report.get("phases") or []:
            start, seconds = phase["start"] - origin, phase["seconds"]
            colour, label = PHASES.get(phase["phase"], ("#d9e2ec", phase["phase"]))
            quiet = phase["phase"] in QUIET_PHASES
            bar_y, bar_h = (y + row / 2 - 1, 2) if quiet else (y + 2, max(row - 4, 2))
            # the stage bar says what staging the model did: fetched (bytes, rate), present, or why it failed
            detail = (" - " + _reports.stage_line(report["stage"], bool(report.get("plan")))) if phase["phase"] == "stage" and report.get("stage") else ""
            if phase["phase"] in ("answer_check", "restart"):
                # what the answers were judged against, and the first difference when they were wrong
                detail = " - " + "; ".join(_reports.answer_lines(report))
            parts.append(f'<rect x="{x(start):.1f}" y="{bar_y:.1f}" width="{max(x(start + seconds) - x(start), 1):.1f}" '
                         f'height="{bar_h}" fill="{colour}"><title>{_e(name)}: {_e(label)} {seconds:.1f} s{_e(detail)}</title></rect>')
        if failed:
            parts.append(_failure_mark(report, name, origin, x, y, row))
    parts.append("</svg>")
    legend = "".join(f'<span><i style="background:{colour}"></i>{_e(label)}</span>' for colour, label in PHASES.values())
    legend += '<span><i style="border:1px dashed #f0b429"></i>out of rotation</span><span><b style="color:#b00020">&#10007;</b> failed</span>'
    return f'<div class="legend">{legend}</div>\n' + "".join(parts)


def _failure_mark(report: dict, name: str, origin: float, x, y: float, row: int) -> str:
    phases = {phase["phase"]: phase for phase in report.get("phases") or []}
    phase = phases.get(report.get("failed_phase")) or (list(phases.values())[-1] if phases else None)
    at = x(phase["start"] + phase["seconds"] - origin) if phase else x(0)
    reason = f'{name}: {report.get("result")} at {report.get("failed_phase")}: {report.get("reason") or ""}'
    if report.get("rollback_error"):
        reason += f'; ROLLBACK FAILED, NO ENGINE IS SERVING: {report["rollback_error"]}'
    return (f'<text x="{at + 2:.1f}" y="{y + row - 2}" font-size="{max(row, 8)}" fill="#b00020" font-weight="700">&#10007;'
            f'<title>{_e(reason)}</title></text>')


def _serving_curve(document: dict, origin: float, span: float, x, height: int) -> list[str]:
    fleet = document.get("fleet") or {}
    series = fleet.get("serving") or []
    nodes = max(fleet.get("nodes") or 0, max((count for _t, count in series), default=0), 1)
    started = _epoch(document.get("started")) or origin
    offset = started - origin  # the series counts from the run's start, the axis from the first phase
    parts = [f'<text x="4" y="14" font-size="12" fill="#52606d">serving (of {nodes})</text>',
             f'<line x1="{LABEL_WIDTH}" y1="{height}" x2="{WIDTH - 20}" y2="{height}" stroke="#cbd2d9"/>']
    if not series:
        return parts
    points = []
    level = None
    for seconds, count in series:
        at = min(max(seconds + offset, 0), span)
        y = height - (height - 18) * count / nodes
        if level is not None:
            points.append(f"{x(at):.1f},{level:.1f}")
        points.append(f"{x(at):.1f},{y:.1f}")
        level = y
    points.append(f"{x(span):.1f},{level:.1f}")
    minimum = fleet.get("min_serving")
    parts.append(f'<polyline points="{" ".join(points)}" fill="none" stroke="#2f80ed" stroke-width="2">'
                 f'<title>nodes serving; fewest {minimum} of {nodes}</title></polyline>')
    parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{height - (height - 18) + 4}" font-size="10" text-anchor="end" fill="#52606d">{nodes}</text>')
    parts.append(f'<text x="{LABEL_WIDTH - 6}" y="{height}" font-size="10" text-anchor="end" fill="#52606d">0</text>')
    return parts


def _axis(span: float, x, top: float, bottom: float) -> list[str]:
    step = next(step for step in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 86400) if span / step <= 12)
    parts = []
    tick = 0
    while tick <= span:
        parts.append(f'<line x1="{x(tick):.1f}" y1="{top}" x2="{x(tick):.1f}" y2="{bottom}" stroke="#e4e7eb"/>')
        label = f"{tick // 60}m{tick % 60:02d}s" if span >= 120 else f"{tick}s"
        parts.append(f'<text x="{x(tick):.1f}" y="{bottom + 14}" font-size="10" text-anchor="middle" fill="#52606d">{label}</text>')
        tick += step
    return parts


# --- the GPU grid -------------------------------------------------------------------------------------------------------
def _processes(report: dict) -> list[tuple[str, dict]]:
    found = [("terminated", p) for p in report.get("terminated") or []] + [("killed", p) for p in report.get("killed") or []]
    for unit in report.get("units") or []:  # a cleanup report keeps each unit's processes apart
        found += [("terminated", p) for p in unit.get("terminated") or []] + [("killed", p) for p in unit.get("killed") or []]
    return found


def gpu_grid(document: dict) -> str:
    """SVG: node x GPU, each cell's left half the memory before, its right half after; tooltips name the holders."""
    hosts = document.get("hosts") or {}
    names = sorted(hosts)
    gpus = sorted({gpu["index"] for report in hosts.values() for key in ("memory_before", "memory_after")
                   for gpu in report.get(key) or [] if gpu.get("index") is not None})
    if not gpus:
        return "<p>No GPU was measured in this run (check mode, or no node reached its teardown).</p>"
    highest = max([gpu.get("used_mib") or 0 for report in hosts.values() for key in ("memory_before", "memory_after")
                   for gpu in report.get(key) or []] + [1])
    row = _row_height(len(names))
    cell = max(min(36, (WIDTH - LABEL_WIDTH - 20) // len(gpus)), 8)
    height = 24 + row * len(names)
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{LABEL_WIDTH + cell * len(gpus) + 20}" height="{height}" role="img" '
             f'aria-label="GPU memory of {len(names)} nodes">']
    for column, index in enumerate(gpus):
        parts.append(f'<text x="{LABEL_WIDTH + column * cell + cell / 2}" y="14" font-size="10" text-anchor="middle" fill="#52606d">{index}</text>')
    font = max(7, min(12, row - 6))
    for line, name in enumerate(names):
        report = hosts[name]
        y = 20 + line * row
        if row >= 10:
            parts.append(f'<text x="4" y="{y + row - (row - font) / 2 - 1:.1f}" font-size="{font}">{_e(name)}</text>')
        before = {gpu["index"]: gpu for gpu in report.get("memory_before") or []}
        after = {gpu["index"]: gpu for gpu in report.get("memory_after") or []}
        holders = {}
        for kind, process in _processes(report):
            for index in process.get("gpus") or []:
                holders.setdefault(index, []).append(f'{kind} {process.get("pid")} {process.get("comm") or ""}')
        for column, index in enumerate(gpus):
            left = LABEL_WIDTH + column * cell
            tip = (f'{name} GPU {index}: before {_mib(before.get(index))}, after {_mib(after.get(index))}'
                   + (f'; {"; ".join(holders[index][:8])}' + (" ..." if len(holders[index]) > 8 else "") if index in holders else ""))
            parts.append(f'<g><title>{_e(tip)}</title>'
                         f'<rect x="{left}" y="{y + 1}" width="{cell / 2:.1f}" height="{row - 2}" fill="{_heat(before.get(index), highest)}"/>'
                         f'<rect x="{left + cell / 2:.1f}" y="{y + 1}" width="{cell / 2 - 1:.1f}" height="{row - 2}" fill="{_heat(after.get(index), highest)}"'
                         f'{DIRTY_STROKE if after.get(index, {}).get("clean") is False else ""}/></g>')
    parts.append("</svg>")
    legend = ('<div class="legend"><span>each cell: <b>left</b> before, <b>right</b> after the teardown</span>'
              f'<span><i style="background:{_heat({"used_mib": 0}, 1)}"></i>free</span>'
              f'<span><i style="background:{_heat({"used_mib": highest}, highest)}"></i>{highest} MiB used</span>'
              '<span><i style="background:#eceff1"></i>not measured</span>'
              '<span><i style="border:1.5px solid #b00020"></i>over the threshold after</span></div>')
    return legend + "".join(parts)


def _mib(gpu: dict | None) -> str:
    return "not measured" if not gpu or gpu.get("used_mib") is None else f'{gpu["used_mib"]} MiB'


def _heat(gpu: dict | None, highest: int) -> str:
    """White-green (free) to deep red (the most used in this run); grey when not measured."""
    if not gpu or gpu.get("used_mib") is None:
        return "#eceff1"
    share = min(max(gpu["used_mib"] / highest, 0.0), 1.0)
    if share < 0.01:
        return "#d5f5e3"
    red, green, blue = int(255 - 80 * share), int(214 - 190 * share), int(170 - 150 * share)
    return f"#{red:02x}{green:02x}{blue:02x}"


# --- tables -------------------------------------------------------------------------------------------------------------
def _table(headers: list[str], rows: list[list]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cell if str(cell).startswith("<td") else f"<td>{_e(cell)}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _summary(document: dict) -> str:
    summary = document.get("summary") or {}
    counts = [[key, f'<td class="num">{value}</td>'] for key, value in summary.items() if value or key == "hosts"]
    return _table(["result", "nodes"], counts)


def _parameters(document: dict) -> str:
    rows = [["playbook", document.get("playbook")], ["run", document.get("run_id")], ["started", document.get("started")],
            ["finished", document.get("finished")], ["check mode", document.get("check_mode")]]
    if document.get("target"):
        rows.insert(1, ["target", document.get("target")])
    rows += [[key, value] for key, value in sorted((document.get("parameters") or {}).items())]
    return _table(["parameter", "value"], rows)


def _host_rows(document: dict) -> str:
    hosts = document.get("hosts") or {}
    switch = document.get("playbook") == "switch_engine"
    rows = []
    for name in sorted(hosts):
        report = hosts[name]
        result = report.get("result")
        cell = f'<td class="{"bad" if result in FAILED_RESULTS else ""}">{_e(result)}</td>'
        processes = _processes(report)
        folded = ""
        if processes or report.get("protected") or report.get("outside"):
            lines = [f'{kind} {p.get("pid")} {p.get("comm") or ""} ({p.get("unit") or "no unit"}) GPUs {p.get("gpus") or "-"}'
                     for kind, p in processes]
            lines += [f'protected {p.get("pid")} {p.get("comm")} ({p.get("reason")})' for p in report.get("protected") or []]
            lines += [f'left running {p.get("pid")} {p.get("comm")} in {p.get("unit") or "no unit"} ({p.get("placement")})'
                      for p in report.get("outside") or []]
            folded = f'<details><summary>{len(lines)} process(es)</summary>{"<br>".join(_e(line) for line in lines)}</details>'
        reason = report.get("reason") or ""
        if report.get("rollback_error"):
            reason += f" ROLLBACK FAILED, NO ENGINE IS SERVING: {report['rollback_error']}"
        if switch:
            downtime = "-" if report.get("downtime_s") is None else f'{report["downtime_s"]:.1f}'
            start = report.get("wake_s") if report.get("wake_s") is not None else report.get("engine_start_s")
            start_cell = "-" if start is None else f'{start:.1f}' + (" (wake)" if report.get("wake_s") is not None else "")
            rows.append([name, cell, f'{_reports.engine_label(report, "from")} -> {_reports.engine_label(report, "to")}', f'<td class="num">{downtime}</td>',
                         f'<td class="num">{_e(start_cell)}</td>', _parked_cell(report), report.get("failed_phase") or "", reason,
                         f"<td>{folded}</td>"])
        else:
            stopped = ", ".join(unit.get("unit") for unit in report.get("units") or [] if unit.get("changed"))
            rows.append([name, cell, stopped or "-", reason, f"<td>{folded}</td>"])
    headers = (["node", "result", "engine", "downtime s", "engine start s", "parked", "failed phase", "reason", "processes"] if switch
               else ["node", "result", "units stopped", "reason", "processes"])
    table = _table(headers, rows)
    return table if len(rows) <= 40 else f"<details><summary>every node ({len(rows)})</summary>{table}</details>"


def _parked_cell(report: dict) -> str:
    """The engine parked on the node: engine and model, its host memory, what it keeps on the GPUs (or the park that
    this run did not make, and why)."""
    parked = report.get("parked")
    if parked:
        left = parked.get("leftover_mib") or {}
        return (f'{parked.get("engine")} ({parked.get("model")}), {(parked.get("host_memory_bytes") or 0) / 2**30:.1f} GiB host, '
                f'{max(left.values()) if left else 0} MiB x {len(left)} GPU(s)')
    decision = report.get("park") or report.get("standby") or {}  # a report written before 55 has only standby
    if decision.get("mode") not in (None, "off") and decision.get("reason"):
        return f'none (not parked: {decision["reason"]})'
    return "-"


def page(document: dict) -> str:
    """The whole page for a switch_engine or gpu_cleanup document."""
    switch = document.get("playbook") == "switch_engine"
    title = (f'switch to {document.get("target")}' if switch else "GPU cleanup") + f' - {len(document.get("hosts") or {})} node(s)'
    fleet = document.get("fleet") or {}
    meta = [f'<b>{_e(document.get("started"))}</b> to <b>{_e(document.get("finished"))}</b>']
    if switch and fleet:
        meta.append(f'serving at start {fleet.get("serving_at_start")}, fewest {fleet.get("min_serving")}, at end {fleet.get("serving_at_end")} '
                    f'of {fleet.get("nodes")}')
    if document.get("check_mode"):
        meta.append("<b>check mode</b>: a plan, nothing was changed")
    body = [f"<h1>{_e(title)}</h1>", f'<div class="meta">{" &middot; ".join(meta)}</div>', _summary(document)]
    if switch:
        body += ["<h2>Timeline</h2>", timeline(document)]
    body += ["<h2>GPUs</h2>", gpu_grid(document), "<h2>Nodes</h2>", _host_rows(document), "<h2>Parameters</h2>", _parameters(document)]
    return _page(f"gpufleet.serving: {title}", body)
