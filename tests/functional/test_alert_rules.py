"""The alert rules the collection ships (roles/monitoring/files): promtool checks them and runs their unit tests
(tests/prometheus), and every alert has a case where it fires."""

from __future__ import annotations

import shutil
import subprocess

import yaml
from conftest import REPO

RULES = REPO / "roles" / "monitoring" / "files" / "gpufleet-serving.rules.yml"
# minutes-long cases at a 1m evaluation interval, days-long ones at 1h (each file has one interval)
TESTS = sorted((REPO / "tests" / "prometheus").glob("*.test.yml"))


def promtool(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("promtool")
    assert binary, "promtool is missing: `make setup` installs Debian's prometheus package, which has it"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=120, check=False)


def test_the_rules_are_valid_and_their_unit_tests_pass():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", *map(str, TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_case_where_it_fires():
    alerts = {rule["alert"] for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"] if "alert" in rule}
    fired = {case["alertname"] for path in TESTS for test in yaml.safe_load(path.read_text())["tests"]
             for case in test.get("alert_rule_test") or [] if case.get("exp_alerts")}
    assert alerts == fired
    assert len(alerts) == 7
