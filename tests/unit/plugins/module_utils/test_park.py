"""Parking the previous engine: what an engine can do from the command its unit runs, the room checks and their
figures, the node's record of its parked engine, the planner's decision, and the cutover's park, wake and rollback
paths over the recording NodeOps of test_cutover."""

from __future__ import annotations

import json

import pytest
from test_cutover import SGLANG, UNITS, VLLM, Clock, Node

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import park
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, Error, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._node import parked
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch_plan as switch_plan

VLLM_SLEEPS = ("/opt/vllm/bin/vllm", "serve", "/models/m", "--enable-sleep-mode")
SGLANG_SAVES = ("/opt/sglang/bin/python", "-m", "sglang.launch_server", "--enable-memory-saver", "--enable-weights-cpu-backup")


@pytest.mark.parametrize(("engine", "argv", "version", "why"), [
    ("vllm", VLLM_SLEEPS, "0.33.0", None),
    ("vllm", VLLM_SLEEPS, "0.32.0+cpu", "vLLM 0.32.0+cpu is a CPU build: it has no sleep mode"),
    ("vllm", VLLM_SLEEPS[:3], "0.33.0", "vllm runs without --enable-sleep-mode"),
    ("sglang", SGLANG_SAVES, "0.5.23", None),
    ("sglang", SGLANG_SAVES[:4], "0.5.23", "sglang runs without --enable-weights-cpu-backup (without the CPU backup its weights are discarded"),
    ("sglang", SGLANG_SAVES[:3], None, "sglang runs without --enable-memory-saver and --enable-weights-cpu-backup"),
])
def test_an_engine_parks_only_as_its_unit_started_it(engine, argv, version, why):
    answer = park.why_not_parkable(engine, argv, version)
    assert (answer is None) if why is None else answer.startswith(why)


def test_the_room_checks_give_their_figures():
    assert park.host_room(100 * 2**30, 60 * 2**30, 2048) is None
    assert park.host_room(60 * 2**30, 60 * 2**30, 2048) == "host memory: 60.0 GiB of weights + 2048 MiB margin > 60.0 GiB available"
    assert park.host_room(60 * 2**30, None, 2048).startswith("the parked engine's weights could not be sized")
    gpus = [{"index": 0, "total_mib": 100000}, {"index": 1, "total_mib": 100000}]
    assert park.gpu_room(gpus, {"0": 5000, "1": 15000}, 0.9) == [
        "GPU 1: the target's 0.9 x 100000 MiB + 15000 MiB kept by the parked engine > 100000 MiB"]
    assert park.gpu_room(gpus, {0: 5000}, None) == [], "no fraction and no engine: nothing to judge by"
    # no fraction: the engine's own default - vLLM's 0.92, SGLang's most (total - 10 GiB on a GPU over 60 GiB: 0.898)
    assert park.gpu_room(gpus, {0: 5000, 1: 9000}, None, "vllm") == [
        "GPU 1: the target's 0.92 x 100000 MiB + 9000 MiB kept by the parked engine > 100000 MiB"]
    assert park.gpu_room(gpus, {0: 5000, 1: 11000}, None, "sglang") == [
        "GPU 1: the target's 0.898 x 100000 MiB + 11000 MiB kept by the parked engine > 100000 MiB"]


def test_a_parked_engine_is_the_units_invocation_that_parked(tmp_path):
    path = tmp_path / "parked.json"
    assert parked.read_record(str(path)) is None
    path.write_text("{not json")
    assert parked.read_record(str(path)) is None, "an unreadable record parks nothing"
    record = {"engine": "vllm", "unit": "vllm.service", "invocation_id": "abc"}
    path.write_text(json.dumps(record))
    assert parked.read_record(str(path)) == record
    assert parked.alive(record, {"ActiveState": "active", "InvocationID": "abc"}) == (True, None)
    assert parked.alive(record, {"ActiveState": "active", "InvocationID": "def"}) == (
        False, "the parked vllm was restarted since it parked (vllm.service has another invocation)")
    assert parked.alive(record, {"ActiveState": "failed"}) == (False, "the parked vllm died (vllm.service is failed)")
    assert parked.remove_record(str(path)) and not path.exists()


def test_after_a_node_restart_the_parked_engine_is_gone_because_the_boot_changed():
    """A record of this boot is judged by the unit; one of another boot says the node restarted, not that the engine
    died - even where systemd restarted the unit since (it serves cold: it is no parked engine)."""
    record = {"engine": "vllm", "unit": "vllm.service", "invocation_id": "abc", "boot_id": "boot-1"}
    assert parked.alive(record, {"ActiveState": "active", "InvocationID": "abc"}, boot="boot-1") == (True, None)
    restarted = (False, "the node restarted since vllm parked (another boot): a parked engine does not outlive a restart")
    assert parked.alive(record, {"ActiveState": "inactive"}, boot="boot-2") == restarted
    assert parked.alive(record, {"ActiveState": "active", "InvocationID": "xyz"}, boot="boot-2") == restarted
    older = {key: value for key, value in record.items() if key != "boot_id"}
    assert parked.alive(older, {"ActiveState": "inactive"}, boot="boot-2")[1] == "the parked vllm died (vllm.service is inactive)", (
        "a record written before boot ids were kept is judged as before")
    assert parked.alive(dict(record, boot_id=parked.boot_id()), {"ActiveState": "active", "InvocationID": "abc"}) == (True, None)


def plan(mode="auto", previous="vllm", parked=None, files=None, argv=VLLM_SLEEPS, version="0.33.0", available=200 * 2**30, park_history=None,
         target_fraction=None, **settings):
    engines = {"vllm": {"model_path": "/models/v", "ready_timeout": 60, "memory_fraction": target_fraction},
               "sglang": {"model_path": "/models/s", "ready_timeout": 60, "memory_fraction": target_fraction}}
    found = switch_plan.Found(engines=engines, found=[previous] if previous != "none" else [], serving=[previous], previous=previous,
                              files=files or {}, parked=parked, previous_argv=list(argv), previous_version=version,
                              host={"available_bytes": available}, sizes={"/models/v": 60 * 2**30, "/models/s": 60 * 2**30},
                              park_history=park_history or {})
    return switch_plan.plan(switch_plan.Settings(target=settings.pop("target", "sglang"), park_previous=mode, **settings), found)


def test_the_planner_parks_where_the_engine_and_the_host_allow_and_says_why_not_elsewhere():
    assert plan("off")["park"]["previous"] == "stop"
    assert plan()["park"] | {} == {"mode": "auto", "previous": "park", "reason": None, "wake": False, "evict": False, "forget_record": False,
                                   "parked_unit": None,
                                   "path": "cold", "cold_reason": None, "refused": None}
    cpu = plan(version="0.32.0+cpu")["park"]
    assert cpu["previous"] == "stop" and cpu["reason"] == "vLLM 0.32.0+cpu is a CPU build: it has no sleep mode" and cpu["refused"] is None
    small = plan(available=40 * 2**30)["park"]
    assert small["previous"] == "stop" and small["reason"].startswith("host memory: 60.0 GiB of weights")
    refused = plan("required", version="0.32.0+cpu")["park"]
    assert refused["refused"] == ("switch_engine_park_previous is required and vllm cannot be parked: "
                                  "vLLM 0.32.0+cpu is a CPU build: it has no sleep mode")
    assert plan("required", previous="none")["park"]["refused"] is None, "nothing serves: nothing to park, nothing refused"
    assert plan("required", target="vllm")["park"]["previous"] == "stop", "an engine switched in place is replaced, not parked"
    with pytest.raises(InvalidInput, match="switch_engine_park_previous: 'sometimes' is not one of off, auto, required"):
        plan("sometimes")


def test_the_planner_checks_each_gpu_by_what_the_engines_last_park_left_before_anything_is_drained():
    history = parked.remembered({}, "vllm", {"leftover_mib": {"0": 30000}, "gpus": [{"index": 0, "total_mib": 100000}], "seconds": 0.6})
    found = plan(park_history=history)["park"]
    assert found["previous"] == "stop" and found["reason"].startswith("GPU 0: the target's 0.898 x 100000 MiB + 30000 MiB"), (
        "the target's memory fraction is its engine's default: SGLang's most (0.898 of 100000 MiB) is judged")
    light = parked.remembered({}, "vllm", {"leftover_mib": {"0": 600}, "gpus": [{"index": 0, "total_mib": 100000}], "seconds": 0.6})
    assert plan(park_history=light)["park"]["previous"] == "park"
    engines_fraction = plan(park_history=history, target_fraction=0.9)["park"]
    assert engines_fraction["previous"] == "stop" and engines_fraction["reason"] == (
        "GPU 0: the target's 0.9 x 100000 MiB + 30000 MiB kept by the parked engine > 100000 MiB (what vllm's last park on this node left)")
    assert plan("required", park_history=history, target_fraction=0.9)["park"]["refused"].startswith(
        "switch_engine_park_previous is required and vllm cannot be parked: GPU 0")
    assert plan(park_history=history, target_fraction=0.6)["park"]["previous"] == "park"


def test_the_planner_wakes_the_parked_target_evicts_a_changed_one_and_starts_cold_after_a_death():
    parked_vllm = {"engine": "vllm", "unit": "vllm.service", "alive": True}
    wake = plan(previous="sglang", parked=parked_vllm, target="vllm", argv=SGLANG_SAVES)
    assert wake["park"]["wake"] and wake["park"]["path"] == "wake" and wake["park"]["previous"] == "stop", "switching back stops the other"
    assert "port" not in wake["preflight_checks"] and "gpus" not in wake["preflight_checks"], "the parked target holds its own port and GPUs"
    changed = plan(previous="sglang", parked=parked_vllm, target="vllm", argv=SGLANG_SAVES, files={"unit": ["--max-model-len"]})["park"]
    assert changed["evict"] and not changed["wake"] and changed["cold_reason"].startswith("the parked vllm is not what was asked")
    other = plan(previous="sglang", parked={"engine": "sglang", "unit": "sglang.service", "alive": True}, target="vllm", argv=SGLANG_SAVES)["park"]
    assert other["evict"], "at most one engine parked per node"
    dead = plan(previous="sglang", parked=dict(parked_vllm, alive=False, reason="the parked vllm died (vllm.service is failed)"),
                target="vllm", argv=SGLANG_SAVES)["park"]
    assert not dead["wake"] and not dead["evict"] and dead["cold_reason"] == "the parked vllm died (vllm.service is failed)"
    assert dead["forget_record"] and changed["forget_record"], "the record of a parked engine that died goes with the cutover (the planner's answer)"
    assert not wake["park"]["forget_record"], "a woken engine's record is the cutover's to remove"


class ParkingNode(Node):
    """Test_cutover's recording node, with the standby calls; `leftover` is what a park leaves per GPU."""

    def __init__(self, clock, leftover=None, **options):
        super().__init__(clock, **options)
        self.leftover = leftover or {"0": 600}
        self.records = []
        self.costs.update(park=0.4, wake=0.3)

    def decide(self, units, kept=()):
        self._step("decide", tuple(units), tuple(kept))
        return {}

    def kill_holders(self, units, kept=(), leave_foreign=False):
        self._step("kill_holders", tuple(units), tuple(kept))
        return {"killed": [], "terminated": [], "targets": [], "outside": [], "kept": [{"pid": 77, "unit": unit} for unit in kept]}

    def park(self, engine, timeout):
        self._step("park", engine.unit)
        return {"seconds": 0.4, "at": 1.0, "invocation_id": "inv-1", "leftover_mib": self.leftover,
                "gpus": [{"index": 0, "total_mib": 100000}], "host_memory_bytes": 60 * 2**30}

    def wake(self, engine, timeout):
        self._step("wake", engine.unit)
        return {"call_s": 0.3}

    def record_parked(self, record, measured=None):
        self.records.append(record)
        self.measured = measured


def run(node, clock, target=SGLANG, previous=VLLM, **options):
    request = cutover.CutoverRequest(units=UNITS, target=target, previous=previous, drain_timeout=120, stop_grace=5, stop_timeout=90, **options)
    return cutover.cutover(request, node, clock, wall_now=1_700_000_000.0)


def names(node):
    return [call[0] for call in node.calls]


def test_a_park_keeps_the_previous_engine_through_the_teardown_and_records_it():
    clock = Clock()
    node = ParkingNode(clock)
    result = run(node, clock, park_previous=True, target_memory_fraction=0.9)
    assert result["result"] == "switched"
    assert names(node)[:6] == ["drain", "park", "memory", "stop_units", "kill_holders", "memory"]
    assert ("stop_units", ("sglang.service",), 5) in node.calls, "the parked unit is not stopped"
    assert ("kill_holders", ("sglang.service",), ("vllm.service",)) in node.calls, "its processes are kept"
    assert ("memory", True, (77,)) in node.calls, "its memory is not counted by the assertion"
    assert (names(node)[1], result["park"]["seconds"]) == ("park", 0.4)
    assert [mark[0] for mark in result["marks"]][:3] == ["drain", "park", "teardown"]
    assert node.records == [result["parked"]] and result["parked"]["unit"] == "vllm.service" and result["parked"]["invocation_id"] == "inv-1"
    assert node.measured["leftover_mib"] == {"0": 600} and node.measured["gpus"] == [{"index": 0, "total_mib": 100000}], (
        "what the park left is kept for the next one's planning")


def test_a_park_that_leaves_the_target_too_little_wakes_the_previous_engine_again():
    clock = Clock()
    node = ParkingNode(clock, leftover={"0": 20000})
    result = run(node, clock, park_previous=True, target_memory_fraction=0.9)
    assert result["result"] == "rolled_back"
    assert result["reason"] == "park: GPU 0: the target's 0.9 x 100000 MiB + 20000 MiB kept by the parked engine > 100000 MiB"
    assert "start" not in names(node) and names(node)[-2:] == ["wake", "wait_ready"], "woken, never started cold"
    assert node.records == [None], "nothing stays parked"


def test_a_target_that_fails_after_a_park_is_rolled_back_by_waking_the_parked_engine():
    clock = Clock()
    node = ParkingNode(clock, failures={("wait_ready", "sglang.service"): CheckFailed("no answer")})
    result = run(node, clock, park_previous=True)
    assert result["result"] == "rolled_back"
    assert ("start", "vllm.service") not in node.calls and ("wake", "vllm.service") in node.calls
    rollback_stops = [call for call in node.calls if call[0] == "stop_units"][-1]
    assert rollback_stops == ("stop_units", ("sglang.service",), 5), "the rollback's teardown keeps the parked engine too"


def test_a_park_call_that_fails_stops_the_engine_as_without_a_park():
    clock = Clock()
    node = ParkingNode(clock, failures={"park": Error("vllm POST /sleep?level=1: HTTP 404 {\"detail\":\"Not Found\"}")})
    result = run(node, clock, park_previous=True)
    assert result["result"] == "switched" and result["park"]["parked"] is False
    assert result["park"]["reason"].startswith("the park failed, stopped instead: vllm POST /sleep?level=1: HTTP 404")
    assert ("stop_units", tuple(UNITS), 5) in node.calls and node.records == [None]


def test_a_wake_replaces_the_start_and_a_failed_wake_rolls_back_to_a_cold_start():
    clock = Clock()
    node = ParkingNode(clock)
    result = run(node, clock, target=VLLM, previous=SGLANG, wake=True)
    assert result["result"] == "switched" and ("start", "vllm.service") not in node.calls
    assert ("stop_units", ("sglang.service",), 5) in node.calls and ("wake", "vllm.service") in node.calls
    assert result["wake"]["wake_s"] == result["engine_start_s"] and node.records == [None], "woken: nothing parked any more"
    clock = Clock()
    node = ParkingNode(clock, failures={"wake": Error("vllm POST /wake_up: HTTP 500")})
    result = run(node, clock, target=VLLM, previous=SGLANG, wake=True)
    assert result["result"] == "rolled_back" and ("start", "sglang.service") in node.calls
    assert ("stop_units", tuple(UNITS), 5) in node.calls, "the rollback tears the failed wake down with the rest"


def test_a_park_request_is_checked():
    with pytest.raises(InvalidInput, match="park_previous: there is no previous engine to park"):
        cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=None, park_previous=True)
    with pytest.raises(InvalidInput, match="at most one engine is parked on a node"):
        cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, park_previous=True, wake=True)


def test_a_parked_engines_processes_are_kept_never_signalled_nor_foreign():
    from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import holders, holders_kill

    request = holders_kill.KillRequest(gpus=None, device_paths=["/dev/nvidia*"], sources=["proc"], protected=[], protected_pids=[],
                                       term_timeout=1, kill_timeout=1, max_targets=8, kill_ambiguous=False, nvml_timeout=1, lock_timeout=1,
                                       units=("sglang.service",), outside_units="fail", owner_uids=frozenset({998}),
                                       kept_units=("vllm.service",))
    parked = {"pid": 10, "uid": 997, "unit": "vllm.service"}
    target = {"pid": 11, "uid": 998, "unit": "sglang.service"}
    alice = {"pid": 12, "uid": 1000, "unit": "session-3.scope"}
    plan = holders.KillPlan(holders=[parked, target, alice], targets=[parked, target, alice])
    holders_kill.place_holders(plan, request, lambda _unit: ("", 0))
    assert [holder["pid"] for holder in plan.kept] == [10] and plan.kept[0]["placement"] == "kept_unit"
    assert [holder["pid"] for holder in plan.targets] == [11, 12]
    assert [holder["pid"] for holder in plan.outside] == [12], "a foreign job beside a parked engine is still refused"
    assert holders_kill.refusal(plan, request).startswith("1 process(es) hold the GPUs outside the units being stopped")


class RecordingHost:
    """The module's side of the node: systemctl calls recorded (with what was held at each), nothing run."""

    def __init__(self, hold_dir):
        self.hold_dir = hold_dir
        self.calls = []
        self.warnings = []

    def get_bin_path(self, name, required=False):
        return f"/usr/bin/{name}"

    def run_command(self, argv, environ_update=None):
        held = sorted(p.name for p in self.hold_dir.iterdir()) if self.hold_dir.is_dir() else []
        self.calls.append((argv[1:], held))
        return 0, "", ""

    def warn(self, message):
        self.warnings.append(message)


def test_a_parked_engine_is_held_from_systemds_restarts_until_a_switch_starts_or_forgets_it(tmp_path):
    """A parked engine that dies must not be restarted cold by systemd (Restart=) beside the engine that serves: its
    unit's start is held while it is parked, and released by whatever starts it or stops keeping it."""
    from pathlib import Path

    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
    from ansible_collections.gpufleet.serving.plugins.module_utils._switch import cutover_node
    from ansible_collections.gpufleet.serving.plugins.module_utils._teardown import run as teardown_node

    record_path = tmp_path / "parked.json"
    holds = Path(parked.hold_dir(str(record_path)))
    host = RecordingHost(holds)
    node = cutover_node.CutoverNode(host, {"parked_path": str(record_path), "journal_path": "", "run_id": "run-1"}, ProcReader(), None)

    def held():
        return sorted(p.name for p in holds.iterdir()) if holds.is_dir() else []

    node.record_parked({"engine": "vllm", "unit": "vllm.service"}, {})
    assert held() == ["vllm.service"]
    node.record_parked({"engine": "sglang", "unit": "sglang.service"}, {})
    assert held() == ["sglang.service"], "one engine parked per node: the other's hold goes"
    node.start("sglang.service")
    assert host.calls[-1] == (["start", "--", "sglang.service"], []), "released before the start: systemd would skip it and answer 0"
    node.record_parked({"engine": "vllm", "unit": "vllm.service"}, {})
    node.record_parked(None)
    assert held() == [] and not record_path.exists()
    # a teardown that stops the parked engine forgets it: the operator's own start of it later is not skipped
    node.record_parked({"engine": "vllm", "unit": "vllm.service"}, {})
    teardown_node.forget_evicted({"parked_path": str(record_path), "steps": ["units"]}, ["vllm.service"], ())
    assert held() == [] and not record_path.exists()
    node.record_parked({"engine": "vllm", "unit": "vllm.service"}, {})
    teardown_node.forget_evicted({"parked_path": str(record_path), "steps": ["units"]}, ["vllm.service"], ("vllm.service",))
    assert held() == ["vllm.service"], "kept parked: still held"
    assert parked.hold_dir(parked.RECORD_PATH) == parked.HOLD_DIR


def test_the_engine_unit_skips_its_start_while_the_node_holds_it():
    from pathlib import Path

    from ansible_collections.gpufleet.serving.plugins.filter.node import node_path

    hold_dir = "{{ 'park_hold_dir' | gpufleet.serving.node_path }}"
    assert node_path("park_hold_dir") == parked.HOLD_DIR, "the roles read the hold where the modules write it"
    template = (Path(__file__).resolve().parents[4] / "roles/engine_common/templates/engine.service.j2").read_text()
    assert f"ConditionPathExists=!{hold_dir}/%n\n" in template
    roles = Path(__file__).resolve().parents[4] / "roles"
    # whatever starts an engine by systemctl releases its hold first
    assert f'path: "{hold_dir}/{{{{ engine_common_facts.unit }}}}"' in (roles / "engine_common/tasks/main.yml").read_text()
    # the switch starts engines only through engine_cutover (its start releases the hold), its rollback too
    assert "systemd_service" not in (roles / "switch_engine/tasks/rollback.yml").read_text()


def test_the_controllers_rollback_wakes_the_previous_engine_the_node_recorded_as_parked_and_forgets_its_record():
    """A switch that parked vLLM and whose soak after the join failed: the controller's rollback keeps the parked vLLM
    through the target's teardown and wakes it - a start would find its unit active and leave it asleep."""
    clock = Clock()
    node = ParkingNode(clock)
    request = cutover.CutoverRequest(units=UNITS, target=SGLANG, previous=VLLM, stop_grace=5, park_previous=True, boot=True)
    result = cutover.rollback_alone(request, node, clock, 1_700_000_000.0, "soak: sglang.service crashed", parked_unit="vllm.service")
    assert ("kill_holders", ("sglang.service",), ("vllm.service",)) in node.calls, "the parked engine's processes are kept"
    assert ("wake", "vllm.service") in node.calls and ("start", "vllm.service") not in node.calls
    assert result["result"] == "rolled_back" and node.records == [None], "woken: the park record goes"
    cold = ParkingNode(clock)
    cutover.rollback_alone(request, cold, clock, 1_700_000_000.0, "soak: sglang.service crashed", parked_unit=None)
    assert ("start", "vllm.service") in cold.calls and ("wake", "vllm.service") not in cold.calls, "no record: started cold"
