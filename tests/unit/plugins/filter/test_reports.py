"""The reports: per-host records, the run documents, the rollout gate and the tables, held against docs/reports.md."""

from __future__ import annotations

import re

import pytest
from conftest import REPO

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _reports as reports
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch

PROCESS = {"pid": 42, "comm": "python3", "cmdline": ["python3", "-m", "sglang.launch_server", "--model-path", "/m"], "gpus": [0], "unit": "x"}
T0 = 1_800_000_000.0


def teardown_steps(**extra) -> dict:
    """Module results as the gpu_teardown role registers them."""
    return {"check_mode": False,
            "units": {"results": [{"unit": "vllm.service", "item": "vllm.service", "changed": True, "found": True, "escalated": True,
                                   "state_before": {"ActiveState": "active"}, "state_after": {"ActiveState": "inactive"},
                                   "killed": [PROCESS], "terminated": [dict(PROCESS, pid=43)], "triggers_stopped": ["vllm.socket"],
                                   "warnings": ["KillMode=process: systemd leaves the unit's other processes running"]}]},
            "holders": {"terminated": [dict(PROCESS, pid=44)], "killed": [dict(PROCESS, pid=45)], "targets": [],
                        "protected": [dict(PROCESS, pid=7, comm="nvidia-persiste", reason="protected name nvidia-persistenced")],
                        "outside": [dict(PROCESS, pid=8, comm="python3", unit="session-4.scope", placement="session")],
                        "stale_nvml_pids": [99]},
            "before": {"gpus": [{"index": 0, "uuid": "GPU-0", "used_mib": 900, "clean": False}]},
            "after": {"gpus": [{"index": 0, "uuid": "GPU-0", "used_mib": 0, "clean": True}]}, **extra}


def switch_record(result="switched", **extra) -> dict:
    return {"target": "sglang", "found": ["vllm"], "previous": "vllm", "outcome": {"result": result},
            "marks": [["lease", T0], ["discover", T0 + 1], ["drain", T0 + 2], ["backup", T0 + 2.5], ["teardown", T0 + 3],
                      ["bring_up", T0 + 6], ["verify", T0 + 16], ["end", T0 + 17]],
            "lease": {"recovered": None}, "teardown": reports.teardown_host_report(teardown_steps()), **extra}


# --- per host --------------------------------------------------------------------------------------------------------------
def test_switch_record_durations_follow_the_phase_marks():
    report = reports.switch_host_report(switch_record())
    assert report["durations_s"] == {"lease": 1.0, "discover": 1.0, "drain": 0.5, "backup": 0.5, "teardown": 3.0, "bring_up": 10.0,
                                     "verify": 1.0, "total": 17.0}
    assert report["result"] == "switched" and report["failed_phase"] is None and report["from"] == "vllm"
    assert [p["pid"] for p in report["killed"]] == [45, 42] and [p["pid"] for p in report["terminated"]] == [44, 43]
    assert report["started"] == "2027-01-15T08:00:00+00:00"


def test_a_rollback_names_the_phase_that_failed_and_keeps_both_teardowns():
    record = switch_record("rolled_back", outcome={"result": "rolled_back", "reason": "Verify | ...: never ready"},
                           rollback_teardown=reports.teardown_host_report(teardown_steps(holders={"killed": [dict(PROCESS, pid=77)]})))
    record["marks"] = record["marks"][:-1] + [["rollback", T0 + 17], ["end", T0 + 30]]
    report = reports.switch_host_report(record)
    assert report["failed_phase"] == "verify" and report["durations_s"]["rollback"] == 13.0
    assert 77 in [p["pid"] for p in report["killed"]]


def test_an_unknown_result_is_refused():
    with pytest.raises(reports.ReportError, match="'done' is not one of"):
        reports.switch_host_report({"outcome": {"result": "done"}})


def test_teardown_record_from_the_module_results():
    report = reports.teardown_host_report(teardown_steps())
    assert report["result"] == "ok" and report["units"][0]["escalated"] and report["stale_nvml_pids"] == [99]
    assert report["planned"] == [], "what would be signalled is listed only in check mode"
    failed = reports.teardown_host_report(teardown_steps(failed_step="Assert memory | Every selected GPU is free",
                                                         failure={"msg": "GPU 3 leaked", "failed": True}))
    assert failed["result"] == "failed" and failed["reason"] == "GPU 3 leaked"
    looped = reports.failure_reason({"results": [{"failed": False}, {"failed": True, "msg": "unit x refused"}]})
    assert looped == "unit x refused"


# --- the documents against docs/reports.md ---------------------------------------------------------------------------------
ALIASES = [(r"\.units\[\]\.(killed|terminated)\[\]\.", ".killed[]."), (r"\.(terminated|planned)\[\]\.", ".killed[]."),
           (r"\.plan\.processes_to_signal\[\]\.", ".killed[]."),
           (r"^(fleet\.serving|hosts\.<host>\.out_of_rotation)\[\].*", r"\1"),
           (r"\.protected\[\]\.(?!reason)", ".killed[]."),
           (r"\.outside\[\]\.(?!placement)", ".killed[]."),
           (r"\.memory_before\[\]\.", ".memory_after[]."),
           (r"\.leftover_mib\.\d+$", ".leftover_mib"),  # keyed by GPU index
           (r"\.standby\.", ".park."),  # the park's first name: the same dict (asserted where produced)
           (r"\.stage_tokenizer\.", ".stage."),  # documented as "the same keys as stage"
           (r"\.rollback_answer_check\.", ".answer_check.")]


def documented_keys(heading: str) -> set[str]:
    text = (REPO / "docs" / "reports.md").read_text()
    section = text.split(f"## {heading}", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, flags=re.M))


def key_paths(value, prefix="") -> set[str]:
    paths = set()
    if isinstance(value, dict):
        for key, item in value.items():
            name = "<host>" if prefix == "hosts" else key
            path = f"{prefix}.{name}" if prefix else name
            if prefix != "hosts":
                paths.add(path)
            if not (prefix.endswith("durations_s") or path.endswith(("durations_s", "downtime_parts_s", "recovered_lease", "target_files_change"))):
                paths |= key_paths(item, path)
    elif isinstance(value, list):
        for item in value:
            paths |= key_paths(item, prefix + "[]")
    return paths


def aliased(path: str) -> str:
    for pattern, replacement in ALIASES:
        path = re.sub(pattern, replacement, path)
    return path


def assert_matches_docs(document: dict, heading: str):
    documented = documented_keys(heading)
    produced = {aliased(path) for path in key_paths(document)}
    assert produced - documented == set(), "produced but not documented"
    assert documented - produced == set(), "documented but not produced"


CHECKS = [{"name": "model", "passed": True, "skipped": False, "detail": "model /m: 4 weight file(s), 0.06 GiB, readable by root"}]
PREWARM = {"changed": False, "bytes": 67108864, "total_bytes": 67108864, "files": 4, "seconds": 0.4, "finished": True, "skipped_reason": None}


# an engine's worker left outside its unit, found by the preflight (extra keys of the module's holders are dropped)
GPU_HOLDERS = {"foreign": [], "escaped": [{"pid": 4242, "user": "vllm", "comm": "python3", "unit": None, "placement": "elsewhere",
                                          "gpus": [0, 1], "start_time": 1}]}


def rotated_record(result="switched", **extra) -> dict:
    """A switch with rotation hooks: out of rotation at T0+3, back at T0+18."""
    marks = [["lease", T0], ["discover", T0 + 1], ["preflight", T0 + 2], ["prewarm", T0 + 2.5], ["leave_rotation", T0 + 3],
             ["drain", T0 + 4], ["teardown", T0 + 5], ["bring_up", T0 + 8], ["verify", T0 + 16], ["join_rotation", T0 + 17],
             ["boot", T0 + 18], ["end", T0 + 19]]
    return switch_record(result, **{"marks": marks, "preflight": CHECKS, "prewarm": PREWARM, "gpu_holders": GPU_HOLDERS, **extra})


def planned_record() -> dict:
    holders = {"targets": [dict(PROCESS, pid=50, unit="vllm.service"), dict(PROCESS, pid=51, unit=None)]}
    teardown = reports.teardown_host_report(teardown_steps(check_mode=True, holders=holders,
                                                           units={"results": [{"unit": "vllm.service", "changed": True}]}))
    return switch_record("would_switch", marks=[["lease", T0], ["discover", T0 + 1], ["preflight", T0 + 2], ["plan", T0 + 3],
                                                ["end", T0 + 5]],
                         outcome={"result": "would_switch"}, preflight=CHECKS, teardown=teardown,
                         prewarm={"changed": False, "bytes": 0, "total_bytes": 10, "files": 1, "seconds": 0.0, "finished": False,
                                  "skipped_reason": "check mode: nothing read"},
                         plan={"running_requests": 2.0, "units_to_stop": ["vllm.service"], "target_files_change": {"unit": True, "secrets": False},
                               "answer_check": {"kind": "golden", "probes": 3, "reason": None, "recorded_at": T0 - 3600}},
                         stage=reports.stage_record(STAGE_PLAN, "lab/tiny-llama"),
                         stage_tokenizer=reports.stage_record(dict(STAGE_PLAN, gguf=None), "lab/tiny-base"))


# what model_stage answers in check mode for a hub model that needs fetching and room made
STAGE_PLAN = {"changed": True, "kind": "hub", "dest": "/var/lib/gpufleet-models/lab--tiny-llama", "present": False,
              "fetch": [{"name": "model.safetensors", "bytes": 3 * 2**30}, {"name": "config.json", "bytes": 600}],
              "bytes": 3 * 2**30 + 600, "seconds": 0.0, "rate_mib_s": None,
              "room": {"free_bytes": 2 * 2**30, "needed_bytes": 4 * 2**30, "ok": True, "merge_bytes": 2**30},
              "removed": [{"path": "/var/lib/gpufleet-models/old--model", "bytes": 2**31}], "problems": [],
              "gguf": {"file": "/var/lib/gpufleet-models/lab--tiny-llama/model.gguf", "parts": 3, "merge": True}}


# a switch whose target fits only in place of the previous engine's model; the target failed and the rollback restaged it
REPLACE = {"path": "/var/lib/gpufleet-models/lab--tiny-llama", "bytes": 64 * 2**20, "estimate_s": 12.5, "removed": False,
           "message": "removing the model it replaces ..."}


def replaced_record(result="rolled_back") -> dict:
    deferred = dict(STAGE_PLAN, changed=False, deferred=True, replace=REPLACE, removed=[], room=dict(STAGE_PLAN["room"], ok=False, replace_bytes=64 * 2**20))
    return switch_record(result, outcome={"result": result, "reason": "bring_up: vllm.service stopped"},
                         stage=reports.stage_record(deferred, "lab/Tiny-GGUF:Q8_0"),
                         replace_decision={"asked": True, "path": REPLACE["path"], "restage": {"source": "lab/tiny-llama"}, "reason": None},
                         replace={"changed": True, "bytes": 24 * 2**20, "seconds": 3.1, "rate_mib_s": 7.7, "replace": dict(REPLACE, removed=True)},
                         restage={"changed": True, "present": False, "bytes": 64 * 2**20, "seconds": 8.2, "rate_mib_s": 7.8},
                         answer_check=dict(CHECKED, passed=False, mismatch="token 1 of probe 1: ' Lyon' where the record has ' Paris'",
                                           after_wake=dict(CHECKED, seconds=0.2)),
                         rollback_answer_check=CHECKED)


CHECKED = {"kind": "golden", "passed": True, "probes": 3, "seconds": 0.31, "mismatch": None, "drift": 0.002, "recorded_at": T0 - 86400,
           "record": "/var/lib/gpufleet-serving/answers/vllm-0123456789abcdef.json", "recorded": False, "refresh": False,
           "answers": [], "expected": [], "identity": {"key": "0123456789abcdef"}}


def test_a_replaced_model_is_reported_with_its_estimate_its_download_and_the_rollbacks_restage():
    report = reports.switch_host_report(replaced_record())
    assert report["replace_model"] == {"asked": True, "refused": None, "path": REPLACE["path"], "bytes": 64 * 2**20, "estimate_s": 12.5,
                                       "deferred": True, "removed": True, "fetched_bytes": 24 * 2**20, "seconds": 3.1, "rate_mib_s": 7.7,
                                       "error": None, "rollback_restages": True,
                                       "restaged": {"present": False, "bytes": 64 * 2**20, "seconds": 8.2, "rate_mib_s": 7.8}}
    line = reports.replace_line(report, planned=False)
    assert line.startswith("removed vllm's /var/lib/gpufleet-models/lab--tiny-llama (0.06 GiB) after its stop; fetched 0.02 GiB in 3.1 s")
    assert line.endswith("; the rollback staged it again: 0.06 GiB in 8.2 s")
    planned = dict(report, replace_model=dict(report["replace_model"], removed=False, restaged=None))
    assert ("would remove vllm's /var/lib/gpufleet-models/lab--tiny-llama (0.06 GiB) after its stop, then fetch the target inside the "
            "downtime (about 12.5 s at the last measured rate); a rollback would stage it again first") in reports.replace_line(planned, planned=True)
    refused = reports.switch_host_report(switch_record(replace_decision={"asked": True, "path": None, "reason": "vllm's model /m is not staged"}))
    assert reports.replace_line(refused, False) == "switch_engine_replace_model: vllm's model /m is not staged"
    assert reports.switch_host_report(switch_record())["replace_model"] is None


def test_the_stage_line_says_a_quant_is_fetched_alone_and_merged():
    planned = reports.stage_line(reports.stage_record(STAGE_PLAN, "lab/Tiny-GGUF:Q4_K_M"), True)
    assert "then merge its 3 parts into /var/lib/gpufleet-models/lab--tiny-llama/model.gguf (room for both: 4.00 GiB)" in planned
    done = dict(STAGE_PLAN, gguf=dict(STAGE_PLAN["gguf"], bytes=2**30, seconds=2.5, rate_mib_s=409.6), seconds=10.0, rate_mib_s=300.0)
    line = reports.stage_line(reports.stage_record(done, "lab/Tiny-GGUF:Q4_K_M"), False)
    assert "; merged 3 parts into /var/lib/gpufleet-models/lab--tiny-llama/model.gguf in 2.5 s, 409.6 MiB/s before the drain" in line


def test_the_stage_record_keeps_what_was_fetched_or_would_be_and_why_it_failed():
    planned = reports.stage_record(STAGE_PLAN, "lab/tiny-llama")
    assert planned["files"] == 2 and planned["bytes"] == 3 * 2**30 + 600 and planned["error"] is None and not planned["present"]
    assert planned["removed"] == [{"path": "/var/lib/gpufleet-models/old--model", "bytes": 2**31}]
    done = reports.stage_record({"finished": 1, "ansible_job_id": "j1", "present": True, "dest": "/m/x", "bytes": 0}, "org/x")
    assert done["present"] and done["error"] is None
    failed = reports.stage_record({"failed": True, "finished": 1, "ansible_job_id": "j2", "msg": "org/x: needs 9 GiB, 2 GiB free"}, "org/x")
    assert failed["error"] == "org/x: needs 9 GiB, 2 GiB free"
    assert reports.stage_record({"skipped": True}, "org/x") is None and reports.stage_record({}, "org/x") is None


def test_downtime_runs_from_leaving_rotation_to_the_end_of_joining_it():
    report = reports.switch_host_report(rotated_record())
    assert report["out_of_rotation"] == [T0 + 3, T0 + 18] and report["downtime_s"] == 15.0
    assert report["downtime_parts_s"] == {"leave_rotation": 1.0, "drain": 1.0, "teardown": 3.0, "bring_up": 8.0, "verify": 1.0,
                                          "join_rotation": 1.0}
    assert [phase["phase"] for phase in report["phases"]][:3] == ["lease", "discover", "preflight"]
    assert report["phases"][4] == {"phase": "leave_rotation", "start": T0 + 3, "seconds": 1.0}
    assert report["prewarm"]["bytes"] == 67108864 and report["preflight"][0]["passed"] is True
    assert report["gpu_holders"] == {"foreign": [], "escaped": [{"pid": 4242, "user": "vllm", "comm": "python3", "unit": None,
                                                                 "placement": "elsewhere", "gpus": [0, 1]}]}


def test_without_a_balancer_the_downtime_is_the_nodes_own_from_the_cutovers_start_to_an_engine_serving():
    """rotation none: clients reach the engine directly; the controller's bookkeeping after the engine serves is no
    downtime. The node's figure holds only while the cutover's outcome is the switch's."""
    record = rotated_record(rotation="none", serving_since=T0 + 10.5, cutover_result="switched", engine_start_s=2.5)
    report = reports.switch_host_report(record)
    assert report["out_of_rotation"] == [T0 + 4, T0 + 10.5] and report["downtime_s"] == 6.5
    assert report["downtime_parts_s"] == {"drain": 1.0, "teardown": 3.0, "bring_up": 2.5}, "each part clipped to the time out of service"
    assert report["overhead_s"] == 4.0
    # with a balancer the same marks count from leaving rotation to having joined it again
    balanced = reports.switch_host_report(dict(record, rotation="haproxy"))
    assert balanced["out_of_rotation"] == [T0 + 3, T0 + 18] and balanced["downtime_s"] == 15.0
    # the soak failed after a good cutover: the controller's rollback counts the balancer's way
    soaked = dict(record, outcome={"result": "rolled_back", "reason": "soak: crashed"})
    assert reports.switch_host_report(soaked)["out_of_rotation"] == [T0 + 3, T0 + 18]


def test_a_node_that_never_came_back_has_no_downtime_figure():
    record = rotated_record("rollback_failed", outcome={"result": "rollback_failed", "reason": "x", "rollback_error": "y"})
    record["marks"] = record["marks"][:8] + [["rollback", T0 + 9], ["end", T0 + 30]]
    report = reports.switch_host_report(record)
    assert report["out_of_rotation"] == [T0 + 3, None] and report["downtime_s"] is None and report["failed_phase"] == "bring_up"


def test_a_failed_preflight_left_the_node_in_rotation():
    record = switch_record("preflight_failed", outcome={"result": "preflight_failed", "reason": "model /m does not exist"},
                           marks=[["lease", T0], ["discover", T0 + 1], ["preflight", T0 + 2], ["end", T0 + 3]],
                           preflight=[{"name": "model", "passed": False, "detail": "model /m does not exist"}], teardown=None)
    report = reports.switch_host_report(record)
    assert report["failed_phase"] == "preflight" and report["out_of_rotation"] is None and report["downtime_s"] is None
    assert report["preflight"] == [{"name": "model", "passed": False, "skipped": False, "detail": "model /m does not exist"}]
    gate = reports_gate({"node1": report})
    assert gate["stop"] and gate["failed"] == ["node1"], "a failed preflight counts against the rollout"


def test_a_preflight_failed_in_the_cutover_left_the_node_serving_as_it_was():
    """rotation none: the cutover ran the checks first, after the controller's leave_rotation mark; nothing was drained."""
    cutover = _switch.cutover_record({"result": "preflight_failed", "reason": "model /m does not exist", "changed": False,
                                      "marks": [["preflight", T0 + 4.2], ["end", T0 + 4.3]],
                                      "preflight": {"passed": False, "failures": ["model /m does not exist"],
                                                    "checks": [{"name": "model", "passed": False, "detail": "model /m does not exist"}],
                                                    "holders": {"foreign": [], "escaped": []}}})
    assert cutover["outcome"] == {"result": "preflight_failed", "reason": "model /m does not exist"} and cutover["serving_since"] is None
    record = switch_record("preflight_failed", outcome=cutover["outcome"], rotation="none", cutover_result="preflight_failed",
                           marks=[["lease", T0], ["discover", T0 + 1], ["leave_rotation", T0 + 3], ["cutover", T0 + 3.1]] + cutover["marks"]
                           + [["end", T0 + 5]], preflight=cutover["preflight"]["checks"], teardown=None)
    report = reports.switch_host_report(record)
    assert report["failed_phase"] == "preflight" and report["out_of_rotation"] is None and report["downtime_s"] is None
    assert report["preflight"] == [{"name": "model", "passed": False, "skipped": False, "detail": "model /m does not exist"}]
    assert report["durations_s"]["preflight"] == 0.8


def reports_gate(hosts):
    from ansible_collections.gpufleet.serving.plugins.plugin_utils import _rollout

    return _rollout.rollout_gate(hosts, 0)


def test_the_plan_separates_the_units_processes_from_other_holders():
    report = reports.switch_host_report(planned_record())
    plan = report["plan"]
    assert plan["units_to_stop"] == ["vllm.service"] and plan["unit_processes"] == 1 and plan["running_requests"] == 2.0
    assert [p["pid"] for p in plan["processes_to_signal"]] == [51]
    assert plan["gpus"] == [{"index": 0, "uuid": "GPU-0", "used_mib": 900, "clean": False, "left_mib": None}]
    assert report["killed"] == [] and report["terminated"] == [], "check mode killed nothing"
    table = reports.switch_table(reports.switch_run_report({"node2": report}, {"check_mode": True}))
    assert "node2: would drain 2 running request(s), stop vllm.service (1 GPU process(es) in them), signal 1 other GPU process(es)" in table
    assert "node2: would write sglang's unit (--diff shows the unit)" in table and "node2: would signal 51 (in no unit) python3" in table
    nothing = reports.switch_host_report(dict(planned_record(), previous="none", found=[]))
    assert "node2: would drain nothing (no engine running), stop" in reports.switch_table(reports.switch_run_report({"node2": nothing}, {}))


def test_fleet_serving_counts_follow_each_nodes_time_out_of_rotation():
    first = reports.switch_host_report(rotated_record())
    second = reports.switch_host_report(rotated_record(marks=[[phase, time + 20] for phase, time in rotated_record()["marks"]]))
    fresh = reports.switch_host_report(rotated_record(found=[], previous="none"))  # served nothing before
    document = reports.switch_run_report({"a": first, "b": second, "c": fresh, "d": None}, {"started": T0})
    fleet = document["fleet"]
    assert fleet["nodes"] == 4 and fleet["untouched"] == 1 and fleet["serving_at_start"] == 2 and fleet["serving_at_end"] == 3
    assert fleet["serving"] == [[0.0, 2], [3.0, 1], [18.0, 2], [18.0, 3], [23.0, 2], [38.0, 3]]
    assert fleet["min_serving"] == 1
    assert ("serving: 2 of 3 node(s) at the start, 3 at the end, never fewer than 1 (a node serves when its engine answers readiness);"
            " 1 node(s) not read in this run") in reports.switch_table(document)


def test_a_node_not_reached_that_serves_throughout_counts_as_serving():
    """Issue 23.4: a stopped rollout leaves node2 serving vLLM; it was read, not touched, and counts at both ends."""
    failed = reports.switch_host_report(rotated_record(result="rollback_failed", serving=["vllm"],
                                                       outcome={"result": "rollback_failed", "reason": "x", "rollback_error": "y"}))
    left = reports.not_reached_report("sglang", "rollout stopped", ["vllm"])
    fleet = reports.switch_run_report({"node1": failed, "node2": left}, {"started": T0})["fleet"]
    assert (fleet["serving_at_start"], fleet["serving_at_end"], fleet["min_serving"], fleet["untouched"]) == (2, 1, 1, 1)


def test_a_node_whose_engine_crash_loops_at_the_start_is_not_counted_as_serving():
    """Issue 23.4: its unit reads activating (found running) but its engine answered no readiness: it served no one."""
    looping = reports.switch_host_report(rotated_record(found=["vllm"], serving=[]))
    serving = reports.switch_host_report(rotated_record(found=["vllm"], serving=["vllm"]))
    assert looping["engines_found"] == ["vllm"] and looping["engines_serving"] == []
    fleet = reports.switch_run_report({"a": looping, "b": serving}, {"started": T0})["fleet"]
    assert (fleet["serving_at_start"], fleet["serving_at_end"], fleet["min_serving"]) == (1, 2, 0)
    # a node not reached and not read (unreachable) is neither serving nor down: counted apart
    unread = reports.switch_run_report({"a": None}, {"started": T0})["fleet"]
    assert (unread["serving_at_start"], unread["untouched"], unread["not_read"]) == (0, 1, 1)


def test_a_node_outside_the_limit_says_so():
    document = reports.switch_run_report({"node1": None, "node2": None}, {"not_in_limit": ["node1"]})
    assert document["hosts"]["node1"]["reason"] == "not in this run's --limit: left as it was, not contacted"
    assert document["hosts"]["node2"]["reason"] == "unreachable before its switch began"
    cleanup = reports.teardown_run_report({"node1": None}, {"not_in_limit": ["node1"]})
    assert cleanup["hosts"]["node1"]["result"] == "not_reached" and "--limit" in cleanup["hosts"]["node1"]["reason"]


def test_a_node_lost_during_its_teardown_is_failed_not_ok():
    """Ansible fails no unreachable step; the record must not read ok when the steps after it never ran."""
    report = reports.teardown_host_report(teardown_steps(holders={"unreachable": True, "msg": "ssh: connection refused"}))
    assert report["result"] == "failed" and report["failed_step"] == "holders"
    assert report["reason"] == "became unreachable during the holders step: ssh: connection refused"


PARKED_VLLM = {"engine": "vllm", "unit": "vllm.service", "model": "llama70b", "invocation_id": "abc", "parked_at": T0 + 6, "park_s": 0.4,
               "leftover_mib": {"0": 610}, "host_memory_bytes": 70 * 2**30}


def test_the_switch_document_matches_its_documentation():
    parking = {"park_decision": {"mode": "auto", "previous": "park", "reason": None, "wake": False, "evict": False, "path": "cold", "cold_reason": None},
               "park": dict(PARKED_VLLM, parked=True, seconds=0.4), "parked": PARKED_VLLM}
    hosts = {"node1": reports.switch_host_report(rotated_record(**parking)), "node2": reports.switch_host_report(planned_record()), "node3": None,
             "node4": reports.switch_host_report(replaced_record())}
    document = reports.switch_run_report(hosts, {"run_id": "r", "target": "sglang", "started": T0, "finished": T0 + 20,
                                                 "parameters": {"hosts": "gpu_nodes", "limit": None, "serial": [1, "25%"],
                                                                "max_fail_percentage": 0, "rotation": "none", "soak_seconds": 15}})
    assert document["schema_version"] == 1 and document["hosts"]["node3"]["result"] == "not_reached"
    assert document["summary"] == {"hosts": 4, "switched": 1, "unchanged": 0, "would_switch": 1, "preflight_failed": 0, "rolled_back": 1,
                                   "rollback_failed": 0, "failed": 0, "unreachable": 0, "not_reached": 1}
    assert set(document["hosts"]["node3"]) == set(document["hosts"]["node1"]), "a host not reached has every key"
    assert document["hosts"]["node1"]["park"]["previous"] == "park"
    assert all(host["standby"] == host["park"] for host in document["hosts"].values()), "standby stays the park's decision, for old tooling"
    assert_matches_docs(document, "switch_engine.json")


def test_the_cleanup_document_matches_its_documentation():
    hosts = {"node1": reports.teardown_host_report(teardown_steps(parked={"engine": "vllm", "unit": "vllm.service", "fate": "evicted", "reason": None})),
             "node2": None}
    document = reports.teardown_run_report(hosts, {"started": T0, "finished": T0 + 5,
                                                   "parameters": {"hosts": "gpu_nodes", "limit": None, "max_fail_percentage": 100}})
    assert document["summary"] == {"hosts": 2, "ok": 1, "failed": 0, "not_reached": 1}
    assert set(document["hosts"]["node2"]) == set(document["hosts"]["node1"])
    assert_matches_docs(document, "gpu_cleanup.json")


# --- the tables ------------------------------------------------------------------------------------------------------------
def test_teardown_table_lists_hosts_processes_and_failures():
    hosts = {"node1": reports.teardown_host_report(teardown_steps()),
             "node2": reports.teardown_host_report(teardown_steps(failed_step="Assert memory | Every selected GPU is free",
                                                                  failure={"msg": "GPU 3 leaked"})),
             "node3": None}
    table = reports.teardown_table(reports.teardown_run_report(hosts, {}))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["host", "result", "units"]
    assert lines[2].split()[:6] == ["node1", "ok", "vllm.service", "2", "2", "1"]
    assert "0:900" in lines[2] and "0:0" in lines[2]
    assert lines[4].startswith("node3  not_reached")
    assert "node2: FAILED at 'Assert memory | Every selected GPU is free': GPU 3 leaked" in table
    assert "node1: vllm.service: killed 42 python3 -m sglang.launch_server --model-path /m" in table
    assert "node1: vllm.service: triggers stopped first: vllm.socket" in table
    assert "node1: protected 7 nvidia-persiste (protected name nvidia-persistenced)" in table
    assert "node1: outside the units 8 python3 in session-4.scope (session): not signalled" in table


def test_check_mode_table_says_what_would_be_signalled():
    host = reports.teardown_host_report(teardown_steps(check_mode=True, holders={"targets": [PROCESS]}))
    assert "n: would signal 42 (in x) python3 -m sglang.launch_server" in reports.teardown_table({"hosts": {"n": host}})


def test_the_cleanup_says_what_becomes_of_the_parked_engine():
    """A --check of a cleanup on a node where vLLM is parked beside a serving SGLang: the parked engine's processes are
    named as the parked engine, and the line says the cleanup would evict it - the node's fast way back - and how to keep
    it; kept, it says so; one found dead is no loss and says why."""
    parked = dict(PROCESS, pid=51, unit="vllm.service")
    evicting = {"engine": "vllm", "unit": "vllm.service", "fate": "evicted", "reason": None}
    host = reports.teardown_host_report(teardown_steps(check_mode=True, holders={"targets": [parked, PROCESS]}, parked=evicting))
    table = reports.teardown_table({"hosts": {"n": host}})
    assert host["parked"] == evicting
    assert ("n: would evict the parked vllm (vllm.service), the node's fast way back to it; gpu_teardown_keep_parked: true keeps it"
            in table)
    assert "n: would signal 51 (in vllm.service - the parked engine) python3" in table
    assert "n: would signal 42 (in x) python3" in table, "another unit's process is not the parked engine"
    kept = reports.teardown_host_report(teardown_steps(check_mode=True, parked=dict(evicting, fate="kept")))
    assert "n: would keep the parked vllm (vllm.service) running" in reports.teardown_table({"hosts": {"n": kept}})
    gone = reports.teardown_host_report(teardown_steps(parked=dict(evicting, fate="not parked", reason="the node restarted since vllm parked")))
    assert "n: no engine is parked any more: the node restarted since vllm parked" in reports.teardown_table({"hosts": {"n": gone}})
    assert reports.teardown_host_report(teardown_steps())["parked"] is None


def test_check_mode_lines_say_whose_each_process_is_and_no_reading_after_is_shown():
    """Issue 42 (11): --check named the processes it would signal without saying which were another user's and which
    an engine's escaped worker; the cleanup's "MiB after" repeated the reading before. Each line says whose; the
    column says it was not measured."""
    escaped = dict(PROCESS, pid=50, user="vllm", unit="run-r1.scope", placement="elsewhere", foreign=False)
    alice = dict(PROCESS, pid=51, user="alice", unit="session-4.scope", placement="session", foreign=True)
    host = reports.teardown_host_report(teardown_steps(check_mode=True, holders={"targets": [PROCESS, escaped, alice], "foreign": [alice]}))
    assert host["planned"][1]["foreign"] is False and host["planned"][2]["foreign"] is True
    table = reports.teardown_table({"hosts": {"n": host}, "check_mode": True})
    assert "n: would signal 50 (an engine's escaped worker: user vllm, run-r1.scope) python3" in table
    assert "n: would signal 51 (ANOTHER USER'S: alice, session-4.scope, session) python3" in table
    row = table.splitlines()[2]
    assert row.rstrip().endswith("not measured (--check)") and "0:0" not in row.split("  ")[-1]
    real = reports.teardown_table({"hosts": {"n": reports.teardown_host_report(teardown_steps())}})
    assert "not measured" not in real and real.splitlines()[2].rstrip().endswith("0:0")


def test_switch_table_rows_and_details():
    record = switch_record("rollback_failed", outcome={"result": "rollback_failed", "reason": "Bring up | ...: exit 1",
                                                       "rollback_error": "Rollback | Start the previous engine: failed"})
    record["found"] = ["vllm", "sglang"]
    table = reports.switch_table({"hosts": {"node1": reports.switch_host_report(record), "node2": reports.not_reached_report("sglang", "x")}})
    lines = table.splitlines()
    assert lines[2].split()[:4] == ["node1", "vllm", "sglang", "rollback_failed"] and lines[3].split()[:4] == ["node2", "-", "sglang", "not_reached"]
    assert "node1: ROLLBACK FAILED, NO ENGINE IS SERVING: Rollback | Start the previous engine: failed" in table
    assert "node1: engines found running: vllm, sglang" in table and "node1: rollback_failed at verify: Bring up" in table


def test_the_failed_phase_is_the_one_before_the_recovery_steps():
    rolled = rotated_record("rolled_back", outcome={"result": "rolled_back", "reason": "verify failed"})
    rolled["marks"] = rolled["marks"][:9] + [["rollback", T0 + 17], ["join_rotation", T0 + 30], ["boot", T0 + 31], ["end", T0 + 32]]
    report = reports.switch_host_report(rolled)
    assert report["failed_phase"] == "verify" and report["out_of_rotation"] == [T0 + 3, T0 + 31] and report["downtime_s"] == 28.0
    stuck = rotated_record("failed", outcome={"result": "failed", "reason": "HAProxy socket refused"})
    stuck["marks"] = stuck["marks"][:5] + [["join_rotation", T0 + 4], ["end", T0 + 5]]
    assert reports.switch_host_report(stuck)["failed_phase"] == "leave_rotation"


def test_from_and_to_carry_engine_version_and_model_in_the_report_the_table_and_the_page():
    from ansible_collections.gpufleet.serving.plugins.plugin_utils import _html_report as html_report

    record = switch_record(target="vllm", previous="vllm", found=["vllm"],
                           from_engine={"engine": "vllm", "version": "0.33.0", "model": "/models/a"},
                           to_engine={"engine": "vllm", "version": "0.34.0", "model": "/models/a"})
    report = reports.switch_host_report(record)
    assert report["from"] == "vllm" and report["to"] == "vllm", "the engine names stay as they were"
    assert report["from_engine"] == {"engine": "vllm", "version": "0.33.0", "model": "/models/a"}
    assert report["to_engine"]["version"] == "0.34.0"
    document = reports.switch_run_report({"node1": report}, {})
    assert reports.switch_table(document).splitlines()[2].split()[:6] == ["node1", "vllm", "0.33.0", "vllm", "0.34.0", "switched"]
    assert "<td>vllm 0.33.0 -&gt; vllm 0.34.0</td>" in html_report.page(document)
    unknown = reports.switch_host_report(dict(record, from_engine={"engine": "vllm", "version": None, "model": None}))
    assert reports.engine_label(unknown, "from") == "vllm", "an unread version is left out, not guessed"


def test_check_mode_says_which_version_would_be_installed():
    record = dict(planned_record(), plan=dict(planned_record()["plan"], target_install={"version": "0.34.0", "installed": "0.33.0"}))
    table = reports.switch_table(reports.switch_run_report({"node2": reports.switch_host_report(record)}, {"check_mode": True}))
    assert "node2: would install sglang 0.34.0 (now 0.33.0) before the drain" in table
    fresh = dict(planned_record(), plan=dict(planned_record()["plan"], target_install={"version": "0.34.0", "installed": None}))
    assert "(now not installed)" in reports.switch_table(reports.switch_run_report({"node2": reports.switch_host_report(fresh)}, {}))


def test_the_cleanup_lists_other_users_gpu_processes_apart_with_what_became_of_them():
    """gpu_cleanup.yml kills foreign holders by default; its table and report name them apart (in --check: would be signalled)."""
    alice = dict(PROCESS, pid=51, comm="python3", unit="session-4.scope", placement="session", user="alice", foreign=True)
    bob = dict(PROCESS, pid=52, comm="jupyter", unit=None, placement="elsewhere", user="bob", foreign=True)
    killed = reports.teardown_host_report(teardown_steps(holders={"killed": [alice], "foreign": [alice]}))
    planned = reports.teardown_host_report(teardown_steps(check_mode=True, holders={"targets": [bob], "foreign": [bob]}))
    assert [(p["pid"], p["user"]) for p in killed["foreign"]] == [(51, "alice")]
    table = reports.teardown_table(reports.teardown_run_report({"node1": killed, "node2": planned}, {}))
    assert "node1: ANOTHER USER'S GPU process 51 python3 (user alice, session-4.scope, session): killed" in table
    assert "node2: ANOTHER USER'S GPU process 52 jupyter (user bob, no unit, elsewhere): would be signalled" in table


def test_a_node_outside_the_limit_is_not_counted_as_down():
    """Issue 42 (2): -l node1 on a 2-node fleet. node2 was never touched and not read: the fleet's counts leave it out
    (not_read 1) instead of counting it not serving (min_serving 0), and the table says so."""
    switched = reports.switch_host_report(rotated_record())
    document = reports.switch_run_report({"node1": switched, "node2": None}, {"started": T0, "not_in_limit": ["node2"]})
    fleet = document["fleet"]
    assert (fleet["nodes"], fleet["not_read"], fleet["serving_at_start"], fleet["serving_at_end"], fleet["min_serving"]) == (2, 1, 1, 1, 0)
    assert document["hosts"]["node2"]["engines_serving"] is None
    table = reports.switch_table(document)
    assert "serving: 1 of 1 node(s) at the start, 1 at the end" in table
    assert "1 node(s) not read in this run (outside --limit, or unreachable before its switch): not counted, neither serving nor down" in table


def test_from_is_unknown_when_the_engines_were_never_read():
    """Issue 42 (3): a node refused before the engines' read (a bad variable, unreachable) reports from: null, not
    "none" (which says it was read and no engine ran)."""
    unread = reports.switch_host_report({"target": "sglang", "outcome": {"result": "failed", "reason": "bad variable"}, "marks": []})
    assert unread["from"] is None
    read_empty = reports.switch_host_report({"target": "sglang", "previous": "none", "outcome": {"result": "failed", "reason": "x"}, "marks": []})
    assert read_empty["from"] == "none"


def test_a_process_stopped_with_its_unit_keeps_the_gpus_it_held_when_observed():
    """Issue 42 (5): the engine's workers die with their unit (systemd_stop_hard names them, without GPUs): their GPUs
    come from the reading before the teardown, so the report and the HTML tooltips name the holders' GPUs."""
    worker = {key: value for key, value in PROCESS.items() if key != "gpus"}
    steps = teardown_steps(before={"gpus": [{"index": 0, "uuid": "GPU-0", "used_mib": 900, "clean": False, "processes": [{"pid": 43}]},
                                            {"index": 1, "uuid": "GPU-1", "used_mib": 900, "clean": False, "processes": [{"pid": 43}, {"pid": 46}]}]})
    steps["units"]["results"][0]["terminated"] = [dict(worker, pid=43)]
    report = reports.teardown_host_report(steps)
    (unit,) = report["units"]
    assert [(p["pid"], p["gpus"]) for p in unit["terminated"]] == [(43, [0, 1])]
    switch = reports.switch_host_report(switch_record(teardown=report))
    assert (43, [0, 1]) in [(p["pid"], p["gpus"]) for p in switch["terminated"]]


def test_a_rerun_reports_what_an_interrupted_runs_cutover_did_from_the_nodes_record():
    """Issue 42 (12): after Ctrl-C the interrupted run's cutover went on to its end on the node; the rerun found it
    unchanged and said nothing of it. Its report keeps the node's record of that cutover, the table a line."""
    last = {"run_id": "20261204T170000-ctl-1.2-3", "target": "sglang", "previous": "vllm", "result": "switched", "reason": None,
            "finished": T0}
    unchanged = reports.switch_host_report(switch_record("unchanged", run_id="20261204T171000-ctl-9.9-9", last_cutover=last))
    kept = unchanged["last_cutover"]
    assert {key: kept[key] for key in ("run_id", "target", "previous", "result")} == {key: last[key] for key in ("run_id", "target", "previous", "result")}
    assert kept["finished"] == reports.switch_host_report(switch_record("unchanged", marks=[["end", T0]]))["finished"], "as the report's times are written"
    table = reports.switch_table({"hosts": {"node1": unchanged}})
    assert "node1: its last cutover was another run's (20261204T170000-ctl-1.2-3, " in table and "switched from vllm to sglang" in table
    own = reports.switch_host_report(switch_record("switched", run_id=last["run_id"], last_cutover=last))
    assert own["last_cutover"] is None, "this run's own cutover is the report itself"


# --- slices of one run (AWX/AAP job slicing) ------------------------------------------------------------------------------
def slice_report(ran: list, outside: list, started: float, run_id: str) -> dict:
    hosts = {host: reports.switch_host_report(rotated_record()) for host in ran} | dict.fromkeys(outside)
    return dict(reports.switch_run_report(hosts, {"target": "sglang", "not_in_limit": outside, "started": started, "finished": started + 20,
                                                  "run_id": run_id}))


def test_the_slices_reports_merge_into_one_fleet_report():
    first = slice_report(["node1", "node2"], ["node3"], T0, "slice-1")
    second = slice_report(["node3"], ["node1", "node2"], T0 + 5, "slice-2")
    merged = reports.merge_run_reports([first, second])
    assert sorted(merged["hosts"]) == ["node1", "node2", "node3"]
    assert [merged["hosts"][host]["result"] for host in ("node1", "node2", "node3")] == ["switched"] * 3
    assert merged["summary"]["hosts"] == 3 and merged["summary"]["switched"] == 3 and merged["target"] == "sglang"
    assert merged["started"] == first["started"] and merged["finished"] == second["finished"]
    assert [(part["run_id"], part["hosts"]) for part in merged["slices"]] == [("slice-1", ["node1", "node2"]), ("slice-2", ["node3"])]
    assert merged["fleet"]["nodes"] == 3 and merged["fleet"]["not_read"] == 0
    # a host of no slice stays as the slices saw it
    alone = reports.merge_run_reports([first])
    assert alone["hosts"]["node3"]["result"] == "not_reached"


def test_overlapping_slices_and_different_runs_are_refused():
    first = slice_report(["node1", "node2"], [], T0, "slice-1")
    with pytest.raises(reports.ReportError, match="node2 was run by slices 1 and 2"):
        reports.merge_run_reports([first, slice_report(["node2"], ["node1"], T0, "slice-2")])
    cleanup = reports.teardown_run_report({"node3": reports.teardown_host_report(teardown_steps())}, {})
    with pytest.raises(reports.ReportError, match="different runs: gpu_cleanup, switch_engine sglang"):
        reports.merge_run_reports([first, cleanup])
    with pytest.raises(reports.ReportError, match="no report"):
        reports.merge_run_reports([])


def test_a_node_ssh_never_reached_is_not_reached_and_one_lost_mid_run_failed():
    """node_teardown is the cleanup's first contact with a node: what SSH said decides whether anything ran there."""
    refused = {"unreachable": True, "msg": "Failed to connect to the host via ssh: ssh: connect to host 10.0.0.7 port 22: Connection refused"}
    report = reports.teardown_host_report(reports.teardown_run_steps(refused, False))
    assert report["result"] == "not_reached" and report["reason"].startswith("unreachable: Failed to connect") and report["failed_step"] is None
    dropped = {"unreachable": True, "msg": "Failed to connect to the host via ssh: Shared connection to 10.0.0.7 closed."}
    report = reports.teardown_host_report(reports.teardown_run_steps(dropped, False))
    assert report["result"] == "failed" and report["reason"].startswith("became unreachable") and report["failed_step"].startswith("Tear down")
    broken = {"failed": False, "msg": "Unsupported parameters for (gpufleet.serving.node_teardown) module: colour"}
    report = reports.teardown_host_report(reports.teardown_run_steps(broken, True))
    assert report["result"] == "failed" and "colour" in report["reason"] and report["check_mode"]


@pytest.mark.parametrize(("result", "check_mode", "failed"), [
    ("switched", False, False), ("unchanged", False, False), ("would_switch", True, False),
    ("preflight_failed", True, False), ("preflight_failed", False, True),
    ("rolled_back", False, True), ("rollback_failed", False, True), ("failed", True, True), ("unreachable", False, True)])
def test_one_verdict_fails_a_node_for_the_role_and_the_playbook_alike(result, check_mode, failed):
    assert reports.switch_failed({"result": result}, check_mode) is failed
    assert reports.switch_failed(None, check_mode) is False, "a node the role never reached has no report to fail it by"
