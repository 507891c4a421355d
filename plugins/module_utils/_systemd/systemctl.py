# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""The seam to systemd: `systemctl` run as an argv list, a unit's state and restart policy read through it."""

from __future__ import annotations

import os

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import SHOW_PROPERTIES, UnitState, parse_show, parse_show_units


class Systemctl:
    """The seam to systemd: every call is an argv list run with LC_ALL=C (never a shell string)."""

    def __init__(self, run_command, binary: str):
        self.run_command = run_command
        self.binary = binary

    def _run(self, *args: str) -> str:
        argv = [self.binary, *args]
        rc, out, err = self.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        if rc != 0:
            raise CommandFailed(f"{' '.join(argv)} failed (rc {rc}): {err.strip() or out.strip()}", cmd=argv, rc=rc, stdout=out, stderr=err)
        return out

    def show(self, unit: str) -> UnitState:
        return UnitState(parse_show(self._run("show", f"--property={','.join(SHOW_PROPERTIES)}", "--", unit)))

    def stop(self, unit: str) -> None:
        # replace-irreversibly: a start job queued meanwhile (ExecStop restarting the unit, another client) cannot cancel ours
        self._run("--no-block", "--job-mode=replace-irreversibly", "stop", "--", unit)

    def disable(self, unit: str) -> None:
        self._run("disable", "--", unit)

    def start(self, unit: str) -> None:
        # blocks only until the main process is exec'd (Type=exec): an engine's readiness is waited for by its caller
        self._run("start", "--", unit)

    def reset_failed(self, units: list[str]) -> None:
        self._run("reset-failed", "--", *units)

    def daemon_reload(self) -> None:
        self._run("daemon-reload")

    def show_units(self, units: list[str], properties: tuple[str, ...]) -> dict[str, dict[str, str]]:
        """Some properties of several units, in one call."""
        return parse_show_units(self._run("show", f"--property={','.join(properties)}", "--", *units), units)

    def journal(self, unit: str, lines: int = 300) -> list[str]:
        """The unit's last log lines, messages only ([] when journalctl cannot say)."""
        journalctl = os.path.join(os.path.dirname(self.binary), "journalctl")
        rc, out, _err = self.run_command([journalctl, "--unit", unit, "--lines", str(lines), "--output", "cat", "--no-pager", "--quiet"],
                                         environ_update={"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        return out.splitlines() if rc == 0 else []

    def unit_file_state(self, unit: str) -> str:
        """enabled, disabled, static, ... as `systemctl is-enabled` reads the files now ('not-found' when none)."""
        argv = [self.binary, "is-enabled", "--", unit]
        rc, out, err = self.run_command(argv, environ_update={"LC_ALL": "C", "LANG": "C", "SYSTEMD_PAGER": "", "SYSTEMD_COLORS": "0"})
        state = out.strip().splitlines()[-1] if out.strip() else ""
        if state:
            return state
        if "No such file" in err or "not found" in err.lower():
            return "not-found"
        raise CommandFailed(f"{' '.join(argv)} failed (rc {rc}): {err.strip()}", cmd=argv, rc=rc, stdout=out, stderr=err)

    def set_boot(self, enable: str | None, units: list[str]) -> dict:
        """Only ``enable`` of ``units`` starts at boot (None: none of them); a unit already as it should be is left
        alone. One daemon-reload when something changed, so that systemd's UnitFileState says what the files say."""
        states = {unit: self.unit_file_state(unit) for unit in units}
        to_enable = [unit for unit in units if unit == enable and states[unit] != "enabled"]
        to_disable = [unit for unit in units if unit != enable and states[unit] == "enabled"]
        if to_enable:
            self._run("enable", "--no-reload", "--", *to_enable)
        if to_disable:
            self._run("disable", "--no-reload", "--", *to_disable)
        if to_enable or to_disable:
            self.daemon_reload()
        return {"enabled": to_enable, "disabled": to_disable, "at_boot": enable}

    def unit_state(self, unit: str) -> str:
        """ActiveState, or auto-restart when the engine exited and systemd waits to start it again (Restart=);
        'unknown' when systemctl cannot say."""
        try:
            state = self.show(unit)
        except CommandFailed:
            return "unknown"
        return "auto-restart" if state.properties.get("SubState") == "auto-restart" else state.active_state or "unknown"


def restart_policy_reader(systemctl: Systemctl | None):
    """unit -> (Restart=, main PID) through systemctl, as gpu_holders_kill places a holder; ("", 0) for every unit
    where systemd is not the init system (systemctl None)."""
    if systemctl is None:
        return lambda _unit: ("", 0)

    def policy(unit: str) -> tuple[str, int]:
        properties = systemctl.show(unit).properties
        return properties.get("Restart", ""), int(properties.get("MainPID") or 0)
    return policy


def systemd_runs() -> bool:
    return os.path.isdir("/run/systemd/system")
