"""The switch's planner on its own: every decision the role's tasks follow, from settings and what the read found."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._models import staging
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch_plan as switch_plan

VLLM = {"engine": "vllm", "configured": True, "install": False, "version": None, "dedicated_user": False, "user": "root",
        "model_dir": None, "draft_model_dir": None, "virtualenvs_root": None, "timeout_stop_sec": 75, "ready_timeout": 600,
        "model": "/models/m"}
SGLANG = dict(VLLM, engine="sglang", timeout_stop_sec=None, ready_timeout=300)
ENGINES = {"vllm": VLLM, "sglang": SGLANG}


def settings(**changes) -> switch_plan.Settings:
    values = {"target": "sglang", "rotation": "none", "prewarm": True, "prewarm_timeout": 30, "soak_seconds": 3, "lease_seconds": 300,
              "backup_dir": "/var/lib/gpufleet-serving/switch", "run_id": "run-1"}
    return switch_plan.Settings.from_vars({**values, **changes})


def found(**changes) -> switch_plan.Found:
    values = {"engines": ENGINES, "found": ["vllm"], "serving": ["vllm"], "previous": "vllm"}
    return switch_plan.Found.from_vars({**values, **changes})


def test_with_no_balancer_the_cutover_runs_every_movable_phase_and_gives_the_lease_back():
    steps = switch_plan.plan(settings(), found())
    assert not steps["unchanged"] and not steps["prepare"] and not steps["stage"]
    assert {name: steps["where"][name] for name in ("preflight", "stage_files", "prewarm", "soak", "release")} == dict.fromkeys(
        ("preflight", "stage_files", "prewarm", "soak", "release"), "cutover")
    assert steps["where"]["leave_rotation"] == steps["where"]["join_rotation"] == "skip"
    # vLLM's unit bound (75 s); its bound covers the preflight and the prewarm run inside the cutover
    assert steps["stop_bound"] == 75
    # each teardown: its stop bound, SIGKILL of its group and a settle (1 s), the holders' TERM and KILL, the memory (_teardown.steps.longest_run)
    # and the answer checks: the target's and a rollback's, each a probe that times out (120 s) and its retry a second later
    assert steps["cutover_bound"] == 120 + 2 * (75 + 1 + 60 + 30 + 60) + 300 + 600 + 2 * (2 * 120 + 1)
    assert switch_plan.plan(settings(answer_check=False), found())["cutover_bound"] == 120 + 2 * (75 + 1 + 60 + 30 + 60) + 300 + 600
    assert switch_plan.plan(settings(answer_timeout=30), found())["cutover_bound"] == 120 + 2 * (75 + 1 + 60 + 30 + 60) + 300 + 600 + 2 * 61
    assert steps["cutover_lease_seconds"] == 300 + steps["cutover_bound"] + 3 + 30 + switch_plan.PREFLIGHT_BOUND


def test_a_balancer_keeps_the_steps_around_the_drain_on_the_controller():
    steps = switch_plan.plan(settings(rotation="haproxy"), found())
    assert steps["prepare"] and steps["stage"]
    assert [steps["where"][name] for name in ("preflight", "stage_files", "prewarm", "leave_rotation", "join_rotation", "soak", "release")] == [
        "controller"] * 7
    assert steps["cutover_lease_seconds"] == 300 + steps["cutover_bound"] + 3


def test_check_mode_plans_on_the_controller_and_a_pinned_install_not_yet_made_is_not_run():
    pinned = dict(SGLANG, install=True, version="0.5.23")
    steps = switch_plan.plan(settings(check_mode=True), found(engines={"vllm": VLLM, "sglang": pinned}))
    assert steps["where"]["preflight"] == "controller" and steps["where"]["prewarm"] == "controller"
    assert steps["where"]["stage_files"] == "skip" and steps["where"]["backup"] == "skip"
    assert steps["preflight_checks"] == ["model", "gpus", "port", "holders"]
    assert steps["would_change"]["install"]


def test_a_pinned_install_or_a_user_to_create_keeps_the_preflight_on_the_controller():
    pinned = dict(SGLANG, install=True, version="0.5.23", virtualenvs_root="/opt/engines")
    steps = switch_plan.plan(settings(), found(engines={"vllm": VLLM, "sglang": pinned}, target_installed="0.5.23"))
    assert steps["where"]["preflight"] == "controller" and not steps["would_change"]["install"]
    # the soak still runs in the cutover, but the prune after it keeps the lease on the controller
    assert steps["where"]["soak"] == "cutover" and steps["where"]["prune"] == "controller" and steps["where"]["release"] == "controller"
    dedicated = dict(SGLANG, dedicated_user=True, user="sglang")
    creates = switch_plan.plan(settings(), found(engines={"vllm": VLLM, "sglang": dedicated}, user_ready=False))
    assert creates["where"]["preflight"] == "controller" and creates["where"]["user"] == "controller"
    assert switch_plan.plan(settings(), found(engines={"vllm": VLLM, "sglang": dedicated}, user_ready=True))["where"]["preflight"] == "cutover"


def test_unchanged_only_when_the_target_alone_serves_its_configuration():
    serving = found(found=["sglang"], serving=["sglang"], previous="sglang")
    assert switch_plan.plan(settings(), serving)["unchanged"]
    assert not switch_plan.plan(settings(), found(found=["sglang"], serving=[], previous="sglang"))["unchanged"]
    assert not switch_plan.plan(settings(), found(found=["sglang", "vllm"], serving=["sglang"], previous="vllm"))["unchanged"]
    assert not switch_plan.plan(settings(), found(found=["sglang"], serving=["sglang"], previous="sglang", files={"unit": ["ExecStart"]}))["unchanged"]
    # an interrupted run's staged files compare equal, but the engine still runs what it was started with
    staged = switch_plan.plan(settings(), found(found=["sglang"], serving=["sglang"], previous="sglang", staged=True))
    assert staged["staged"] and not staged["unchanged"]


def test_a_target_serving_beside_the_engines_escaped_workers_is_unchanged_and_sweeps_them():
    engines = {"vllm": dict(VLLM, unit="vllm.service"), "sglang": dict(SGLANG, unit="sglang.service")}
    stray = {"pid": 4242, "user": "vllm", "unit": None, "devices": ["/dev/nvidia6"], "via": ["fd"]}
    serving = {"engines": engines, "found": ["sglang"], "serving": ["sglang"], "previous": "sglang"}
    steps = switch_plan.plan(settings(), found(**serving, escaped=[stray]))
    # the target is not restarted for them: unchanged, and the teardown takes the other engine's processes only
    assert steps["unchanged"]
    assert steps["sweep"] == {"pids": [4242], "units": ["vllm.service"], "kept_units": ["sglang.service"]}
    assert switch_plan.plan(settings(), found(**serving))["sweep"] is None
    # a switch's own teardown kills them: no sweep of its own
    switching = switch_plan.plan(settings(), found(engines=engines, escaped=[stray]))
    assert not switching["unchanged"] and switching["sweep"] is None


def test_an_unchanged_node_forgets_a_parked_engine_that_is_parked_no_more():
    """Found by the fault campaign (seed 4000): the parked engine killed, a rerun unchanged left its record and its
    start hold - a later start of its unit skipped in silence."""
    serving = {"found": ["sglang"], "serving": ["sglang"], "previous": "sglang"}
    dead = {"engine": "vllm", "unit": "vllm.service", "alive": False, "reason": "the parked vllm died (vllm.service is inactive)"}
    steps = switch_plan.plan(settings(), found(**serving, parked=dead))
    assert steps["unchanged"]
    assert steps["forget_parked"] == {"engine": "vllm", "unit": "vllm.service", "reason": dead["reason"],
                                      "paths": ["/var/lib/gpufleet-serving/parked.json", "/run/gpufleet-serving/parked/vllm.service"]}
    assert switch_plan.plan(settings(), found(**serving, parked=dict(dead, alive=True, reason=None)))["forget_parked"] is None
    assert switch_plan.plan(settings(), found(**serving))["forget_parked"] is None
    # a switch decides the parked engine's fate itself (cold, evicted)
    assert switch_plan.plan(settings(), found(parked=dead))["forget_parked"] is None
    assert steps["parked_forgotten"], "removed for real: nothing parked on the node afterwards"
    assert not switch_plan.plan(settings(check_mode=True), found(**serving, parked=dead))["parked_forgotten"], "--check removes nothing"
    assert not switch_plan.plan(settings(), found(**serving))["parked_forgotten"]


def test_what_follows_the_read_is_one_answer_the_role_includes():
    """The role's task file after the read, and whether it prepares: the planner's answer, not the role's Jinja."""
    serving = {"found": ["sglang"], "serving": ["sglang"], "previous": "sglang"}
    assert switch_plan.plan(settings(), found(**serving))["path"] == "unchanged"
    assert switch_plan.plan(settings(check_mode=True), found())["path"] == "plan"
    assert switch_plan.plan(settings(), found())["path"] == "switch"
    behind = settings(rotation="haproxy")
    assert switch_plan.plan(behind, found())["prepare"] and not switch_plan.plan(behind, found(**serving))["prepare"], (
        "an unchanged node prepares nothing")
    assert switch_plan.plan(behind, found(**serving))["rejoin_rotation"], "an unchanged node behind a balancer is put back in rotation"
    assert not switch_plan.plan(settings(), found(**serving))["rejoin_rotation"], "no balancer: nothing to join"
    assert not switch_plan.plan(settings(rotation="haproxy", check_mode=True), found(**serving))["rejoin_rotation"], "--check joins nothing"
    assert not switch_plan.plan(behind, found())["rejoin_rotation"], "a switch joins after its cutover"


def test_the_way_back_leaves_another_users_job_unless_the_operator_asked_to_kill_it():
    """Seed 6000: the rollback refusing a job that came during the cutover left no engine."""
    assert switch_plan.plan(settings(), found())["rollback_outside_units"] == "report"
    assert switch_plan.plan(settings(outside_units="report"), found())["rollback_outside_units"] == "report"
    assert switch_plan.plan(settings(outside_units="kill"), found())["rollback_outside_units"] == "kill"


def test_an_engine_switched_in_place_is_backed_up_and_its_files_carry_the_staged_mark():
    steps = switch_plan.plan(settings(), found(found=["sglang"], serving=["sglang"], previous="sglang", files={"unit": ["ExecStart"]}))
    assert steps["in_place"] and steps["where"]["backup"] == "controller" and steps["prepare"]
    assert steps["staged_mark_files"] == [{"name": "staged", "path": "/var/lib/gpufleet-serving/switch/staged", "content": "run-1\n", "mode": "0600"}]
    assert switch_plan.plan(settings(), found())["staged_mark_files"] == []


def test_hub_models_are_staged_on_the_controllers_step_and_the_spec_floor_is_verified_there():
    hub = dict(SGLANG, model="org/m", model_revision="v2", model_dir="/srv/models/org--m@v2", draft_model="org/d", draft_model_dir="/srv/models/org--d")
    steps = switch_plan.plan(settings(min_spec_acceptance=0.5), found(engines={"vllm": VLLM, "sglang": hub}))
    assert steps["where"]["stage_model"] == "controller" and steps["where"]["verify"] == "controller"
    assert steps["where"]["soak"] == "controller" and steps["where"]["release"] == "controller"
    assert steps["stage_items"] == [{"label": "org/m", "source": "org/m", "revision": "v2", "dest": "/srv/models/org--m@v2", "quant": None,
                                     "merge_gguf": False},
                                    {"label": "org/d", "source": "org/d", "revision": "main", "dest": "/srv/models/org--d"}]


def test_a_switch_that_stages_a_model_checks_the_target_before_it_fetches_anything():
    """With no balancer the preflight is the cutover's first step - unless a model is staged first: then it runs before
    the download, so that what would refuse the target (the engine cannot load the model) is known before hours of fetching."""
    plain = switch_plan.plan(settings(), found(found=["vllm"], serving=["vllm"], previous="vllm"))
    hub = dict(SGLANG, model="org/m", model_dir="/srv/models/org--m")
    staging_first = switch_plan.plan(settings(), found(engines={"vllm": VLLM, "sglang": hub}, found=["vllm"], serving=["vllm"], previous="vllm"))
    assert plain["where"]["preflight"] == "cutover"
    assert staging_first["where"]["preflight"] == "controller" and staging_first["where"]["stage_model"] == "controller"


def test_one_quant_of_a_hub_repository_is_staged_alone_and_merged():
    """vllm_model: org/name-GGUF:QUANT - the repository without the quant is the source, the quant selects its files,
    and a split set is merged into the one file the engine loads."""
    quant = dict(VLLM, model="unsloth/GLM-5-GGUF:UD-Q4_K_XL", model_dir="/srv/models/unsloth--GLM-5-GGUF--UD-Q4_K_XL",
                 tokenizer="zai-org/GLM-5", tokenizer_dir="/srv/models/zai-org--GLM-5--tokenizer")
    steps = switch_plan.plan(settings(target="vllm"), found(engines={"vllm": quant, "sglang": SGLANG}, found=["sglang"], serving=["sglang"],
                                                            previous="sglang"))
    assert steps["stage_items"] == [{"label": "unsloth/GLM-5-GGUF:UD-Q4_K_XL", "source": "unsloth/GLM-5-GGUF", "revision": "main",
                                     "dest": "/srv/models/unsloth--GLM-5-GGUF--UD-Q4_K_XL", "quant": "UD-Q4_K_XL", "merge_gguf": True},
                                    {"label": "zai-org/GLM-5", "source": "zai-org/GLM-5", "revision": "main", "dest": "/srv/models/zai-org--GLM-5--tokenizer",
                                     "files": staging.TOKENIZER_FILES, "files_optional": True}], "the base model's tokenizer, never its weights"


def test_no_previous_engine_and_an_explicit_stop_bound():
    steps = switch_plan.plan(settings(stop_timeout=20), found(found=[], serving=[], previous="none"))
    assert steps["stop_bound"] == 20 and steps["cutover_bound"] == 120 + 2 * (20 + 1 + 60 + 30 + 60) + 300 + 2 * (2 * 120 + 1)
    assert switch_plan.plan(settings(), found(found=[], serving=[], previous="none"))["stop_bound"] == switch_plan.DEFAULT_STOP_BOUND
    assert switch_plan.plan(settings(prewarm=False), found())["where"]["prewarm"] == "skip"


@pytest.mark.parametrize("result, cutover_node, in_place, rotation, expected", [
    ("switched", {"cutover_result": "switched"}, False, "none", (False, False)),
    ("switched", {"cutover_result": "switched"}, False, "haproxy", (True, False)),  # join and soak on the controller
    ("switched", {"cutover_result": "switched", "boot_error": "enable failed"}, False, "none", (True, False)),
    ("rolled_back", {"cutover_result": "rolled_back"}, False, "none", (True, False)),  # back in rotation, boot
    ("rolled_back", {"cutover_result": "failed"}, True, "none", (True, True)),  # the controller's rollback: the mark is left
    ("switched", {"cutover_result": "switched"}, True, "none", (False, False)),  # the cutover removed the mark itself
    ("failed", None, True, "none", (False, False)),  # no engine serves: the staged mark stays for the rerun
])
def test_what_is_left_after_the_cutover(result, cutover_node, in_place, rotation, expected):
    node = found(found=["sglang"], serving=["sglang"], previous="sglang", files={"unit": ["x"]}) if in_place else found()
    steps = switch_plan.plan(settings(rotation=rotation), node)
    left = switch_plan.finish_steps(steps, result, cutover_node)
    assert (left["finish"], left["clear_mark"]) == expected


def test_bad_settings_are_named():
    with pytest.raises(InvalidInput, match="switch_engine_rotation is dns: none, haproxy"):
        switch_plan.plan(settings(rotation="dns"), found())
    with pytest.raises(InvalidInput, match="soak_seconds: must be at least 0"):
        settings(soak_seconds=-1)
    with pytest.raises(InvalidInput, match="unknown colour"):
        switch_plan.Settings.from_vars({"target": "vllm", "colour": "red"})


def test_before_the_read_the_rotation_hooks_complete_or_why_not_and_the_first_lease():
    def error(**changes):
        return switch_plan.opening(settings(**changes))["rotation_error"]
    assert error() == "" and error(rotation="haproxy", haproxy_backend="engines") == ""
    assert "with switch_engine_haproxy_backend" in error(rotation="haproxy")
    assert error(rotation="custom", leave_tasks="leave.yml", join_tasks="join.yml") == ""
    assert error(rotation="custom", leave_tasks="leave.yml").startswith("switch_engine_rotation is custom")
    assert switch_plan.opening(settings())["first_lease_seconds"] == 330
    assert switch_plan.opening(settings(prewarm=False))["first_lease_seconds"] == 300


def test_only_a_previous_model_staged_from_the_hub_may_be_replaced_and_its_staging_is_the_way_back():
    """switch_engine_replace_model (issue 52, 5): the previous engine's staged directory and its staging for a rollback -
    decided with the opt-in or without (a refusal names the way through) - or why not."""
    quant = dict(VLLM, model="unsloth/GLM-5-GGUF:UD-Q4_K_XL", model_dir="/srv/models/unsloth--GLM-5-GGUF--UD-Q4_K_XL")
    nvfp4 = dict(SGLANG, model="nvidia/GLM-5-NVFP4", model_dir="/srv/models/nvidia--GLM-5-NVFP4", model_revision="v2")
    pivot = found(engines={"vllm": quant, "sglang": nvfp4}, found=["sglang"], serving=["sglang"], previous="sglang")
    steps = switch_plan.plan(settings(target="vllm", replace_model=True), pivot)
    assert steps["replace"] == {"asked": True, "path": "/srv/models/nvidia--GLM-5-NVFP4", "reason": None,
                                "restage": {"label": "nvidia/GLM-5-NVFP4", "source": "nvidia/GLM-5-NVFP4", "revision": "v2",
                                            "dest": "/srv/models/nvidia--GLM-5-NVFP4", "quant": None, "merge_gguf": False}}
    assert switch_plan.plan(settings(target="vllm"), pivot)["replace"]["path"] == "/srv/models/nvidia--GLM-5-NVFP4", "named without the opt-in"
    from_path = found(engines={"vllm": quant, "sglang": SGLANG}, found=["sglang"], serving=["sglang"], previous="sglang")
    refused = switch_plan.plan(settings(target="vllm", replace_model=True), from_path)["replace"]
    assert refused["path"] is None and refused["reason"] == ("sglang's model /models/m is not staged from the hub: it could not be staged "
                                                             "again for a rollback, so it is never removed")
    required = switch_plan.plan(settings(target="vllm", replace_model=True, park_previous="required"), pivot)["replace"]
    assert required["path"] is None and "park" in required["reason"]
    same = found(engines={"vllm": quant, "sglang": nvfp4}, found=["sglang"], serving=["sglang"], previous="sglang")
    in_place = switch_plan.plan(settings(target="sglang", replace_model=True), same)["replace"]
    assert in_place["path"] is None and "in-place" in in_place["reason"]


def test_the_cutovers_staging_request_is_the_item_with_the_common_options_replacing_first():
    item = {"label": "lab/Tiny-GGUF:Q8_0", "source": "lab/Tiny-GGUF", "revision": "main", "dest": "/m/q8", "quant": "Q8_0", "merge_gguf": True}
    request = switch_plan.stage_request(item, {"endpoint": "http://hub", "margin_mib": 1}, "/m/old")
    assert request == {"source": "lab/Tiny-GGUF", "revision": "main", "dest": "/m/q8", "quant": "Q8_0", "merge_gguf": True,
                       "endpoint": "http://hub", "margin_mib": 1, "replaceable": "/m/old", "replace": "now"}


def test_the_plan_says_which_answer_check_the_target_gets():
    """Issue 53 (4): golden where a record of the target's engine, model, version and command is on the node; a sanity
    check where there is none, where its command or version changes, or on a refresh; none when off."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers

    sglang = dict(SGLANG, served_model_name="llama70b")
    argv = ["/usr/bin/sglang", "serve", "--model-path", "/models/m"]
    record = dict(answers.identity("sglang", "llama70b", "0.5.23", argv), created=1_700_000_000)
    node = found(engines={"vllm": VLLM, "sglang": sglang}, target_installed="0.5.23", target_argv=argv, answer_records=[record])
    assert switch_plan.plan(settings(), node)["answer_check"] == {"kind": "golden", "probes": 3, "reason": None, "recorded_at": 1_700_000_000}
    other_version = found(engines={"vllm": VLLM, "sglang": sglang}, target_installed="0.5.24", target_argv=argv, answer_records=[record])
    assert switch_plan.plan(settings(answer_expectations=2), other_version)["answer_check"]["kind"] == "sanity"
    assert switch_plan.plan(settings(answer_expectations=2), other_version)["answer_check"]["probes"] == 5
    changed = switch_plan.plan(settings(), found(engines={"vllm": VLLM, "sglang": sglang}, target_installed="0.5.23", target_argv=argv,
                                                 answer_records=[record], files={"unit": ["ExecStart"]}))
    assert changed["answer_check"]["reason"] == "its command line or version changes: no record is this configuration's yet"
    assert switch_plan.plan(settings(answer_refresh=True), node)["answer_check"]["kind"] == "sanity"
    assert switch_plan.plan(settings(answer_check=False), node)["answer_check"]["kind"] is None


def test_check_mode_says_the_answer_check_the_run_makes_when_it_wakes_a_parked_target():
    """Found on a 2-node lab: SGLang parked with its answers recorded, `--check` said "a sanity check: its command line
    or version changes" and the run woke it and compared with its record. The plan takes the identity the cutover's
    check takes - the parked unit's command (engine_observe's read, through the switch's observed()), the version the
    run reports - and one rule (answers.record_for) picks the record for both: golden, this record, in each."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers
    from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch

    argv = ["/opt/sglang/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/m", "--enable-memory-saver"]
    observe = {"engines": {"vllm": {"running": True, "serving": True, "installed": True, "argv": ["/opt/vllm/bin/vllm", "serve", "/models/m"]},
                           "sglang": {"running": True, "installed": True, "argv": argv}},
               "parked": {"engine": "sglang", "unit": "sglang.service", "alive": True}}
    seen = _switch.observed(observe, ["vllm", "sglang"], "sglang")
    assert seen["found"] == ["vllm"] and seen["commands"]["sglang"] == argv, "a parked engine is not running, but its command is read"
    sglang = dict(SGLANG, served_model_name="llama70b", version="0.5.23")
    record = dict(answers.identity("sglang", "llama70b", "0.5.23", argv), created=1_700_000_000)
    node = found(engines={"vllm": VLLM, "sglang": sglang}, target_installed="0.5.23", target_argv=seen["commands"]["sglang"],
                 answer_records=[record], parked=observe["parked"])
    steps = switch_plan.plan(settings(check_mode=True, park_previous="auto"), node)
    assert steps["park"]["wake"] and steps["answer_check"] == {"kind": "golden", "probes": 3, "reason": None, "recorded_at": 1_700_000_000}
    # the run: the cutover's identity (engine, served name, the version it reports, the unit's command) and its verdict
    ran = answers.identity("sglang", "llama70b", "0.5.23", argv)
    got = [answers.Answer(**probe) for probe in record.get("probes") or []]
    assert answers.record_for(ran, node.answer_records) is record
    assert answers.judge(ran, record, got, [], [], 0.0)["kind"] == "golden"


def test_the_previous_engine_is_one_running_other_than_the_target_else_the_target_in_place_else_none():
    assert switch_plan.previous_engine(["vllm", "sglang"], "vllm") == "sglang"
    assert switch_plan.previous_engine(["sglang", "vllm"], "sglang") == "vllm"
    assert switch_plan.previous_engine(["vllm"], "vllm") == "vllm", "a switch in place: the target is its own way back"
    assert switch_plan.previous_engine([], "vllm") == "none"
    assert switch_plan.plan(settings(), found(previous="sglang", found=["sglang"], serving=["sglang"]))["in_place"]
    assert not switch_plan.plan(settings(), found())["in_place"]
