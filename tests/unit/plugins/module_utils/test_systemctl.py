"""The seam to systemd (_systemd/systemctl.py) over a stand-in `systemctl` and `journalctl`: real processes, real argv,
real exit statuses - what each call asks, what it makes of the answer, and how a failure is named."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import systemctl as systemd_systemctl

# Each call appends {"argv", "env"} to calls.jsonl; the answer comes from answers/<systemctl's verb, or "journal">:
# "<rc>\n<stdout>"; after printing, the stand-in kills itself with the signal named in answers/<word>.signal.
STAND_IN = r"""#!/usr/bin/python3
import json, os, signal, sys
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as calls:
    calls.write(json.dumps({"argv": [os.path.basename(sys.argv[0]), *sys.argv[1:]],
                            "env": {k: os.environ.get(k) for k in ("LC_ALL", "LANG", "SYSTEMD_PAGER", "SYSTEMD_COLORS")}}) + "\n")
word = "journal" if sys.argv[0].endswith("journalctl") else next(arg for arg in sys.argv[1:] if not arg.startswith("-"))
answer = os.path.join(here, "answers", word)
rc, _, out = open(answer).read().partition("\n") if os.path.exists(answer) else ("0", "", "")
sys.stdout.write(out)
sys.stderr.write(open(answer + ".err").read() if os.path.exists(answer + ".err") else "")
sys.stdout.flush()
if os.path.exists(answer + ".signal"):  # what it printed so far is out; then a signal ends it
    os.kill(os.getpid(), getattr(signal, open(answer + ".signal").read().strip()))
sys.exit(int(rc))
"""


class StandIn:
    def __init__(self, directory):
        self.directory = directory
        (directory / "answers").mkdir()
        for name in ("systemctl", "journalctl"):
            (directory / name).write_text(STAND_IN)
            (directory / name).chmod(0o755)
        self.systemctl = systemd_systemctl.Systemctl(run_command, str(directory / "systemctl"))

    def answer(self, word: str, rc: int, out: str = "", err: str = "") -> None:
        (self.directory / "answers" / word).write_text(f"{rc}\n{out}")
        (self.directory / "answers" / f"{word}.err").write_text(err)

    def killed_by(self, word: str, signal_name: str) -> None:
        (self.directory / "answers" / f"{word}.signal").write_text(signal_name)

    def calls(self) -> list[dict]:
        path = self.directory / "calls.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run_command(argv, environ_update=None):
    """AnsibleModule.run_command's contract: (rc, stdout, stderr), rc negative when a signal ended the command."""
    proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, **(environ_update or {})}, check=False)
    return proc.returncode, proc.stdout, proc.stderr


@pytest.fixture
def stand_in(tmp_path):
    return StandIn(tmp_path)


def test_every_call_is_an_argv_list_in_the_c_locale_without_pager_or_colours(stand_in):
    stand_in.answer("show", 0, "ActiveState=active\nSubState=running\n")
    stand_in.answer("is-enabled", 0, "enabled\n")
    stand_in.systemctl.stop("vllm.service")
    stand_in.systemctl.start("vllm.service")
    stand_in.systemctl.unit_state("vllm.service")
    stand_in.systemctl.journal("vllm.service")
    stand_in.systemctl.unit_file_state("vllm.service")
    calls = stand_in.calls()
    assert [call["argv"][0] for call in calls] == ["systemctl", "systemctl", "systemctl", "journalctl", "systemctl"]
    assert all(call["env"] == {"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"} for call in calls), calls
    # the stop queues its job without waiting and cannot be cancelled by a start queued meanwhile
    assert calls[0]["argv"][1:] == ["--no-block", "--job-mode=replace-irreversibly", "stop", "--", "vllm.service"]
    assert calls[1]["argv"][1:] == ["start", "--", "vllm.service"]
    assert calls[3]["argv"][1:] == ["--unit", "vllm.service", "--lines", "300", "--output", "cat", "--no-pager", "--quiet"]


def test_a_failure_is_named_with_the_command_its_status_and_what_it_said(stand_in):
    stand_in.answer("stop", 5, err="Failed to stop engine.service: Unit engine.service not loaded.\n")
    with pytest.raises(CommandFailed, match=r"stop -- engine.service failed \(rc 5\): Failed to stop engine.service: Unit engine.service not loaded"):
        stand_in.systemctl.stop("engine.service")
    stand_in.answer("daemon-reload", 1, out="said on stdout only\n")
    with pytest.raises(CommandFailed, match=r"daemon-reload failed \(rc 1\): said on stdout only"):
        stand_in.systemctl.daemon_reload()


def test_a_systemctl_ended_by_a_signal_is_a_failure_not_an_answer(stand_in):
    """run_command's rc is negative when a signal ended the command (an OOM kill, a timeout): never success."""
    stand_in.killed_by("reset-failed", "SIGKILL")
    with pytest.raises(CommandFailed, match=r"rc -9"):
        stand_in.systemctl.reset_failed(["vllm.service"])
    stand_in.killed_by("show", "SIGTERM")
    assert stand_in.systemctl.unit_state("vllm.service") == "unknown"


def test_the_journal_is_the_units_messages_or_nothing_when_journalctl_cannot_say(stand_in):
    stand_in.answer("journal", 0, "first\nInductorError: no compiler\n")
    assert stand_in.systemctl.journal("vllm.service") == ["first", "InductorError: no compiler"]
    assert stand_in.calls()[-1]["argv"][1:5] == ["--unit", "vllm.service", "--lines", "300"]
    stand_in.systemctl.journal("vllm.service", lines=20)
    assert stand_in.calls()[-1]["argv"][3:5] == ["--lines", "20"]
    for rc in (1, 4):
        stand_in.answer("journal", rc, "No journal files were found.\n")
        assert stand_in.systemctl.journal("vllm.service") == []
    stand_in.answer("journal", 0, "half a line")
    stand_in.killed_by("journal", "SIGKILL")
    assert stand_in.systemctl.journal("vllm.service") == [], "a journalctl killed halfway says nothing"


def test_unit_file_state_is_the_last_line_systemctl_prints(stand_in):
    """`systemctl is-enabled` prints warnings first on some versions; its last line is the state, whatever its status."""
    stand_in.answer("is-enabled", 1, "Warning: the unit file changed on disk\ndisabled\n")
    assert stand_in.systemctl.unit_file_state("vllm.service") == "disabled"
    stand_in.answer("is-enabled", 0, "enabled\n")
    assert stand_in.systemctl.unit_file_state("vllm.service") == "enabled"
    stand_in.answer("is-enabled", 1, "", "Failed to get unit file state for x.service: Unit x.service not found.\n")
    assert stand_in.systemctl.unit_file_state("x.service") == "not-found"


def test_unit_state_tells_a_unit_waiting_to_restart_from_one_that_runs(stand_in):
    stand_in.answer("show", 0, "Id=vllm.service\nActiveState=activating\nSubState=auto-restart\n")
    assert stand_in.systemctl.unit_state("vllm.service") == "auto-restart"
    stand_in.answer("show", 0, "Id=vllm.service\nActiveState=activating\nSubState=start\n")
    assert stand_in.systemctl.unit_state("vllm.service") == "activating"
    stand_in.answer("show", 0, "Id=vllm.service\nSubState=dead\n")
    assert stand_in.systemctl.unit_state("vllm.service") == "unknown"
    stand_in.answer("show", 0, "Id=vllm.service\nActiveState=active\n")  # no SubState: the ActiveState
    assert stand_in.systemctl.unit_state("vllm.service") == "active"
    stand_in.answer("show", 1, err="Failed to connect to bus\n")
    assert stand_in.systemctl.unit_state("vllm.service") == "unknown"


def test_the_restart_policy_reader_reads_systemd_or_says_nothing_restarts_without_it(stand_in):
    stand_in.answer("show", 0, "Id=sidecar.service\nRestart=on-failure\nMainPID=4242\n")
    assert systemd_systemctl.restart_policy_reader(stand_in.systemctl)("sidecar.service") == ("on-failure", 4242)
    stand_in.answer("show", 0, "Id=sidecar.service\nRestart=no\nMainPID=0\n")
    assert systemd_systemctl.restart_policy_reader(stand_in.systemctl)("sidecar.service") == ("no", 0)
    stand_in.answer("show", 0, "Id=sidecar.service\n")
    assert systemd_systemctl.restart_policy_reader(stand_in.systemctl)("sidecar.service") == ("", 0)
    assert systemd_systemctl.restart_policy_reader(None)("anything.service") == ("", 0)
    assert len(stand_in.calls()) == 3, "without systemd nothing is run"


def test_set_boot_compares_unit_names_by_value(stand_in):
    """The serving unit's name comes from the module's arguments, the list from elsewhere: equal names, other objects."""
    stand_in.answer("is-enabled", 1, "disabled\n")
    serving = json.loads('"sglang.service"')  # read at run time, as from the module's arguments: not the literal below
    assert stand_in.systemctl.set_boot(serving, ["vllm.service", "sglang.service"]) == {
        "enabled": ["sglang.service"], "disabled": [], "at_boot": serving}
    assert [call["argv"][1:] for call in stand_in.calls() if call["argv"][1] != "is-enabled"] == [
        ["enable", "--no-reload", "--", "sglang.service"], ["daemon-reload"]]


def test_set_boot_leaves_alone_what_it_cannot_or_need_not_change_and_makes_a_runtime_enable_lasting(stand_in):
    """Switching back to vLLM (a name that sorts after the other): SGLang, enabled, is disabled; a unit only enabled in
    /run (enabled-runtime) is enabled for good; a static or masked unit - never `enabled` - is left as it is."""
    states = {"sglang.service": "enabled", "vllm.service": "enabled-runtime", "helper.service": "static", "old.service": "masked"}

    def is_enabled(argv, environ_update=None):  # each unit's own answer; every other call to the stand-in
        if argv[1] == "is-enabled":
            return 0, states[argv[-1]] + "\n", ""
        return run_command(argv, environ_update)
    systemctl = systemd_systemctl.Systemctl(is_enabled, stand_in.systemctl.binary)
    assert systemctl.set_boot("vllm.service", list(states)) == {"enabled": ["vllm.service"], "disabled": ["sglang.service"],
                                                                "at_boot": "vllm.service"}
    assert [call["argv"][1:] for call in stand_in.calls()[-3:]] == [
        ["enable", "--no-reload", "--", "vllm.service"], ["disable", "--no-reload", "--", "sglang.service"], ["daemon-reload"]]


def test_set_boot_never_disables_the_serving_unit_named_by_an_equal_string(stand_in):
    stand_in.answer("is-enabled", 0, "enabled\n")
    serving = json.loads('"vllm.service"')
    assert stand_in.systemctl.set_boot(serving, ["vllm.service"]) == {"enabled": [], "disabled": [], "at_boot": serving}
    assert all(call["argv"][1] == "is-enabled" for call in stand_in.calls())
