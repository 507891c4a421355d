"""The HTML pages as a browser draws them: headless Chromium renders them to PNG, read back pixel by pixel."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "tools"))

import report_example  # noqa: E402
import report_png  # noqa: E402

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _html_report  # noqa: E402

pytestmark = pytest.mark.skipif(report_png.chromium() is None, reason="needs Debian's chromium (make setup installs it)")


@pytest.mark.parametrize("nodes", [3, 200])
def test_the_page_renders_one_row_per_node_and_is_not_blank(tmp_path, nodes):
    page = tmp_path / "switch_engine.html"
    page.write_text(_html_report.page(report_example.document(nodes)))
    picture = tmp_path / "switch_engine.png"
    height = 650 + (20 if nodes <= 30 else 7) * nodes
    report_png.render(page, picture, height, width=400)  # narrow: the strips are at the left, and a small picture reads fast
    seen = report_png.read_picture(picture)
    assert seen["node_rows"] == nodes
    assert seen["inked_share"] > 0.05 and seen["colours"] > 50


def test_a_blank_picture_is_told_apart(tmp_path):
    page = tmp_path / "blank.html"
    page.write_text("<!DOCTYPE html><html><body></body></html>")
    picture = tmp_path / "blank.png"
    report_png.render(page, picture, 300, width=300)
    seen = report_png.read_picture(picture)
    assert seen["node_rows"] == 0 and seen["inked_share"] < 0.01
