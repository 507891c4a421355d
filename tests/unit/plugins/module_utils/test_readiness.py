"""engine_ready's and engine_drain's waits and verdicts, and host_lease's request: errors raised, never a module exit."""

from __future__ import annotations

import pytest
from test_lease_and_engine_http import ScriptedClient

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, EngineExited, InvalidInput, LockTimeout, RequesterGone
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease

READY_PARAMS = {"engine": "vllm", "url": None, "model": "llama70b", "api_key": None, "unit": "vllm.service", "timeout": 10,
                "interval": 1, "completion": True, "min_spec_acceptance": None, "probe_requests": 8}


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def monotonic(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


def test_requests_are_validated_naming_the_option():
    with pytest.raises(InvalidInput, match="interval: must be greater than 0"):
        readiness.ReadyRequest.from_params(dict(READY_PARAMS, interval=0))
    with pytest.raises(InvalidInput, match="min_spec_acceptance must be between 0 and 1"):
        readiness.ReadyRequest.from_params(dict(READY_PARAMS, min_spec_acceptance=1.5))
    assert readiness.ReadyRequest.from_params(READY_PARAMS).url == "http://127.0.0.1:8000"
    with pytest.raises(InvalidInput, match="name must be 1-64"):
        lease.LeaseRequest.from_params({"name": "a b", "owner": "o", "state": "acquired", "lease_seconds": 1, "wait_timeout": 0, "break_owner": None})
    with pytest.raises(InvalidInput, match="lease_seconds must be greater than 0"):
        lease.LeaseRequest.from_params({"name": "x", "owner": "o", "state": "acquired", "lease_seconds": 0, "wait_timeout": 0, "break_owner": None})


def test_a_unit_that_exits_while_awaited_ends_the_wait_at_once_with_an_error():
    states = iter(["activating", "activating", "auto-restart"])
    clock = FakeClock()
    with pytest.raises(EngineExited) as raised:
        readiness.wait_ready(readiness.ReadyRequest.from_params(READY_PARAMS), ScriptedClient({}), lambda unit: next(states), clock=clock)
    assert raised.value.msg.startswith("vllm.service is auto-restart 2.0 s into this wait: the engine exited (journalctl -u vllm.service)")
    assert raised.value.context["unit_state"] == "auto-restart" and clock.now == 2.0, "the third reading ended it, not the deadline"
    said = ["Started vllm.service.", "(APIServer pid=9) ERROR 12-02 18:32:00 [api.py:1] OSError: [Errno 28] No space left on device"]
    with pytest.raises(EngineExited) as raised:
        readiness.wait_ready(readiness.ReadyRequest.from_params(READY_PARAMS), ScriptedClient({}), lambda unit: "failed", clock=FakeClock(),
                             journal=lambda unit: said)
    assert "; it said: OSError: [Errno 28] No space left on device (journalctl -u vllm.service)" in raised.value.msg
    assert raised.value.context["engine_said"] == "OSError: [Errno 28] No space left on device"


def test_ready_and_not_ready_are_reports():
    ready = ScriptedClient({"/health": http.Response(200), "/v1/models": http.Response(200, '{"data": [{"id": "llama70b"}]}'),
                            "/v1/completions": http.Response(200, '{"choices": [{"text": " Paris"}]}')})
    report = readiness.wait_ready(readiness.ReadyRequest.from_params(READY_PARAMS), ready, lambda unit: "active", clock=FakeClock())
    assert report["ready"] and report["unit_state"] == "active"
    waiting = readiness.wait_ready(readiness.ReadyRequest.from_params(dict(READY_PARAMS, unit=None)), ScriptedClient({}), clock=FakeClock())
    assert not waiting["ready"] and waiting["waiting_for"].startswith("/health: no connection") and "unit_state" not in waiting


def serving_client(health=lambda: http.Response(200)) -> ScriptedClient:
    return ScriptedClient({"/health": health, "/v1/models": http.Response(200, '{"data": [{"id": "llama70b"}]}'),
                           "/v1/completions": http.Response(200, '{"choices": [{"text": " Paris"}]}')})


def unit_at(clock: FakeClock, crash_at: float | None = None):
    """The unit's properties over time: a new main PID and one restart from crash_at on (systemd's Restart=)."""
    def properties(unit):
        crashed = crash_at is not None and clock.now >= crash_at
        return {"ActiveState": "active", "SubState": "running", "InvocationID": "a1", "MainPID": "200" if crashed else "100",
                "NRestarts": "1" if crashed else "0"}
    return properties


def test_a_soak_that_holds_watches_its_whole_length_with_completions():
    """Issue 23.3: readiness and a completion every interval, the unit's identity unchanged, for the soak's length."""
    clock, client = FakeClock(), serving_client()
    record = readiness.soak(readiness.ReadyRequest.from_params(dict(READY_PARAMS, soak=10, interval=1)), client, unit_at(clock), clock=clock)
    assert record == {"seconds": 10.0, "probes": 11, "passed": True} and clock.now == 10.0
    assert client.calls.count(("POST", "/v1/completions")) == 11


def test_an_engine_restarted_by_systemd_during_the_soak_is_a_crash_named_with_when():
    """A crash 6 s after ready: systemd restarted it (new main PID, NRestarts moved) and it may answer again - still a crash."""
    clock = FakeClock()
    with pytest.raises(EngineExited) as raised:
        readiness.soak(readiness.ReadyRequest.from_params(dict(READY_PARAMS, soak=30, interval=1)), serving_client(), unit_at(clock, 6), clock=clock)
    assert raised.value.msg.startswith("vllm.service crashed 6.0 s after it was ready (MainPID 100 -> 200, NRestarts 0 -> 1")
    assert raised.value.context["soak"]["passed"] is False and clock.now == 6.0, "it ended at the crash, not at the soak's end"


def test_a_soak_fails_on_readiness_failing_twice_in_a_row_not_once():
    clock = FakeClock()
    answers = iter([http.Response(200), http.Response(None, error="timed out")] + [http.Response(200)] * 3
                   + [http.Response(503), http.Response(503)] + [http.Response(200)] * 100)
    request = readiness.ReadyRequest.from_params(dict(READY_PARAMS, soak=30, interval=1))
    with pytest.raises(CheckFailed, match=r"stopped serving 6.0 s after it was ready: /health: 503 \(2 probes in a row\)"):
        readiness.soak(request, serving_client(lambda: next(answers)), unit_at(clock), clock=clock)
    with pytest.raises(InvalidInput, match="soak"):
        readiness.ReadyRequest.from_params(dict(READY_PARAMS, soak=-1))


def test_acceptance_under_the_floor_is_a_failed_check_carrying_the_report():
    metrics = iter(["vllm:spec_decode_num_draft_tokens_total 0\nvllm:spec_decode_num_accepted_tokens_total 0\n",
                    "vllm:spec_decode_num_draft_tokens_total 100\nvllm:spec_decode_num_accepted_tokens_total 20\n"])

    class Client(ScriptedClient):
        def request(self, method, path, payload=None):
            return http.Response(200, next(metrics)) if path == "/metrics" else http.Response(200, "{}")

    request = readiness.ReadyRequest.from_params(dict(READY_PARAMS, min_spec_acceptance=0.5))
    with pytest.raises(CheckFailed) as raised:
        readiness.check_acceptance(request, Client({}), {"ready": True})
    assert "acceptance 0.2 is below min_spec_acceptance 0.5" in raised.value.msg and raised.value.context["spec_acceptance"] == 0.2


def test_a_drain_deadline_fails_only_when_asked():
    busy = ScriptedClient({"/metrics": http.Response(200, "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\n")})
    params = {"engine": "sglang", "url": None, "timeout": 2, "interval": 1, "fail_on_timeout": False}
    report = readiness.wait_drained(readiness.DrainRequest.from_params(params), busy, clock=FakeClock())
    assert report == {"drained": False, "running": 4.0, "answering": True, "elapsed": 2.0}
    with pytest.raises(CheckFailed, match="4 request\\(s\\) still running after 2s"):
        readiness.wait_drained(readiness.DrainRequest.from_params(dict(params, fail_on_timeout=True)), busy, clock=FakeClock())


def test_taking_a_held_lease_raises_naming_the_holder_and_takes_nothing(tmp_path):
    store = lease.LeaseStore("switch_engine", str(tmp_path))
    mine = {"name": "switch_engine", "owner": "run-a", "state": "acquired", "lease_seconds": 60, "wait_timeout": 0, "break_owner": None}
    assert lease.take(lease.LeaseRequest.from_params(mine), store, False, still_wanted=lambda: True)["changed"]
    other = dict(mine, owner="run-b")
    with pytest.raises(LockTimeout, match="switch_engine is held by run-a"):
        lease.take(lease.LeaseRequest.from_params(other), store, False, still_wanted=lambda: True)
    with pytest.raises(RequesterGone, match="whoever asked for the lease is gone"):
        lease.take(lease.LeaseRequest.from_params(dict(other, wait_timeout=5)), store, False, still_wanted=lambda: False)
    assert store.acquire("run-a", 60, 0).holder["owner"] == "run-a", "run-b took nothing"


def test_what_the_engine_said_is_the_first_exception_line_of_its_last_start():
    """The switch's reason for an engine that exited while starting names its root cause, from its journal."""
    from ansible_collections.gpufleet.serving.plugins.module_utils._engines.readiness import engine_said
    journal = [
        "Started vllm.service - vLLM.",
        "ValueError: an older start's failure",
        "vllm.service: Main process exited, code=exited, status=1/FAILURE",
        "Started vllm.service - vLLM.",
        "Failed to import from vllm._C: ImportError('libnuma.so.1: cannot open shared object file')",
        "(VllmWorker-0 pid=472) ERROR 12-02 18:36:02 [multiproc_executor.py:953] WorkerProc failed to start.",
        "(EngineCore pid=240) ERROR 12-02 18:32:00 [core.py:1510] EngineCore failed to start.",
        "(EngineCore pid=240) ERROR 12-02 18:32:00 [core.py:1510] Traceback (most recent call last):",
        '(EngineCore pid=240) ERROR 12-02 18:32:00 [core.py:1510]   File "/opt/vllm/core.py", line 1482, in run_engine_core',
        "(EngineCore pid=240) ERROR 12-02 18:32:00 [core.py:1510] RuntimeError: Insufficient space in /dev/shm: 160 MiB required, 62 MiB free.",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}",
        "vllm.service: Main process exited, code=exited, status=1/FAILURE",
    ]
    assert engine_said(journal) == "RuntimeError: Insufficient space in /dev/shm: 160 MiB required, 62 MiB free."
    worker = ["Started vllm.service.", "(VllmWorker-0 pid=472) ERROR 12-02 18:36:02 [multiproc_executor.py:953] AttributeError: no 'init_cpu_memory_env'",
              "RuntimeError: Engine core initialization failed. See root cause above."]
    assert engine_said(worker) == "AttributeError: no 'init_cpu_memory_env'", "a worker's prefix (a name with a dash) is dropped too"
    assert engine_said(["Started x.service.", "INFO 12-02 18:32:00 [api.py:1] loading", "x.service: Failed with result 'exit-code'."]) is None
    assert engine_said(["safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"]).startswith("safetensors_rust.SafetensorError")
