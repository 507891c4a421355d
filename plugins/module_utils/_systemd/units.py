# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""systemd units: their names (checked, normalized, the protected ones refused), `systemctl show` parsed, a unit's
state and command line."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed, InvalidInput

UNIT_NAME_MAX = 255  # systemd's UNIT_NAME_MAX is 256 with the terminating NUL
STOPPABLE_TYPES = (".service", ".scope", ".socket", ".timer", ".path")
OTHER_TYPES = (".slice", ".target", ".device", ".mount", ".automount", ".swap")
UNIT_NAME = re.compile(r"^[A-Za-z0-9:_.@-]+$")
SYSTEMD_ESCAPE = re.compile(r"\\x[0-9a-fA-F]{2}")
INACTIVE_STATES = ("inactive", "failed")

# Units whose loss takes the node, its drivers or its monitoring down; refused unless allow_protected.
PROTECTED_UNITS = frozenset({
    "sshd.service", "ssh.service", "dbus.service", "dbus-broker.service", "nvidia-persistenced.service",
    "nvidia-fabricmanager.service", "nv-fabricmanager.service", "nvidia-dcgm.service", "dcgm.service",
    "nv-hostengine.service", "dcgm-exporter.service", "nvidia-imex.service", "containerd.service", "docker.service",
    "docker.socket", "crio.service", "podman.service", "kubelet.service",
    # sockets that start the above again
    "ssh.socket", "sshd.socket", "dbus.socket", "podman.socket", "containerd.socket", "nvidia-dcgm.socket",
})
PROTECTED_PREFIXES = ("systemd-",)  # systemd's own units: journald, logind, udevd, networkd, resolved ...

SHOW_PROPERTIES = (
    "Id", "LoadState", "ActiveState", "SubState", "Job", "MainPID", "ControlPID", "ControlGroup", "KillMode",
    "SendSIGKILL", "TimeoutStopUSec", "Restart", "TriggeredBy", "InvocationID", "NRestarts", "FragmentPath",
    "UnitFileState", "MemoryCurrent",
)


def normalize_unit_name(name) -> str:
    """The unit name systemctl would act on (`vllm` -> `vllm.service`); anything ambiguous or unsafe is refused."""
    if not isinstance(name, str) or not name:
        raise InvalidInput("name: give a unit name such as vllm or vllm.service")
    if "\0" in name or "\n" in name or "\r" in name:
        raise InvalidInput(f"name: {name!r} contains a NUL or line break")
    if len(name) > UNIT_NAME_MAX:
        raise InvalidInput(f"name: {len(name)} characters is longer than systemd's limit of {UNIT_NAME_MAX}")
    if any(char in name for char in "*?[]"):
        raise InvalidInput(f"name: {name!r} is a glob pattern; give one unit (systemctl would act on every match)")
    if "/" in name or ".." in name:
        raise InvalidInput(f"name: {name!r} is a path; give a unit name")
    if not name.isascii():
        raise InvalidInput(f"name: {name!r} has non-ASCII characters; systemd unit names are ASCII (escape others as \\xNN)")
    if name.startswith("-") and name != "-.slice":
        raise InvalidInput(f"name: {name!r} starts with '-'")
    if not UNIT_NAME.match(SYSTEMD_ESCAPE.sub("", name)):
        raise InvalidInput(f"name: {name!r} contains characters a unit name cannot have (whitespace or shell metacharacters)")
    if not name.endswith(STOPPABLE_TYPES + OTHER_TYPES):
        name += ".service"
        if len(name) > UNIT_NAME_MAX:
            raise InvalidInput(f"name: {name!r} is longer than systemd's limit of {UNIT_NAME_MAX}")
    prefix = name.rsplit(".", 1)[0]
    if prefix.endswith("@") or prefix.startswith("@"):
        raise InvalidInput(f"name: {name!r} is a template without an instance; give an instance such as {prefix}1.service")
    return name


def refusal(unit: str, allow_protected: bool) -> str | None:
    """Why this unit must not be stopped by this module, or None."""
    if unit == "init.scope" or unit.endswith(".slice"):
        return f"{unit} is {'PID 1' if unit == 'init.scope' else 'a slice holding other units'}; refusing to stop it"
    if unit.endswith(OTHER_TYPES):
        return f"{unit} is not a service, scope, socket, timer or path unit; refusing to stop it"
    if not allow_protected and (unit in PROTECTED_UNITS or unit.startswith(PROTECTED_PREFIXES)):
        return f"{unit} is protected (node access, drivers, monitoring or container runtime); set allow_protected: true to stop it anyway"
    return None


def parse_show(text: str) -> dict[str, str]:
    """`systemctl show` output (KEY=VALUE lines, values may contain '=')."""
    properties = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            properties[key] = value
    return properties


def parse_show_units(text: str, units: list[str]) -> dict[str, dict[str, str]]:
    """`systemctl show UNIT...`: one block of KEY=VALUE lines per unit, in the order asked, blocks apart by a blank line."""
    blocks = text.strip("\n").split("\n\n")
    if len(blocks) != len(units):
        raise CommandFailed(f"systemctl show printed {len(blocks)} block(s) for {len(units)} unit(s)", stdout=text)
    return {unit: parse_show(block) for unit, block in zip(units, blocks)}


def exec_start_argv(exec_start: str | None) -> list[str]:
    """The words of a unit's first ExecStart=, as `systemctl show` prints it ({ path=... ; argv[]=WORDS ; ... }); []
    if none."""
    found = re.search(r"argv\[\]=(.*?) ; ", exec_start or "")
    return found.group(1).split() if found else []


@dataclass(frozen=True)
class UnitState:
    properties: dict

    @property
    def found(self) -> bool:
        return self.properties.get("LoadState") not in ("not-found", None, "") or self.active_state not in ("inactive", "")

    @property
    def active_state(self) -> str:
        return self.properties.get("ActiveState", "")

    @property
    def inactive(self) -> bool:
        return self.active_state in INACTIVE_STATES

    @property
    def job_pending(self) -> bool:
        return self.properties.get("Job", "") not in ("", "0")

    @property
    def triggered_by(self) -> list[str]:
        """Sockets, timers and paths that can start this unit again."""
        return self.properties.get("TriggeredBy", "").split()

    @property
    def control_group(self) -> str:
        return self.properties.get("ControlGroup", "")

    @property
    def restart_marks(self) -> tuple[str, str]:
        return self.properties.get("InvocationID", ""), self.properties.get("NRestarts", "")

    def summary(self) -> dict:
        keys = ("ActiveState", "SubState", "LoadState", "MainPID", "InvocationID", "NRestarts", "UnitFileState")
        return {key: self.properties.get(key) for key in keys}

    def warnings(self) -> list[str]:
        warnings = []
        kill_mode = self.properties.get("KillMode")
        if kill_mode in ("process", "none"):
            warnings.append(f"KillMode={kill_mode}: systemd leaves the unit's other processes running on stop; this module kills them")
        if self.properties.get("SendSIGKILL") == "no":
            warnings.append("SendSIGKILL=no: systemd would never SIGKILL this unit's processes; this module does at its deadline")
        if self.properties.get("TimeoutStopUSec") == "infinity":
            warnings.append("TimeoutStopSec=infinity: a plain systemctl stop could wait forever")
        return warnings
