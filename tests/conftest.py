"""Shared fixtures: the collection on sys.path, the simulated NVML library, stand-in device files,
real helper processes, and a runner that executes a module the way Ansible does (a separate
Python process reading its arguments, printing its JSON result)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
BUILD = REPO / "build"
COLLECTIONS = BUILD / "collections"
HELPER = REPO / "tests" / "helpers" / "gpu_holder.py"
STUCK_FUSE = REPO / "tests" / "helpers" / "stuck_fuse.py"
HUNG_MOUNT_SECONDS = 60  # the hung_mount fixture's mount stops hanging after this, so that a hang fails, not blocks

sys.path.insert(0, str(REPO / "tests" / "sim"))
sys.path.insert(0, str(REPO / "tests" / "tools"))


def _link_collection() -> None:
    """build/collections/ansible_collections/gpufleet/serving -> the repository, so imports resolve from a clone."""
    link = COLLECTIONS / "ansible_collections" / "gpufleet" / "serving"
    if not link.exists():
        link.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            link.symlink_to(REPO)


_link_collection()
sys.path.insert(0, str(COLLECTIONS))

import nvml_sim  # noqa: E402
import tree_state  # noqa: E402

_TREE_BEFORE: set[str] | None = None
# catalogue case -> the outcomes of the tests that declare it (covers marker), this session
_CASE_OUTCOMES: dict[str, list[tuple[str, str]]] = {}


# On in `make unit`/`make test`/`make stress` (GPUFLEET_TREE_GUARD=1), off for a pytest run by hand: a file a developer
# edits during the run would read as written by it.
TREE_GUARD = os.environ.get("GPUFLEET_TREE_GUARD") == "1"


# A test that hangs (a poll that regressed to the wall clock, a wait on a process that never comes) fails after this
# many seconds instead of blocking the suite; the slowest test takes about a tenth of it under load.
TEST_TIMEOUT_SECONDS = 240


def pytest_configure(config) -> None:
    config.addinivalue_line("markers", "covers(*cases): the catalogue cases this test sets up and asserts (tests/tools/catalogue_map.py)")
    config.addinivalue_line("markers", "host_pid_namespace: needs the host's PIDs, as NVML reports them (make mutants' sandbox, a PID "
                            "namespace of its own, leaves it out)")


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_SECONDS))


def pytest_runtest_logreport(report) -> None:
    """Note, per catalogue case, whether each of its tests ran or was skipped (and why)."""
    if report.when == "call" or (report.when == "setup" and report.skipped):
        cases = getattr(report, "catalogue_cases", ())
        outcome = "skipped: " + str(report.longrepr[-1]) if report.skipped and isinstance(report.longrepr, tuple) else report.outcome
        for case in cases:
            _CASE_OUTCOMES.setdefault(case, []).append((report.nodeid, outcome))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    marker = item.get_closest_marker("covers")
    outcome.get_result().catalogue_cases = tuple(marker.args) if marker else ()


def skipped_cases() -> dict[str, list[tuple[str, str]]]:
    """Cases whose every test this session declared covered was skipped: not covered on this machine."""
    return {case: outcomes for case, outcomes in sorted(_CASE_OUTCOMES.items())
            if outcomes and all(outcome.startswith("skipped") for _test, outcome in outcomes)}


def pytest_sessionstart(session) -> None:
    global _TREE_BEFORE
    _TREE_BEFORE = tree_state.status() if TREE_GUARD else None


def pytest_sessionfinish(session, exitstatus) -> None:
    """A test writes under build/ or a tmp_path, never into the working tree: what it added fails the run."""
    written = tree_state.added_by_run(_TREE_BEFORE)
    if written:
        session.config.pluginmanager.get_plugin("terminalreporter").write_line(
            "FAILED: the tests wrote into the working tree (write under build/ or tmp_path):\n  " + "\n  ".join(written), red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    # every declared test's outcome, for the map of what this run covered (tests/tools/catalogue_map.py --run)
    directory = os.environ.get("GPUFLEET_CATALOGUE_DIR")
    if directory and _CASE_OUTCOMES:
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"pytest-{os.getpid()}.json"), "w", encoding="utf-8") as record:
            json.dump(_CASE_OUTCOMES, record, indent=1, sort_keys=True)
    # a case whose tests all skipped here was not tested here: named, and in the gate (GPUFLEET_TREE_GUARD, make unit /
    # make test) a failure
    skipped = skipped_cases()
    if skipped:
        lines = [f"{case}: " + "; ".join(f"{test} ({outcome})" for test, outcome in outcomes) for case, outcomes in skipped.items()]
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        reporter.write_line("")
        reporter.write_line(
            "CATALOGUE CASES NOT TESTED ON THIS MACHINE (every test of each was skipped; make setup installs what they need):\n  "
            + "\n  ".join(lines), red=True)
        if TREE_GUARD:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def sim_library() -> Path:
    return nvml_sim.build_library(BUILD / "sim")


@pytest.fixture
def sim(tmp_path, sim_library) -> nvml_sim.SimNvml:
    """Four simulated H200s whose device minors are permuted against their NVML indexes."""
    return nvml_sim.SimNvml(tmp_path / "nvml", gpus=nvml_sim.default_gpus(4, minors=[2, 0, 3, 1]))


@dataclass
class Devices:
    root: Path
    gpu_minors: list[int]

    def gpu(self, minor: int) -> str:
        return str(self.root / f"nvidia{minor}")

    @property
    def ctl(self) -> str:
        return str(self.root / "nvidiactl")

    @property
    def uvm(self) -> str:
        return str(self.root / "nvidia-uvm")

    @property
    def globs(self) -> list[str]:
        return [str(self.root / "nvidia*"), str(self.root / "nvidia-caps" / "*")]


@pytest.fixture
def devices(tmp_path) -> Devices:
    """Stand-in device files: regular files named as the driver names its nodes."""
    root = tmp_path / "dev"
    (root / "nvidia-caps").mkdir(parents=True)
    names = [f"nvidia{minor}" for minor in range(4)] + ["nvidiactl", "nvidia-uvm", "nvidia-caps/nvidia-cap1"]
    for name in names:
        (root / name).write_bytes(b"\0" * 4096)
    return Devices(root, list(range(4)))


class Processes:
    """Starts helper processes and guarantees they are gone after the test."""

    def __init__(self):
        self.started: list[subprocess.Popen] = []
        self.extra_pids: list[int] = []

    def holder(self, *args: str, env: dict | None = None) -> tuple[subprocess.Popen, list[int]]:
        proc = subprocess.Popen([sys.executable, str(HELPER), *args], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, **(env or {})})
        self.started.append(proc)
        line = proc.stdout.readline().split()
        assert line and line[0] == "ready", f"helper did not start: {line}"
        pids = [int(word) for word in line[1:]]
        self.extra_pids += pids[1:]
        return proc, pids

    def decoy(self, *words: str) -> subprocess.Popen:
        """A process whose command line names engines (python3, sglang) but holds no GPU file."""
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1e6)", *words])
        self.started.append(proc)
        return proc

    def cleanup(self) -> None:
        for proc in self.started:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(sig)
            proc.wait(timeout=10)
        for pid in self.extra_pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def processes():
    procs = Processes()
    yield procs
    procs.cleanup()


def remove_cgroup(path: str, attempts: int = 100) -> None:
    """A cgroup can be removed only once its last process is reaped: retry for a few seconds."""
    for _attempt in range(attempts):
        try:
            os.rmdir(path)
            return
        except OSError:
            time.sleep(0.05)


FREEZER = Path("/sys/fs/cgroup/freezer")


class Freezer:
    """A cgroup v1 freezer group: a frozen process sits in D state and a SIGKILL stays pending until it is thawed,
    the catalogue's unkillable process (F4) made real."""

    def __init__(self, name: str):
        self.group = FREEZER / name
        self.group.mkdir()

    def _set(self, state: str) -> None:
        (self.group / "freezer.state").write_text(state)
        deadline = time.monotonic() + 10
        while (self.group / "freezer.state").read_text().strip() != state:
            assert time.monotonic() < deadline, f"freezer never reached {state}"
            time.sleep(0.02)

    def freeze(self, pid: int) -> None:
        (self.group / "cgroup.procs").write_text(str(pid))
        self._set("FROZEN")

    def thaw(self) -> None:
        self._set("THAWED")

    def remove(self) -> None:
        self.thaw()
        for pid in (self.group / "cgroup.procs").read_text().split():
            with contextlib.suppress(OSError):
                (FREEZER / "cgroup.procs").write_text(pid)
        remove_cgroup(str(self.group))


@pytest.fixture
def hung_mount(tmp_path):
    """A FUSE mount that stops answering (tests/helpers/stuck_fuse.py): `pages` never reads, `frozen` never stats.
    Its end aborts the connection, which wakes every task waiting on it; request it after `processes`, so that it
    ends first and the helpers waiting on it can die."""
    if not os.path.exists("/dev/fuse"):
        pytest.skip("needs /dev/fuse to make a mount that hangs")
    mountpoint = tmp_path / "hung"
    mountpoint.mkdir()
    server = subprocess.Popen([sys.executable, str(STUCK_FUSE), str(mountpoint)], stdout=subprocess.PIPE, text=True)
    # a regression that waits on the mount in a process we wait for would hang the suite: the mount ends by itself
    watchdog = threading.Timer(HUNG_MOUNT_SECONDS, server.terminate)
    watchdog.start()
    try:
        assert server.stdout.readline().strip() == "ready", "the FUSE helper did not mount"
        yield mountpoint
    finally:
        watchdog.cancel()
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)
        subprocess.run(["umount", "-l", str(mountpoint)], check=False, capture_output=True)


@pytest.fixture
def frozen(tmp_path):
    if not (FREEZER / "cgroup.procs").exists():
        # cgroup v2's freezer cannot stand in: SIGKILL reaches frozen v2 tasks, so nothing there is unkillable
        pytest.skip("needs the cgroup v1 freezer to make a process unkillable (v2's freezer lets SIGKILL through)")
    freezer = Freezer(f"gpufleet-test-{os.getpid()}-{tmp_path.name}")
    yield freezer
    freezer.remove()


def wait_for(condition, what: str, timeout: float = 10, interval: float = 0.02) -> None:
    """Poll `condition` until it holds, failing with `what` at the deadline: a wait on an event, never a fixed sleep."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"{what} (not within {timeout:g} s)"
        time.sleep(interval)


def is_stopped(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_STOPPED
    except psutil.NoSuchProcess:
        return False


def stop(proc: subprocess.Popen) -> None:
    """SIGSTOP, then wait until the kernel shows the process stopped: kill(2) returns before the stop has landed, and a
    test that reads the state at once may still see it running (a flake under load)."""
    proc.send_signal(signal.SIGSTOP)
    wait_for(lambda: is_stopped(proc.pid), f"PID {proc.pid} never stopped after SIGSTOP")


def alive(pid: int) -> bool:
    """Alive and not a zombie, judged by psutil: an oracle independent of the collection's own /proc reader."""
    try:
        return psutil.Process(pid).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except psutil.NoSuchProcess:
        return False


@dataclass
class ModuleResult:
    rc: int
    result: dict
    stderr: str

    @property
    def failed(self) -> bool:
        return bool(self.result.get("failed"))

    def __getitem__(self, key):
        return self.result[key]

    @property
    def warnings(self) -> list[str]:
        """Warning texts (ansible-core 2.19 wraps each in a WarningSummary; older versions give strings)."""
        return [w["event"]["msg"] if isinstance(w, dict) else w for w in self.result.get("warnings", [])]


def _module_invocation(name: str, args: dict, check_mode: bool, env: dict | None, prefix: tuple[str, ...] = ()) -> dict:
    module_args = dict(args, _ansible_check_mode=check_mode)
    return {
        "args": [*prefix, sys.executable, "-m", f"ansible_collections.gpufleet.serving.plugins.modules.{name}",
                 json.dumps({"ANSIBLE_MODULE_ARGS": module_args})],
        "text": True, "cwd": "/", "env": {**os.environ, "PYTHONPATH": str(COLLECTIONS), **(env or {})},
    }


def start_module(name: str, args: dict, env: dict | None = None) -> subprocess.Popen:
    """The module running in the background, for tests that interrupt it."""
    return subprocess.Popen(stdout=subprocess.PIPE, stderr=subprocess.PIPE, **_module_invocation(name, args, False, env))


def run_module(name: str, args: dict, check_mode: bool = False, env: dict | None = None, timeout: float = 120,
               prefix: tuple[str, ...] = ()) -> ModuleResult:
    """Execute plugins/modules/<name>.py in its own Python process, as Ansible does on a managed node; `prefix` runs it
    under a command that changes how it runs (setpriv dropping a capability, a sacrificial parent)."""
    proc = subprocess.run(capture_output=True, timeout=timeout, check=False, **_module_invocation(name, args, check_mode, env, prefix))
    try:
        result = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"module printed no JSON (rc {proc.returncode}):\n{proc.stdout}\n{proc.stderr}") from None
    return ModuleResult(proc.returncode, result, proc.stderr)


@dataclass
class SignalPath:
    """How the code under test reaches a process: through a pidfd where the kernel has them (5.3 and later), or by
    kill(2) after a start-time check where it has not (RHEL 8's 4.18, a seccomp policy that denies pidfd_open)."""

    name: str
    env: dict

    @property
    def use_pidfd(self) -> bool:
        return self.name == "pidfd"


# Python without os.pidfd_open, as the module's own probe (signals.pidfds_supported) then finds it: the module runs the
# kill(2) path end to end, in its own process, with nothing in the collection told to
NO_PIDFD_SITE = "import os\n\nif hasattr(os, 'pidfd_open'):\n    del os.pidfd_open\n"


@pytest.fixture(params=["pidfd", "kill"])
def signal_path(request) -> SignalPath:
    """Each test that takes this runs on both ways of signalling (tests/tools/catalogue_map.py counts them)."""
    if request.param == "pidfd":
        return SignalPath("pidfd", {})
    site = BUILD / "no-pidfd-site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(NO_PIDFD_SITE)
    return SignalPath("kill", {"PYTHONPATH": f"{site}{os.pathsep}{COLLECTIONS}"})


@pytest.fixture
def nvml_env(sim, sim_library, devices) -> dict:
    """Environment that makes nvidia-ml-py load the simulated library with `sim`'s state; once initialised, the
    library holds the stand-in device files open, as the real one holds the driver's (the module's own NVML
    worker is then a holder it must never count or signal)."""
    return {"LD_LIBRARY_PATH": str(sim_library.parent), "GPUFLEET_SIM_NVML_DEV": str(devices.root), **sim.env}
