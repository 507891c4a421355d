#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_observe
short_description: Read in one step which inference engines a node has, runs, starts at boot and serves, and their versions
version_added: 0.5.0
description:
  - For each engine of O(engines), reads its systemd unit (loaded, running, enabled at boot, the command it was
    started with) in one C(systemctl show); the version of the executable a running unit runs and of the engine's
    configured O(engines[].executable), from their Python environments' package metadata as
    M(gpufleet.serving.engine_version) reads them; and, for a running engine, whether it serves now, as
    M(gpufleet.serving.engine_ready) with no wait answers (health, the model listed, and with
    O(engines[].completion) a one-token completion).
  - Then whether each path of O(paths) exists, and how each file of O(files) differs from the content, mode and owner
    given (as M(gpufleet.serving.engine_files) would find them, without writing).
  - Changes nothing. C(playbooks/switch_engine.yml) decides from this which engine to drain and roll back to, and
    whether a node already serves its target; one module run instead of one per read keeps a rerun that has nothing
    to do short.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only; the same reads as a normal run.
options:
  engines:
    description: The engines to read, each at most once.
    type: list
    elements: dict
    required: true
    suboptions:
      engine:
        description: V(vllm) or V(sglang).
        type: str
        required: true
        choices: [vllm, sglang]
      unit:
        description: Its systemd unit.
        type: str
        required: true
      url:
        description: Its base URL on the node; without it, readiness is not asked.
        type: str
      model:
        description: The model name it serves (readiness checks it is listed).
        type: str
      api_key:
        description: Its API key, for the readiness probes.
        type: str
      executable:
        description: Its configured executable (absolute path), whose version is read whether the unit runs or not.
        type: str
      completion:
        description: Readiness includes a one-token completion.
        type: bool
        default: false
  paths:
    description: Paths whose existence is reported (marks an earlier run may have left).
    type: list
    elements: path
    default: []
  files:
    description:
      - Files compared with what is given, as M(gpufleet.serving.engine_files) compares them (its O(files) form; the
        switch gives its target's unit and secrets, so that an unchanged rerun needs no module run of its own for
        the comparison). Contents of C(secret) files are kept out of the logs.
    type: list
    elements: dict
    default: []
    suboptions:
      name:
        description: The file's name in RV(files); its path by default.
        type: str
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The content it should have.
        type: str
        required: true
      mode:
        description: Octal mode.
        type: str
        default: "0644"
      owner:
        description: Owner.
        type: str
        default: root
      group:
        description: Group.
        type: str
        default: root
      secret:
        description: Its content is never logged.
        type: bool
        default: false
      reload:
        description: Accepted for the form of M(gpufleet.serving.engine_files); nothing is reloaded here.
        type: bool
        default: false
  users:
    description: Users whose account is reported (an engine's own user, which the switch creates only when it is not as
      its role would make it).
    type: list
    elements: str
    default: []
  devices:
    description: Device files whose group and mode are reported (C(/dev/nvidiactl)).
    type: list
    elements: path
    default: []
  timeout:
    description: Seconds each version read and each readiness request may take.
    type: float
    default: 10
  record_path:
    description: The node's record of its last cutover (M(gpufleet.serving.engine_cutover)'s O(gpufleet.serving.engine_cutover#module:record_path)).
    type: str
    default: /var/lib/gpufleet-serving/last_cutover.json
  lease:
    description:
      - A host lease taken (or renewed) first, as M(gpufleet.serving.host_lease) takes it with no wait, so that a switch
        takes its lease and reads the node in one module run. Nothing is read unless it is held
        (C(lease.taken) in RV(lease)); in check mode it is only looked at, as M(gpufleet.serving.host_lease) does.
      - When another run holds it, or the work of an interrupted run still runs on the node, RV(lease) says which and
        the reads are left out - the caller waits with M(gpufleet.serving.host_lease), then reads again.
    type: dict
    suboptions:
      name:
        description: The lease's name.
        type: str
        default: switch_engine
      owner:
        description: The run taking it.
        type: str
        required: true
      lease_seconds:
        description: Seconds it is held for.
        type: float
        required: true
      break_owner:
        description: Take it over from this owner, as M(gpufleet.serving.host_lease)'s
          O(gpufleet.serving.host_lease#module:break_owner) does.
        type: str
requirements:
  - systemd
notes:
  - An engine whose unit is not installed is reported with C(installed=false), not as an error.
seealso:
  - module: gpufleet.serving.engine_version
  - module: gpufleet.serving.engine_ready
"""

EXAMPLES = r"""
- name: What runs here, and does it serve?
  gpufleet.serving.engine_observe:
    engines:
      - {engine: vllm, unit: vllm.service, url: "http://127.0.0.1:8000", model: llama70b, completion: true}
      - {engine: sglang, unit: sglang.service, url: "http://127.0.0.1:30000", model: llama70b}
    paths: [/var/lib/gpufleet/rollback/staged]
  register: observed

- name: Serving engines
  ansible.builtin.debug:
    msg: "{{ observed.engines | dict2items | selectattr('value.serving') | map(attribute='key') | list }}"
"""

RETURN = r"""
engines:
  description:
    - By engine - C(unit); C(load_state), C(active_state), C(unit_file_state) as systemd says them; C(installed) (the
      unit is loaded), C(running) (active, activating, reloading or deactivating), C(enabled) (starts at boot);
      C(argv), the words of its C(ExecStart=) while it runs; C(versions) by executable (null where none could be
      read) and C(version_reasons) why not; C(serving) and C(readiness), its readiness answer (null when not
      running).
  returned: always
  type: dict
  sample:
    vllm: {unit: vllm.service, load_state: loaded, active_state: active, unit_file_state: enabled, installed: true, running: true,
           enabled: true, argv: [/opt/vllm/0.33.0/bin/vllm, serve, /models/m], versions: {/opt/vllm/0.33.0/bin/vllm: 0.33.0},
           version_reasons: {}, serving: true, readiness: {ready: true, elapsed: 0.04}}
paths:
  description: Whether each of O(paths) exists, by path.
  returned: always
  type: dict
  sample: {/var/lib/gpufleet/rollback/staged: false}
files:
  description: By name, what differs from O(files) - C(absent), C(content), C(mode), C(owner); an empty list for a file
    as given.
  returned: always
  type: dict
  sample: {unit: [], secrets: [content]}
users:
  description: By user of O(users) - C(exists), C(home), C(shell), C(groups) (supplementary, by name).
  returned: always
  type: dict
  sample: {vllm: {exists: true, home: /var/lib/vllm, shell: /usr/sbin/nologin, groups: [video]}}
devices:
  description: By path of O(devices) - C(exists), C(group), C(mode) (octal string).
  returned: always
  type: dict
  sample: {/dev/nvidiactl: {exists: true, group: video, mode: "0660"}}
last_cutover:
  description:
    - The node's record of its last cutover - C(run_id), C(target), C(previous), C(result), C(reason), C(finished)
      (unix time) - or null when there is none (or it cannot be read). A run whose controller was interrupted goes on to
      its end on the node; the next run reports what it did from here.
  returned: always
  type: dict
lease:
  description:
    - O(lease) as taken - C(taken), C(holder) (C(owner), C(age), C(expires_in)), C(recovered) (the expired or broken
      lease it replaced), C(waited); when not taken, C(msg) says why and C(working) names the pid of an interrupted
      run's work that still runs. The other keys are then empty.
  returned: when O(lease) is given
  type: dict
"""

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_http as http
from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils import _lease as lease
from ansible_collections.gpufleet.serving.plugins.module_utils import _observe as observe
from ansible_collections.gpufleet.serving.plugins.module_utils import _readiness as readiness
from ansible_collections.gpufleet.serving.plugins.module_utils import _versions as versions
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, LockTimeout
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import Systemctl

ENGINE_OPTIONS = dict(engine=dict(type="str", required=True, choices=["vllm", "sglang"]), unit=dict(type="str", required=True),
                      url=dict(type="str"), model=dict(type="str"), api_key=dict(type="str", no_log=True), executable=dict(type="str"),
                      completion=dict(type="bool", default=False))
ARGUMENT_SPEC = dict(
    engines=dict(type="list", elements="dict", required=True, options=ENGINE_OPTIONS),
    paths=dict(type="list", elements="path", default=[]),
    files=dict(type="list", elements="dict", default=[], options=files.FILE_OPTIONS),
    users=dict(type="list", elements="str", default=[]),
    devices=dict(type="list", elements="path", default=[]),
    timeout=dict(type="float", default=10),
    lease=dict(type="dict", options=dict(name=dict(type="str", default="switch_engine"), owner=dict(type="str", required=True),
                                         lease_seconds=dict(type="float", required=True), break_owner=dict(type="str"))),
    record_path=dict(type="str", default="/var/lib/gpufleet-serving/last_cutover.json"),
)


class Node(observe.NodeReader):
    """The reads, through the collection's systemctl seam, version reader and readiness probe."""

    def __init__(self, module: AnsibleModule):
        self.systemctl = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True))
        self.timeout = module.params["timeout"]

    def units(self, units: list[str]) -> dict[str, dict[str, str]]:
        return self.systemctl.show_units(units, observe.UNIT_PROPERTIES)

    def version(self, engine: str, executable: str) -> tuple[str | None, str | None]:
        return versions.installed_version(engine, executable, self.timeout)

    def serves(self, probe: observe.EngineProbe) -> dict:
        request = readiness.ReadyRequest(engine=probe.engine, url=probe.url, model=probe.model or "", api_key=probe.api_key, unit=probe.unit,
                                         timeout=0, interval=1, completion=probe.completion, min_spec_acceptance=None, probe_requests=1)
        try:
            return readiness.wait_ready(request, http.HttpClient(probe.url, probe.api_key, timeout=self.timeout), self.systemctl.unit_state)
        except Error as exc:  # it exited while starting: it serves no one
            return dict(exc.context, ready=False, msg=exc.msg)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def user(self, name: str) -> dict:
        try:
            account = pwd.getpwnam(name)
        except KeyError:
            return {"exists": False, "home": None, "shell": None, "groups": []}
        groups = sorted(group.gr_name for group in grp.getgrall() if name in group.gr_mem)
        return {"exists": True, "home": account.pw_dir, "shell": account.pw_shell, "groups": groups}

    def device(self, path: str) -> dict:
        try:
            status = os.stat(path)
        except OSError:
            return {"exists": False, "group": None, "mode": None}
        try:
            group = grp.getgrgid(status.st_gid).gr_name
        except KeyError:
            group = str(status.st_gid)
        return {"exists": True, "group": group, "mode": f"{stat.S_IMODE(status.st_mode):04o}"}


def take_lease(params: dict, check_mode: bool) -> dict:
    """The lease taken with no wait: {taken, holder, recovered, waited}, or {taken: false, msg, holder, working}."""
    request = lease.LeaseRequest.from_params(dict(params, state="acquired", wait_timeout=0))
    try:
        taken = lease.take(request, lease.LeaseStore(request.name), check_mode, still_wanted=lambda: True)
    except LockTimeout as exc:
        return dict(exc.context, taken=False, msg=exc.msg)
    taken.pop("changed", None)  # the lease is the run's bookkeeping, not a change to the node
    return dict(taken, taken=True)


def lease_held(taken: dict | None) -> dict:
    """A read that failed says that the lease was taken all the same, for its caller to give it back."""
    return {"lease": taken} if taken else {}


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.no_log_values.update(item["content"] for item in module.params["files"] if item["secret"])
    taken = None
    try:
        if module.params["timeout"] <= 0:
            raise observe.InvalidInput(f"timeout: must be greater than 0, got {module.params['timeout']:g}")
        engines = [observe.EngineProbe.from_params(index, params) for index, params in enumerate(module.params["engines"])]
        taken = take_lease(module.params["lease"], module.check_mode) if module.params["lease"] else None
        if taken is not None and not taken["taken"]:
            module.exit_json(changed=False, lease=taken, engines={}, paths={}, files={}, users={}, devices={}, last_cutover=None)
        result = observe.observe(engines, module.params["paths"], Node(module), module.params["users"], module.params["devices"])
        result["files"] = files.compare([files.WantedFile.from_params(item) for item in module.params["files"]])
        result["last_cutover"] = observe.last_cutover(module.params["record_path"])
    except OSError as exc:
        module.fail_json(msg=f"{exc.filename or 'a file'}: {exc.strerror}", **lease_held(taken))
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict(exc.context, **lease_held(taken)))
    if taken is not None:
        result["lease"] = taken
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
