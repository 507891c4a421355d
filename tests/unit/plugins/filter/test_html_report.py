"""The run reports as HTML pages (plugins/plugin_utils/_html_report.py), from report documents."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from ansible_collections.gpufleet.serving.plugins.filter.reports import FilterModule
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _html_report, _reports

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tests" / "tools"))

import report_example  # noqa: E402
from test_reports import teardown_steps  # noqa: E402


@pytest.fixture(scope="module")
def fleet_of_200() -> dict:
    return report_example.document(200)


def cleanup_document() -> dict:
    hosts = {"node1": _reports.teardown_host_report(teardown_steps()),
             "node2": dict(_reports.teardown_host_report({**teardown_steps(), "failed_step": "Assert memory",
                                                          "failure": {"msg": "GPU 0 <b>still</b> used"}}))}
    return _reports.teardown_run_report(hosts, {"check_mode": False, "started": 1796100000, "finished": 1796100030,
                                                "parameters": {"hosts": "gpu_nodes", "limit": None, "max_fail_percentage": 100}})


def test_the_page_is_one_file_that_fetches_nothing(fleet_of_200):
    page = _html_report.page(fleet_of_200)
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<(script|link|img|iframe|object)\b", page)
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page) and "url(" not in page and "@import" not in page
    assert re.findall(r"https?://[^\s\"'<]+", page) == ["http://www.w3.org/2000/svg"] * page.count("<svg ")  # the SVG namespace only


def test_the_timeline_has_a_row_per_node_and_marks_every_failure(fleet_of_200):
    page = _html_report.page(fleet_of_200)
    assert page.count(f'fill="{_html_report.ROW_MARK}"') == 200
    failed = {name for name, report in fleet_of_200["hosts"].items() if report["result"] in _html_report.FAILED_RESULTS}
    assert len(failed) == 4  # two rollbacks, a failed preflight, an unreachable node
    for name in failed:
        reason = fleet_of_200["hosts"][name]["reason"]
        assert re.search(rf"&#10007;<title>{re.escape(name)}: \w+ at \w+: {re.escape(reason)}", page)
    # one bar per phase that ran, on one axis, with its node and seconds on hover
    bars = sum(len(report["phases"]) for report in fleet_of_200["hosts"].values())
    assert len(re.findall(r"<rect [^>]*><title>gpu-\d+: (?!out of rotation)[\w -]+ \d+\.\d s</title></rect>", page)) == bars
    # and the time out of rotation, dashed around the bars, for each node that left it
    assert page.count(": out of rotation ") == sum(1 for report in fleet_of_200["hosts"].values() if report["out_of_rotation"])
    # the nodes serving over time: one step line from the fleet series
    assert page.count("<polyline ") == 1 and "fewest 150 of 200" in page


def test_the_gpu_grid_has_a_cell_per_node_and_gpu_naming_before_after_and_the_holders(fleet_of_200):
    page = _html_report.page(fleet_of_200)
    cells = re.findall(r"<g><title>(gpu-\d+) GPU (\d+): before ([^,]+), after ([^;<]+)(;[^<]*)?</title>", page)
    assert len(cells) == 200 * 8
    first = next(cell for cell in cells if cell[0] == "gpu-001" and cell[1] == "7")
    assert first[2].endswith("MiB") and first[3] == "0 MiB" and "killed 40007 VLLM::Worker_TP7" in first[4]
    skipped = [cell for cell in cells if cell[0] == "gpu-042"]  # the failed preflight never reached its teardown
    assert {cell[2] for cell in skipped} == {"not measured"}


def test_a_small_run_is_labelled_row_by_row_and_a_large_one_every_tenth_row(fleet_of_200):
    small = _html_report.page(report_example.document(3))
    assert all(f">gpu-00{index}</text>" in small for index in (1, 2, 3))
    large = _html_report.page(fleet_of_200)
    labels = re.findall(r'font-size="7"[^>]*>(gpu-\d+)</text>', large)
    assert len(labels) == 20 and labels[0] == "gpu-001"  # rows go by start time: the canary first


def test_the_cleanup_page_has_the_grid_summary_and_parameters_and_escapes_what_it_shows():
    page = FilterModule().filters()["report_html"](cleanup_document())
    assert "<h1>GPU cleanup - 2 node(s)</h1>" in page and "Timeline" not in page
    assert "GPU 0 &lt;b&gt;still&lt;/b&gt; used" in page and "<b>still</b>" not in page
    assert "protected 7 nvidia-persiste (protected name nvidia-persistenced)" in page
    assert "left running 8 python3 in session-4.scope (session)" in page
    assert re.search(r"<td>max_fail_percentage</td><td>100</td>", page)


def test_a_check_mode_run_says_so_and_draws_no_gpu_it_did_not_measure():
    document = report_example.document(3)
    document["check_mode"] = True
    for report in document["hosts"].values():
        report["memory_before"], report["memory_after"] = [], []
    page = _html_report.page(document)
    assert "<b>check mode</b>: a plan, nothing was changed" in page and "No GPU was measured in this run" in page
