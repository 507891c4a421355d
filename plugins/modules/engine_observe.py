#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import grp
import os
import pwd
import stat

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils import _versions as versions
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http
from ansible_collections.gpufleet.serving.plugins.module_utils._engines import observe, readiness
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error, LockTimeout
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.holders import DEFAULT_DEVICE_GLOBS
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease
from ansible_collections.gpufleet.serving.plugins.module_utils._processes.procfs import owner_uid
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.systemctl import Systemctl

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
    lease=dict(type="dict", options=dict(name=dict(type="str", default=paths.LEASE_NAME), owner=dict(type="str", required=True),
                                         lease_seconds=dict(type="float", required=True), break_owner=dict(type="str"))),
    record_path=dict(type="str", default=paths.LAST_CUTOVER),
    parked_path=dict(type="str", default=paths.PARKED_RECORD),
    sizes=dict(type="list", elements="path", default=[]),
    park_history_path=dict(type="str", default=paths.PARK_HISTORY),
    answer_record_dir=dict(type="str", default=paths.ANSWERS_DIR),
    owners=dict(type="list", elements="str", default=[]),
    device_paths=dict(type="list", elements="str", default=list(DEFAULT_DEVICE_GLOBS)),
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
            module.exit_json(changed=False, lease=taken, engines={}, paths={}, files={}, users={}, devices={}, last_cutover=None,
                             parked=None, host={}, sizes={}, park_history={}, answer_records=[], escaped=[])
        result = observe.observe(engines, module.params["paths"], Node(module), module.params["users"], module.params["devices"])
        result["files"] = files.compare([files.WantedFile.from_params(item) for item in module.params["files"]])
        result["last_cutover"] = observe.last_cutover(module.params["record_path"])
        # what a park decides from: the engine parked now, the host's memory, the weights a park would keep there
        result["parked"] = observe.parked_engine(module.params["parked_path"], result["engines"])
        result["host"] = observe.host_memory()
        result["sizes"] = {path: observe.weights_bytes(path) for path in module.params["sizes"]}
        result["park_history"] = observe.park_history(module.params["park_history_path"])
        # the engines' golden records here: what an answer check would compare with (--check says which it would run)
        result["answer_records"] = observe.answer_records(module.params["answer_record_dir"])
        # the engines' own workers holding GPUs outside every engine unit: left beside a target that already serves
        owners = {uid: str(name) for name in module.params["owners"] if (uid := owner_uid(name)) is not None}
        result["escaped"] = observe.escaped_holders(owners, [probe.unit for probe in engines], tuple(module.params["device_paths"]))
    except OSError as exc:
        module.fail_json(msg=f"{exc.filename or 'a file'}: {exc.strerror}", **lease_held(taken))
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict(exc.context, **lease_held(taken)))
    if taken is not None:
        result["lease"] = taken
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
