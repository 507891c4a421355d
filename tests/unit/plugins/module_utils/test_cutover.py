"""engine_cutover's orchestration over a recording NodeOps: the order of the steps, the stop bounds, the rollback,
the phase marks on a driven clock. The real steps are the module_utils the three teardown modules use (tested on real
processes and systemd elsewhere); this is what the cutover adds."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, CommandFailed, EngineExited, InvalidInput, Refused
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover, preflight

VLLM = cutover.Engine("vllm", "vllm.service", "http://127.0.0.1:8000", "m", ready_timeout=60)
SGLANG = cutover.Engine("sglang", "sglang.service", "http://127.0.0.1:30000", "m", ready_timeout=30)
UNITS = ["vllm.service", "sglang.service"]


class Clock:
    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


class Node(cutover.NodeOps):
    """Records each call; each step takes `cost` seconds of the driven clock; `failures` makes a step raise."""

    def __init__(self, clock, failures=None, drained=True, costs=None, left=()):
        self.clock, self.failures, self.drained = clock, dict(failures or {}), drained
        self.left = list(left)  # holders the holders step reports and leaves (outside_units=report)
        self.foreign = []  # another user's job that came during the cutover (outside_units=fail refuses it)
        self.costs = {"drain": 0.2, "stop_units": 0.3, "kill_holders": 0.05, "memory": 0.02, "start": 0.01, "wait_ready": 2.0, **(costs or {})}
        self.calls = []
        self.answers_by_unit, self.records = {}, {}
        self.ask_errors = {}  # unit -> errors its next asks raise, in order (the one after the last answers)
        self.said = {}  # unit -> the root cause its journal names
        self.ask_timeouts = []

    def _step(self, name, *args):
        self.calls.append((name, *args))
        self.clock.now += self.costs.get(name, 0.0)
        failure = self.failures.get((name, *args[:1])) or self.failures.get(name)
        if isinstance(failure, Exception):
            raise failure

    def preflight(self, request):
        self._step("preflight", request.engine)
        failures = list(self.failures.get("preflight_checks") or [])
        return {"passed": not failures, "failures": failures, "checks": [{"name": "model", "passed": not failures}], "gpus": [], "holders": {}}

    def write_files(self, wanted):
        self._step("write_files", tuple(wanted))
        return {"changed": True, "files": {name: ["content"] for name in wanted}, "reloaded": True}

    def prewarm(self, paths, timeout):
        self._step("prewarm", tuple(paths), timeout)
        return {"bytes": 1 << 30, "total_bytes": 1 << 30, "files": 2, "seconds": 0.4, "finished": True, "skipped_reason": None}

    def drain(self, engine, timeout):
        self._step("drain", engine.unit, timeout)
        return {"drained": self.drained, "answering": True, "running": 0 if self.drained else 3}

    def stop_units(self, units, stop_timeout):
        self._step("stop_units", tuple(units), stop_timeout)
        after = {"vllm.service": "failed"}
        return {"results": [{"unit": unit, "changed": unit in after, "state_after": {"ActiveState": after.get(unit, "inactive")}} for unit in units]}

    def kill_holders(self, units, kept=(), leave_foreign=False):
        self._step("kill_holders", tuple(units))
        if self.foreign and not leave_foreign:  # outside_units=fail: refused, nothing signalled
            raise Refused(f"1 process(es) hold the GPUs outside the units being stopped (pid {self.foreign[0]} of user alice)")
        left = self.left + (self.foreign if leave_foreign else [])
        return {"killed": [], "terminated": [], "targets": [], "outside": [{"pid": pid, "comm": "train.py"} for pid in left]}

    def memory(self, wait, left_pids=()):
        self._step("memory", wait)
        self.calls[-1] += (tuple(left_pids),) if left_pids else ()
        return {"gpus": [{"index": 0, "used_mib": 0 if wait else 70000, "clean": wait}], "passed": wait}

    def reset_failed(self, units):
        self._step("reset_failed", tuple(units))

    def restore(self, files):
        self._step("restore", tuple(item["dest"] for item in files))

    def start(self, unit):
        self._step("start", unit)

    def wait_ready(self, engine, timeout):
        self._step("wait_ready", engine.unit, timeout)
        return {"ready": True, "elapsed": self.costs["wait_ready"]}

    def set_boot(self, enable, units):
        self._step("set_boot", enable, tuple(units))
        return {"enabled": [enable] if enable else [], "disabled": [unit for unit in units if unit != enable], "at_boot": enable}

    def stage(self, params):
        self._step("stage", params["source"])
        return {"changed": True, "present": False, "replace": {"path": params["replaceable"], "removed": True}, "bytes": 1 << 30}

    def ask(self, engine, prompt, max_tokens, timeout):
        self._step("ask", engine.unit)
        self.ask_timeouts.append(timeout)
        if self.ask_errors.get(engine.unit):
            raise self.ask_errors[engine.unit].pop(0)
        text = self.answers_by_unit.get(engine.unit, " Paris, the city of light.")
        if isinstance(text, list):  # one answer per start: the first call's, then the next
            text = text[0] if len(text) == 1 else text.pop(0)
        tokens = [text[i:i + 4] for i in range(0, len(text), 4)]
        return answers.Answer(prompt, text, tokens, [-0.1] * len(tokens))

    def unit_command(self, unit):
        return f"/usr/bin/{unit} serve /m"

    def engine_said(self, unit):
        return self.said.get(unit)

    def read_answers(self, path):
        return self.records.get(path)

    def write_answers(self, path, record):
        self._step("write_answers", path)
        self.records[path] = record

    def soak(self, engine, seconds):
        self._step("soak", engine.unit, seconds)
        self.clock.now += seconds
        return {"seconds": seconds, "probes": int(seconds), "passed": True}


def run(node, clock, previous=VLLM, **options):
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=previous, drain_timeout=120, stop_grace=5, stop_timeout=90, **options)
    return cutover.cutover(request, node, clock, wall_now=1_700_000_000.0)


def test_the_switch_runs_drain_teardown_bring_up_in_order_and_measures_the_engine_start():
    clock = Clock()
    node = Node(clock)
    result = run(node, clock)
    assert [call[0] for call in node.calls] == ["drain", "memory", "stop_units", "kill_holders", "memory", "reset_failed", "start", "wait_ready"]
    assert node.calls[2] == ("stop_units", tuple(UNITS), 5), "an engine the drain found idle gets the short grace"
    assert ("reset_failed", ("vllm.service",)) in node.calls, "a unit the stop left failed is cleared (a switch is no engine failure)"
    assert node.calls[1] == ("memory", False) and node.calls[4] == ("memory", True), "one reading before, the wait after"
    assert result["result"] == "switched" and result["reason"] is None
    assert result["engine_start_s"] == pytest.approx(2.01), "from the unit start to the first good readiness answer"
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "bring_up", "end"]
    starts = dict((phase, at) for phase, at in result["marks"])
    assert starts["teardown"] - starts["drain"] == pytest.approx(0.2)
    assert starts["bring_up"] - starts["teardown"] == pytest.approx(0.39)
    assert starts["drain"] == pytest.approx(1_700_000_000.0), "monotonic times anchored once to the node's wall clock"
    assert set(result["teardown"]) == {"check_mode", "seconds", "before", "units", "holders", "after"}
    assert result["teardown"]["seconds"] == pytest.approx({"before": 0.02, "units": 0.3, "holders": 0.05, "after": 0.02}), "each step's time"


def test_a_busy_engine_gets_its_stop_timeout_and_no_previous_engine_means_no_drain():
    clock = Clock()
    busy = Node(clock, drained=False)
    run(busy, clock)
    assert ("stop_units", tuple(UNITS), 90) in busy.calls, "requests still running at the drain's end: the unit's own stop timeout"
    fresh = Node(clock)
    result = run(fresh, clock, previous=None)
    assert fresh.calls[0][0] == "memory" and not any(call[0] == "drain" for call in fresh.calls)
    assert [mark[0] for mark in result["marks"]] == ["teardown", "bring_up", "end"]
    assert ("stop_units", tuple(UNITS), 5) in fresh.calls


def test_a_target_that_does_not_serve_is_torn_down_and_the_previous_engine_started_again():
    clock = Clock()
    node = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("sglang.service stopped 2.0 s after its start")})
    result = run(node, clock, restore=[{"src": "/backup/vllm.service", "dest": "/etc/systemd/system/vllm.service"}])
    names = [call[0] for call in node.calls]
    rollback = names[names.index("wait_ready") + 1:]
    assert rollback == ["memory", "stop_units", "kill_holders", "memory", "reset_failed", "restore", "reset_failed", "start", "wait_ready"]
    assert ("stop_units", tuple(UNITS), 5) in node.calls[names.index("wait_ready") + 1:], "the failed target serves no one: the grace"
    assert node.calls[-2:] == [("start", "vllm.service"), ("wait_ready", "vllm.service", 60)]
    assert result["result"] == "rolled_back" and result["reason"] == "bring_up: sglang.service stopped 2.0 s after its start"
    assert result["engine_start_s"] is None and result["rollback_teardown"]["after"]["passed"]
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "bring_up", "rollback", "end"]


def test_a_failed_teardown_rolls_back_with_its_steps_recorded():
    clock = Clock()
    survivors = cutover.TeardownFailed("vllm.service: processes survived SIGKILL", units={"results": [{"unit": "vllm.service", "failed": True}]})
    node = Node(clock, failures={("stop_units", tuple(UNITS)): None})
    calls = {"n": 0}
    original = node.stop_units

    def stop_units(units, stop_timeout):
        calls["n"] += 1
        if calls["n"] == 1:
            node.calls.append(("stop_units", tuple(units), stop_timeout))
            raise survivors
        return original(units, stop_timeout)

    node.stop_units = stop_units
    result = run(node, clock)
    assert result["result"] == "rolled_back" and result["reason"].startswith("teardown: units: vllm.service: processes survived")
    assert result["teardown"]["failed_step"] == "units" and result["teardown"]["units"]["results"][0]["failed"]
    assert not any(call == ("start", "sglang.service") for call in node.calls), "the target is never started on GPUs not freed"
    assert ("start", "vllm.service") in node.calls


def test_a_rollback_that_fails_too_is_reported_loudly_not_raised():
    clock = Clock()
    not_free = CheckFailed("GPU 3 still holds 70000 MiB", passed=False)
    node = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("did not serve")})
    memory = node.memory

    def memory_failing_in_rollback(wait, left_pids=()):
        if wait and any(call[0] == "wait_ready" for call in node.calls):
            node.calls.append(("memory", wait))
            raise not_free
        return memory(wait, left_pids)

    node.memory = memory_failing_in_rollback
    result = run(node, clock)
    assert result["result"] == "rollback_failed" and result["rollback_error"] == "after: GPU 3 still holds 70000 MiB"
    assert result["rollback_teardown"]["failed_step"] == "after"
    assert ("start", "vllm.service") not in node.calls, "the previous engine is not started on GPUs that are not free"


def test_no_previous_engine_means_the_rollback_only_tears_the_target_down():
    clock = Clock()
    node = Node(clock, failures={("start", "sglang.service"): cutover.NotServing("systemctl start failed")})
    result = run(node, clock, previous=None)
    assert result["result"] == "rolled_back"
    assert [call for call in node.calls if call[0] == "start"] == [("start", "sglang.service")]


def test_the_request_names_what_is_wrong():
    with pytest.raises(InvalidInput, match="does not include the target's unit sglang.service"):
        cutover.CutoverRequest(units=["vllm.service"], target=SGLANG, previous=VLLM)
    with pytest.raises(InvalidInput, match="units: give every engine unit"):
        cutover.CutoverRequest(units=[], target=SGLANG, previous=None)
    with pytest.raises(InvalidInput, match="target: missing url, model"):
        cutover.Engine.from_params("target", {"engine": "sglang", "unit": "sglang.service"})
    with pytest.raises(InvalidInput, match="stop_grace"):
        cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=None, stop_grace=-1)
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM)
    assert request.longest_run == 120 + 2 * 90 + 30 + 60


def test_messages_say_whether_the_engine_exited_or_was_still_loading():
    assert cutover.not_serving_message(SGLANG, 3.04, "failed", "the engine exited") == \
        "sglang.service stopped 3.0 s after its start, before it served: the engine exited"
    assert cutover.not_serving_message(SGLANG, 30.0, "activating", "still waiting for models") == \
        "sglang.service did not serve within 30.0 s (ready_timeout 30 s): still waiting for models"


def test_boot_is_set_to_the_target_while_it_loads_and_back_to_the_previous_engine_on_a_rollback():
    clock = Clock()
    node = Node(clock)
    result = run(node, clock, boot=True)
    names = [call[0] for call in node.calls]
    assert names[-3:] == ["start", "set_boot", "wait_ready"], "set while the engine loads, not after it serves"
    assert ("set_boot", "sglang.service", tuple(UNITS)) in node.calls
    assert result["boot"]["at_boot"] == "sglang.service" and result["boot_error"] is None
    assert result["engine_start_s"] == pytest.approx(2.01)

    failing = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("sglang.service did not serve")})
    result = run(failing, clock, boot=True)
    boots = [call for call in failing.calls if call[0] == "set_boot"]
    assert boots == [("set_boot", "sglang.service", tuple(UNITS)), ("set_boot", "vllm.service", tuple(UNITS))]
    assert failing.calls[-1][0] == "set_boot", "after the previous engine serves again"
    assert result["result"] == "rolled_back" and result["boot"]["at_boot"] == "vllm.service"

    fresh = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("no")})
    result = run(fresh, clock, previous=None, boot=True)
    assert result["boot"]["at_boot"] is None, "no engine served before: none starts at boot after the rollback"


def test_boot_is_left_alone_unless_asked_and_its_failure_does_not_roll_back():
    clock = Clock()
    node = Node(clock)
    result = run(node, clock)
    assert not any(call[0] == "set_boot" for call in node.calls) and result["boot"] is None
    broken = Node(clock, failures={"set_boot": CheckFailed("systemctl enable failed (rc 1): read-only file system")})
    result = run(broken, clock, boot=True)
    assert result["result"] == "switched", "the target serves: a boot state that could not be set is reported, not rolled back"
    assert result["boot_error"] == "only sglang.service at boot: systemctl enable failed (rc 1): read-only file system"
    assert result["boot"] is None


def test_a_soak_asked_for_watches_the_target_after_it_was_ready_and_counts_in_the_longest_run():
    clock = Clock()
    node = Node(clock)
    result = run(node, clock, soak=15, boot=True)
    names = [call[0] for call in node.calls]
    assert names[-3:] == ["set_boot", "wait_ready", "soak"] and node.calls[-1] == ("soak", "sglang.service", 15)
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "bring_up", "soak", "end"]
    starts = dict((phase, at) for phase, at in result["marks"])
    assert starts["end"] - starts["soak"] == pytest.approx(15), "the soak is its own phase, after the engine's start"
    assert result["engine_start_s"] == pytest.approx(2.01), "the soak is not the engine's start"
    assert result["result"] == "switched" and result["soak"]["passed"]
    assert cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, soak=15).longest_run == 120 + 2 * 90 + 30 + 15 + 60
    with pytest.raises(InvalidInput, match="soak"):
        cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, soak=-1)
    plain = Node(clock)
    assert "soak" not in [mark[0] for mark in run(plain, clock)["marks"]] and not any(call[0] == "soak" for call in plain.calls)


def test_a_target_that_crashes_in_its_soak_is_rolled_back_with_the_soaks_record():
    clock = Clock()
    crash = EngineExited("sglang.service crashed 8.0 s after it was ready (NRestarts 0 -> 1; journalctl -u sglang.service)",
                         soak={"seconds": 8.0, "probes": 8, "passed": False})
    node = Node(clock, failures={("soak", "sglang.service"): crash})
    result = run(node, clock, soak=15, boot=True)
    names = [call[0] for call in node.calls]
    rollback = ["memory", "stop_units", "kill_holders", "memory", "reset_failed", "reset_failed", "start", "wait_ready", "set_boot"]
    assert names[names.index("soak") + 1:] == rollback
    assert result["result"] == "rolled_back" and result["reason"].startswith("soak: sglang.service crashed 8.0 s after it was ready")
    assert result["soak"] == {"seconds": 8.0, "probes": 8, "passed": False}
    assert result["boot"]["at_boot"] == "vllm.service"
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "bring_up", "soak", "rollback", "end"]


def test_the_cutover_clears_its_marks_and_gives_the_lease_back_only_when_it_ended_with_an_engine_serving(tmp_path):
    """engine_cutover's last step on a real lease file and real marks: the lease given back however the cutover
    ended, the mark cleared only when an engine serves; neither when not asked."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover_node as engine_cutover

    store = lease.LeaseStore("switch_engine", str(tmp_path))
    mark = tmp_path / "staged"
    params = {"clear_paths": [str(mark)], "release_lease": True, "lease_owner": "run-1", "run_id": None, "record_path": ""}
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM)

    def attempt(result):
        mark.write_text("run-1\n")
        store.acquire("run-1", 60, 0)
        engine_cutover.finish(result, params, store, request)
        return result["lease_released"], mark.exists(), store.acquire("run-2", 60, 0).holder["owner"]

    assert attempt({"result": "switched", "soak": {"passed": True}}) == (True, False, "run-2")
    store.release("run-2")
    assert attempt({"result": "rolled_back", "soak": None}) == (True, False, "run-2")
    store.release("run-2")
    assert attempt({"result": "rollback_failed", "soak": None}) == (True, True, "run-2"), "no engine serves: the mark stays"
    store.release("run-2")
    store.acquire("run-1", 60, 0)
    engine_cutover.finish(result := {"result": "switched"}, dict(params, release_lease=False), store, request)
    assert result["lease_released"] is False and store.acquire("run-2", 60, 0).holder["owner"] == "run-1"


def test_the_cutover_leaves_the_node_a_record_of_how_it_ended_for_the_next_run(tmp_path):
    """Issue 42 (12): the record the next run reads (engine_observe's last_cutover): whose run, from what to what, how
    it ended and when - written whole, whatever the result; an unwritable one is noted, never a failure."""
    import json

    from ansible_collections.gpufleet.serving.plugins.module_utils._engines import observe
    from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover_node as engine_cutover

    store = lease.LeaseStore("switch_engine", str(tmp_path))
    path = tmp_path / "state" / "last_cutover.json"
    params = {"clear_paths": [], "release_lease": False, "lease_owner": "run-7", "run_id": None, "record_path": str(path)}
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM)
    engine_cutover.finish(result := {"result": "rolled_back", "reason": "bring_up: did not serve"}, params, store, request)
    written = json.loads(path.read_text())
    assert written == result["record"] and {key: written[key] for key in ("run_id", "target", "previous", "result", "reason")} == {
        "run_id": "run-7", "target": "sglang", "previous": "vllm", "result": "rolled_back", "reason": "bring_up: did not serve"}
    assert observe.last_cutover(str(path)) == written
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    engine_cutover.finish(result := {"result": "switched"}, dict(params, record_path=str(blocked / "x.json")), store, request)
    assert result["record"] is None and result["record_error"].startswith(str(blocked / "x.json"))
    # the fault campaign's full disk: said to the operator, not only kept in the result
    result["answer_check"] = {"record_error": "/var/lib/gpufleet-serving/answers/vllm-1.json: No space left on device"}
    assert engine_cutover.unwritten_records(result) == [
        f"the node's record of this cutover was not written: {result['record_error']}",
        "the answers' record was not written: /var/lib/gpufleet-serving/answers/vllm-1.json: No space left on device"]
    assert engine_cutover.unwritten_records({"result": "switched", "record": {}}) == []
    assert observe.last_cutover(str(tmp_path / "none.json")) is None


def test_a_prewarm_asked_for_reads_the_weights_before_the_drain_and_never_stops_the_switch():
    clock = Clock()
    node = Node(clock, costs={"prewarm": 0.4})
    result = run(node, clock, prewarm_paths=["/models/m"], prewarm_timeout=300)
    assert node.calls[0] == ("prewarm", ("/models/m",), 300) and node.calls[1][0] == "drain", "read while the previous engine serves"
    assert [mark[0] for mark in result["marks"]] == ["prewarm", "drain", "teardown", "bring_up", "end"]
    assert result["prewarm"]["finished"] and result["result"] == "switched"
    assert cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, prewarm_paths=["/m"], prewarm_timeout=300).longest_run \
        == 300 + 120 + 2 * 90 + 30 + 60
    unreadable = Node(clock, failures={"prewarm": InvalidInput("/models/m: no local weight files")})
    result = run(unreadable, clock, prewarm_paths=["/models/m"], prewarm_timeout=300)
    assert result["prewarm"] == {"failed": True, "msg": "/models/m: no local weight files"}
    assert result["result"] == "switched" and ("start", "sglang.service") in unreadable.calls, "a slower start, not a reason to stop"
    plain = Node(clock)
    assert run(plain, clock)["prewarm"] is None and not any(call[0] == "prewarm" for call in plain.calls)


def preflight_request(**params):
    defaults = {"engine": "sglang", "checks": ["model", "port"], "version_argv": None, "version": None, "model": "/models/m", "draft_model": None,
                "user": "root", "gpus_needed": 1, "visible_devices": None, "port": 30000, "port_owners": [], "install_dir": None,
                "install_min_free_mib": 20480, "nvml_timeout": 10, "version_timeout": 120}
    return preflight.Request.from_params({**defaults, **params})


def test_a_preflight_and_files_asked_for_run_first_while_the_previous_engine_serves():
    clock = Clock()
    node = Node(clock, costs={"preflight": 0.1, "write_files": 0.05})
    result = run(node, clock, preflight=preflight_request(), files=["unit", "secrets"], prewarm_paths=["/models/m"], prewarm_timeout=300)
    names = [call[0] for call in node.calls]
    assert names[:4] == ["preflight", "write_files", "prewarm", "drain"], "checked, then written, then read - all before the drain"
    assert [mark[0] for mark in result["marks"]] == ["preflight", "stage", "prewarm", "drain", "teardown", "bring_up", "end"]
    assert result["result"] == "switched" and result["preflight"]["passed"] and result["files"]["reloaded"]
    # the preflight's own waits (its version command, two NVML reads) count in the bound the lease covers
    assert cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, preflight=preflight_request()).longest_run \
        == 120 + 2 * 10 + 120 + 2 * 90 + 30 + 60


def test_a_failed_preflight_ends_the_cutover_with_nothing_written_or_stopped():
    clock = Clock()
    node = Node(clock, failures={"preflight_checks": ["model /models/m does not exist", "port 30000 is held by nginx"]})
    result = run(node, clock, preflight=preflight_request(), files=["unit"], prewarm_paths=["/models/m"], prewarm_timeout=300)
    assert [call[0] for call in node.calls] == ["preflight"], "no file written, nothing read, drained, stopped or started"
    assert result["result"] == "preflight_failed" and result["changed"] is False
    assert result["reason"] == "model /models/m does not exist; port 30000 is held by nginx"
    assert [mark[0] for mark in result["marks"]] == ["preflight", "end"] and result["teardown"] is None and result["files"] is None


def test_files_that_cannot_be_written_end_the_cutover_before_the_drain():
    clock = Clock()
    node = Node(clock, failures={"write_files": InvalidInput("/etc/systemd/system/sglang.service: Read-only file system")})
    result = run(node, clock, preflight=preflight_request(), files=["unit"])
    assert [call[0] for call in node.calls] == ["preflight", "write_files"], "the previous engine was never drained or stopped"
    assert result["result"] == "failed" and result["reason"] == "stage: the target's files: /etc/systemd/system/sglang.service: Read-only file system"
    assert [mark[0] for mark in result["marks"]] == ["preflight", "stage", "end"]


@pytest.mark.covers("E6")
def test_holders_reported_and_left_are_not_counted_by_either_memory_assertion_forward_or_in_the_rollback():
    """outside_units=report: the foreign job the holders step left is passed to the memory assertion after it, in the
    switch and in its rollback, so that neither waits for (or fails on) memory that was never the engine's."""
    clock = Clock()
    node = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("did not serve")}, left=[4242, 4343])
    result = run(node, clock)
    assert result["result"] == "rolled_back"
    waits = [call for call in node.calls if call[:2] == ("memory", True)]
    assert waits == [("memory", True, (4242, 4343))] * 2, "forward and rollback assertions both discount the left holders"
    before = [call for call in node.calls if call[:2] == ("memory", False)]
    assert before and all(len(call) == 2 for call in before), "the reading before the teardown counts everything"


def test_another_users_job_that_came_during_the_cutover_is_left_by_the_rollback_which_brings_the_previous_engine_back():
    """Found by the fault campaign (seed 6000): a job of another user appeared after the preflight, during the drain;
    the teardown (outside_units=fail) refused it after the units stopped, and the rollback's teardown refused it again:
    no engine at all. The rollback leaves it (reported, its memory not counted) and starts the previous engine."""
    clock = Clock()
    node = Node(clock)
    node.foreign = [5150]
    result = run(node, clock)
    assert result["result"] == "rolled_back" and result["rollback_error"] is None
    assert result["reason"].startswith("teardown: holders: 1 process(es) hold the GPUs outside the units being stopped")
    assert ("start", "vllm.service") in node.calls and ("wait_ready", "vllm.service", 60) in node.calls
    assert [call for call in node.calls if call[:2] == ("memory", True)] == [("memory", True, (5150,))], "its memory is not counted"
    assert result["rollback_teardown"]["holders"]["outside"] == [{"pid": 5150, "comm": "train.py"}]


REPLACE = {"source": "acme/Tiny-GGUF", "quant": "Q4_K_M", "dest": "/models/acme--Tiny-GGUF--Q4_K_M", "replace": "now",
           "replaceable": "/models/lab--tiny-llama", "timeout": 600}
RESTAGE = {"source": "lab/tiny-llama", "dest": "/models/lab--tiny-llama", "replace": "now", "replaceable": "/models/acme--Tiny-GGUF--Q4_K_M",
           "timeout": 500}


def test_a_model_replacing_the_previous_ones_is_staged_after_the_teardown_inside_the_downtime():
    """Issue 52 (5): the disk holds one model - the target's is staged between the teardown and the start (its own
    phase, counted in the downtime and in the cutover's longest run)."""
    clock = Clock()
    node = Node(clock, costs={"stage": 40.0})
    result = run(node, clock, replace_model=REPLACE, restage_previous=RESTAGE)
    names = [call[0] for call in node.calls]
    assert names.index("kill_holders") < names.index("stage") < names.index("start")
    assert ("stage", "acme/Tiny-GGUF") in node.calls and ("stage", "lab/tiny-llama") not in node.calls
    assert result["result"] == "switched" and result["replace"]["replace"]["removed"] and result["restage"] is None
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "replace", "bring_up", "end"]
    starts = dict(result["marks"])
    assert starts["bring_up"] - starts["replace"] == pytest.approx(40.0)
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, replace_model=REPLACE, restage_previous=RESTAGE)
    plain = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM)
    assert request.longest_run - plain.longest_run == pytest.approx(1100.0), "the download and the rollback's again"


def test_a_rollback_after_a_replacement_stages_the_previous_model_again_before_its_start():
    clock = Clock()
    node = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("sglang.service stopped")})
    result = run(node, clock, replace_model=REPLACE, restage_previous=RESTAGE)
    names = [call[0] for call in node.calls]
    rollback = names[names.index("wait_ready") + 1:]
    assert rollback.index("stage") < rollback.index("start"), names
    assert node.calls[len(names) - len(rollback) + rollback.index("stage")] == ("stage", "lab/tiny-llama")
    assert result["result"] == "rolled_back" and result["restage"]["replace"]["path"] == "/models/acme--Tiny-GGUF--Q4_K_M"


def test_a_failed_download_in_the_downtime_rolls_back_and_a_failed_restage_says_no_engine_serves():
    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error

    clock = Clock()
    node = Node(clock, failures={("stage", "acme/Tiny-GGUF"): Error("acme/Tiny-GGUF: the download failed: 503")})
    result = run(node, clock, replace_model=REPLACE, restage_previous=RESTAGE)
    assert result["result"] == "rolled_back" and result["reason"] == "replace: acme/Tiny-GGUF: the download failed: 503"
    assert result["replace"] == {"failed": True, "msg": "acme/Tiny-GGUF: the download failed: 503"}
    assert ("start", "sglang.service") not in node.calls and ("start", "vllm.service") in node.calls

    both = Node(clock, failures={"stage": Error("hub unreachable")})
    failed = run(both, clock, replace_model=REPLACE, restage_previous=RESTAGE)
    assert failed["result"] == "rollback_failed"
    assert failed["rollback_error"] == "the previous engine's model could not be staged again: hub unreachable"
    assert ("start", "vllm.service") not in both.calls


def test_a_replacement_needs_its_way_back_and_no_park():
    with pytest.raises(InvalidInput, match="restage_previous"):
        cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, replace_model=REPLACE)
    with pytest.raises(InvalidInput, match="cannot be parked"):
        cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, replace_model=REPLACE, restage_previous=RESTAGE, park_previous=True)


CHECK = answers.CheckSettings(versions={"sglang": "0.5.23", "vllm": "0.33.0"}, record_dir="/rec")


def test_a_new_engine_is_sanity_checked_before_it_counts_as_serving_and_its_answers_become_its_record_after_the_soak():
    clock = Clock()
    node = Node(clock)
    result = run(node, clock, answers=CHECK, soak=3)
    names = [call[0] for call in node.calls]
    assert names.index("wait_ready") < names.index("ask") < names.index("soak") < names.index("write_answers")
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "bring_up", "answer_check", "soak", "end"]
    checked = result["answer_check"]
    assert checked["kind"] == "sanity" and checked["passed"] and checked["recorded"] and checked["probes"] == 3
    record = node.records[checked["record"]]
    assert record["engine"] == "sglang" and record["version"] == "0.5.23" and len(record["probes"]) == 3

    again = Node(clock)
    again.records = node.records
    second = run(again, clock, answers=CHECK)
    assert second["answer_check"]["kind"] == "golden" and second["answer_check"]["passed"] and not second["answer_check"]["recorded"]
    assert "write_answers" not in [call[0] for call in again.calls], "a record is kept, not rewritten"


def test_an_engine_that_answers_garbage_or_otherwise_than_its_record_is_rolled_back_before_rotation():
    clock = Clock()
    garbage = Node(clock)
    garbage.answers_by_unit["sglang.service"] = "!!!!!!!!!!!!"
    result = run(garbage, clock, answers=CHECK)
    assert result["result"] == "rolled_back" and result["reason"].startswith("answer_check: sglang answered wrongly (sanity check): probe 1")
    assert ("start", "vllm.service") in garbage.calls and not garbage.records

    recorded = Node(clock)
    run(recorded, clock, answers=CHECK)
    changed = Node(clock)
    changed.records = recorded.records
    changed.answers_by_unit["sglang.service"] = " Lyon, the city of light."
    result = run(changed, clock, answers=CHECK)
    assert result["result"] == "rolled_back" and "token 1 of probe 1: ' Lyo' where the record has ' Par'" in result["reason"]
    assert result["rollback_answer_check"]["kind"] == "sanity" and result["rollback_answer_check"]["passed"], "the previous engine's own"


def test_a_probe_that_fails_once_is_asked_again_and_the_check_says_so():
    """An engine's first request may fail while it warms up: the probe is asked once more, a second later, and the
    check passes saying what the first answer was - never a rollback without a word, never a silent pass."""
    clock = Clock()
    node = Node(clock)
    node.ask_errors["sglang.service"] = [CommandFailed("/v1/completions for 'The capital of France is': 503 warming up")]
    result = run(node, clock, answers=CHECK)
    checked = result["answer_check"]
    assert result["result"] == "switched" and checked["passed"] and checked["kind"] == "sanity"
    assert checked["retried"] == "/v1/completions for 'The capital of France is': 503 warming up"
    assert [call[1] for call in node.calls if call[0] == "ask"] == ["sglang.service"] * 4, "three probes, the first asked twice"
    assert node.ask_timeouts == [120.0] * 4, "each probe may take switch_engine_answer_timeout (a first request compiles kernels)"
    quick = answers.CheckSettings.from_params({"record_dir": "/rec", "probe_timeout": 30})
    assert quick.probe_timeout == 30 and quick.longest_run == 61
    with pytest.raises(InvalidInput, match="answer_check.probe_timeout: 1 to 3600 seconds, got 0.5"):
        answers.CheckSettings.from_params({"probe_timeout": 0.5})


def test_an_engine_whose_probes_fail_twice_is_rolled_back_naming_what_it_said():
    """The real vLLM's case (molecule/real_vllm): its EngineCore died on the first request with logprobs (Inductor
    found no C++ compiler) and answers 500 to everything after. The retry fails too: rolled back, the reason naming the
    probe's error and the root cause from the engine's journal; no third ask."""
    clock = Clock()
    node = Node(clock)
    dead = "/v1/completions for 'The capital of France is': 500 EngineCore encountered an issue"
    node.ask_errors["sglang.service"] = [CommandFailed(dead), CommandFailed(dead)]
    node.said["sglang.service"] = "torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found"
    result = run(node, clock, answers=CHECK)
    assert result["result"] == "rolled_back", result["reason"]
    assert (f"a probe failed: {dead}; sglang said: torch._inductor.exc.InductorError: InvalidCxxCompiler: No working C++ compiler found "
            "(journalctl -u sglang.service)") in result["reason"]
    assert [call[1] for call in node.calls if call[0] == "ask"].count("sglang.service") == 2
    assert result["answer_check"]["retried"] == dead and not result["answer_check"]["passed"]


def test_a_woken_engine_that_answers_otherwise_is_started_cold_and_checked_again():
    clock = Clock()
    first = Node(clock)
    run(first, clock, answers=CHECK)
    woken = Node(clock)
    woken.records = first.records
    woken.wake = lambda engine, timeout: {"call_s": 0.1}
    woken.record_parked = lambda record, measured=None: woken.calls.append(("record_parked", record))
    woken.answers_by_unit["sglang.service"] = ["!!!!!!!!!!!!", "!!!!!!!!!!!!", "!!!!!!!!!!!!", " Paris, the city of light."]
    result = run(woken, clock, answers=CHECK, wake=True)
    assert result["result"] == "switched", result["reason"]
    assert result["wake"]["answered_differently"].startswith("token 1 of probe 1: '!!!!' where the record has ' Par'")
    assert result["answer_check"]["kind"] == "golden" and result["answer_check"]["passed"]
    assert result["answer_check"]["after_wake"]["passed"] is False
    assert [mark[0] for mark in result["marks"]] == ["drain", "teardown", "bring_up", "answer_check", "restart", "end"]
    names = [call[0] for call in woken.calls]
    assert names.count("stop_units") == 2 and ("start", "sglang.service") in woken.calls
    assert ("record_parked", None) in woken.calls, "started cold: no engine is parked any more"


def test_a_previous_engine_that_answers_otherwise_after_the_rollback_fails_the_rollback():
    clock = Clock()
    node = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("sglang.service stopped")})
    node.answers_by_unit["vllm.service"] = ""
    result = run(node, clock, answers=CHECK)
    assert result["result"] == "rollback_failed"
    assert result["rollback_error"].startswith("vllm answers wrongly after the rollback (sanity check): probe 1")


def test_a_null_in_a_nested_option_is_an_option_not_given():
    """A switch from a node where no engine served (after a cleanup) passed the preflight's way back as
    {engine: null, ...}: refused as 'value of engine must be one of: vllm, sglang, got: None' and the cutover never ran
    (switch_park's answers case found it). A null is a key not given, at every depth."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover_node

    request = cutover_node.preflight_request({"engine": "vllm", "model": "/m", "port": 8000, "checks": ["model"],
                                              "previous": {"engine": None, "memory_fraction": None, "gpus_needed": 1, "visible_devices": None}})
    assert request.previous is None
    with pytest.raises(InvalidInput, match="previous"):
        cutover_node.preflight_request({"engine": "vllm", "model": "/m", "port": 8000, "checks": ["model"], "previous": {"engine": "tgi"}})


def test_a_previous_engine_woken_by_the_rollback_that_answers_otherwise_is_started_cold_too():
    clock = Clock()
    node = Node(clock, failures={("wait_ready", "sglang.service"): cutover.NotServing("sglang.service stopped")})
    # vllm's record, taken when it was a target (the same identity as the previous engine's)
    ident = answers.identity("vllm", "m", "0.33.0", "/usr/bin/vllm.service serve /m")
    node.records[answers.record_path("/rec", ident)] = answers.new_record(
        ident, [answers.Answer(p, " Paris, the city of light.", [" Paris, the city of light."[i:i + 4] for i in range(0, 26, 4)], [-0.1] * 7)
                for p in answers.PROBES], 0)
    node.park = lambda engine, timeout: {"parked": True, "seconds": 0.1, "gpus": [], "leftover_mib": {}}
    node.wake = lambda engine, timeout: {"call_s": 0.1}
    node.record_parked = lambda record, measured=None: None
    node.answers_by_unit["vllm.service"] = ["!!!!!!!!!!!!"] * 3 + [" Paris, the city of light."]
    result = run(node, clock, answers=CHECK, park_previous=True)
    assert result["result"] == "rolled_back", result["rollback_error"]
    checked = result["rollback_answer_check"]
    assert checked["kind"] == "golden" and checked["passed"] and checked["after_wake"]["passed"] is False
    assert ("start", "vllm.service") in node.calls, "started cold after its wake answered otherwise"


def roll_back_alone(node, clock, reason="soak: sglang.service crashed 3.1 s after it was ready", parked_unit=None, **options):
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, drain_timeout=120, stop_grace=5, stop_timeout=90, boot=True,
                                     **options)
    return cutover.rollback_alone(request, node, clock, 1_700_000_000.0, reason, parked_unit)


def test_the_controllers_rollback_is_the_cutovers_own_rollback_alone():
    """A failure the controller saw after the cutover switched (its soak after the balancer's join): the same steps as the
    cutover's own rollback, with nothing of the forward path - no drain, no start of the target - and only the previous
    engine at boot."""
    clock = Clock()
    node = Node(clock)
    result = roll_back_alone(node, clock, restore=[{"src": "/backup/vllm.service", "dest": "/etc/systemd/system/vllm.service"}])
    assert [call[0] for call in node.calls] == ["memory", "stop_units", "kill_holders", "memory", "reset_failed", "restore", "reset_failed",
                                                "start", "wait_ready", "set_boot"]
    assert ("stop_units", tuple(UNITS), 5) in node.calls, "the failed target serves no one: the short grace"
    assert node.calls[-3:] == [("start", "vllm.service"), ("wait_ready", "vllm.service", 60), ("set_boot", "vllm.service", tuple(UNITS))]
    assert result["result"] == "rolled_back" and result["reason"] == "soak: sglang.service crashed 3.1 s after it was ready"
    assert result["rollback_teardown"]["after"]["passed"] and result["teardown"] is None and result["engine_start_s"] is None
    assert result["boot"]["at_boot"] == "vllm.service"
    assert [mark[0] for mark in result["marks"]] == ["rollback", "end"]


def test_a_controllers_rollback_that_fails_is_rollback_failed_with_the_previous_engine_still_alone_at_boot():
    clock = Clock()
    node = Node(clock, failures={("wait_ready", "vllm.service"): cutover.NotServing("vllm.service did not serve within 60.0 s")})
    result = roll_back_alone(node, clock)
    assert result["result"] == "rollback_failed" and result["rollback_error"] == "vllm.service did not serve within 60.0 s"
    assert result["reason"] == "soak: sglang.service crashed 3.1 s after it was ready", "the reason stays the first failure"
    assert node.calls[-1] == ("set_boot", "vllm.service", tuple(UNITS)), "the engine meant to serve starts at boot, up or not"


def test_a_controllers_rollback_after_a_replacement_stages_the_previous_model_again():
    clock = Clock()
    node = Node(clock)
    result = roll_back_alone(node, clock, replace_model=REPLACE, restage_previous=RESTAGE)
    names = [call[0] for call in node.calls]
    assert names.index("kill_holders") < names.index("stage") < names.index("start"), names
    assert ("stage", "lab/tiny-llama") in node.calls and ("stage", "acme/Tiny-GGUF") not in node.calls
    assert result["result"] == "rolled_back" and result["restage"]["replace"]["path"] == "/models/acme--Tiny-GGUF--Q4_K_M"
