"""gpu_memory_assert's judgement on its own (plugins/module_utils/_gpus/memory.py): the limits, what a problem says,
why a dirty GPU is dirty, the request's checks. NVML readings are given as the module's inventory shapes them."""

from __future__ import annotations

import os

import pytest
from test_pure_logic import FakeClock

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import memory
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.memory import Limits, MemoryRequest


def gpu(index: int, used: int | None = 0, total: int | None = 1000, status: str = "ok", api: str = "v2", processes=(), **more) -> dict:
    return {"index": index, "uuid": f"GPU-{index}", "bus_id": f"0000:0{index}:00.0", "minor": index, "status": status, "memory_api": api,
            "total_mib": total, "used_mib": used, "reserved_mib": 10, "processes": list(processes), **more}


def inventory(*gpus: dict) -> dict:
    return {"driver_version": "580.1", "gpus": list(gpus)}


def params(**overrides) -> dict:
    return {"gpus": None, "expected_count": None, "max_used_mib": None, "max_used_percent": None, "max_processes": None, "v1_reserve_mib": 1024,
            "timeout": 30, "interval": 0.5, "nvml_timeout": 10, "device_paths": None, "left_pids": None, **overrides}


def test_the_default_limit_is_512_mib_and_a_percent_alone_replaces_it():
    assert memory.DEFAULT_MAX_USED_MIB == 512 and memory.DEFAULT_V1_RESERVE_MIB == 1024
    assert MemoryRequest.from_params(params()).limits == Limits(512, None, 1024, None, frozenset())
    assert MemoryRequest.from_params(params(max_used_percent=5)).limits.max_used_mib is None
    both = MemoryRequest.from_params(params(max_used_mib=100, max_used_percent=5.5, max_processes=0, v1_reserve_mib=0, left_pids=[7, 9]))
    assert both.limits == Limits(100, 0, 0, 5.5, frozenset({7, 9}))


def test_a_request_keeps_what_it_was_given_and_defaults_the_device_files():
    request = MemoryRequest.from_params(params(gpus=["0", "GPU-1"], expected_count=8, timeout=0, interval=0.25, nvml_timeout=3))
    assert (request.gpus, request.expected_count, request.timeout, request.interval, request.nvml_timeout) == (["0", "GPU-1"], 8, 0, 0.25, 3)
    assert request.device_paths == list(memory.DEFAULT_DEVICE_GLOBS)
    assert MemoryRequest.from_params(params(gpus=[], device_paths=["/dev/nvidia0"])).gpus is None
    assert MemoryRequest.from_params(params(device_paths=["/dev/nvidia0"])).device_paths == ["/dev/nvidia0"]


@pytest.mark.parametrize(("overrides", "says"), [
    ({"left_pids": [1]}, "left_pids: 1 is not a process id"),
    ({"left_pids": [True]}, "left_pids: True is not a process id"),
    ({"left_pids": ["7"]}, "left_pids: '7' is not a process id"),
    ({"max_used_mib": -1}, "max_used_mib: must be a whole number of MiB, at least 0, got -1"),
    ({"max_used_mib": True}, "max_used_mib: must be a whole number of MiB, at least 0, got True"),
    ({"max_used_mib": 1.5}, "max_used_mib: must be a whole number of MiB, at least 0, got 1.5"),
    ({"max_used_percent": 100.5}, "max_used_percent: must be a share of each GPU's memory from 0 to 100, got 100.5"),
    ({"max_used_percent": -0.1}, "max_used_percent: must be a share of each GPU's memory from 0 to 100, got -0.1"),
    ({"max_used_percent": False}, "max_used_percent: must be a share of each GPU's memory from 0 to 100, got False"),
    ({"max_used_percent": "5"}, "max_used_percent: must be a share of each GPU's memory from 0 to 100, got '5'"),
    ({"interval": 0}, "interval"),
    ({"nvml_timeout": 0}, "nvml_timeout"),
    ({"timeout": -1}, "timeout"),
])
def test_a_bad_request_is_refused_naming_the_option(overrides, says):
    with pytest.raises(InvalidInput) as refused:
        MemoryRequest.from_params(params(**overrides))
    assert refused.value.msg.startswith(says), refused.value.msg


@pytest.mark.parametrize(("percent", "max_used"), [(0, 0), (100, None)])
def test_the_bounds_of_a_limit_are_allowed(percent, max_used):
    assert MemoryRequest.from_params(params(max_used_percent=percent, max_used_mib=max_used)).limits.max_used_percent == percent


def test_v1_used_memory_is_counted_without_the_driver_reserve():
    assert memory.comparable_used_mib({"memory_api": "v1", "used_mib": 1024}, 1024) == 0
    assert memory.comparable_used_mib({"memory_api": "v1", "used_mib": 1000}, 1024) == 0
    assert memory.comparable_used_mib({"memory_api": "v1", "used_mib": 1100}, 1024) == 76
    assert memory.comparable_used_mib({"memory_api": "v2", "used_mib": 1100}, 1024) == 1100
    assert memory.comparable_used_mib({"memory_api": "v1", "used_mib": None}, 1024) is None


def test_a_gpu_at_its_limit_is_clean_and_one_mib_over_is_not():
    limits = Limits(max_used_mib=512)
    assessment = memory.assess(inventory(gpu(0, used=512), gpu(1, used=513)), [0, 1], limits)
    assert [g["problems"] for g in assessment.gpus] == [[], ["513 MiB used > max_used_mib 512"]]
    assert [g["clean"] for g in assessment.gpus] == [True, False] and assessment.dirty == [1] and assessment.fatal == []
    assert [g["compared_used_mib"] for g in assessment.gpus] == [512, 513]


def test_a_percent_limit_is_of_each_gpus_own_total_and_both_limits_must_hold():
    limits = Limits(max_used_mib=None, max_used_percent=10)
    assessment = memory.assess(inventory(gpu(0, used=100, total=1000), gpu(1, used=101, total=1000), gpu(2, used=150, total=2000)), [0, 1, 2], limits)
    assert [g["problems"] for g in assessment.gpus] == [[], ["101 MiB used > max_used_percent 10 % of 1000 MiB"], []]
    both = memory.assess(inventory(gpu(0, used=150, total=2000)), [0], Limits(max_used_mib=120, max_used_percent=10))
    assert both.gpus[0]["problems"] == ["150 MiB used > max_used_mib 120"]
    assert Limits(None, max_used_percent=10).used_limits(None) == [] and Limits(None, max_used_percent=10).used_limits(0) == []
    assert Limits(None, max_used_percent=12.5).used_limits(800) == [(100.0, "max_used_percent 12.5 % of 800 MiB")]


def test_only_the_selected_gpus_are_judged_in_the_order_asked():
    assessment = memory.assess(inventory(gpu(0, used=900), gpu(1), gpu(2, used=900)), [2, 1], Limits(512))
    assert [g["index"] for g in assessment.gpus] == [2, 1] and assessment.dirty == [2]


def test_processes_over_their_limit_are_counted_without_the_holders_left_on_purpose():
    listed = [{"pid": 10, "used_mib": 300}, {"pid": 11, "used_mib": 200}]
    assessment = memory.assess(inventory(gpu(0, used=100, processes=listed)), [0], Limits(None, max_processes=1))
    assert assessment.gpus[0]["problems"] == ["2 processes > max_processes 1"]
    at_limit = memory.assess(inventory(gpu(0, used=100, processes=listed[:1])), [0], Limits(None, max_processes=1))
    assert at_limit.passed
    left = memory.assess(inventory(gpu(0, used=600, processes=listed)), [0], Limits(512, max_processes=0, left_pids=frozenset({10, 11})))
    assert left.passed and left.gpus[0]["left_mib"] == 500 and left.gpus[0]["compared_used_mib"] == 100


def test_a_left_holder_is_discounted_and_named_when_the_gpu_is_still_dirty():
    listed = [{"pid": 10, "used_mib": 300}, {"pid": 11, "used_mib": None}, {"pid": 12, "used_mib": 400}]
    assessment = memory.assess(inventory(gpu(0, used=1000, processes=listed)), [0], Limits(512, left_pids=frozenset({10, 11})))
    assert assessment.gpus[0]["left_mib"] == 300 and assessment.gpus[0]["compared_used_mib"] == 700
    assert assessment.gpus[0]["problems"] == ["700 MiB used > max_used_mib 512",
                                              "300 MiB of left holder(s) 10, 11 not counted (NVML reports no memory for 11)"]
    known = memory.assess(inventory(gpu(0, used=1000, processes=listed[:1] + listed[2:])), [0], Limits(512, left_pids=frozenset({10})))
    assert known.gpus[0]["problems"][1] == "300 MiB of left holder(s) 10 not counted"
    none_left = memory.assess(inventory(gpu(0, used=1000, processes=listed)), [0], Limits(512))
    assert none_left.gpus[0]["left_mib"] is None and none_left.gpus[0]["problems"] == ["1000 MiB used > max_used_mib 512"]
    more_than_used = memory.assess(inventory(gpu(0, used=200, processes=listed[:1])), [0], Limits(512, left_pids=frozenset({10})))
    assert more_than_used.gpus[0]["compared_used_mib"] == 0


def test_a_gpu_nvml_cannot_read_is_dirty_and_lost_or_reset_or_error_will_not_get_better():
    gpus = [gpu(0, used=None, status="lost", error="GPU is lost"), gpu(1, used=None, status="reset_required"),
            gpu(2, used=None, status="error", error="Unknown Error"), gpu(3, used=None, status="not_supported"), gpu(4, used=None)]
    assessment = memory.assess(inventory(*gpus), [0, 1, 2, 3, 4], Limits(512))
    assert [g["problems"] for g in assessment.gpus] == [["NVML status lost: GPU is lost"], ["NVML status reset_required"],
                                                        ["NVML status error: Unknown Error"], ["NVML status not_supported"], []]
    assert assessment.dirty == [0, 1, 2, 3] and assessment.fatal == [0, 1, 2]


def test_classification_follows_nvml_status_then_the_holders():
    assert memory.classify({"status": "lost"}, [{"pid": 1}]) == memory.GPU_LOST == "gpu_lost"
    assert memory.classify({"status": "reset_required"}, [{"pid": 1}]) == memory.RESET_REQUIRED == "reset_required"
    assert memory.classify({"status": "error"}, [{"pid": 1}]) == memory.NVML_ERROR == "nvml_error"
    assert memory.classify({"status": "ok"}, [{"pid": 1}]) == memory.HOLDER_PRESENT == "holder_present"
    assert memory.classify({"status": "ok"}, []) == memory.NO_HOLDER_FOUND == "no_holder_found"


def test_a_dirty_gpus_holders_are_those_nvml_places_on_it_and_unconfirmed_listings_are_stale():
    listed0 = [{"pid": 10, "used_mib": 600, "type": "compute"}, {"pid": 99, "used_mib": 10, "type": "compute"}]
    assessment = memory.assess(inventory(gpu(0, used=700, processes=listed0), gpu(1, used=0), gpu(2, used=900)), [0, 1, 2], Limits(512))
    holder = {"pid": 10, "comm": "python3", "state": "S"}
    everywhere = {"pid": 20, "comm": "cuda-app", "state": "S"}  # holds every node; NVML lists it on no GPU
    elsewhere = {"pid": 99, "comm": "other", "state": "S"}
    by_minor = {0: [holder, everywhere], 1: [everywhere], 2: [everywhere, elsewhere]}
    details = memory.explain_dirty(assessment, by_minor, proc_confirmed={10, 20})
    assert sorted(details) == [0, 2], "a clean GPU is not explained"
    assert details[0]["proc_holders"] == [holder, everywhere]
    assert [(p["pid"], p["stale"]) for p in details[0]["nvml_processes"]] == [(10, None), (99, "not a live holder in /proc")]
    assert details[2]["proc_holders"] == [everywhere], "NVML places 99 on GPU 0 only"
    assert details[2]["classification"] == memory.HOLDER_PRESENT and details[2]["nvml_processes"] == []


def test_the_failure_message_says_per_dirty_gpu_what_is_used_who_holds_it_and_why():
    listed = [{"pid": 10, "used_mib": 600, "type": "compute"}, {"pid": 11, "used_mib": 5, "type": "graphics"}]
    assessment = memory.assess(inventory(gpu(0), gpu(1, used=700, processes=listed), gpu(2, used=None, status="lost", error="GPU is lost")),
                               [0, 1, 2], Limits(512))
    details = memory.explain_dirty(assessment, {1: [{"pid": 10, "comm": "python3", "state": "D"}]}, proc_confirmed={10})
    assert memory.failure_message(assessment, details, 12.5).splitlines() == [
        "2 of 3 GPU(s) not clean after 12.5s:",
        "GPU 1 (GPU-1, bus 0000:01:00.0): 700 MiB used > max_used_mib 512; holders in /proc: 10 (python3, state D); "
        "NVML processes: 10, 11 (graphics, stale: not a live holder in /proc); holder_present: a process still holds the GPU",
        "GPU 2 (GPU-2, bus 0000:02:00.0): NVML status lost: GPU is lost; holders in /proc: none; NVML processes: none; gpu_lost: "
        "NVML reports the GPU lost (fallen off the bus): the node needs attention, a reboot in practice",
    ]
    bare = {"index": 3, "clean": False, "problems": ["x"]}
    assert memory.failure_message(memory.Assessment(gpus=[bare], dirty=[3]), {}, 1).splitlines()[1] == (
        "GPU 3 (?, bus ?): x; holders in /proc: none; NVML processes: none; None: ")


def test_a_listed_process_is_described_by_what_is_unusual_about_it():
    assert memory._describe_listed({"pid": 5, "type": "compute", "stale": None}) == "5"
    assert memory._describe_listed({"pid": 5}) == "5"
    assert memory._describe_listed({"pid": 5, "type": "mps", "stale": "gone"}) == "5 (mps, stale: gone)"
    assert memory._describe_listed({"pid": 5, "type": "compute", "stale": "gone"}) == "5 (stale: gone)"


def test_the_inventory_checks_that_waiting_cannot_fix():
    request = MemoryRequest.from_params(params(expected_count=3))
    with pytest.raises(memory.GpuCountMismatch) as fewer:
        memory.check_inventory(request, inventory(gpu(0), gpu(4)))
    assert fewer.value.msg == ("expected 3 GPU(s), NVML sees 2 (a GPU fell off the bus or is hidden); seen: 0=0000:00:00.0, 4=0000:04:00.0")
    assert fewer.value.context == {"gpu_count": 2, "expected_count": 3}
    with pytest.raises(memory.GpuCountMismatch, match="NVML sees 0 .*; seen: none"):
        memory.check_inventory(request, inventory())
    assert memory.check_inventory(MemoryRequest.from_params(params(expected_count=2, gpus=["1"])), inventory(gpu(0), gpu(1))) == [1]
    too_big = MemoryRequest.from_params(params(max_used_mib=1001))
    with pytest.raises(InvalidInput, match="max_used_mib: 1001 MiB is more than GPU 1's total of 1000 MiB"):
        memory.check_inventory(too_big, inventory(gpu(0, total=2000), gpu(1, total=1000)))
    assert memory.check_inventory(MemoryRequest.from_params(params(max_used_mib=1000)), inventory(gpu(0, total=1000))) == [0]
    only_big = MemoryRequest.from_params(params(max_used_mib=1500, gpus=["0"]))
    assert memory.check_inventory(only_big, inventory(gpu(0, total=2000), gpu(1, total=1000))) == [0], "an unselected GPU's size is not a limit"
    assert memory.check_inventory(MemoryRequest.from_params(params(max_used_mib=1500)), inventory(gpu(0, total=None))) == [0]


def test_the_watch_reads_until_clean_and_gives_up_early_only_on_a_fatal_gpu():
    request = MemoryRequest.from_params(params(timeout=10, interval=1))
    readings = iter([inventory(gpu(0, used=900)), inventory(gpu(0, used=0))])
    watched = memory.watch(lambda: next(readings), request, [0], inventory(gpu(0, used=900)), FakeClock())
    assert watched.assessment.passed and watched.attempts == 3 and not watched.timed_out
    stuck = memory.watch(lambda: inventory(gpu(0, used=900)), request, [0], inventory(gpu(0, used=900)), FakeClock())
    assert stuck.timed_out and not stuck.assessment.passed and stuck.elapsed >= 10
    lost = inventory(gpu(0, used=None, status="lost"))
    gave_up = memory.watch(lambda: lost, request, [0], lost, FakeClock())
    assert gave_up.attempts == 1 and not gave_up.timed_out and gave_up.assessment.fatal == [0]


def test_the_report_keeps_its_keys_for_each_gpu():
    assessment = memory.assess(inventory(gpu(0, extra="not reported")), [0], Limits(512))
    report = memory.gpu_report(assessment)
    assert list(report[0]) == list(memory.REPORT_KEYS) and report[0]["clean"] is True and report[0]["uuid"] == "GPU-0"
    assert memory.REPORT_KEYS == ("index", "uuid", "name", "bus_id", "minor", "status", "total_mib", "used_mib", "reserved_mib", "memory_api",
                                  "compared_used_mib", "left_mib", "processes", "clean", "problems")


def test_a_percent_limit_keeps_its_fraction():
    assert Limits(None, max_used_percent=10.05).used_limits(1000) == [(100.5, "max_used_percent 10.05 % of 1000 MiB")]


@pytest.mark.parametrize(("listed", "left", "limit", "problems"), [
    (2, 1, 1, []), (3, 1, 1, ["2 processes > max_processes 1", "1 MiB of left holder(s) 10 not counted"]), (0, 0, 1, []), (1, 0, 2, []),
])
def test_the_processes_counted_are_those_listed_less_the_ones_left(listed, left, limit, problems):
    processes = [{"pid": 10 + n, "used_mib": 1} for n in range(listed)]
    assessment = memory.assess(inventory(gpu(0, used=0, processes=processes)), [0],
                               Limits(None, max_processes=limit, left_pids=frozenset(range(10, 10 + left))))
    assert assessment.gpus[0]["problems"] == problems


@pytest.mark.parametrize("pid", [0, -5])
def test_a_left_pid_of_0_or_below_is_refused(pid):
    with pytest.raises(InvalidInput, match=f"left_pids: {pid} is not a process id"):
        MemoryRequest.from_params(params(left_pids=[pid]))


def test_pid_2_may_be_left_as_any_process():
    assert MemoryRequest.from_params(params(left_pids=[2])).limits.left_pids == frozenset({2})


def test_holders_by_minor_groups_each_gpus_holders_and_leaves_out_the_excluded_the_gone_and_the_unreadable(devices, processes):
    from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcessGone, ProcReader

    _a, (first,) = processes.holder("--open", devices.gpu(0))
    _b, (second,) = processes.holder("--open", devices.gpu(0), devices.gpu(1))
    _c, (third,) = processes.holder("--open", devices.gpu(2))
    _d, (shared_only,) = processes.holder("--open", devices.ctl)
    parent = os.getpid()

    class Reader(ProcReader):
        """The scan (in its own child process) sees every holder; describing them here, `gone` has exited and
        `refused` cannot be read."""

        gone: set[int] = set()
        refused: set[int] = set()

        def stat(self, pid):
            if os.getpid() == parent and pid in self.gone:
                raise ProcessGone(pid)
            if os.getpid() == parent and pid in self.refused:
                raise PermissionError(13, "Permission denied")
            return super().stat(pid)

    grouped, confirmed = memory.holders_by_minor(devices.globs, Reader(), exclude={first, os.getpid()})
    assert {minor: [info["pid"] for info in infos] for minor, infos in grouped.items()} == {0: [second], 1: [second], 2: [third]}
    assert grouped[0][0]["via"] == ["fd"] and grouped[0][0]["comm"]
    assert confirmed == {second, third, shared_only}, "every holder but the excluded; nothing excluded that held nothing"
    Reader.gone, Reader.refused = {second}, set()
    assert sorted(memory.holders_by_minor(devices.globs, Reader(), exclude=set())[0]) == [0, 2]
    Reader.gone, Reader.refused = set(), {first, second}
    assert sorted(memory.holders_by_minor(devices.globs, Reader(), exclude=set())[0]) == [2]


class ScriptedNvml:
    """NvmlClient's stand-in: each inventory() is the next reading, or raises it; the clock moves by `seconds` per call."""

    readings: list = []
    clock: FakeClock | None = None
    seconds = 0.0

    def __init__(self, _loader, _timeout):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        return False

    def inventory(self):
        if self.clock:
            self.clock.now += self.seconds
        reading = self.readings.pop(0)
        if isinstance(reading, Exception):
            raise reading
        return reading


@pytest.fixture
def scripted(monkeypatch):
    monkeypatch.setattr(memory, "NvmlClient", ScriptedNvml)
    ScriptedNvml.clock, ScriptedNvml.seconds = FakeClock(), 0.0
    return ScriptedNvml


def test_a_clean_run_reports_each_gpu_the_attempts_and_the_time_it_took(scripted):
    scripted.readings, scripted.seconds = [inventory(gpu(0, used=900)), inventory(gpu(0, used=100))], 0.25
    request = MemoryRequest.from_params(params(timeout=10, interval=1))
    result = memory.assert_free(request, None, scripted.clock)
    assert result == {"changed": False, "gpus": memory.gpu_report(memory.assess(inventory(gpu(0, used=100)), [0], Limits(512))), "dirty": [],
                      "passed": True, "attempts": 2, "elapsed": 1.25, "driver_version": "580.1"}


def test_without_a_clock_the_real_one_is_used(scripted):
    scripted.readings, scripted.clock = [inventory(gpu(0))], None
    assert memory.assert_free(MemoryRequest.from_params(params()), None)["passed"] is True


def test_a_failure_before_the_watch_says_not_passed_and_how_long_it_took(scripted):
    scripted.readings, scripted.seconds = [inventory(gpu(0))], 0.5
    with pytest.raises(memory.GpuCountMismatch) as mismatch:
        memory.assert_free(MemoryRequest.from_params(params(expected_count=2)), None, scripted.clock)
    assert mismatch.value.context == {"passed": False, "elapsed": 0.5, "gpu_count": 1, "expected_count": 2}


def test_a_hung_nvml_says_so_with_its_classification_and_the_time_waited(scripted):
    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import NvmlHung

    scripted.readings, scripted.seconds = [NvmlHung("nvmlDeviceGetMemoryInfo_v2 did not answer within nvml_timeout=2s", call="x")], 2.0
    with pytest.raises(NvmlHung) as hung:
        memory.assert_free(MemoryRequest.from_params(params(nvml_timeout=2)), None, scripted.clock)
    assert hung.value.msg == "nvmlDeviceGetMemoryInfo_v2 did not answer within nvml_timeout=2s: classification nvml_hung"
    assert hung.value.context == {"classification": "nvml_hung", "passed": False, "elapsed": 2.0, "call": "x"}
