"""gpu_memory_assert through the real nvidia-ml-py over the simulated libnvidia-ml.so.1 (M* of the catalogue)."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import run_module
from nvml_sim import NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NO_PERMISSION

MODULE = "gpu_memory_assert"


def comm_of(pid: int) -> str:
    """The holder's command name: python or python3, after how pytest itself was started."""
    return Path(f"/proc/{pid}/comm").read_text().strip()


def assert_args(devices, **extra) -> dict:
    return {"device_paths": devices.globs, "timeout": 2, "interval": 0.1, **extra}


@pytest.mark.covers('M1', 'M14')
def test_idle_gpus_pass_on_v2_used_with_the_reserve_reported_apart(devices, nvml_env):
    """M1, M14: idle GPUs show v2 used 0 and reserved 615 MiB; check mode measures the same way."""
    for check_mode in (False, True):
        result = run_module(MODULE, assert_args(devices, expected_count=4), check_mode=check_mode, env=nvml_env)
        assert not result.failed, result["msg"] if result.failed else ""
        assert result["passed"] is True and result["changed"] is False and result["dirty"] == []
        assert [(g["index"], g["minor"], g["used_mib"], g["reserved_mib"], g["memory_api"]) for g in result["gpus"]] == [
            (0, 2, 0, 615, "v2"), (1, 0, 0, 615, "v2"), (2, 3, 0, 615, "v2"), (3, 1, 0, 615, "v2")]
        assert result["gpus"][0]["uuid"].startswith("GPU-") and result["gpus"][0]["bus_id"] == "00000000:18:00.0"
        assert result["gpus"][0]["name"] == "NVIDIA H200" and result["driver_version"] == "580.159.04"


@pytest.mark.covers('M2')
def test_v1_only_driver_subtracts_the_documented_reserve(devices, sim, processes, nvml_env):
    """M2: v1 counts the 615 MiB reserve as used; comparing it raw with 512 MiB would fail an idle GPU."""
    sim.fault("nvmlDeviceGetMemoryInfo_v2", NVML_ERROR_FUNCTION_NOT_FOUND)
    idle = run_module(MODULE, assert_args(devices), env=nvml_env)
    assert idle["passed"] is True
    assert {(g["memory_api"], g["used_mib"], g["compared_used_mib"]) for g in idle["gpus"]} == {("v1", 615, 0)}

    _helper, (pid,) = processes.holder("--open", devices.gpu(0), "--sim-root", str(sim.root), "--alloc", "1:2048")
    busy = run_module(MODULE, assert_args(devices, timeout=0), env=nvml_env)
    assert busy.failed and busy["dirty"] == [1]
    assert busy["gpus"][1]["compared_used_mib"] == 2048 + 615 - 1024


@pytest.mark.covers("M16")
def test_a_percentage_threshold_applies_to_each_gpus_own_total(devices, sim, processes, nvml_env):
    """M16: 2 GiB used on a 143771 MiB GPU is 1.4 %: under 2 %, over 1 % - alone, and with an absolute threshold
    beside it both must hold."""
    processes.holder("--open", devices.gpu(0), "--sim-root", str(sim.root), "--alloc", "1:2048")
    under = run_module(MODULE, assert_args(devices, timeout=0, max_used_percent=2), env=nvml_env)
    assert under["passed"] is True, under.get("msg")
    over = run_module(MODULE, assert_args(devices, timeout=0, max_used_percent=1), env=nvml_env)
    assert over.failed and over["dirty"] == [1]
    assert "2048 MiB used > max_used_percent 1 % of 143771 MiB" in over["gpus"][1]["problems"][0]
    both = run_module(MODULE, assert_args(devices, timeout=0, max_used_percent=2, max_used_mib=1024), env=nvml_env)
    assert both.failed and both["gpus"][1]["problems"] == ["2048 MiB used > max_used_mib 1024"]
    default = run_module(MODULE, assert_args(devices, timeout=0), env=nvml_env)
    assert default.failed and default["gpus"][1]["problems"] == ["2048 MiB used > max_used_mib 512"], "512 MiB when no threshold is given"


@pytest.mark.covers('M3')
def test_memory_released_later_passes_once_it_is_free(devices, sim, processes, nvml_env):
    """M3: polling, not a fixed sleep: passes on the first reading after the holder exits."""
    proc, _pids = processes.holder("--open", devices.gpu(0), "--sim-root", str(sim.root), "--alloc", "2:30000")
    threading.Timer(1.0, proc.kill).start()
    result = run_module(MODULE, assert_args(devices, timeout=20), env=nvml_env)
    assert result["passed"] is True


@pytest.mark.covers("M4")
def test_memory_held_by_a_d_state_process_fails_at_the_deadline_naming_it_in_d_state(devices, sim, processes, frozen, nvml_env):
    """M4 (held by a D-state process): a holder frozen with its allocation (D state, as a process stuck in the driver)
    keeps the GPU; the assertion fails at its deadline, not before, with the last reading, NVML's process, the /proc
    holder with state D, and holder_present."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(1), "--sim-root", str(sim.root), "--alloc", "3:30000")
    frozen.freeze(pid)
    result = run_module(MODULE, assert_args(devices, timeout=1.0), env=nvml_env, timeout=60)
    assert result.failed and result["passed"] is False and result["dirty"] == [3] and result["elapsed"] >= 1.0
    message = result["msg"]
    assert "30000 MiB used > max_used_mib 512" in message and f"holders in /proc: {pid} ({comm_of(pid)}, state D)" in message
    assert f"NVML processes: {pid};" in message and "holder_present" in message
    assert result["details"]["3"]["classification"] == "holder_present"
    assert [(h["pid"], h["state"]) for h in result["details"]["3"]["proc_holders"]] == [(pid, "D")]


@pytest.mark.covers('M4')
def test_holder_present_names_gpu_pid_and_classification(devices, sim, processes, nvml_env):
    """M4 (holder present): per-GPU used MiB, /proc holders, NVML processes."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(3), "--sim-root", str(sim.root), "--alloc", "2:40000")
    result = run_module(MODULE, assert_args(devices, timeout=0.5), env=nvml_env)
    assert result.failed and result["passed"] is False and result["dirty"] == [2]
    message = result["msg"]
    assert "GPU 2 (GPU-" in message and "40000 MiB used > max_used_mib 512" in message
    assert f"holders in /proc: {pid} ({comm_of(pid)}, state S)" in message  # pid, command name and state
    assert f"NVML processes: {pid};" in message
    assert "holder_present" in message
    assert result["details"]["2"]["classification"] == "holder_present"
    assert [h["pid"] for h in result["details"]["2"]["proc_holders"]] == [pid]
    assert result["elapsed"] >= 0.5


@pytest.mark.covers('M4')
@pytest.mark.timeout(120)
def test_a_holder_whose_files_cannot_be_read_is_still_named(devices, sim, processes, hung_mount, nvml_env):
    """M4 (holder present) with a wedged holder: it keeps 3000 MiB on GPU 2 (minor 3) and also a file on a mount whose
    stat() never returns, after its GPU node. The failure still names it - found on the node before the scan gave its
    files up after their time box (blocked_reads) - with holder_present, and the run ends: the scan's child, left
    blocked on the mount, holds neither the module's output nor its NVML worker's pipe."""
    _helper, (pid,) = processes.holder("--open", devices.gpu(3), "--open-hung", str(hung_mount / "frozen"),
                                       "--sim-root", str(sim.root), "--alloc", "2:3000")
    result = run_module(MODULE, assert_args(devices, timeout=0.5), env=nvml_env, timeout=30)
    assert result.failed and result["dirty"] == [2] and "holder_present" in result["msg"]
    (holder,) = result["details"]["2"]["proc_holders"]
    assert holder["pid"] == pid and holder["blocked_reads"] == ["files"] and holder["via"] == ["fd"]


@pytest.mark.covers("M4")
def test_memory_kept_by_an_ipc_mapping_after_its_exporter_exited_names_the_importer(devices, sim, processes, nvml_env):
    """M4 (IPC mapping): a process exports 6000 MiB on GPU 0 (minor 2); another maps it (CUDA IPC: the driver keeps the
    allocation while any process maps it) and holds the device only by that mapping; the exporter exits. The memory
    stays: the assertion fails at its deadline naming the importer (held by mmap) as the holder, NVML's listed pid as
    stale, holder_present; once the importer goes, the same assertion passes."""
    exporter, (exporter_pid,) = processes.holder("--open", devices.gpu(2))
    importer, (importer_pid,) = processes.holder("--mmap", devices.gpu(2))
    sim.allocate(0, 6000, holders=[exporter_pid, importer_pid], reported_pid=exporter_pid)
    exporter.kill()
    exporter.wait()

    held = run_module(MODULE, assert_args(devices, timeout=0.5), env=nvml_env)
    assert held.failed and held["dirty"] == [0] and held["elapsed"] >= 0.5
    detail = held["details"]["0"]
    assert detail["classification"] == "holder_present"
    assert [(h["pid"], h["via"]) for h in detail["proc_holders"]] == [(importer_pid, ["mmap"])]
    assert [(p["pid"], bool(p["stale"])) for p in detail["nvml_processes"]] == [(exporter_pid, True)]
    assert "6000 MiB used > max_used_mib 512" in held["msg"]

    importer.kill()
    importer.wait()
    assert run_module(MODULE, assert_args(devices, timeout=2), env=nvml_env)["passed"] is True


@pytest.mark.covers('M4')
def test_leaked_memory_without_holder_is_classified_no_holder_found(devices, sim, nvml_env):
    """M4 (leak): memory used, no process: a reset may be needed."""
    sim.gpus[1].leaked_mib = 8000
    sim.write()
    result = run_module(MODULE, assert_args(devices, timeout=0.3), env=nvml_env)
    assert result.failed and result["dirty"] == [1]
    assert result["details"]["1"]["classification"] == "no_holder_found"
    assert "a GPU reset may be needed" in result["msg"]


@pytest.mark.covers('G3')
def test_the_modules_own_nvml_worker_holds_every_device_yet_is_never_a_holder(devices, sim, nvml_env):
    """G3: an initialised NVML holds nvidiactl, nvidia-uvm and each GPU's node (the simulated library as the real
    one does). The module's own NVML worker - alive while a failure is explained - must never show up as a holder of a
    dirty GPU (without the module's exclusion of its descendants, it would be listed on every GPU)."""
    probe = subprocess.Popen([sys.executable, "-c", "import pynvml, time; pynvml.nvmlInit(); print('up', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, **nvml_env})
    try:
        assert probe.stdout.readline().strip() == "up"
        held = {os.readlink(f"/proc/{probe.pid}/fd/{fd}") for fd in os.listdir(f"/proc/{probe.pid}/fd")}
        assert {devices.ctl, devices.uvm, *(devices.gpu(minor) for minor in range(4))} <= held
    finally:
        probe.kill()
        probe.wait()

    sim.gpus[1].leaked_mib = 8000
    sim.write()
    result = run_module(MODULE, assert_args(devices, timeout=0.3), env=nvml_env)
    assert result.failed and result["dirty"] == [1]
    assert result["details"]["1"]["proc_holders"] == [] and result["details"]["1"]["classification"] == "no_holder_found"


@pytest.mark.covers('M5')
def test_stale_nvml_pid_is_marked_and_the_real_holder_named(devices, sim, processes, nvml_env):
    """M5: NVML lists only the dead parent; the forked child holds the memory (not 'idle')."""
    proc, (parent, child) = processes.holder("--open", devices.gpu(2), "--fork-child", "--sim-root", str(sim.root), "--alloc", "0:20480")
    proc.kill()
    proc.wait()
    result = run_module(MODULE, assert_args(devices, timeout=0.3), env=nvml_env)
    assert result.failed and result["dirty"] == [0]
    detail = result["details"]["0"]
    assert [h["pid"] for h in detail["proc_holders"]] == [child]
    assert [(p["pid"], p["stale"]) for p in detail["nvml_processes"]] == [(parent, "not a live holder in /proc")]
    assert detail["classification"] == "holder_present"


@pytest.mark.covers('M17')
def test_graphics_and_mps_processes_are_listed_by_type_and_their_memory_counts(devices, sim, processes, nvml_env):
    """M17: NVML's graphics and MPS lists are read besides compute; their memory makes the GPU dirty."""
    _helper, (xorg,) = processes.holder("--open", devices.gpu(2), "--comm", "Xorg")  # minor 2 is NVML index 0
    sim.allocate(0, 300, holders=[xorg], kind="graphics")
    _helper, (mps,) = processes.holder("--open", devices.gpu(2), "--comm", "nvidia-cuda-mps-server")
    sim.allocate(0, 2048, holders=[mps], kind="mps")
    result = run_module(MODULE, assert_args(devices, timeout=0.3), env=nvml_env)
    assert result.failed and result["dirty"] == [0]
    assert result["gpus"][0]["used_mib"] == 2348
    assert {p["pid"]: p["type"] for p in result["details"]["0"]["nvml_processes"]} == {xorg: "graphics", mps: "mps"}
    assert f"NVML processes: {xorg} (graphics), {mps} (mps);" in result["msg"] or \
        f"NVML processes: {mps} (mps), {xorg} (graphics);" in result["msg"]


@pytest.mark.covers('M6')
def test_hung_nvml_call_fails_within_nvml_timeout(devices, sim, nvml_env):
    """M6: NVML runs in a worker that is abandoned when it does not answer."""
    sim.fault("nvmlDeviceGetMemoryInfo_v2", "hang")
    started = time.monotonic()
    result = run_module(MODULE, assert_args(devices, timeout=30, nvml_timeout=2), env=nvml_env)
    took = time.monotonic() - started
    assert took < 15
    assert result.failed and result["classification"] == "nvml_hung" and result["passed"] is False
    assert "nvml_timeout=2s" in result["msg"]
    assert 2 <= result["elapsed"] <= took, "the time the module waited: nvml_timeout, then it gave up"


@pytest.mark.covers('M18')
def test_a_slow_first_nvml_call_is_waited_for_up_to_nvml_timeout(devices, sim, nvml_env):
    """M18: without persistence mode the driver initialises on the first NVML call, which can take seconds. Within
    nvml_timeout that is waited for; beyond it the task fails as hung instead of waiting on."""
    sim.fault("nvmlInitWithFlags", "slow:1500")
    patient = run_module(MODULE, assert_args(devices, nvml_timeout=10), env=nvml_env)
    assert not patient.failed and patient["passed"] is True
    hasty = run_module(MODULE, assert_args(devices, nvml_timeout=0.5), env=nvml_env)
    assert hasty.failed and hasty["classification"] == "nvml_hung"


@pytest.mark.covers('M12')
@pytest.mark.parametrize("function", ["nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetComputeRunningProcesses_v3"])
def test_a_query_nvml_refuses_is_never_a_pass(devices, sim, nvml_env, function):
    """M12 (the part that needs no MIG hardware): a parent handle that refuses a memory or process query
    (NVML_ERROR_NO_PERMISSION, as MIG-enabled GPUs can) must not read as an idle GPU."""
    sim.fault(function, NVML_ERROR_NO_PERMISSION)
    result = run_module(MODULE, assert_args(devices, timeout=0.3), env=nvml_env)
    assert result.failed and result["passed"] is False and result["dirty"] == [0, 1, 2, 3]
    assert "Insufficient Permissions" in result["msg"]


@pytest.mark.covers('M7', 'M8')
@pytest.mark.parametrize(("status", "classification"), [("lost", "gpu_lost"), ("reset_required", "reset_required")])
def test_lost_or_reset_required_gpu_fails_at_once(devices, sim, nvml_env, status, classification):
    """M7, M8: no waiting out the deadline; never a reset."""
    sim.gpus[3].status = status
    sim.write()
    started = time.monotonic()
    result = run_module(MODULE, assert_args(devices, timeout=60), env=nvml_env)
    assert time.monotonic() - started < 30
    assert result.failed and result["dirty"] == [3] and result["attempts"] == 1
    assert result["details"]["3"]["classification"] == classification
    assert result["gpus"][3]["status"] == status


@pytest.mark.covers('M9')
def test_driver_not_loaded_and_library_missing_fail_without_traceback(devices, sim, nvml_env, tmp_path):
    """M9."""
    missing = run_module(MODULE, assert_args(devices), env=dict(nvml_env, LD_LIBRARY_PATH=str(tmp_path)))
    assert missing.failed and "libnvidia-ml.so.1 was not found" in missing["msg"]
    sim.fault("nvmlInitWithFlags", NVML_ERROR_DRIVER_NOT_LOADED)
    unloaded = run_module(MODULE, assert_args(devices), env=nvml_env)
    assert unloaded.failed and "the NVIDIA kernel driver is not loaded" in unloaded["msg"]
    assert "Traceback" not in unloaded.stderr


@pytest.mark.covers('M10')
def test_expected_count_mismatch_fails_at_once_listing_what_nvml_sees(devices, sim, nvml_env):
    """M10: 8 expected, NVML sees fewer (a GPU fell off the bus)."""
    started = time.monotonic()
    result = run_module(MODULE, assert_args(devices, expected_count=8, timeout=60), env=nvml_env)
    took = time.monotonic() - started
    assert result.failed and "expected 8 GPU(s), NVML sees 4" in result["msg"]
    assert "3=00000000:48:00.0" in result["msg"]
    assert result["passed"] is False and 0 <= result["elapsed"] <= took


@pytest.mark.covers('M11')
def test_selection_by_index_and_uuid_ignores_cuda_visible_devices(devices, sim, processes, nvml_env):
    """M11: NVML order, not CUDA's; only the selected GPUs are judged."""
    processes.holder("--open", devices.gpu(0), "--sim-root", str(sim.root), "--alloc", "1:9000")
    env = dict(nvml_env, CUDA_VISIBLE_DEVICES="1")
    by_index = run_module(MODULE, assert_args(devices, gpus=["0", "2"], timeout=0), env=env)
    assert by_index["passed"] is True and [g["index"] for g in by_index["gpus"]] == [0, 2]
    by_uuid = run_module(MODULE, assert_args(devices, gpus=[sim.gpus[1].uuid], timeout=0), env=env)
    assert by_uuid.failed and by_uuid["dirty"] == [1]


def test_max_processes_counts_listed_processes(devices, sim, processes, nvml_env):
    processes.holder("--open", devices.gpu(0), "--sim-root", str(sim.root), "--alloc", "0:100")
    result = run_module(MODULE, assert_args(devices, max_processes=0, timeout=0), env=nvml_env)
    assert result.failed and "1 processes > max_processes 0" in result["msg"]


@pytest.mark.covers('M16')
@pytest.mark.parametrize(("args", "message"), [
    ({"max_used_mib": -1}, "max_used_mib: must be a whole number of MiB, at least 0"),
    ({"max_used_mib": 10**7}, "max_used_mib: 10000000 MiB is more than GPU 0's total of 143771 MiB"),
    ({"max_used_mib": "lots"}, "max_used_mib"),
    ({"max_used_percent": -1}, "max_used_percent: must be a share of each GPU's memory from 0 to 100, got -1"),
    ({"max_used_percent": 150}, "max_used_percent: must be a share of each GPU's memory from 0 to 100, got 150"),
    ({"max_used_percent": "most"}, "max_used_percent"),
    ({"timeout": -5}, "timeout: must be at least 0"),
    ({"interval": 0}, "interval: must be greater than 0"),
    ({"nvml_timeout": -1}, "nvml_timeout: must be greater than 0"),
    ({"expected_count": -1}, "expected_count: must be a whole number of at least 0"),
    ({"gpus": ["4"]}, "GPU index 4 does not exist: NVML sees 4 GPU(s) (indexes 0-3)"),
    ({"gpus": ["GPU-nope"]}, "no GPU has UUID 'GPU-nope'"),
    ({"gpus": ["0; reboot"]}, "is neither a GPU index"),
])
def test_bad_input_is_rejected_before_polling(devices, nvml_env, args, message):
    """M16: thresholds absolute and as a percentage, and the other numbers, refused before the first poll."""
    result = run_module(MODULE, {**assert_args(devices), **args}, env=nvml_env)
    assert result.failed
    assert message in result["msg"]


@pytest.mark.covers('M3')
def test_memory_released_seconds_after_the_holder_exits_is_waited_for(devices, sim, processes, nvml_env):
    """M3 with the driver's release lag: the holder is gone at once, the memory only 4 s later. The module must pass
    only after the release, having read NVML every interval meanwhile - a fixed sleep would show one or two readings."""
    proc, (pid,) = processes.holder("--open", devices.gpu(1))
    sim.allocate(3, 20000, holders=[pid], linger_ms=4000)
    proc.kill()
    proc.wait()
    killed = time.monotonic()
    result = run_module(MODULE, assert_args(devices, timeout=30), env=nvml_env)
    returned = time.monotonic()
    assert result["passed"] is True and returned - killed >= 4.0  # not before the release
    lag_left = 4.0 - (returned - result["elapsed"] - killed)  # of the 4 s, what was left when its polling began
    assert lag_left > 1 and result["elapsed"] >= lag_left - 0.1  # it waited that out
    # reading every 0.1 s meanwhile (half of them at least, on a loaded machine); a fixed sleep would read once or twice
    assert result["attempts"] >= 0.5 * lag_left / 0.1


def test_leaked_allocation_without_holder_stays_until_removed(devices, sim, nvml_env):
    leak = sim.allocate(0, 4000, holders=[], leak=True)
    assert run_module(MODULE, assert_args(devices, timeout=0), env=nvml_env)["dirty"] == [0]
    leak.unlink()
    assert run_module(MODULE, assert_args(devices, timeout=0), env=nvml_env)["passed"] is True


@pytest.mark.covers('E6')
def test_memory_of_a_holder_left_running_on_purpose_is_not_counted(devices, sim, processes, nvml_env):
    """E6 (report): another user's job keeps 8000 MiB on GPU 2, and the engine left 300 MiB there. Naming the job in
    left_pids judges what the engine released (300 MiB: clean, left_mib 8000); without it the GPU is dirty; and the
    engine's own leftover above the threshold still fails the GPU, with the discount named."""
    _job, (job,) = processes.holder("--open", devices.gpu(2))
    sim.allocate(2, 8000, holders=[job])
    engine_left = sim.allocate(2, 300, holders=[], leak=True)
    counted = run_module(MODULE, assert_args(devices, timeout=0), env=nvml_env)
    assert counted.failed and counted["dirty"] == [2]
    discounted = run_module(MODULE, assert_args(devices, timeout=0, left_pids=[job]), env=nvml_env)
    assert discounted["passed"] is True, discounted.result
    gpu = next(gpu for gpu in discounted["gpus"] if gpu["index"] == 2)
    assert (gpu["used_mib"], gpu["left_mib"], gpu["compared_used_mib"]) == (8300, 8000, 300)
    engine_left.unlink()
    sim.allocate(2, 4000, holders=[], leak=True)
    still = run_module(MODULE, assert_args(devices, timeout=0, left_pids=[job]), env=nvml_env)
    assert still.failed and still["dirty"] == [2]
    assert "4000 MiB used > max_used_mib" in still["msg"] and f"8000 MiB of left holder(s) {job} not counted" in still["msg"]


@pytest.mark.covers('M16')
@pytest.mark.parametrize(("args", "message"), [
    ({"left_pids": [1]}, "left_pids: 1 is not a process id"),
    ({"max_used_mib": -1}, "max_used_mib: must be a whole number of MiB, at least 0"),
    ({"max_used_percent": 120.0}, "max_used_percent: must be a share of each GPU's memory from 0 to 100"),
])
def test_bad_thresholds_are_refused_before_nvml_is_polled(devices, sim, nvml_env, args, message):
    """M16: invalid input is refused before the first NVML call - proven by an NVML whose init hangs: a module that
    polled first would time out on it (nvml_hung), not name the bad value."""
    sim.fault("nvmlInitWithFlags", "hang")
    result = run_module(MODULE, assert_args(devices, timeout=5, nvml_timeout=2, **args), env=nvml_env, timeout=60)
    assert result.failed and message in result["msg"], result.result
    assert "classification" not in result.result and result["elapsed"] < 1.5
