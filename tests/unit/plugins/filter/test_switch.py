"""The switch role's filters around engine_cutover: its inputs from the engines' facts, its lease bound, and what the
role records of its result (the teardown records the report reads)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch

FACTS = {"engine": "sglang", "unit": "sglang.service", "url": "http://127.0.0.1:30000", "served_model_name": "m", "ready_timeout": 600,
         "api_key": ""}


def test_an_engines_facts_become_the_cutovers_engine():
    assert _switch.cutover_engine(FACTS) == {"engine": "sglang", "unit": "sglang.service", "url": "http://127.0.0.1:30000", "model": "m",
                                             "api_key": None, "ready_timeout": 600.0}
    with pytest.raises(_switch.SwitchError, match="lack url"):
        _switch.cutover_engine(dict(FACTS, url=""))


def test_the_record_drops_the_nodes_end_mark_and_keeps_teardowns_as_gpu_teardown_records():
    result = {"result": "switched", "reason": None, "marks": [["drain", 10.0], ["teardown", 10.2], ["bring_up", 10.6], ["end", 13.0]],
              "teardown": {"check_mode": False, "units": {"results": [{"unit": "vllm.service", "changed": True,
                                                                       "state_before": {"ActiveState": "active"}, "state_after": {"ActiveState": "inactive"}}]},
                           "holders": {"killed": [{"pid": 7, "comm": "python3", "cmdline": ["python3", "-m", "vllm"]}]},
                           "before": {"gpus": [{"index": 0, "used_mib": 900, "clean": False}]},
                           "after": {"gpus": [{"index": 0, "used_mib": 0, "clean": True}]}},
              "rollback_teardown": None, "engine_start_s": 2.4}
    record = _switch.cutover_record(result)
    assert record["marks"] == [["drain", 10.0], ["teardown", 10.2], ["bring_up", 10.6]]
    assert record["outcome"] == {"result": "switched"} and record["engine_start_s"] == 2.4
    assert record["teardown"]["result"] == "ok" and record["teardown"]["units"][0]["after"] == "inactive"
    assert record["teardown"]["killed"][0]["cmdline"] == "python3 -m vllm" and record["teardown"]["memory_after"][0]["clean"]
    assert record["rollback_teardown"] is None
    assert record["serving_since"] == 13.0 and record["cutover_result"] == "switched", "the node's end: an engine serves from then"


def test_a_target_soaked_in_the_cutover_served_from_its_soaks_start_and_a_crash_in_it_from_the_rollbacks_end():
    soaked = {"result": "switched", "marks": [["drain", 10.0], ["teardown", 10.2], ["bring_up", 10.6], ["soak", 13.0], ["end", 28.0]],
              "engine_start_s": 2.4, "lease_released": True}
    record = _switch.cutover_record(soaked)
    assert record["marks"][-1] == ["soak", 13.0] and record["serving_since"] == 13.0, "ready at the soak's start, not at its end"
    assert record["lease_released"] is True
    crashed = dict(soaked, result="rolled_back", reason="soak: sglang.service crashed", lease_released=False,
                   marks=soaked["marks"][:-1] + [["rollback", 21.0], ["end", 24.0]])
    record = _switch.cutover_record(crashed)
    assert record["serving_since"] == 24.0 and record["lease_released"] is False, "the previous engine served again at the end"


def test_a_failed_teardown_and_a_failed_rollback_keep_their_reasons():
    result = {"result": "rollback_failed", "reason": "teardown: units: survived", "rollback_error": "after: GPU 3 busy", "marks": [],
              "teardown": {"check_mode": False, "units": {"results": []}, "failed_step": "units", "failure": {"msg": "survived", "failed": True}},
              "rollback_teardown": {"check_mode": False, "failed_step": "after", "failure": {"msg": "GPU 3 busy", "failed": True}}}
    record = _switch.cutover_record(result)
    assert record["outcome"] == {"result": "rollback_failed", "reason": "teardown: units: survived", "rollback_error": "after: GPU 3 busy"}
    assert record["teardown"]["result"] == "failed" and record["teardown"]["failed_step"] == "units"
    assert record["rollback_teardown"]["reason"] == "GPU 3 busy"
    assert record["serving_since"] is None, "no engine serves after a failed rollback"
    with pytest.raises(_switch.SwitchError, match="'maybe' is not one of"):
        _switch.cutover_record({"result": "maybe"})


ENGINE_OF = {"vllm.service": "vllm", "sglang.service": "sglang"}


def test_the_boot_state_the_cutover_left_names_the_engine_enabled_and_none_set_keeps_what_was():
    switched = {"result": "switched", "marks": [["bring_up", 10.0], ["end", 12.0]], "boot": {"at_boot": "sglang.service"}}
    assert _switch.cutover_record(switched, ENGINE_OF, ["vllm"])["enabled"] == ["sglang"]
    assert _switch.cutover_record(dict(switched, boot={"at_boot": None}), ENGINE_OF, ["vllm"])["enabled"] == [], "no engine at boot"
    assert _switch.cutover_record(dict(switched, boot=None), ENGINE_OF, ["vllm"])["enabled"] == ["vllm"], "not set: as it was"
    node = _switch.cutover_record(dict(switched, parked={"engine": "vllm"}), ENGINE_OF, [])["node"]
    assert node["parked"] == {"engine": "vllm"} and node["cutover_result"] == "switched" and node["serving_since"] == 12.0
    assert "parked" not in _switch.cutover_record(switched)["node"], "no park record written: the one read stands"


def test_the_controllers_rollback_updates_what_it_changed_and_keeps_the_cutovers_result():
    """The cutover switched, the soak after the join failed, the rollback alone ran: the report reads the rollback's
    serving time, boot and restaging, and still the cutover's own result and park (finish.yml does not run the
    rollback's finish twice)."""
    cutover = _switch.cutover_record({"result": "switched", "marks": [["bring_up", 10.0], ["end", 12.0]], "boot": {"at_boot": "sglang.service"},
                                      "park": {"parked": True, "seconds": 0.4}, "parked": {"engine": "vllm"}}, ENGINE_OF, ["vllm"])
    rolled = {"result": "rolled_back", "reason": "soak: sglang.service crashed", "marks": [["rollback", 40.0], ["end", 44.0]],
              "boot": {"at_boot": "vllm.service"}, "park": {"parked": True}, "parked": None, "rollback_teardown": None, "restage": None}
    record = _switch.rollback_record(rolled, ENGINE_OF, cutover["enabled"], cutover["node"])
    assert record["marks"] == [["rollback", 40.0]] and record["outcome"] == {"result": "rolled_back", "reason": "soak: sglang.service crashed"}
    assert record["enabled"] == ["vllm"]
    assert record["node"]["serving_since"] == 44.0 and record["node"]["parked"] is None, "woken: no engine parked any more"
    assert record["node"]["cutover_result"] == "switched" and record["node"]["park"] == {"parked": True, "seconds": 0.4}
    assert _switch.rollback_record(rolled, ENGINE_OF, [], None)["node"]["serving_since"] == 44.0, "a cutover that failed as a task left none"


def test_a_task_that_lost_the_node_is_told_from_one_that_did_not():
    assert _switch.lost_during({"unreachable": True, "msg": "ssh: timed out"}, "cutover") == {
        "result": "unreachable", "reason": "became unreachable during cutover: ssh: timed out"}
    assert _switch.lost_during({"result": "lease_lost", "reason": "held by run-2"}, "rollback") == {
        "result": "failed", "reason": "lost the switch lease during rollback (held by run-2)"}
    renewal = {"holder": {"owner": "run-2"}, "msg": ""}
    assert _switch.lost_during(renewal, "stage", "run-1")["result"] == "failed", "a renewal another run holds"
    assert _switch.lost_during(renewal, "stage", "run-2") is None
    assert _switch.lost_during({"skipped": True}, "stage", "run-1") is None, "a skipped renewal lost nothing"
    assert _switch.lost_during({"result": "switched"}, "cutover") is None


def test_a_hub_model_is_staged_under_the_models_root_and_a_path_is_not():
    root = "/var/lib/gpufleet-models"
    assert _switch.staged_model_dir("meta-llama/Llama-3.3-70B-Instruct", "main", root) == f"{root}/meta-llama--Llama-3.3-70B-Instruct"
    assert _switch.staged_model_dir("org/m", "v1.2", root + "/") == f"{root}/org--m@v1.2", "another revision, another directory"
    assert _switch.staged_model_dir("/models/Llama", "main", root) == "", "a path is verified where it is"
    assert _switch.staged_model_dir("org/m", "main", "") == "", "no root: not staged"
    assert _switch.staged_model_dir("unsloth/GLM-5-GGUF:UD-Q4_K_XL", "main", root) == f"{root}/unsloth--GLM-5-GGUF--UD-Q4_K_XL", (
        "one quant of a repository of many: a directory of its own")
    for model, revision, root_given, message in [("org/m", "main", "models", "switch_engine_models_root: give an absolute directory"),
                                                 ("org/m", "../x", root, "model revision '../x'"),
                                                 ("not a model", "main", root, "neither a hub repository")]:
        with pytest.raises(_switch.SwitchError, match=message):
            _switch.staged_model_dir(model, revision, root_given)


def cutover_steps(**where):
    return {"where": {"preflight": "controller", "stage_files": "controller", "prewarm": "controller", "soak": "controller", **where},
            "in_place": False, "park": {"previous": "stop"}, "answer_check": {"kind": "sanity"}, "cutover_lease_seconds": 900.0}


OFFERED = {"previous": dict(FACTS, engine="vllm", unit="vllm.service", secrets_path="/etc/gpufleet/vllm.env"), "backup_dir": "/var/backup/",
           "clear_paths": ["/var/backup/staged"], "preflight": {"engine": "sglang"}, "files": [{"name": "unit"}],
           "prewarm_paths": ["/models/m", None], "soak": 30, "stage_timeout": 600, "replacing": False, "answer_check": {"tolerance": 0.05}}


def test_the_cutover_is_given_only_what_the_planner_put_inside_it():
    behind_a_balancer = _switch.cutover_inputs(cutover_steps(), OFFERED)
    assert behind_a_balancer["preflight"] is None and behind_a_balancer["files"] == [] and behind_a_balancer["prewarm_paths"] == []
    assert behind_a_balancer["soak"] == 0.0 and behind_a_balancer["restore"] == [] and behind_a_balancer["clear_paths"] == []
    assert behind_a_balancer["previous"]["unit"] == "vllm.service" and behind_a_balancer["answer_check"] == {"tolerance": 0.05}
    alone = _switch.cutover_inputs(cutover_steps(preflight="cutover", stage_files="cutover", prewarm="cutover", soak="cutover"), OFFERED)
    assert alone["preflight"] == {"engine": "sglang"} and alone["files"] == [{"name": "unit"}]
    assert alone["prewarm_paths"] == ["/models/m"] and alone["soak"] == 30.0 and alone["lease_seconds"] == 900.0
    assert _switch.cutover_inputs(dict(cutover_steps(), answer_check={"kind": None}), OFFERED)["answer_check"] is None, "the check is off"
    assert _switch.cutover_inputs(cutover_steps(), dict(OFFERED, previous={}))["previous"] is None, "no engine served before"


def test_an_in_place_switch_restores_the_backup_and_a_replacement_neither_prewarms_nor_parks():
    in_place = _switch.cutover_inputs(dict(cutover_steps(), in_place=True), OFFERED)
    assert in_place["restore"] == [{"src": "/var/backup/vllm.service", "dest": "/etc/systemd/system/vllm.service"},
                                   {"src": "/var/backup/vllm.env", "dest": "/etc/gpufleet/vllm.env"}]
    assert in_place["clear_paths"] == ["/var/backup/staged"]
    parking = dict(cutover_steps(prewarm="cutover"), park={"previous": "park"})
    assert _switch.cutover_inputs(parking, OFFERED)["park_previous"] is True
    replacing = _switch.cutover_inputs(parking, dict(OFFERED, replacing=True))
    assert replacing["park_previous"] is False and replacing["prewarm_paths"] == [], "the previous model goes: nothing to park, nothing to read yet"
    assert replacing["lease_seconds"] == 900.0 + 2 * 600, "the target's download and the rollback's again"
