#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: gpu_holders_kill
short_description: Ensure no unprotected process holds the GPUs
version_added: 0.1.0
description:
  - Finds every process that holds an NVIDIA device file open (C(/proc/<pid>/fd)) or mapped (C(/proc/<pid>/maps)),
    matched by file identity as C(fuser) does, unioned with the processes NVML lists on the GPUs.
  - NVML process lists are hints. A PID that NVML lists but C(/proc) does not confirm as a holder (dead, a thread id,
    or reused by another process) is reported in RV(stale_nvml_pids) and never signalled.
  - Each target is identified by its PID and start time and signalled through a pidfd where the kernel has them
    (the start time is re-checked otherwise), so a recycled PID is never hit. Targets get SIGTERM followed by
    SIGCONT (a stopped process acts on SIGTERM only once continued), then SIGKILL after O(term_timeout).
  - A process has exited only when its whole thread group has; a zombie leader whose threads still run still holds the GPU.
  - Never signalled, whatever the options - PID 1, kernel threads, this module's process, its ancestors (SSH session, sudo,
    C(sh -c), C(ansible-playbook) on a local connection, C(async_wrapper)) and children, the built-in protected names
    and O(protected).
  - The scope of a run is decided by evidence the holder cannot forge - its control group (a process of one of O(units),
    including one left in the unit's group after the unit stopped) or its user (one of O(owners), the engines' dedicated
    users, a worker that escaped its unit). Command lines are never evidence. Every other holder is foreign and
    handled by O(outside_units) - refused by default, killed or reported on request. The main process of another
    service that systemd restarts is never killed alone.
  - Every signal is journalled before it is sent and again with its outcome (RV(signals)), in the module result and
    appended to a node-local file (O(journal_path)) that outlives the module and its controller.
  - Fails when any target survives O(kill_timeout) after SIGKILL, for example a process in uninterruptible sleep (D state).
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - gpufleet.serving.signal_journal
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Returns the full plan (RV(holders), RV(targets), RV(protected)) and signals nothing.
options:
  gpus:
    description:
      - GPUs to free, as NVML indexes (V(0), V(1), ...) or UUIDs (V(GPU-...)). Default is all GPUs.
      - Indexes are NVML's order, which is not the C(/dev/nvidiaN) minor number; the module maps them through NVML.
      - With a selection, a process that holds only shared nodes (C(/dev/nvidiactl), C(/dev/nvidia-uvm)) is not a holder
        of the selected GPUs.
      - A CUDA process holds the device node of every GPU it can see, so with a selection NVML's process lists decide
        which GPUs a process uses; a holder NVML does not list is a target only when all its per-GPU nodes are selected,
        and is reported in RV(ambiguous) otherwise.
    type: list
    elements: str
  device_paths:
    description:
      - Globs of the device files whose holders are looked for. Per-GPU nodes are recognised by their device number
        (or, for stand-in regular files, by the name C(nvidia<minor>)).
    type: list
    elements: str
    default: ['/dev/nvidia*', '/dev/nvidia-caps/*']
  sources:
    description:
      - Where holders are discovered. V(proc) scans C(/proc); V(nvml) takes NVML's compute, graphics and MPS process lists,
        each PID confirmed in C(/proc) before it can become a target.
    type: list
    elements: str
    choices: [proc, nvml]
    default: [proc, nvml]
  protected:
    description:
      - Process names never signalled, added to the built-in set - NVIDIA's daemons (nvidia-persistenced,
        nvidia-fabricmanager, nv-fabricmanager, nvidia-imex, nvidia-gridd, nvidia-topologyd, nvlsm), DCGM (nv-hostengine,
        dcgmi, dcgm-exporter), CUDA MPS (nvidia-cuda-mps-control, and nvidia-cuda-mps-server, whose memory belongs to
        all its clients - stop MPS with its C(quit) command, the memory assertion names what it holds), Kubernetes and the
        GPU Operator (nvidia-device-plugin, gpu-feature-discovery, nvidia-validator, nvidia-mig-manager,
        nvidia-mig-parted), display servers (Xorg, Xwayland), sshd, systemd, container runtimes (containerd-shim,
        containerd, dockerd) and the Ansible controllers ansible-playbook, ansible and ansible-pull, which an C(async) task
        on a local connection does not have as ancestors. Each protected holder is reported with the reason.
      - A name matches the executable's file name or C(comm), which the kernel cuts at 15 characters.
    type: list
    elements: str
    default: []
  protected_pids:
    description:
      - Process ids never signalled, for example a profiler attached to the GPUs. Thread ids are rejected.
    type: list
    elements: int
    default: []
  term_timeout:
    description: Seconds to wait for targets to exit after SIGTERM before sending SIGKILL.
    type: float
    default: 30
  kill_timeout:
    description: Seconds to wait for targets to exit after SIGKILL before reporting them as survivors.
    type: float
    default: 30
  ambiguous:
    description:
      - What to do, with a O(gpus) selection, with holders that NVML lists on no GPU and that hold device nodes of selected
        and other GPUs - typically the child of a CUDA process that forked after allocating, whose parent NVML still lists.
      - V(report) leaves them alone and lists them in RV(ambiguous); V(kill) treats them as targets.
    type: str
    choices: [report, kill]
    default: report
  units:
    description:
      - The systemd units being stopped with this teardown (for example V(vllm.service)). Their processes are the expected
        holders and are always targets; every other holder is "outside the units" and handled by O(outside_units).
    type: list
    elements: str
    default: []
  outside_units:
    description:
      - What to do with unprotected holders outside O(units), each reported with its C(placement) - in another service
        (named, with its C(restart) setting), a login session's scope (a shell or C(nohup) over SSH), a container's scope,
        or elsewhere (a transient scope, no unit).
      - V(fail) (the default) signals nothing at all and fails, listing them in RV(outside) - a holder outside the
        request's scope is never killed unasked.
      - V(kill) signals them too, for the dedicated inference node where nothing else may hold a GPU.
      - V(report) leaves them running and lists them in RV(outside); the task succeeds. Pass their PIDs to
        M(gpufleet.serving.gpu_memory_assert)'s O(gpufleet.serving.gpu_memory_assert#module:left_pids) so that the memory
        they keep is not counted against what the engine released.
      - A holder that is the main process of another service whose C(Restart=) is not C(no) is never killed alone,
        since systemd would start it again - with V(kill) the task fails naming that unit and signals nothing (the holder
        is listed in RV(restarting)); add the unit to O(units) to stop it with the rest.
    type: str
    choices: [kill, report, fail]
    default: fail
  owners:
    description:
      - The engines' users (names or uids). A holder outside O(units) that runs as one of them is the engines' own - a
        worker that escaped its unit, re-parented to PID 1 - and is killed like the units' processes whatever
        O(outside_units) says; a holder of any other user outside O(units) is foreign (RV(foreign)).
      - A name that is no account on the node owns no process. V(root) and uid 0 are refused.
      - Empty (the default) - every holder outside O(units) is foreign.
    type: list
    elements: str
    default: []
  max_targets:
    description:
      - Upper bound on the number of processes signalled. Above it nothing is signalled and the module fails with the plan.
    type: int
    default: 64
  nvml_timeout:
    description: Seconds an NVML query may take before the module reports NVML hung and fails.
    type: float
    default: 10
  lock_timeout:
    description:
      - Seconds to wait for another run of this module on the host to finish. Two runs never scan and signal at once.
    type: float
    default: 60
requirements:
  - Linux with C(/proc)
  - nvidia-ml-py on the managed node, unless O(sources=[proc]) and no O(gpus) selection
notes:
  - Run it as root (C(become) true) to see every process's file descriptors.
  - Entries of C(/proc) that cannot be read (permission denied, processes that exit mid-scan) are skipped and counted in
    RV(unreadable), never fatal. C(/proc/<pid>/maps) of a process in D state is not read, since that can block.
  - Reads that a wedged process can block forever - its descriptors' targets (a file on a hung NFS or FUSE mount), its
    maps and command line (its memory map lock held by a thread stuck in the kernel, whatever the leader's state) - are
    given up after half a second each - the scan runs in a child process left behind where it blocks - and named in
    RV(unreadable) (V(files_blocked), V(maps_blocked)) and the holder's RV(holders[].blocked_reads); what was found
    before the block is kept.
  - On kernels without pidfds (before 5.3) the start time is re-checked immediately before each C(kill()); a PID reused
    within that instant could still be hit.
  - NVML reports host PIDs. When the module runs inside a PID namespace, NVML PIDs count only where C(/proc) confirms them.
seealso:
  - module: gpufleet.serving.systemd_stop_hard
  - module: gpufleet.serving.gpu_memory_assert
"""

EXAMPLES = r"""
---
- name: Free every GPU of the node, whoever holds it (a dedicated inference node)
  gpufleet.serving.gpu_holders_kill:
    outside_units: kill
  become: true

- name: Free GPUs 6 and 7 only, addressed by NVML index and UUID, with a short grace period
  gpufleet.serving.gpu_holders_kill:
    gpus: [6, GPU-4f1e7c2a-83d9-4b1e-9f0e-5c2d7a8b9e10]
    term_timeout: 10
    kill_timeout: 20
  become: true

- name: Free the GPUs after stopping vLLM, leaving anyone else's GPU processes alone (and listed)
  gpufleet.serving.gpu_holders_kill:
    units: [vllm.service]
    outside_units: report
  become: true

- name: Free the GPUs after stopping vLLM and its escaped workers; refuse if anyone else holds a GPU
  gpufleet.serving.gpu_holders_kill:
    units: [vllm.service]
    owners: [vllm]
    outside_units: fail
  become: true

- name: Show what would be killed, keeping a profiler alive
  gpufleet.serving.gpu_holders_kill:
    protected: [nsys]
  check_mode: true
  register: gpu_plan
"""

RETURN = r"""
holders:
  description: Every process holding the selected GPUs, protected ones included.
  returned: always
  type: list
  elements: dict
  contains:
    pid:
      description: Process id.
      type: int
      sample: 48211
    start_time:
      description: Start time in clock ticks after boot; with the pid, the identity signals are bound to.
      type: int
    comm:
      description: Kernel command name (at most 15 characters).
      type: str
      sample: python3
    exe:
      description: Executable path, or null when unreadable.
      type: str
    cmdline:
      description: Arguments, or null when not read (D state) or given up (see RV(holders[].blocked_reads)).
      type: list
      elements: str
    blocked_reads:
      description: The reads of its C(/proc) entries given up after their time box (V(files), V(maps), V(cmdline)) - a
        wedged process. Present only then.
      type: list
      elements: str
      sample: [cmdline]
    uid:
      description: Real user id.
      type: int
    user:
      description: The account name of RV(holders[].uid) on the node, or the uid as text where no account has it.
      type: str
      sample: vllm
    foreign:
      description: Outside O(units) and not run by one of O(owners).
      type: bool
    state:
      description: Process state letter from /proc (R, S, D, T, Z).
      type: str
    unit:
      description: The systemd service or scope the process runs in, when any.
      type: str
      sample: vllm.service
    cgroup:
      description: Its cgroup in systemd's hierarchy (null when unreadable).
      type: str
      sample: /system.slice/vllm.service
    placement:
      description:
        - Where the process runs - V(listed_unit) (one of O(units)), V(other_service), V(session) (a login session's
          scope, or the SSH daemon's service where logind does not run), V(container) (a docker, podman, containerd or
          CRI-O scope) or V(elsewhere) (a transient scope, no unit).
      type: str
      sample: listed_unit
    restart:
      description: For V(other_service), the unit's C(Restart=) setting (V(no) where systemd does not run).
      type: str
      sample: on-failure
    main_process:
      description: For V(other_service), whether it is the unit's main process (the one systemd restarts).
      type: bool
    namespace_pid:
      description: The PID inside the process's own PID namespace (a container's view), or null when it runs in ours.
      type: int
    via:
      description: How the holding was found (fd, mmap, nvml).
      type: list
      elements: str
      sample: [fd, nvml]
    devices:
      description: Device files held.
      type: list
      elements: str
      sample: [/dev/nvidia0, /dev/nvidiactl]
    gpus:
      description: NVML indexes of the GPUs held.
      type: list
      elements: int
      sample: [0]
    gpu_uuids:
      description: The same GPUs by UUID (empty when NVML was not asked).
      type: list
      elements: str
      sample: [GPU-4f1e7c2a-83d9-4b1e-9f0e-5c2d7a8b9e10]
  sample: []
targets:
  description: The holders chosen to be signalled (in check mode, those that would be).
  returned: always
  type: list
  elements: dict
terminated:
  description: Targets that exited after SIGTERM.
  returned: always
  type: list
  elements: dict
killed:
  description: Targets that needed SIGKILL.
  returned: always
  type: list
  elements: dict
survivors:
  description:
    - Targets still alive after SIGKILL and O(kill_timeout), with state (D = uninterruptible), wchan, threads and
      C(signals_pending), pending signals by name (a pending SIGKILL marks a task that cannot die now).
  returned: always
  type: list
  elements: dict
protected:
  description: Holders that were not signalled, each with its C(reason).
  returned: always
  type: list
  elements: dict
  sample: [{pid: 812, comm: nvidia-persistenced, reason: protected name nvidia-persistenced}]
stale_nvml_pids:
  description: PIDs NVML lists that /proc does not confirm as holders, with the GPU and the reason; never signalled.
  returned: always
  type: list
  elements: dict
  sample: [{pid: 40117, gpu: 0, used_mib: 20480, reason: no such process}]
ambiguous:
  description:
    - With a O(gpus) selection, holders that NVML lists on no GPU and that hold device nodes of selected and other GPUs
      (a CUDA process opens the node of every GPU it can see); they are not signalled. Each has a C(reason).
  returned: always
  type: list
  elements: dict
outside:
  description:
    - Foreign holders (outside O(units), not of O(owners)) that were left running (O(outside_units=report)) or that
      failed the task (O(outside_units=fail), the default); empty with V(kill).
  returned: always
  type: list
  elements: dict
foreign:
  description:
    - Unprotected holders outside O(units) that do not run as one of O(owners) - another user's job, a login session's
      process, a container's - whatever O(outside_units) did with them (killed with V(kill)). In check mode, the ones
      that would be killed, refused or left alone.
  returned: always
  type: list
  elements: dict
restarting:
  description: Holders that are the main process of another service systemd would restart; they fail the task and nothing is signalled.
  returned: always
  type: list
  elements: dict
not_signalled:
  description: Targets that exited, or whose PID was reused, between the scan and the first signal.
  returned: always
  type: list
  elements: dict
signals:
  description:
    - Audit trail of every signal sent, with pid, start time, signal name and result (sent, gone, denied), and from the
      journal the process's exe, cgroup, uid and comm, how it was sent (C(via) - pidfd, kill), O(run_id) and the times
      of the intent and the outcome.
  returned: always
  type: list
  elements: dict
journal_path:
  description: The journal file the signals were appended to (null when O(journal_path) is empty).
  returned: always
  type: str
unreadable:
  description: Counts of /proc entries that could not be read, by reason.
  returned: always
  type: dict
  sample: {permission_denied: 1, maps_blocked: 1}
elapsed:
  description: Seconds the module took.
  returned: always
  type: float
"""

import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils import _holders_kill as holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils import _journal as journal
from ansible_collections.gpufleet.serving.plugins.module_utils import _systemd as systemd
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._nvml import NvmlClient
from ansible_collections.gpufleet.serving.plugins.module_utils._procfs import ProcReader
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import Systemctl

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str"),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
    sources=dict(type="list", elements="str", choices=["proc", "nvml"], default=["proc", "nvml"]),
    protected=dict(type="list", elements="str", default=[]),
    protected_pids=dict(type="list", elements="int", default=[]),
    term_timeout=dict(type="float", default=30),
    kill_timeout=dict(type="float", default=30),
    ambiguous=dict(type="str", choices=["report", "kill"], default="report"),
    max_targets=dict(type="int", default=64),
    nvml_timeout=dict(type="float", default=10),
    lock_timeout=dict(type="float", default=60),
    units=dict(type="list", elements="str", default=[]),
    outside_units=dict(type="str", choices=["kill", "report", "fail"], default="fail"),
    owners=dict(type="list", elements="str", default=[]),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
    run_id=dict(type="str"),
)


def nvml_client(timeout: float) -> NvmlClient:
    return NvmlClient(lambda: pynvml, timeout)


def restart_policy(module: AnsibleModule):
    """A service's Restart= and main PID through systemctl; nothing where systemd is not the init system."""
    running = systemd.systemd_runs()
    return systemd.restart_policy_reader(Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)) if running else None)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    started = time.monotonic()
    reader = ProcReader()
    try:
        request = holders_kill.KillRequest.from_params(module.params, reader)
        if request.needs_nvml and pynvml is None:
            module.fail_json(msg=missing_required_lib("nvidia-ml-py", reason="to query NVML (or set sources: [proc] without gpus)"),
                             exception=PYNVML_IMPORT_ERROR)
        signals_journal = journal.Journal(module.params["journal_path"] or None, module.params["run_id"] or journal.new_run_id("gpu_holders_kill"),
                                          "gpu_holders_kill", reader)
        result = holders_kill.kill_holders(request, nvml_client, reader, restart_policy(module), module.check_mode,
                                           module.warn, module.log, journal=signals_journal)
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict({"elapsed": time.monotonic() - started}, **exc.context))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
