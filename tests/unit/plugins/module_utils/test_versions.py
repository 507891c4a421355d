"""Which Python runs an engine's executable, whether an install is the pin, and which side-by-side virtualenvs go."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.filter import engines as engine_filters
from ansible_collections.gpufleet.serving.plugins.module_utils import _versions as versions
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engines as engines


@pytest.mark.parametrize(("executable", "line", "expected"), [
    ("/opt/vllm/0.33.0/bin/vllm", b"#!/opt/vllm/0.33.0/bin/python3\n", ("/opt/vllm/0.33.0/bin/python3", None)),
    ("/opt/sglang/0.5.23/bin/python", None, ("/opt/sglang/0.5.23/bin/python", None)),
    ("/usr/bin/python3.11", None, ("/usr/bin/python3.11", None)),
    ("/opt/vllm/0.34.0/bin/vllm", None, (None, "/opt/vllm/0.34.0/bin/vllm does not exist")),
    ("/usr/local/bin/vllm", b"\x7fELF\x02", (None, "/usr/local/bin/vllm is not a Python script (no #! line)")),
    ("/usr/local/bin/vllm", b"#!/bin/sh\n", (None, "/usr/local/bin/vllm is not run by Python (#!/bin/sh)")),
])
def test_the_interpreter_of_an_executable(executable, line, expected):
    assert versions.interpreter(executable, line) == expected


def test_an_env_line_is_not_guessed():
    python, reason = versions.interpreter("/usr/local/bin/vllm", b"#!/usr/bin/env -S python3\n")
    assert python is None and reason == "/usr/local/bin/vllm runs python3 through env: which Python that is depends on PATH"


@pytest.mark.parametrize(("installed", "pin", "matches"), [
    ("0.33.0", "0.33.0", True), ("0.32.0+cpu", "0.32.0", True), ("0.33.0", "0.34.0", False), (None, "0.33.0", False),
    ("0.33.0", None, True), (None, None, False), ("0.33.0rc1", "0.33.0", False),
])
def test_an_install_matches_its_pin_with_any_local_build(installed, pin, matches):
    assert versions.matches_pin(installed, pin) is matches


def entries(*pairs):
    return [{"path": path, "installed": when} for path, when in pairs]


def test_the_serving_and_the_previous_virtualenv_are_kept_before_newer_ones():
    found = entries(("/opt/vllm/0.31.0", 1), ("/opt/vllm/0.32.0", 2), ("/opt/vllm/0.33.0", 3), ("/opt/vllm/0.35.0", 5), ("/opt/vllm/0.34.0", 4))
    # a downgrade to 0.32.0 from 0.34.0: 0.35.0 is the newest install, but 0.34.0 is what a rollback starts
    assert versions.virtualenvs_to_prune(found, 2, "/opt/vllm/0.32.0", "/opt/vllm/0.34.0") == ["/opt/vllm/0.31.0", "/opt/vllm/0.33.0",
                                                                                               "/opt/vllm/0.35.0"]
    assert versions.virtualenvs_to_prune(found, 3, "/opt/vllm/0.32.0/", None) == ["/opt/vllm/0.31.0", "/opt/vllm/0.33.0"]
    assert versions.virtualenvs_to_prune(found, 1, "/opt/vllm/0.36.0", None) == [entry["path"] for entry in sorted(found, key=lambda e: e["installed"])]
    assert versions.virtualenvs_to_prune(found, 9, "/opt/vllm/0.33.0") == []


@pytest.mark.parametrize("keep", [0, -1, True, "2"])
def test_a_keep_below_one_is_refused(keep):
    with pytest.raises(ValueError, match="keep: a whole number of at least 1"):
        versions.virtualenvs_to_prune([], keep, "/opt/vllm/0.33.0")


def test_the_filter_takes_only_virtualenvs_directly_under_the_root():
    found = [{"path": "/opt/vllm/pyvenv.cfg", "mtime": 1.0},  # the old layout: the root itself was the virtualenv
             {"path": "/opt/vllm/0.32.0/pyvenv.cfg", "mtime": 2.0}, {"path": "/opt/vllm/0.33.0/pyvenv.cfg", "mtime": 3.0},
             {"path": "/opt/vllm/0.34.0/pyvenv.cfg", "mtime": 4.0}]
    assert engine_filters.virtualenvs_to_prune(found, "/opt/vllm", 2, "/opt/vllm/0.34.0", "/opt/vllm/0.33.0") == ["/opt/vllm/0.32.0"]
    assert engine_filters.virtualenvs_to_prune(found, "/opt/vllm/", "1", "/opt/vllm/0.34.0") == ["/opt/vllm/0.32.0", "/opt/vllm/0.33.0"]


def test_what_a_unit_runs_from_systemctl_show():
    shown = ("{ path=/opt/vllm/0.33.0/bin/vllm ; argv[]=/opt/vllm/0.33.0/bin/vllm serve /models/llama70b --port 8000 ; "
             "ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }")
    argv = engines.unit_command(shown)
    assert argv == ["/opt/vllm/0.33.0/bin/vllm", "serve", "/models/llama70b", "--port", "8000"]
    assert engine_filters.engine_identity("vllm", argv, "0.33.0") == {"engine": "vllm", "version": "0.33.0", "model": "/models/llama70b"}
    sglang = ["/opt/sglang/0.5.23/bin/python", "-m", "sglang.launch_server", "--model-path", "/models/q", "--port", "30000"]
    assert engine_filters.engine_identity("sglang", sglang, "") == {"engine": "sglang", "version": None, "model": "/models/q"}
    assert engines.unit_command("") == [] and engines.command_model("vllm", ["/usr/bin/vllm", "serve"]) is None


def test_the_role_s_facts_say_where_versions_sit_side_by_side():
    base = {"unit": "vllm.service", "port": 8000, "shutdown_timeout": 60, "ready_timeout": 60, "user": "vllm", "restart": "always",
            "model": "/models/m", "install": True, "version": "0.34.0", "virtualenvs_root": "/opt/vllm", "virtualenvs_keep": "3"}
    facts = engines.engine_facts(dict(base, virtualenv="/opt/vllm/0.34.0"), "vllm")
    assert facts["executable"] == "/opt/vllm/0.34.0/bin/vllm" and facts["virtualenvs_root"] == "/opt/vllm" and facts["virtualenvs_keep"] == 3
    elsewhere = engines.engine_facts(dict(base, virtualenv="/srv/vllm"), "vllm")
    assert elsewhere["virtualenvs_root"] is None, "a virtualenv outside the root is never pruned"
    with pytest.raises(engines.EngineArgsError, match="vllm_virtualenvs_keep: must be at least 1"):
        engines.engine_facts(dict(base, virtualenv="/opt/vllm/0.34.0", virtualenvs_keep=0), "vllm")
    with pytest.raises(engines.EngineArgsError, match="vllm_virtualenvs_root: give an absolute directory other than /"):
        engines.engine_facts(dict(base, virtualenv="/opt/vllm/0.34.0", virtualenvs_root="opt"), "vllm")


def test_the_report_names_what_is_installed_a_local_build_of_the_pin_included():
    """Issue 42 (4): vLLM's CPU build installed as 0.32.0+cpu for the pin 0.32.0 is the pin, and the report names it
    as installed; another version there now is replaced by the pin, which the report names; no pin - what is there."""
    assert versions.reported_version("0.32.0+cpu", "0.32.0") == "0.32.0+cpu"
    assert versions.reported_version("0.31.1", "0.32.0") == "0.32.0"
    assert versions.reported_version(None, "0.32.0") == "0.32.0"
    assert versions.reported_version("0.5.23", None) == "0.5.23"
    assert versions.reported_version(None, None) is None
