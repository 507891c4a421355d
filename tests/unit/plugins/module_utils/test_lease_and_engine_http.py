"""The switch lease (with an injected boot clock) and the engine HTTP logic (with a scripted client)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._node.lease import LeaseStore
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import requester_gone


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.now += seconds


@pytest.fixture
def store(tmp_path):
    clock = Clock()
    return LeaseStore("switch_engine", str(tmp_path), clock=clock, sleep=clock.sleep), clock


def test_lease_is_exclusive_renewable_and_released(store):
    leases, _clock = store
    first = leases.acquire("run-a", 60, 0)
    assert first.taken and first.holder["owner"] == "run-a"
    assert not leases.acquire("run-a", 60, 0).taken, "renewing one's own lease is not a new taking"
    blocked = leases.acquire("run-b", 60, 0)
    assert not blocked.taken and blocked.holder["owner"] == "run-a"
    assert not leases.release("run-b") and leases.release("run-a")
    assert leases.acquire("run-b", 60, 0).taken


@pytest.mark.covers('E2')
def test_waiting_run_gets_an_expired_lease_and_names_the_dead_owner(store, monkeypatch):
    """E2: the owner died; once its lease expires the next run takes it over and says whose it was."""
    import time as time_module

    leases, clock = store
    leases.acquire("dead-run", 30, 0)
    monotonic = [0.0]
    monkeypatch.setattr(time_module, "monotonic", lambda: monotonic[0])

    def sleep(seconds):
        clock.now += seconds
        monotonic[0] += seconds

    leases.sleep = sleep
    taken = leases.acquire("next-run", 60, wait_timeout=120)
    assert taken.taken and taken.recovered == {"owner": "dead-run", "broken": False}
    assert 29 <= clock.now - 100 <= 31


def test_a_dead_owner_is_broken_at_once_and_only_that_owner(store):
    """An interrupted run's lease is taken over without waiting for its expiry - but only the owner named dead."""
    leases, _clock = store
    leases.acquire("interrupted-run", 600, 0)
    assert not leases.acquire("next-run", 60, 0, break_owner="some-other-run").taken, "a lease that changed hands is waited for"
    taken = leases.acquire("next-run", 60, 0, break_owner="interrupted-run")
    assert taken.taken and taken.recovered == {"owner": "interrupted-run", "broken": True}


def test_a_wait_whose_requester_is_gone_ends_and_takes_nothing(store, monkeypatch):
    """An interrupted controller's wait must not take the lease later for a run that no longer exists."""
    import time as time_module

    leases, clock = store
    leases.acquire("other-controller-run", 600, 0)
    monotonic = [0.0]
    monkeypatch.setattr(time_module, "monotonic", lambda: monotonic[0])
    asked = []

    def sleep(seconds):
        clock.now += seconds
        monotonic[0] += seconds

    leases.sleep = sleep

    def still_wanted():
        asked.append(monotonic[0])
        if len(asked) < 3:
            return True
        leases.release("other-controller-run")  # the holder gives it back just as the requester goes away
        return False

    outcome = leases.acquire("interrupted-run", 60, wait_timeout=15, still_wanted=still_wanted)
    assert outcome.abandoned and not outcome.taken and outcome.holder["owner"] == "other-controller-run"
    assert len(asked) == 3 and monotonic[0] < 15
    assert leases.acquire("next-run", 60, 0).taken, "the lease was left free for the next run"


def test_a_requester_gone_while_the_wait_sleeps_takes_nothing_freed_in_the_same_sleep(store):
    """switch_faults' interrupted lease wait (a CI run, under load): the controller went away and the holder gave the
    lease back within one retry's sleep. The retry must ask first, not take the lease for a run that no longer exists."""
    leases, clock = store
    leases.acquire("other-controller-run", 600, 0)
    gone = []

    def sleep(seconds):
        clock.now += seconds
        leases.release("other-controller-run")
        gone.append(True)

    leases.sleep = sleep
    outcome = leases.acquire("interrupted-run", 60, wait_timeout=15, still_wanted=lambda: not gone)
    assert outcome.abandoned and not outcome.taken
    assert leases.held()["owner"] is None, "the lease stays free for the next run"


def test_requester_gone_sees_the_far_end_of_the_output_close(tmp_path):
    """A real pipe, as a module's stdout is to sshd or to the controller's worker."""
    import os

    read_end, write_end = os.pipe()
    try:
        assert not requester_gone(write_end)
        assert not requester_gone(write_end, parent=os.getppid())
        assert requester_gone(write_end, parent=os.getppid() + 1), "reparented: whoever started us is gone"
        os.close(read_end)
        assert requester_gone(write_end)
    finally:
        os.close(write_end)
    with open(tmp_path / "output", "w", encoding="utf-8") as regular_file:
        assert not requester_gone(regular_file.fileno()), "a file never hangs up"


def test_check_mode_acquire_writes_nothing(store):
    leases, _clock = store
    assert leases.acquire("run-a", 60, 0, dry_run=True).taken
    assert leases.acquire("run-b", 60, 0).taken


METRICS = """# HELP vllm:num_requests_running Number of requests in model execution batches.
vllm:num_requests_running{model_name="llama70b",engine="0"} 3.0
vllm:num_requests_running{model_name="llama70b",engine="1"} 1.0
vllm:num_requests_waiting{model_name="llama70b",engine="0"} 2
vllm:spec_decode_num_draft_tokens_total{model_name="llama70b",engine="0"} 300
vllm:spec_decode_num_accepted_tokens_total{model_name="llama70b",engine="0"} 120
"""


class ScriptedClient:
    def __init__(self, replies):
        self.replies = replies
        self.calls = []

    def request(self, method, path, payload=None):
        self.calls.append((method, path))
        reply = self.replies.get(path)
        return reply() if callable(reply) else (reply or http.Response(None, error="refused"))


def test_metrics_are_summed_over_label_sets():
    metrics = http.parse_metrics(METRICS)
    assert metrics["vllm:num_requests_running"] == 4.0 and metrics["vllm:num_requests_waiting"] == 2.0
    client = ScriptedClient({"/metrics": http.Response(200, METRICS)})
    assert http.running_requests("vllm", client) == 6.0
    assert http.running_requests("vllm", ScriptedClient({})) is None


def test_readiness_goes_health_models_completion_and_reports_what_it_waits_for():
    assert http.check_ready("vllm", ScriptedClient({}), "llama70b").waiting_for.startswith("/health: no connection")
    loading = ScriptedClient({"/health_generate": http.Response(503)})
    assert http.check_ready("sglang", loading, "llama70b").waiting_for == "/health_generate: 503"
    listed_other = ScriptedClient({"/health": http.Response(200), "/v1/models": http.Response(200, '{"data": [{"id": "other"}]}')})
    assert "not listed" in http.check_ready("vllm", listed_other, "llama70b").waiting_for
    ready = ScriptedClient({"/health": http.Response(200), "/v1/models": http.Response(200, '{"data": [{"id": "llama70b"}]}'),
                            "/v1/completions": http.Response(200, '{"choices": [{"text": " Paris"}]}')})
    assert http.check_ready("vllm", ready, "llama70b").ready
    assert [call[1] for call in ready.calls] == ["/health", "/v1/models", "/v1/completions"]


def test_spec_acceptance_from_vllm_counters_and_sglang_gauge():
    before = {"vllm:spec_decode_num_draft_tokens_total": 100.0, "vllm:spec_decode_num_accepted_tokens_total": 70.0}
    after = {"vllm:spec_decode_num_draft_tokens_total": 300.0, "vllm:spec_decode_num_accepted_tokens_total": 90.0}
    assert http.spec_acceptance("vllm", before, after) == pytest.approx(0.1)
    assert http.spec_acceptance("vllm", before, before) is None
    assert http.spec_acceptance("sglang", {}, {"sglang:spec_accept_rate": 0.62}) == 0.62


def test_engine_ready_rejects_bad_timeouts_and_reports_an_engine_that_is_down():
    """Bad input names the option; an engine that does not answer is 'not ready yet', within the call's timeout."""
    from conftest import run_module

    bad = run_module("engine_ready", {"engine": "vllm", "model": "m", "timeout": -1})
    assert bad.failed and "timeout: must be at least 0" in bad["msg"]
    down = run_module("engine_ready", {"engine": "vllm", "model": "m", "url": "http://127.0.0.1:9", "timeout": 0.5, "interval": 0.1})
    assert not down.failed and down["ready"] is False and down["waiting_for"].startswith("/health: no connection")
    drained = run_module("engine_drain", {"engine": "sglang", "url": "http://127.0.0.1:9", "timeout": 1})
    assert drained["drained"] is True and drained["answering"] is False


@pytest.mark.covers('E11')
def test_a_lease_changing_hands_waits_for_the_work_its_last_holder_left_running(store, tmp_path):
    """E11: an interrupted controller's cutover goes on on the node; the next run takes the lease only once it ended,
    and names it while it runs. The work lock is a real flock held by another open file, as engine_cutover holds it."""
    import fcntl
    import os

    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import LockTimeout
    from ansible_collections.gpufleet.serving.plugins.module_utils._node.lease import LeaseRequest, take

    leases, _clock = store
    leases.acquire("interrupted-run", 600, 0)
    work = os.open(leases.work_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(work, fcntl.LOCK_EX)
    os.pwrite(work, b"4242\n", 0)
    try:
        assert leases.work_holder() == "4242"
        blocked = leases.acquire("next-run", 60, 0, break_owner="interrupted-run")
        assert not blocked.taken and blocked.working == "4242" and blocked.holder["owner"] == "interrupted-run"
        request = LeaseRequest("switch_engine", "next-run", "acquired", 60, 0, "interrupted-run")
        with pytest.raises(LockTimeout, match=r"work of interrupted-run still runs on this node \(pid 4242"):
            take(request, leases, False, still_wanted=lambda: True)
        assert not leases.acquire("interrupted-run", 600, 0).working, "its own renewal is never held up by its own work"
    finally:
        os.close(work)  # the cutover ended (or died): the kernel dropped its lock
    assert leases.work_holder() is None
    taken = leases.acquire("next-run", 60, 0, break_owner="interrupted-run")
    assert taken.taken and taken.recovered == {"owner": "interrupted-run", "broken": True}


def test_a_lease_given_back_while_its_work_still_runs_is_taken_only_once_that_work_ended(store):
    """E11, SSH dropped: a controller that lost the node during its cutover gives the lease back over a new connection
    while the cutover goes on; the next run waits for that work all the same."""
    import fcntl
    import os

    from ansible_collections.gpufleet.serving.plugins.module_utils._errors import LockTimeout
    from ansible_collections.gpufleet.serving.plugins.module_utils._node.lease import LeaseRequest, take

    leases, _clock = store
    leases.acquire("cut-off-run", 600, 0)
    work = os.open(leases.work_path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(work, fcntl.LOCK_EX)
    os.pwrite(work, b"4343\n", 0)
    try:
        assert leases.release("cut-off-run")
        blocked = leases.acquire("next-run", 60, 0)
        assert not blocked.taken and blocked.working == "4343" and blocked.holder["owner"] is None
        with pytest.raises(LockTimeout, match=r"the work of a run that gave the lease back still runs on this node \(pid 4343"):
            take(LeaseRequest("switch_engine", "next-run", "acquired", 60, 0, None), leases, False, still_wanted=lambda: True)
    finally:
        os.close(work)
    taken = leases.acquire("next-run", 60, 0)
    assert taken.taken and taken.recovered is None


@pytest.mark.parametrize(("content", "why"), [
    ("{\"owner\": \"run-a\", \"acq", "is not a lease record (Unterminated string"),
    ("[1, 2]", "is not a lease record (no owner and expiry)"),
    ("{\"owner\": \"run-a\"}", "is not a lease record (no owner and expiry)"),
])
def test_a_lease_file_that_cannot_be_read_is_taken_over_and_named_not_called_expired(store, content, why):
    """Issue 42 (8): a damaged lease file (cut, edited by hand) names no owner. It is taken over as an expired lease
    is, and the takeover says the file was unreadable and where it is; the table says so too."""
    from ansible_collections.gpufleet.serving.plugins.plugin_utils import _reports as reports

    leases, _clock = store
    with open(leases.path, "w", encoding="utf-8") as handle:
        handle.write(content)
    taken = leases.acquire("run-b", 60, 0)
    assert taken.taken and taken.holder["owner"] == "run-b"
    assert taken.recovered["owner"] is None and taken.recovered["unreadable"].startswith(f"{leases.path} {why}")
    document = {"hosts": {"node1": {"result": "switched", "recovered_lease": taken.recovered}}}
    assert f"node1: took over a switch lease that could not be read - {leases.path} {why}" in reports.switch_table(document)
    assert "expired" not in reports.switch_table(document)
