"""The shipped Grafana dashboard is what tests/tools/dashboard.py generates, and every query reads metrics the nodes
write (their queries run against a real Prometheus in molecule/switch_metrics)."""

from __future__ import annotations

import re
import sys

from conftest import REPO

from ansible_collections.gpufleet.serving.plugins.module_utils._node import metrics

sys.path.insert(0, str(REPO / "tests" / "tools"))
import dashboard  # noqa: E402


def test_the_shipped_dashboard_is_generated_from_code():
    assert (REPO / "roles" / "monitoring" / "files" / "gpufleet-serving.json").read_text() == dashboard.render(), (
        "run python tests/tools/dashboard.py")


def test_every_panel_queries_metrics_the_nodes_write():
    written = {metrics.PREFIX + name for name, _kind, _labels, _text in metrics.METRICS}
    panels = dashboard.build()["panels"]
    assert len(panels) == 5 and all(panel["targets"] for panel in panels)
    for expr in dashboard.queries():
        assert set(re.findall(r"gpufleet_\w+", expr)) <= written, expr
