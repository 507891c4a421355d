"""The teardown's side effects on a node (_teardown/node.py): what it asks of systemd, of the holders' kill and of the
memory check, with those three recorded - the plumbing its mutants showed untested (for real: test_node_teardown.py)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, CommandFailed
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._teardown import node as teardown_node


class Host:
    """The module's side: commands, binaries, warnings. systemctl answers each verb as ``answers`` says."""

    def __init__(self, answers: dict | None = None):
        self.answers = answers or {}
        self.warnings: list[str] = []
        self.asked_bins: list[tuple] = []

    def run_command(self, argv, environ_update=None):
        return self.answers.get(argv[1], (0, "", ""))

    def get_bin_path(self, name, required=False):
        self.asked_bins.append((name, required))
        return f"/usr/bin/{name}"

    def warn(self, message):
        self.warnings.append(message)

    def log(self, message):
        pass


PARAMS = {"journal_path": "", "run_id": "", "lease_owner": None, "kill_timeout": 30.0, "term_timeout": 20.0, "settle": 0.25,
          "gpus": [], "device_paths": ["/dev/nvidia*"], "protected": [], "max_targets": 64, "outside_units": "fail", "owners": [],
          "holders_kill_timeout": None, "incomplete_scan": "fail", "expected_gpu_count": 8, "max_used_mib": 512, "memory_timeout": 60.0}


def node(host=None, **overrides) -> teardown_node.TeardownNode:
    return teardown_node.TeardownNode(host or Host(), PARAMS | overrides, ProcReader(), nvml=None, caller="node_teardown")


def test_systemctl_is_required_and_the_journal_is_named_by_the_run_or_the_lease_owner():
    host = Host()
    assert node(host).journal.path is None and node(host).journal.run_id.startswith("node_teardown-")
    assert ("systemctl", True) in host.asked_bins
    assert node(run_id="run-7", lease_owner="owner-3").journal.run_id == "run-7"
    assert node(lease_owner="owner-3").journal.run_id == "owner-3"
    assert node(journal_path="/var/log/x/signals.jsonl").journal.path == "/var/log/x/signals.jsonl"


@pytest.fixture
def recorded(monkeypatch):
    asked = {}

    def kill_holders(request, *_args, **_kwargs):
        asked["holders"] = request
        return {"changed": False}

    def assert_free(request, _nvml):
        asked.setdefault("memory", []).append(request)
        if asked.get("busy"):
            raise CheckFailed("GPU 0 holds 900 MiB", gpus=[{"index": 0, "used_mib": 900}])
        return {"gpus": []}
    monkeypatch.setattr(teardown_node.holders_kill, "kill_holders", kill_holders)
    monkeypatch.setattr(teardown_node.memory, "assert_free", assert_free)
    return asked


def test_a_rollbacks_teardown_reports_another_users_holders_where_the_node_would_refuse_them(recorded):
    node().kill_holders(["vllm"], leave_foreign=True)
    assert recorded["holders"].outside_units == "report" and recorded["holders"].units == ("vllm.service",)
    node(outside_units="kill").kill_holders(["vllm"], leave_foreign=True)
    assert recorded["holders"].outside_units == "kill", "a node that kills them still kills them"
    node().decide(["vllm"], ("sglang.service",))
    assert recorded["holders"].outside_units == "fail" and recorded["holders"].kept_units == ("sglang.service",)


def test_the_holders_wait_after_sigkill_is_their_own_or_the_units(recorded):
    node().kill_holders(["vllm"])
    assert recorded["holders"].kill_timeout == 30.0
    node(holders_kill_timeout=5.0).kill_holders(["vllm"])
    assert recorded["holders"].kill_timeout == 5.0


def test_the_memory_before_is_a_reading_and_the_memory_after_a_verdict(recorded):
    recorded["busy"] = True
    assert node().memory(wait=False) == {"gpus": [{"index": 0, "used_mib": 900}], "msg": None}
    assert recorded["memory"][-1].timeout == 0, "the reading before waits for nothing"
    with pytest.raises(CheckFailed, match="GPU 0 holds 900 MiB"):
        node().memory(wait=True, left_pids=(7,))
    assert recorded["memory"][-1].timeout == 60.0 and recorded["memory"][-1].limits.left_pids == frozenset({7})
    assert recorded["memory"][-1].limits.v1_reserve_mib == 1024 and recorded["memory"][-1].limits.max_used_mib == 512


def test_a_unit_that_cannot_be_reset_or_read_is_a_warning_or_nothing_never_a_failure():
    host = Host({"reset-failed": (1, "", "Unit vllm.service not loaded.\n"), "show": (1, "", "Failed to connect to bus\n")})
    teardown = node(host)
    teardown.reset_failed(["vllm.service"])
    assert any("not loaded" in warning for warning in host.warnings)
    assert teardown.unit_properties("vllm.service") == {}
    with pytest.raises(CommandFailed):
        teardown.systemctl.show("vllm.service")


def test_units_are_stopped_for_real_as_they_are_asked_never_a_protected_one(monkeypatch):
    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Refused
    from ansible_collections.gpufleet.serving.plugins.module_utils._teardown.steps import TeardownFailed

    asked = {}

    def stop_units(requests, _systemctl, _reader, check_mode, *_args, **_kwargs):
        asked.update(requests=requests, check_mode=check_mode)
        return [{"unit": request.unit} for request in requests], asked.get("failures", [])
    monkeypatch.setattr(teardown_node.systemd_stop, "stop_units", stop_units)
    assert node().stop_units(["vllm"], 9.0) == {"results": [{"unit": "vllm.service"}]}
    (request,) = asked["requests"]
    assert asked["check_mode"] is False and request.stop_timeout == 9.0
    assert (request.must_exist, request.disable, request.stop_triggers, request.allow_protected) == (False, False, False, False)
    node(disable_units=True, stop_triggers=True).stop_units(["vllm"], 9.0)
    assert (asked["requests"][0].disable, asked["requests"][0].stop_triggers) == (True, True)
    with pytest.raises(Refused):
        node().stop_units(["ssh"], 9.0)
    asked["failures"] = ["vllm.service is deactivating after the stop"]
    with pytest.raises(TeardownFailed, match="vllm.service is deactivating") as raised:
        node().stop_units(["vllm"], 9.0)
    assert raised.value.context["units"] == {"results": [{"unit": "vllm.service"}]}


def test_a_plain_kill_follows_the_nodes_setting_for_another_users_holders(recorded):
    import json

    node(outside_units=json.loads('"fail"')).kill_holders(["vllm"])
    assert recorded["holders"].outside_units == "fail"
    node(outside_units=json.loads('"fail"')).kill_holders(["vllm"], leave_foreign=True)
    assert recorded["holders"].outside_units == "report", "the setting as read from the module's arguments, compared by value"
