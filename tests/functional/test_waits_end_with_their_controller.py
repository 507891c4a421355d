"""E11: a module that only waits (readiness, free GPU memory) stops once whoever asked for it is gone. A real module
process whose output pipe loses its reader - as when the controller is interrupted or its SSH connection drops - ends
at its next poll instead of polling the node for minutes for no one."""

from __future__ import annotations

import socket
import subprocess
import time

import pytest
from conftest import start_module


def unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def assert_it_stops_when_its_reader_goes(proc, waits_for: float) -> None:
    time.sleep(1.5)
    assert proc.poll() is None, f"the module should still be waiting (rc {proc.returncode}): {proc.stderr.read()}"
    proc.stdout.close()  # the controller is gone: the far end of the module's output closes
    started = time.monotonic()
    try:
        proc.wait(timeout=waits_for / 4)
    except subprocess.TimeoutExpired:
        pass
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            pytest.fail(f"still polling {time.monotonic() - started:.0f} s after its controller was gone (its wait: {waits_for:g} s)")
    assert proc.returncode != 0, "it stopped waiting: a failure, not a readiness or a pass it never saw"


@pytest.mark.covers("E11")
def test_a_readiness_wait_ends_when_its_controller_is_gone():
    proc = start_module("engine_ready", {"engine": "vllm", "url": f"http://127.0.0.1:{unused_port()}", "model": "llama70b", "timeout": 120,
                                         "interval": 0.2})
    assert_it_stops_when_its_reader_goes(proc, 120)


@pytest.mark.covers("E11")
def test_a_memory_poll_ends_when_its_controller_is_gone(devices, sim, processes, nvml_env):
    processes.holder("--open", devices.gpu(0), "--sim-root", str(sim.root), "--alloc", "0:4096")
    proc = start_module("gpu_memory_assert", {"device_paths": devices.globs, "timeout": 120, "interval": 0.2}, env=nvml_env)
    assert_it_stops_when_its_reader_goes(proc, 120)
