"""engine_observe's logic over a recording NodeReader: which engines run, are enabled and serve, which versions are
read (the running unit's executable and the target's configured one), and that an engine not running is not probed.
The real reads (systemctl, package metadata, HTTP) are the module_utils tested elsewhere and the Molecule scenarios."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import observe
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import parse_show_units
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _switch_plan as switch_plan

SHOW = """Id=vllm.service
LoadState=loaded
ActiveState=active
UnitFileState=enabled
ExecStart={ path=/opt/vllm/0.33.0/bin/vllm ; argv[]=/opt/vllm/0.33.0/bin/vllm serve /models/m --port 8000 ; ignore_errors=no ; start_time=[n/a] }

Id=sglang.service
LoadState=loaded
ActiveState=inactive
UnitFileState=disabled
ExecStart={ path=/opt/sglang/bin/python ; argv[]=/opt/sglang/bin/python -m sglang.launch_server ; ignore_errors=no ; start_time=[n/a] }
"""


class Reader(observe.NodeReader):
    def __init__(self, show=SHOW, serving=True):
        self.show, self.serving, self.calls = show, serving, []

    def units(self, units):
        self.calls.append(("units", tuple(units)))
        return parse_show_units(self.show, units)

    def version(self, engine, executable):
        self.calls.append(("version", engine, executable))
        return ("0.33.0", None) if "0.33.0" in executable else (None, f"{executable} does not exist")

    def serves(self, probe):
        self.calls.append(("serves", probe.engine, probe.completion))
        return {"ready": self.serving, "elapsed": 0.01}

    def exists(self, path):
        return path == "/var/lib/gpufleet/rollback/staged"


VLLM = observe.EngineProbe("vllm", "vllm.service", "http://127.0.0.1:8000", "m", executable="/opt/vllm/0.34.0/bin/vllm", completion=True)
SGLANG = observe.EngineProbe("sglang", "sglang.service", "http://127.0.0.1:30000", "m")


def test_one_read_of_every_unit_the_running_engine_probed_and_both_its_executables_versioned():
    reader = Reader()
    found = observe.observe([VLLM, SGLANG], ["/var/lib/gpufleet/rollback/staged", "/nope"], reader)
    assert [call for call in reader.calls if call[0] == "units"] == [("units", ("vllm.service", "sglang.service"))], "one systemctl show"
    vllm, sglang = found["engines"]["vllm"], found["engines"]["sglang"]
    assert vllm["running"] and vllm["enabled"] and vllm["installed"] and vllm["serving"]
    assert vllm["argv"][:3] == ["/opt/vllm/0.33.0/bin/vllm", "serve", "/models/m"]
    assert vllm["versions"] == {"/opt/vllm/0.33.0/bin/vllm": "0.33.0", "/opt/vllm/0.34.0/bin/vllm": None}
    assert vllm["version_reasons"] == {"/opt/vllm/0.34.0/bin/vllm": "/opt/vllm/0.34.0/bin/vllm does not exist"}
    assert not sglang["running"] and not sglang["serving"] and sglang["readiness"] is None and sglang["argv"] == []
    assert ("serves", "sglang", False) not in reader.calls, "an engine not running is not probed"
    assert ("serves", "vllm", True) in reader.calls, "the target's answer includes a completion"
    assert found["paths"] == {"/var/lib/gpufleet/rollback/staged": True, "/nope": False}


def test_a_running_engine_that_does_not_answer_is_found_but_not_serving_and_a_missing_unit_is_not_installed():
    show = SHOW.replace("LoadState=loaded\nActiveState=inactive", "LoadState=not-found\nActiveState=inactive")
    found = observe.observe([VLLM, SGLANG], [], Reader(show=show, serving=False))
    assert found["engines"]["vllm"]["running"] and not found["engines"]["vllm"]["serving"]
    assert not found["engines"]["sglang"]["installed"]
    kept = _switch.observed(found, ["vllm", "sglang"])
    assert kept["found"] == ["vllm"] and kept["serving"] == [] and kept["installed"] == ["vllm"] and kept["enabled"] == ["vllm"]
    assert kept["commands"] == {"vllm": found["engines"]["vllm"]["argv"]} and kept["versions"]["sglang"] == {}
    assert kept["previous"] is None, "no target given: no previous engine chosen"
    assert _switch.observed(found, ["vllm", "sglang"], "sglang")["previous"] == "vllm"
    assert _switch.observed(found, ["vllm", "sglang"], "vllm")["previous"] == "vllm", "in place"


@pytest.mark.parametrize(("params", "message"), [
    ({"engine": "tgi", "unit": "tgi.service"}, "'tgi' is not vllm or sglang"),
    ({"engine": "vllm", "unit": ""}, "give its unit"),
    ({"engine": "vllm", "unit": "vllm.service", "executable": "bin/vllm"}, "absolute path"),
])
def test_bad_engines_are_refused_by_name(params, message):
    with pytest.raises(InvalidInput, match=message):
        observe.EngineProbe.from_params(0, params)


def test_an_engine_given_twice_is_refused_before_anything_is_read():
    reader = Reader()
    with pytest.raises(InvalidInput, match="vllm given more than once"):
        observe.observe([VLLM, VLLM], [], reader)
    assert reader.calls == []


def test_the_switch_asks_for_the_targets_executable_and_completion_only():
    facts = {"vllm": {"engine": "vllm", "unit": "vllm.service", "url": "u", "served_model_name": "m", "api_key": "", "executable": "/v/bin/vllm",
                      "configured": True},
             "sglang": {"engine": "sglang", "unit": "sglang.service", "url": "u2", "served_model_name": "", "executable": "/s/bin/python",
                        "configured": False}}
    requests = _switch.observe_requests(facts, ["vllm", "sglang"], "vllm")
    assert requests[0]["executable"] == "/v/bin/vllm" and requests[0]["completion"] and requests[0]["api_key"] is None
    assert requests[1]["executable"] is None and not requests[1]["completion"] and requests[1]["model"] is None
    with pytest.raises(_switch.SwitchError, match="did not answer for sglang"):
        _switch.observed({"engines": {"vllm": {}}}, ["vllm", "sglang"])


@pytest.mark.parametrize(("account", "device", "ready"), [
    ({"exists": True, "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin", "groups": []}, {"exists": True, "group": "video", "mode": "0666"}, True),
    ({"exists": True, "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin", "groups": ["video"]}, {"exists": True, "group": "video", "mode": "0660"}, True),
    ({"exists": True, "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin", "groups": []}, {"exists": True, "group": "video", "mode": "0660"}, False),
    ({"exists": True, "home": "/home/vllm", "shell": "/usr/sbin/nologin", "groups": []}, {"exists": False}, False),
    ({"exists": True, "home": "/var/lib/vllm", "shell": "/bin/bash", "groups": []}, {"exists": False}, False),
    ({"exists": False}, {"exists": False}, False),
])
def test_the_switch_creates_the_engines_user_only_when_it_is_not_as_the_role_makes_it(account, device, ready):
    facts = {"dedicated_user": True, "user": "vllm", "state_directory": "/var/lib/vllm"}
    observed = {"users": {"vllm": account}, "devices": {"/dev/nvidiactl": device}}
    assert switch_plan.user_ready(facts, observed) is ready
    assert switch_plan.user_ready({"dedicated_user": False, "user": "root"}, {}) is True


def test_users_and_devices_are_read_as_asked():
    class WithAccounts(Reader):
        def user(self, name):
            return {"exists": name == "vllm", "home": "/var/lib/vllm", "shell": "/usr/sbin/nologin", "groups": []}

        def device(self, path):
            return {"exists": True, "group": "video", "mode": "0660"}

    found = observe.observe([VLLM, SGLANG], [], WithAccounts(), users=["vllm", "nobody2"], devices=["/dev/nvidiactl"])
    assert found["users"]["vllm"]["exists"] and not found["users"]["nobody2"]["exists"]
    assert found["devices"] == {"/dev/nvidiactl": {"exists": True, "group": "video", "mode": "0660"}}


def test_the_version_reads_run_side_by_side():
    """Each read starts a Python of its own: read one after the other, the barrier (one party per read) would break."""
    import threading

    barrier = threading.Barrier(2, timeout=5)

    class SideBySide(Reader):
        def version(self, engine, executable):
            barrier.wait()  # BrokenBarrierError after 5 s when the other read does not start meanwhile
            return super().version(engine, executable)

    found = observe.observe([VLLM, SGLANG], [], SideBySide())
    assert found["engines"]["vllm"]["versions"] == {"/opt/vllm/0.33.0/bin/vllm": "0.33.0", "/opt/vllm/0.34.0/bin/vllm": None}


class InUnit(ProcReader):
    """The real /proc, with the units some processes run in."""

    def __init__(self, units: dict[int, str]):
        super().__init__()
        self.units = units

    def unit(self, pid: int) -> str | None:
        return self.units.get(pid) or super().unit(pid)


def test_the_engines_escaped_workers_are_their_users_gpu_holders_outside_every_engine_unit(devices, processes):
    """Real processes and real /proc: a process of an engine's user holding a GPU file outside the engine units is
    escaped; one holding nothing, or of a user not an owner, is not; a holder inside an engine unit is not."""
    _holder, (holder_pid,) = processes.holder("--open", devices.gpu(2), devices.ctl)
    idle = processes.decoy("vllm", "serve")
    me = os.getuid()
    found = observe.escaped_holders({me: "vllm"}, ["vllm.service", "sglang.service"], tuple(devices.globs))
    assert [holder["pid"] for holder in found] == [holder_pid]
    assert found[0]["user"] == "vllm" and found[0]["via"] == ["fd"]
    assert found[0]["devices"] == sorted([devices.gpu(2), devices.ctl])
    assert idle.pid not in [holder["pid"] for holder in found]
    # not an owner's: another user's job is the preflight's and the teardown's business, not an escaped worker
    assert observe.escaped_holders({me + 1: "sglang"}, ["vllm.service"], tuple(devices.globs)) == []
    # inside one of the engine units: its own (this machine runs no systemd, so the holder's cgroup is read as that unit's)
    in_unit = InUnit({holder_pid: "vllm.service"})
    assert observe.escaped_holders({me: "vllm"}, ["vllm.service"], tuple(devices.globs), in_unit) == []
    assert [h["unit"] for h in observe.escaped_holders({me: "vllm"}, ["sglang.service"], tuple(devices.globs), in_unit)] == ["vllm.service"]
    # no owners or no device files: nothing is read
    assert observe.escaped_holders({}, [], tuple(devices.globs)) == []
    assert observe.escaped_holders({me: "vllm"}, [], (str(devices.root / "absent*"),)) == []
