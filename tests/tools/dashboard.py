"""The Grafana dashboard the collection ships (roles/monitoring/files/gpufleet-serving.json), generated from code with
grafana-foundation-sdk rather than hand-edited: every panel's query is here, and tests run each against the lab's
Prometheus (molecule/switch_metrics). Run it to regenerate the file: python tests/tools/dashboard.py"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from grafana_foundation_sdk.builders import bargauge, dashboard, prometheus, table, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder

OUT = Path(__file__).resolve().parents[2] / "roles" / "monitoring" / "files" / "gpufleet-serving.json"

# (title, kind, unit, [(legend, PromQL)]): each panel's queries, in order
PANELS = [
    ("Nodes by engine and state", "table", "none",
     [("{{engine}} {{state}}", "count by (engine, state) (gpufleet_engine_info)")]),
    ("Last switch: time out of service per node", "bargauge", "s",
     [("{{instance}}", "gpufleet_last_switch_downtime_seconds")]),
    ("Rollbacks and refusals", "timeseries", "short",
     [("rollbacks", 'sum(increase(gpufleet_switches_total{result=~"rolled_back|rollback_failed"}[1h]))'),
      ("refused: {{reason}}", "sum by (reason) (increase(gpufleet_refusals_total[1h]))")]),
    ("GPU memory after the last teardown", "timeseries", "bytes",
     [("{{instance}} GPU {{gpu}}", "gpufleet_gpu_memory_used_bytes")]),
    ("Parked engines: host memory", "bargauge", "bytes",
     [("{{instance}} {{engine}}", "gpufleet_parked_engine_host_memory_bytes")]),
]
BUILDERS = {"table": table.Panel, "bargauge": bargauge.Panel, "timeseries": timeseries.Panel}


def build() -> dict:
    board = (dashboard.Dashboard("gpufleet.serving: engines on the GPU fleet").uid("gpufleet-serving").tags(["gpufleet", "vllm", "sglang"])
             .refresh("1m").time("now-24h", "now"))
    for title, kind, unit, queries in PANELS:
        panel = BUILDERS[kind]().title(title).unit(unit).height(8).span(12)
        for index, (legend, expr) in enumerate(queries):
            query = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + index))
            panel = panel.with_target(query.instant() if kind in ("table", "bargauge") else query)
        board = board.with_panel(panel)
    return json.loads(JSONEncoder(sort_keys=True, indent=2).encode(board.build()))


def queries() -> list[str]:
    return [expr for _title, _kind, _unit, panel in PANELS for _legend, expr in panel]


def render() -> str:
    return json.dumps(build(), indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT}", file=sys.stderr)
