# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Controller-side report shaping: short per-host records and readable tables."""

from __future__ import annotations

CMDLINE_WIDTH = 60


def process_summary(process: dict) -> dict:
    cmdline = " ".join(process.get("cmdline") or []) or process.get("comm") or "?"
    summary = {"pid": process.get("pid"), "comm": process.get("comm"), "cmdline": cmdline, "gpus": process.get("gpus", []),
               "unit": process.get("unit")}
    if process.get("reason"):
        summary["reason"] = process["reason"]
    return summary


def unit_summary(result: dict) -> dict:
    before = (result.get("state_before") or {}).get("ActiveState")
    after = (result.get("state_after") or {}).get("ActiveState")
    return {"unit": result.get("unit"), "found": result.get("found"), "changed": bool(result.get("changed")),
            "before": before, "after": after, "escalated": bool(result.get("escalated")),
            "terminated": [process_summary(p) for p in result.get("terminated") or []],
            "killed": [process_summary(p) for p in result.get("killed") or []],
            "triggers_stopped": list(result.get("triggers_stopped") or []), "warnings": list(result.get("warnings") or []),
            "failed": bool(result.get("failed")), "msg": result.get("msg") if result.get("failed") else None}


def gpu_summary(gpu: dict) -> dict:
    return {"index": gpu.get("index"), "uuid": gpu.get("uuid"), "used_mib": gpu.get("used_mib"), "clean": gpu.get("clean")}


def _shorten(text: str, width: int = CMDLINE_WIDTH) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def _table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(cell)) for cell in column) for column in zip(headers, *rows)] if rows else [len(h) for h in headers]
    line = "  ".join(f"{{:<{width}}}" for width in widths)
    out = [line.format(*headers), line.format(*["-" * width for width in widths])]
    out += [line.format(*[str(cell) for cell in row]) for row in rows]
    return "\n".join(out)


def _memory(gpus: list[dict]) -> str:
    if not gpus:
        return "-"
    return " ".join(f"{gpu['index']}:{gpu['used_mib']}" for gpu in gpus)


def teardown_table(reports: dict) -> str:
    """One block per host: a summary row, then every process terminated or killed with its command line."""
    rows = []
    details = []
    for host in sorted(reports):
        report = reports[host] or {}
        units = report.get("units", [])
        stopped = [u["unit"] for u in units if u.get("changed")]
        row = [host, report.get("result", "unreached"), ",".join(stopped) or "-",
               len(report.get("terminated", [])) + sum(len(u.get("terminated", [])) for u in units),
               len(report.get("killed", [])) + sum(len(u.get("killed", [])) for u in units),
               len(report.get("protected", [])), _memory(report.get("memory_before", [])), _memory(report.get("memory_after", []))]
        rows.append(row)
        if report.get("result") == "failed":
            details.append(f"{host}: FAILED at '{report.get('failed_step')}': {report.get('reason')}")
        for unit in units:
            if unit.get("triggers_stopped"):
                details.append(f"{host}: {unit['unit']}: triggers stopped first: {', '.join(unit['triggers_stopped'])}")
            for kind in ("terminated", "killed"):
                for process in unit.get(kind, []):
                    details.append(f"{host}: {unit['unit']}: {kind} {process['pid']} {_shorten(process['cmdline'])}")
            for warning in unit.get("warnings", []):
                details.append(f"{host}: {unit['unit']}: warning: {warning}")
        verb = "would signal" if report.get("check_mode") else None
        for kind in ("terminated", "killed"):
            for process in report.get(kind, []):
                details.append(f"{host}: holder {kind} {process['pid']} {_shorten(process['cmdline'])}")
        if verb:
            for process in report.get("planned", []):
                details.append(f"{host}: {verb} {process['pid']} {_shorten(process['cmdline'])}")
        for process in report.get("protected", []):
            details.append(f"{host}: protected {process['pid']} {process.get('comm')} ({process.get('reason')})")
    headers = ["host", "result", "units stopped", "terminated", "killed", "protected", "MiB before (gpu:used)", "MiB after"]
    return _table(headers, rows) + ("\n\n" + "\n".join(details) if details else "")


def _seconds(value) -> str:
    return "-" if value is None else f"{float(value):.1f}"


def switch_table(reports: dict) -> str:
    """One row per host: from, to, result, rollback, durations; then the processes killed and failure reasons."""
    rows = []
    details = []
    for host in sorted(reports):
        report = reports[host] or {}
        durations = report.get("durations") or {}
        rows.append([host, report.get("from", "-"), report.get("to", "-"), report.get("result", "-"),
                     "yes" if report.get("rolled_back") else "no", _seconds(durations.get("drain")), _seconds(durations.get("teardown")),
                     _seconds(durations.get("bring_up")), _seconds(durations.get("total")), len(report.get("killed") or [])])
        if report.get("reason"):
            details.append(f"{host}: {report['result']}: {report['reason']}")
        if report.get("rollback_error"):
            details.append(f"{host}: ROLLBACK FAILED, NOTHING SERVES: {report['rollback_error']}")
        if report.get("recovered_lease"):
            details.append(f"{host}: took over the expired switch lease of {report['recovered_lease'].get('owner')}")
        for process in report.get("killed") or []:
            details.append(f"{host}: killed {process.get('pid')} {_shorten(process.get('cmdline') or '')}")
    headers = ["host", "from", "to", "result", "rolled back", "drain s", "teardown s", "bring-up s", "total s", "killed"]
    return _table(headers, rows) + ("\n\n" + "\n".join(details) if details else "")
