"""engine_cutover's first steps as Ansible runs it, on this machine's real files, sockets and the real nvidia-ml-py
over the simulated NVML library: a failed preflight ends it with nothing written, read, drained or stopped; files
that cannot be written end it before the drain; a preflight option it cannot use is refused naming it. (Its drain,
teardown and bring-up run on systemd nodes: the switch_engine and switch_faults scenarios.)"""

from __future__ import annotations

import os
import socket
import uuid

from conftest import run_module


def cutover_args(tmp_path, **extra) -> dict:
    return {"units": ["gpufleet-test-vllm.service", "gpufleet-test-sglang.service"], "lease_name": f"test-{uuid.uuid4().hex[:8]}",
            "target": {"engine": "sglang", "unit": "gpufleet-test-sglang.service", "url": "http://127.0.0.1:9", "model": "m"},
            "previous": {"engine": "vllm", "unit": "gpufleet-test-vllm.service", "url": "http://127.0.0.1:9", "model": "m"}, **extra}


def unit_file(tmp_path) -> dict:
    return {"name": "unit", "path": str(tmp_path / "etc" / "gpufleet-test-sglang.service"), "content": "[Service]\nExecStart=/bin/true\n"}


def test_a_failed_preflight_ends_the_cutover_with_nothing_written_or_drained(tmp_path, nvml_env):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        secrets = {"name": "secrets", "path": str(tmp_path / "etc" / "sglang.env"), "content": "SGLANG_API_KEY=s3cr3t-key\n", "secret": True,
                   "mode": "0600"}
        result = run_module("engine_cutover", cutover_args(
            tmp_path, preflight={"engine": "sglang", "checks": ["model", "gpus", "port"], "model": str(tmp_path / "missing"), "port": port,
                                 "gpus_needed": 16, "version": None},
            files=[unit_file(tmp_path), secrets], prewarm_paths=[str(tmp_path)]), env=nvml_env)
    assert not result.failed, result["msg"] if result.failed else ""
    assert result["result"] == "preflight_failed" and result["changed"] is False
    assert [check["name"] for check in result["preflight"]["checks"]] == ["model", "gpus", "port"]
    assert result["reason"] == "; ".join(result["preflight"]["failures"]) and len(result["preflight"]["failures"]) == 3
    assert "16" in result["reason"] and str(port) in result["reason"], "each failed check says what it found"
    assert [mark[0] for mark in result["marks"]] == ["preflight", "end"]
    assert result["drain"] is None and result["teardown"] is None and result["prewarm"] is None and result["files"] is None
    assert not (tmp_path / "etc").exists(), "nothing written"
    assert "s3cr3t-key" not in result.stderr and "s3cr3t-key" not in str(result.result), "a secret file's content is never returned"


def test_files_that_cannot_be_written_end_the_cutover_before_the_drain(tmp_path, nvml_env):
    (tmp_path / "etc").write_text("a file where the unit's directory should be")
    result = run_module("engine_cutover", cutover_args(
        tmp_path, preflight={"engine": "sglang", "checks": ["gpus"], "model": "m", "port": 30000}, files=[unit_file(tmp_path)]), env=nvml_env)
    assert not result.failed, result["msg"] if result.failed else ""
    assert result["result"] == "failed" and result["reason"].startswith("stage: the target's files: ")
    assert result["preflight"]["passed"] and [mark[0] for mark in result["marks"]] == ["preflight", "stage", "end"]
    assert result["drain"] is None and result["teardown"] is None, "the previous engine was never drained or stopped"


def test_a_preflight_it_cannot_use_is_refused_naming_the_option(tmp_path, nvml_env):
    result = run_module("engine_cutover", cutover_args(tmp_path, preflight={"engine": "sglang", "checks": ["model", "smell"], "model": "m",
                                                                            "port": 30000}), env=nvml_env)
    assert result.failed and result["msg"].startswith("preflight: ") and "smell" in result["msg"]
    result = run_module("engine_cutover", cutover_args(tmp_path, preflight={"engine": "sglang", "model": "m"}), env=nvml_env)
    assert result.failed and result["msg"].startswith("preflight: ") and "port" in result["msg"]
    result = run_module("engine_cutover", cutover_args(tmp_path, files=[{"name": "unit", "content": "x"}]), env=nvml_env)
    assert result.failed and result["msg"].startswith("files[0]: ") and "path" in result["msg"]
    assert not os.path.exists("/etc/systemd/system/gpufleet-test-sglang.service")


def test_a_secret_file_is_never_returned_when_another_option_is_refused(tmp_path, nvml_env):
    secrets = {"name": "secrets", "path": str(tmp_path / "sglang.env"), "content": "SGLANG_API_KEY=t0p-s3cret\n", "secret": "yes"}
    args = cutover_args(tmp_path, files=[secrets])
    args["target"] = dict(args["target"], unit="")  # refused before the files are looked at
    result = run_module("engine_cutover", args, env=nvml_env)
    assert result.failed and "unit" in result["msg"]
    assert "t0p-s3cret" not in str(result.result) and "t0p-s3cret" not in result.stderr
    assert not (tmp_path / "sglang.env").exists()


def test_the_rollback_alone_plans_the_previous_engine_in_check_mode_and_touches_nothing_under_another_runs_lease(tmp_path, nvml_env):
    """The controller's rollback (rollback_reason): --check says which engine it would start; for real, under a lease
    another run holds, it is lease_lost with nothing touched - as the cutover itself is."""
    args = cutover_args(tmp_path, rollback_reason="soak: sglang crashed", files=[unit_file(tmp_path)])
    planned = run_module("engine_cutover", args, check_mode=True, env=nvml_env)
    assert not planned.failed, planned["msg"] if planned.failed else ""
    assert planned["result"] == "would_roll_back" and planned["unit_to_start"] == "gpufleet-test-vllm.service"
    held = run_module("host_lease", {"name": args["lease_name"], "owner": "another-run", "lease_seconds": 60}, env=nvml_env)
    assert not held.failed and held["changed"]
    result = run_module("engine_cutover", dict(args, lease_owner="this-run", record_path=str(tmp_path / "last_cutover.json")), env=nvml_env)
    assert not result.failed, result["msg"] if result.failed else ""
    assert result["result"] == "lease_lost" and result["holder"]["owner"] == "another-run" and result["marks"] == []
    assert not (tmp_path / "etc").exists() and not (tmp_path / "last_cutover.json").exists(), "nothing written, nothing recorded"
    run_module("host_lease", {"name": args["lease_name"], "owner": "another-run", "state": "released"}, env=nvml_env)
