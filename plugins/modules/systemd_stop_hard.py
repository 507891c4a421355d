#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: systemd_stop_hard
short_description: Ensure a systemd unit is stopped and every process of it is gone
version_added: 0.1.0
description:
  - Stops the unit with a real stop job (only a stop job keeps C(Restart=) from starting it again), queued without
    blocking and watched against the module's own deadline, so units with C(TimeoutStopSec=infinity) or
    C(SendSIGKILL=no) cannot hang the task.
  - When the unit is down but processes remain in its control group (C(KillMode=process) or C(none)), they get SIGTERM
    and SIGCONT.
  - At O(stop_timeout) every process still in the unit's control group, including workers that escaped with C(setsid) or
    were reparented to PID 1, gets SIGKILL - through C(cgroup.kill) where the kernel has it (cgroup v2, Linux 5.14+),
    otherwise by re-reading the group and killing each process through a pidfd until the group stays empty.
  - Verifies the result - the unit C(inactive) or C(failed), its control group empty, and neither C(InvocationID) nor
    C(NRestarts) changed after O(settle) seconds - and fails, listing survivors with their state, otherwise.
  - Refuses C(init.scope), slices, units whose control group holds this module or its ancestors, and protected units
    (SSH, D-Bus, systemd's own units, NVIDIA persistence, fabric manager, DCGM, container runtimes) unless
    O(allow_protected=true).
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - gpufleet.serving.signal_journal
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: >-
      Reports whether the unit would be stopped or disabled, which of its triggers would be stopped, and lists the
      processes of its control group; changes nothing.
options:
  name:
    description:
      - The unit. A name without a unit type suffix means a service (V(vllm) is V(vllm.service)).
      - Globs, paths, templates without an instance, whitespace and shell metacharacters are rejected before anything runs.
      - One of O(name) and O(names) is required.
    type: str
  names:
    description:
      - Several units, stopped one after the other in one module run (every option applies to each); each is validated
        before any is stopped, and a unit that fails does not keep the next one running. The result lists each unit's
        own result in RV(units); the task fails, naming each unit that failed, when any did.
    type: list
    elements: str
  stop_timeout:
    description: Seconds the graceful stop may take before the module SIGKILLs the unit's control group.
    type: float
    default: 90
  kill_timeout:
    description: Seconds to wait after SIGKILL for the control group to empty.
    type: float
    default: 30
  settle:
    description:
      - Seconds to wait after the unit is down before checking that nothing started it again.
      - systemd restarts a unit C(RestartSec=) after it stopped, 100 ms by default.
    type: float
    default: 0.5
  must_exist:
    description: Fail when the unit does not exist. By default a missing unit is fine and unchanged.
    type: bool
    default: false
  disable:
    description: Also disable the unit, so that it does not start at boot.
    type: bool
    default: false
  allow_protected:
    description: Allow stopping a protected unit (never C(init.scope) or a slice).
    type: bool
    default: false
  stop_triggers:
    description:
      - First stop the units that can start this one again (its C(TriggeredBy=) sockets, timers and paths), so that a
        connection or a timer firing during the teardown cannot bring it back. Nothing starts them again afterwards.
      - Without it, a unit with triggers gets a warning naming them.
      - A protected trigger (C(ssh.socket), C(dbus.socket), ...) is refused unless O(allow_protected=true).
    type: bool
    default: false
requirements:
  - systemd
notes:
  - The task takes at most O(stop_timeout) + O(kill_timeout) + O(settle) seconds plus the time of C(systemctl) calls;
    with O(stop_triggers=true), O(stop_timeout) once more for the triggers.
  - On cgroup v1 without C(cgroup.kill), a process forking faster than it is killed could outlive O(kill_timeout); the
    module then fails listing it.
  - Two runs on the same unit are serialised by a lock on the host.
seealso:
  - module: gpufleet.serving.gpu_holders_kill
  - module: gpufleet.serving.gpu_memory_assert
  - module: ansible.builtin.systemd_service
"""

EXAMPLES = r"""
---
- name: Stop vLLM, giving it two minutes to drain, and make sure its workers are gone
  gpufleet.serving.systemd_stop_hard:
    name: vllm
    stop_timeout: 120
  become: true

- name: Stop a socket-activated engine and its socket, so that no connection starts it again
  gpufleet.serving.systemd_stop_hard:
    name: vllm
    stop_triggers: true
  become: true

- name: Stop both engines' units in one run
  gpufleet.serving.systemd_stop_hard:
    names: [vllm, sglang]
    stop_timeout: 10
  become: true

- name: Stop and disable an SGLang instance of a template unit
  gpufleet.serving.systemd_stop_hard:
    name: sglang@7b.service
    disable: true
  become: true
"""

RETURN = r"""
units:
  description: With O(names), each unit's result, with the keys below (and C(failed), C(msg) for a unit that failed).
  returned: when O(names) is given
  type: list
  elements: dict
unit:
  description: The resolved unit name.
  returned: with O(name)
  type: str
  sample: vllm.service
found:
  description: Whether systemd knows the unit.
  returned: with O(name); in each of RV(units) with O(names)
  type: bool
state_before:
  description: ActiveState, SubState, LoadState, MainPID, InvocationID, NRestarts and UnitFileState before the run.
  returned: with O(name); in each of RV(units) with O(names)
  type: dict
state_after:
  description: The same properties after the run (equal to RV(state_before) in check mode).
  returned: with O(name); in each of RV(units) with O(names)
  type: dict
processes:
  description: Processes of the unit's control group before the run (in check mode, those that would be stopped).
  returned: with O(name); in each of RV(units) with O(names)
  type: list
  elements: dict
escalated:
  description: Whether the graceful stop ran out of time and the control group was SIGKILLed.
  returned: with O(name); in each of RV(units) with O(names)
  type: bool
kill_method:
  description: V(cgroup.kill) or V(signal loop) when escalated, else null.
  returned: with O(name); in each of RV(units) with O(names)
  type: str
terminated:
  description: Processes of the unit that exited during the graceful stop (pid, start_time, comm, cmdline, state).
  returned: with O(name); in each of RV(units) with O(names)
  type: list
  elements: dict
killed:
  description: Processes that were still there at the deadline and died of SIGKILL.
  returned: with O(name); in each of RV(units) with O(names)
  type: list
  elements: dict
survivors:
  description:
    - Processes still in the control group at the end, with state (D = uninterruptible), wchan and
      C(signals_pending), pending signals by name (a pending SIGKILL marks a task that cannot die now).
  returned: with O(name); in each of RV(units) with O(names)
  type: list
  elements: dict
disabled:
  description: Whether the unit was disabled by this run.
  returned: with O(name); in each of RV(units) with O(names)
  type: bool
triggers_stopped:
  description: Triggers of the unit stopped by this run (in check mode, those that would be), with O(stop_triggers=true).
  returned: with O(name); in each of RV(units) with O(names)
  type: list
  elements: str
  sample: [vllm.socket]
warnings:
  description: Unit settings that make a plain stop unsafe (KillMode=process/none, SendSIGKILL=no, TimeoutStopSec=infinity, triggers).
  returned: when any (in each of RV(units) with O(names))
  type: list
  elements: str
signals:
  description:
    - The signals this module sent itself, each journalled before it was sent (O(journal_path)) - SIGTERM and SIGCONT
      to leftovers of C(KillMode=process/none), the SIGKILL of the escalation (C(via) - C(cgroup.kill), pidfd, kill) -
      with pid, start time, exe, cgroup, uid, result and O(run_id). The signals systemd sends on C(stop) are its own.
  returned: with O(name); in each of RV(units) with O(names)
  type: list
  elements: dict
journal_path:
  description: The journal file the signals were appended to (null when O(journal_path) is empty).
  returned: with O(name); in each of RV(units) with O(names)
  type: str
elapsed:
  description: Seconds the module took.
  returned: always
  type: float
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _journal as journal
from ansible_collections.gpufleet.serving.plugins.module_utils import _systemd as systemd
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._procfs import ProcReader

ARGUMENT_SPEC = dict(
    name=dict(type="str"),
    names=dict(type="list", elements="str"),
    stop_timeout=dict(type="float", default=90),
    kill_timeout=dict(type="float", default=30),
    settle=dict(type="float", default=0.5),
    must_exist=dict(type="bool", default=False),
    disable=dict(type="bool", default=False),
    allow_protected=dict(type="bool", default=False),
    stop_triggers=dict(type="bool", default=False),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
    run_id=dict(type="str"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True, mutually_exclusive=[("name", "names")],
                           required_one_of=[("name", "names")])
    started = time.monotonic()
    try:
        # every name is checked before systemctl is looked for, and before any unit is stopped
        names = [module.params["name"]] if module.params["names"] is None else list(dict.fromkeys(module.params["names"]))
        requests = [systemd.stop_request(dict(module.params, name=name)) for name in names]
        systemctl = systemd.Systemctl(module.run_command, module.get_bin_path("systemctl", required=True))
        reader = ProcReader()
        signals_journal = journal.Journal(module.params["journal_path"] or None,
                                          module.params["run_id"] or journal.new_run_id("systemd_stop_hard"), "systemd_stop_hard", reader)
        if module.params["names"] is None:
            module.exit_json(**systemd.stop_unit(requests[0], systemctl, reader, module.check_mode, module.warn, journal=signals_journal))
        results, failures = systemd.stop_units(requests, systemctl, reader, module.check_mode, module.warn, journal=signals_journal)
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict({"elapsed": time.monotonic() - started}, **exc.context))
    result = dict(changed=any(unit.get("changed") for unit in results), units=results, elapsed=time.monotonic() - started)
    if failures:
        module.fail_json(msg="; ".join(failures), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
