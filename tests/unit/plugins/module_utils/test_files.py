"""engine_files' logic on real files: what differs (content, mode, owner), the whole file renamed into place, one
reload only when a unit changed, nothing written in check mode, secrets never in a diff."""

from __future__ import annotations

import os
import stat

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, InvalidInput


def wanted(path, content, **extra):
    return files.WantedFile.from_params({"path": str(path), "content": content, **extra})


def test_files_are_written_whole_with_their_mode_then_left_alone(tmp_path):
    unit = wanted(tmp_path / "systemd" / "vllm.service", "[Service]\nExecStart=/bin/true\n", name="unit", reload=True)
    secrets = wanted(tmp_path / "secrets" / "vllm.env", "KEY=s3cret\n", name="secrets", mode="0600", secret=True)
    reloads = []
    result = files.converge([unit, secrets], 0o755, False, lambda: reloads.append(1))
    assert result["changed"] and result["files"] == {"unit": ["absent"], "secrets": ["absent"]} and result["reloaded"]
    assert (tmp_path / "systemd" / "vllm.service").read_text() == "[Service]\nExecStart=/bin/true\n"
    assert stat.S_IMODE(os.stat(tmp_path / "secrets" / "vllm.env").st_mode) == 0o600
    assert stat.S_IMODE(os.stat(tmp_path / "secrets").st_mode) == 0o755, "a missing parent is created with directory_mode"
    assert reloads == [1]
    assert [d["after_header"] for d in result["diff"]] == [str(tmp_path / "systemd" / "vllm.service")], "no secret in a diff"
    assert not [name for name in os.listdir(tmp_path / "systemd") if name.startswith(".")], "no temporary file left"

    again = files.converge([unit, secrets], 0o755, False, lambda: reloads.append(2))
    assert not again["changed"] and again["files"] == {"unit": [], "secrets": []} and not again["reloaded"] and reloads == [1]


def test_a_changed_secret_alone_does_not_reload_and_a_mode_change_is_seen(tmp_path):
    path = tmp_path / "vllm.env"
    path.write_text("KEY=old\n")
    os.chmod(path, 0o644)
    reloads = []
    result = files.converge([wanted(path, "KEY=new\n", name="secrets", mode="0600", secret=True)], 0o755, False, lambda: reloads.append(1))
    assert result["files"]["secrets"] == ["content", "mode"] and not result["reloaded"] and reloads == []
    assert path.read_text() == "KEY=new\n" and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_check_mode_compares_and_writes_nothing(tmp_path):
    path = tmp_path / "vllm.service"
    path.write_text("old\n")
    os.chmod(path, 0o644)
    result = files.converge([wanted(path, "new\n", name="unit", reload=True)], 0o755, True, lambda: pytest.fail("reloaded in check mode"))
    assert result["changed"] and result["files"]["unit"] == ["content"] and not result["reloaded"]
    assert path.read_text() == "old\n"
    assert result["diff"] == [{"before_header": str(path), "after_header": str(path), "before": "old\n", "after": "new\n"}]


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a file's owner needs root")
def test_an_owner_that_differs_is_set(tmp_path):
    path = tmp_path / "f"
    path.write_text("x")
    os.chmod(path, 0o644)
    os.chown(path, 65534, 65534)
    result = files.converge([wanted(path, "x", name="f")], 0o755, False, lambda: None)
    assert result["files"]["f"] == ["owner"] and (path.stat().st_uid, path.stat().st_gid) == (0, 0)


@pytest.mark.parametrize(("params", "message"), [
    ({"path": "relative/unit", "content": ""}, "absolute path"),
    ({"path": "/etc/x", "content": "", "mode": "rw-r--r--"}, "not an octal mode"),
    ({"path": "/etc/x", "content": "", "mode": "17777"}, "out of range"),
])
def test_bad_files_are_refused_by_name(params, message):
    with pytest.raises(InvalidInput, match=message):
        files.WantedFile.from_params(params)


def test_an_unknown_owner_and_a_file_given_twice_are_refused_before_anything_is_written(tmp_path):
    with pytest.raises(InvalidInput, match="no user 'no-such-user'"):
        files.converge([wanted(tmp_path / "a", "x"), wanted(tmp_path / "c", "x", owner="no-such-user")], 0o755, False, lambda: None)
    twice = [wanted(tmp_path / "a", "x", name="unit"), wanted(tmp_path / "b", "y", name="unit")]
    with pytest.raises(InvalidInput, match="unit given more than once"):
        files.converge(twice, 0o755, False, lambda: None)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_compare_says_what_converge_would_change_and_writes_nothing(tmp_path):
    """engine_observe's comparison (the switch's unchanged rerun decides from it) agrees with converge's."""
    unit = tmp_path / "vllm.service"
    unit.write_text("[Service]\n")
    os.chmod(unit, 0o644)
    secrets = tmp_path / "vllm.env"
    secrets.write_text("KEY=old\n")
    os.chmod(secrets, 0o600)
    given = [wanted(unit, "[Service]\n", name="unit"), wanted(secrets, "KEY=new\n", name="secrets", mode="0600", secret=True),
             wanted(tmp_path / "staged", "run\n", name="staged")]
    compared = files.compare(given)
    assert compared == {"unit": [], "secrets": ["content"], "staged": ["absent"]}
    assert compared == files.converge(given, 0o755, True, lambda: None)["files"]
    assert secrets.read_text() == "KEY=old\n" and not (tmp_path / "staged").exists()
    with pytest.raises(InvalidInput, match="unit given more than once"):
        files.compare([given[0], given[0]])


def test_a_file_that_cannot_be_written_is_named_and_nothing_is_reloaded(tmp_path):
    (tmp_path / "systemd").write_text("a file where the unit's directory should be\n")
    unit = wanted(tmp_path / "systemd" / "vllm.service", "[Service]\nExecStart=/bin/true\n", name="unit", reload=True)
    reloads = []
    with pytest.raises(Error) as raised:
        files.converge([unit], 0o755, False, lambda: reloads.append(1))
    assert str(tmp_path / "systemd") in raised.value.msg and "Not a directory" in raised.value.msg
    assert reloads == []
