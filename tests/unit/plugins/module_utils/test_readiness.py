"""engine_ready's and engine_drain's waits and verdicts, and host_lease's request: errors raised, never a module exit."""

from __future__ import annotations

import pytest
from test_lease_and_engine_http import ScriptedClient

from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_http as http
from ansible_collections.gpufleet.serving.plugins.module_utils import _lease as lease
from ansible_collections.gpufleet.serving.plugins.module_utils import _readiness as readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, EngineExited, InvalidInput, LockTimeout, RequesterGone

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
    assert raised.value.msg.startswith("vllm.service is auto-restart: the engine exited while starting")
    assert raised.value.context["unit_state"] == "auto-restart" and clock.now == 2.0, "the third reading ended it, not the deadline"


def test_ready_and_not_ready_are_reports():
    ready = ScriptedClient({"/health": http.Response(200), "/v1/models": http.Response(200, '{"data": [{"id": "llama70b"}]}'),
                            "/v1/completions": http.Response(200, '{"choices": [{"text": " Paris"}]}')})
    report = readiness.wait_ready(readiness.ReadyRequest.from_params(READY_PARAMS), ready, lambda unit: "active", clock=FakeClock())
    assert report["ready"] and report["unit_state"] == "active"
    waiting = readiness.wait_ready(readiness.ReadyRequest.from_params(dict(READY_PARAMS, unit=None)), ScriptedClient({}), clock=FakeClock())
    assert not waiting["ready"] and waiting["waiting_for"].startswith("/health: no connection") and "unit_state" not in waiting


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
