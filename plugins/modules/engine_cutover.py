#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_cutover
short_description: Switch a node from one inference engine to another in one step - drain, teardown, bring-up, or roll back
version_added: 0.5.0
description:
  - The node-local critical path of C(playbooks/switch_engine.yml), run as one module execution so that the node is out
    of service for the engine's own start plus well under a second of ours.
  - Drains the previous engine (its running and queued requests to 0, or O(drain_timeout)); stops every unit of O(units)
    as M(gpufleet.serving.systemd_stop_hard) does (an idle engine gets O(stop_grace) on SIGTERM, a busy one
    O(stop_timeout), then SIGKILL of its control group); kills what still holds the GPUs as
    M(gpufleet.serving.gpu_holders_kill) does; asserts every GPU free as M(gpufleet.serving.gpu_memory_assert) does;
    starts the target's unit and waits until it serves as M(gpufleet.serving.engine_ready) does (health, the model
    listed, a one-token completion).
  - When a step after the drain fails - the teardown, the target's start or its readiness - the target is torn down,
    the files in O(restore) are put back, and the previous engine is started and awaited again. The task then
    succeeds with RV(result=rolled_back), or RV(result=rollback_failed) and RV(rollback_error) when that failed too; the
    caller decides what a rollback means for its run.
  - Phase times are measured on the node (monotonic clock) and returned as RV(marks).
  - Holds a host lock named after O(lease_name) for its whole run, so that a run whose controller was interrupted is
    waited for (M(gpufleet.serving.host_lease) waits for it before a lease changes hands) instead of raced.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - gpufleet.serving.signal_journal
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports the units it would stop and the unit it would start; changes nothing.
options:
  units:
    description: Every engine unit of the node (the target's among them); all are stopped, whichever was running.
    type: list
    elements: str
    required: true
  target:
    description: The engine to start.
    type: dict
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
        description: Its base URL on the node.
        type: str
        required: true
      model:
        description: The served model name that C(/v1/models) must list.
        type: str
        required: true
      api_key:
        description: Bearer key for its guarded routes.
        type: str
      ready_timeout:
        description: Seconds from its unit start until it must serve.
        type: float
        default: 600
  previous:
    description: The engine serving now, drained first and started again by a rollback. Unset when no engine serves.
    type: dict
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
        description: Its base URL on the node.
        type: str
        required: true
      model:
        description: The served model name that C(/v1/models) must list.
        type: str
        required: true
      api_key:
        description: Bearer key for its guarded routes.
        type: str
      ready_timeout:
        description: Seconds from its unit start until it must serve.
        type: float
        default: 600
  boot:
    description:
      - Leave only the engine that serves at the end enabled at boot among O(units) - the target, set while it loads,
        or after a rollback the previous engine (none when there was none) - so that a node rebooted at any moment
        after the cutover starts the engine it served. Units already as they should be are not touched.
      - A failure here does not roll back (the engine serves); RV(boot_error) says what could not be set.
    type: bool
    default: false
  restore:
    description: Files the rollback copies back before it starts the previous engine (C(src), C(dest)), followed by a
      C(daemon-reload) - the previous configuration of an engine the switch rewrote.
    type: list
    elements: dict
    default: []
    suboptions:
      src:
        description: The kept copy.
        type: path
        required: true
      dest:
        description: Where it goes back.
        type: path
        required: true
  drain_timeout:
    description: Seconds to wait for the previous engine's running requests to finish.
    type: float
    default: 120
  stop_grace:
    description: Seconds on SIGTERM for an engine the drain found idle (and for a failed target in the rollback); a real
      vLLM exits idle in about 5 s.
    type: float
    default: 15
  stop_timeout:
    description: Seconds on SIGTERM for an engine still busy at the end of the drain, or one that did not answer it.
    type: float
    default: 90
  kill_timeout:
    description: Seconds to wait after SIGKILL, for a unit's control group and for the GPU holders.
    type: float
    default: 30
  term_timeout:
    description: Seconds GPU holders outside the units get on SIGTERM before SIGKILL.
    type: float
    default: 30
  gpus:
    description: GPUs to free and check (NVML indexes or UUIDs); default all.
    type: list
    elements: str
    default: []
  device_paths:
    description: Globs of the device files whose holders are looked for.
    type: list
    elements: str
    default: ['/dev/nvidia*', '/dev/nvidia-caps/*']
  protected:
    description: Process names never signalled, added to M(gpufleet.serving.gpu_holders_kill)'s built-in set.
    type: list
    elements: str
    default: []
  max_targets:
    description: Upper bound on the GPU holders signalled; above it nothing is signalled and the step fails.
    type: int
    default: 64
  outside_units:
    description:
      - What to do with foreign GPU holders - outside O(units) and not run by one of O(owners) - as
        M(gpufleet.serving.gpu_holders_kill)'s option. V(fail) (the default) refuses to signal anything and rolls back;
        the switch finds them in its preflight, before the drain.
    type: str
    choices: [kill, report, fail]
    default: fail
  owners:
    description:
      - The engines' users; their GPU holders outside O(units) (escaped workers) are killed with the units' processes,
        as M(gpufleet.serving.gpu_holders_kill)'s option.
    type: list
    elements: str
    default: []
  max_used_mib:
    description: Used MiB per GPU under which it counts as free.
    type: int
    default: 512
  memory_timeout:
    description: Seconds to wait for every GPU to be free once the holders are gone.
    type: float
    default: 60
  expected_gpu_count:
    description: Fail the teardown when NVML does not see exactly this many GPUs.
    type: int
  settle:
    description: Seconds to wait after a unit is down before checking that nothing started it again.
    type: float
    default: 0.25
  interval:
    description: Seconds between two readiness probes of the engine being started.
    type: float
    default: 0.25
  soak:
    description:
      - Seconds the target must go on serving once it was ready, as M(gpufleet.serving.engine_ready)'s
        O(gpufleet.serving.engine_ready#module:soak) watches it (same invocation, main PID and restart count; readiness
        with a one-token completion keeps passing). A crash in them is a failed target, and the cutover rolls back.
      - For a caller with nothing to do between the target's first good answer and its soak (no balancer to put the
        node back into); one with a balancer soaks after its join, with M(gpufleet.serving.engine_ready).
      - The soak is part of the cutover's work. A controller interrupted or gone (it lost the node) does not end it, so
        that a crash in it is still rolled back; the next run waits for it as for the rest of the cutover.
      - V(0) (the default) does not soak.
    type: float
    default: 0
  soak_interval:
    description: Seconds between two probes of the soak.
    type: float
    default: 1
  preflight:
    description:
      - The target's preflight, run first - before the files, the prewarm and the drain - given as the options of
        M(gpufleet.serving.engine_preflight) (C(engine), C(checks), C(model), C(port), ...), for a caller whose node
        serves until the drain (no balancer to leave first).
      - A failed check ends the cutover there with RV(result=preflight_failed) and its lines in RV(reason); nothing is
        written or stopped. RV(preflight) holds the checks either way.
      - Omitted (the default), no preflight runs.
    type: dict
  files:
    description:
      - The target's unit and secrets, written after the preflight and before the drain, as
        M(gpufleet.serving.engine_files) writes its O(gpufleet.serving.engine_files#module:files) (the same keys; a
        unit with C(reload) reloads systemd when it changed, a C(secret) file's content is never logged).
      - Files that cannot be written end the cutover there with RV(result=failed); nothing was stopped.
    type: list
    elements: dict
    default: []
  prewarm_paths:
    description:
      - The target's weight files (or the directories holding them), read into the page cache first, before the drain,
        as M(gpufleet.serving.weights_prewarm) reads them - for a caller whose node serves until the drain (no balancer
        to leave first). Never a reason not to switch - RV(prewarm) records what was read, or why not.
    type: list
    elements: path
    default: []
  prewarm_timeout:
    description: Seconds the prewarm may read for; it stops there and the cutover goes on.
    type: float
    default: 300
  prewarm_margin_mib:
    description: MiB of available memory the prewarm leaves untouched (weights that do not fit are not read).
    type: int
    default: 8192
  clear_paths:
    description:
      - Files removed once the cutover ends with an engine serving (the target, or the previous engine after a rollback)
        - the switch's mark that the target's files were staged over the running engine's.
    type: list
    elements: path
    default: []
  release_lease:
    description:
      - Give the lease of O(lease_owner) back at the end, however the cutover ended - for a caller with nothing left
        to do on the node (no module run of its own).
    type: bool
    default: false
  lease_name:
    description: The lease this cutover works under (M(gpufleet.serving.host_lease)'s O(gpufleet.serving.host_lease#module:name)).
    type: str
    default: switch_engine
  lease_owner:
    description:
      - The run that holds the lease. The cutover renews it first, for O(lease_seconds), and changes nothing when another
        owner holds it (RV(result=lease_lost)) - one renewal covering the whole critical path, with no module run of its own.
      - Unset, no lease is renewed or checked.
    type: str
  lease_seconds:
    description: Seconds the renewal holds the lease - at least the cutover's RV(longest_run) plus the caller's margin.
    type: float
    default: 3600
  record_path:
    description:
      - The node's record of its last cutover, written when the cutover ends whatever its result - the run id
        (O(run_id), else O(lease_owner)), the target and the previous engine, the result, its reason and when. A run
        interrupted on the controller goes on to its end on the node, and the next run reads this record (the
        C(last_cutover) that M(gpufleet.serving.engine_observe) returns) and reports it.
      - Empty - no record.
    type: str
    default: /var/lib/gpufleet-serving/last_cutover.json
requirements:
  - systemd
  - nvidia-ml-py on the managed node
notes:
  - The task runs until the target serves or its C(ready_timeout) passes, and then as long as the rollback's start of
    the previous engine - the caller's lease must cover that (RV(longest_run) says how long it may be).
seealso:
  - module: gpufleet.serving.systemd_stop_hard
  - module: gpufleet.serving.gpu_holders_kill
  - module: gpufleet.serving.gpu_memory_assert
  - module: gpufleet.serving.engine_ready
  - module: gpufleet.serving.engine_drain
"""

EXAMPLES = r"""
---
- name: Switch this node from vLLM to SGLang, rolling back to vLLM when SGLang does not serve within 10 minutes
  gpufleet.serving.engine_cutover:
    units: [vllm.service, sglang.service]
    target: {engine: sglang, unit: sglang.service, url: "http://127.0.0.1:30000", model: llama70b, ready_timeout: 600}
    previous: {engine: vllm, unit: vllm.service, url: "http://127.0.0.1:8000", model: llama70b, ready_timeout: 600}
  register: cutover
  become: true
"""

RETURN = r"""
result:
  description: V(switched), V(rolled_back) (the target did not come up; the previous engine serves again),
    V(rollback_failed) (no engine serves), V(lease_lost) (another run holds the lease; nothing was touched),
    V(preflight_failed) (a check of O(preflight) failed; nothing was touched) or V(failed) (O(files) could not be
    written; nothing was stopped).
  returned: always
  type: str
reason:
  description: Why the target did not come up, prefixed with the phase it failed in.
  returned: always
  type: str
rollback_error:
  description: Why the rollback failed.
  returned: always
  type: str
preflight:
  description: The result of O(preflight) as M(gpufleet.serving.engine_preflight) returns it (C(passed), C(checks),
    C(failures), C(gpus), C(holders)); null when none ran.
  returned: always
  type: dict
files:
  description: What writing O(files) changed, as M(gpufleet.serving.engine_files) returns it (C(files) by name,
    C(reloaded)); null when none were given or the preflight failed.
  returned: always
  type: dict
marks:
  description: The phases as they began on the node - C([[phase, unix seconds], ...]), ending with C(end).
  returned: always
  type: list
  elements: list
  sample: [[drain, 1764673200.101], [teardown, 1764673200.152], [bring_up, 1764673200.591], [end, 1764673202.92]]
engine_start_s:
  description: Seconds from the target's unit start to its first good readiness answer (null when it did not serve).
  returned: always
  type: float
drain:
  description: The drain's result (drained, running, answering, elapsed), null when no engine served.
  returned: always
  type: dict
teardown:
  description: The teardown's steps - C(before), C(units) (C(results), one per unit), C(holders), C(after) - as
    M(gpufleet.serving.systemd_stop_hard), M(gpufleet.serving.gpu_holders_kill) and M(gpufleet.serving.gpu_memory_assert)
    return them; C(seconds), each step's time; C(failed_step) and C(failure) when one failed.
  returned: always
  type: dict
rollback_teardown:
  description: The rollback's teardown, in the same shape; null when no rollback ran.
  returned: always
  type: dict
boot:
  description: What O(boot) changed - C(enabled) and C(disabled) units, C(at_boot) the unit left enabled (null for
    none); null when O(boot) is false or the step did not run.
  returned: always
  type: dict
boot_error:
  description: Why the boot state could not be set; null when it was, or when O(boot) is false.
  returned: always
  type: str
ready:
  description: The target's last readiness answer (checks, elapsed).
  returned: when the target served
  type: dict
soak:
  description: The soak's record - C(seconds) watched, C(probes) sent, C(passed); null when O(soak) is 0 or the
    target did not serve.
  returned: always
  type: dict
prewarm:
  description: The prewarm's record, as M(gpufleet.serving.weights_prewarm) returns it (C(bytes), C(total_bytes),
    C(files), C(seconds), C(finished), C(skipped_reason)), or C(failed) and C(msg); null without O(prewarm_paths).
  returned: always
  type: dict
lease_released:
  description: Whether the cutover gave the lease back (O(release_lease)).
  returned: always
  type: bool
record:
  description: The record written to O(record_path) (run_id, target, previous, result, reason, finished), or null.
  returned: always
  type: dict
longest_run:
  description: An upper bound of this task's waits, in seconds.
  returned: always
  type: float
"""

import json
import os
import shutil
import signal
import time
import traceback

from ansible.module_utils.basic import AnsibleModule, missing_required_lib
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.module_utils.parsing.convert_bool import boolean

from ansible_collections.gpufleet.serving.plugins.module_utils import _cutover as cutover
from ansible_collections.gpufleet.serving.plugins.module_utils import _engine_http as http
from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils import _holders_kill as holders_kill
from ansible_collections.gpufleet.serving.plugins.module_utils import _journal as journal
from ansible_collections.gpufleet.serving.plugins.module_utils import _lease as lease
from ansible_collections.gpufleet.serving.plugins.module_utils import _memory as memory
from ansible_collections.gpufleet.serving.plugins.module_utils import _preflight as preflight
from ansible_collections.gpufleet.serving.plugins.module_utils import _preflight_node as preflight_node
from ansible_collections.gpufleet.serving.plugins.module_utils import _prewarm as prewarm
from ansible_collections.gpufleet.serving.plugins.module_utils import _readiness as readiness
from ansible_collections.gpufleet.serving.plugins.module_utils import _systemd as systemd
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, CommandFailed, EngineExited, Error, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._locking import host_lock
from ansible_collections.gpufleet.serving.plugins.module_utils._nvml import NvmlClient
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import Clock
from ansible_collections.gpufleet.serving.plugins.module_utils._procfs import ProcReader

try:
    import pynvml
except ImportError:
    pynvml = None
    PYNVML_IMPORT_ERROR = traceback.format_exc()
else:
    PYNVML_IMPORT_ERROR = None

ENGINE_OPTIONS = dict(engine=dict(type="str", required=True, choices=["vllm", "sglang"]), unit=dict(type="str", required=True),
                      url=dict(type="str", required=True), model=dict(type="str", required=True), api_key=dict(type="str", no_log=True),
                      ready_timeout=dict(type="float", default=600))
ARGUMENT_SPEC = dict(
    units=dict(type="list", elements="str", required=True),
    target=dict(type="dict", required=True, options=ENGINE_OPTIONS),
    previous=dict(type="dict", options=ENGINE_OPTIONS),
    boot=dict(type="bool", default=False),
    restore=dict(type="list", elements="dict", default=[], options=dict(src=dict(type="path", required=True), dest=dict(type="path", required=True))),
    drain_timeout=dict(type="float", default=120),
    stop_grace=dict(type="float", default=15),
    stop_timeout=dict(type="float", default=90),
    kill_timeout=dict(type="float", default=30),
    term_timeout=dict(type="float", default=30),
    gpus=dict(type="list", elements="str", default=[]),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
    protected=dict(type="list", elements="str", default=[]),
    max_targets=dict(type="int", default=64),
    outside_units=dict(type="str", choices=["kill", "report", "fail"], default="fail"),
    owners=dict(type="list", elements="str", default=[]),
    max_used_mib=dict(type="int", default=512),
    memory_timeout=dict(type="float", default=60),
    expected_gpu_count=dict(type="int"),
    settle=dict(type="float", default=0.25),
    interval=dict(type="float", default=0.25),
    soak=dict(type="float", default=0),
    soak_interval=dict(type="float", default=1),
    preflight=dict(type="dict"),
    files=dict(type="list", elements="dict", default=[]),
    prewarm_paths=dict(type="list", elements="path", default=[]),
    prewarm_timeout=dict(type="float", default=300),
    prewarm_margin_mib=dict(type="int", default=8192),
    clear_paths=dict(type="list", elements="path", default=[]),
    release_lease=dict(type="bool", default=False),
    lease_name=dict(type="str", default="switch_engine"),
    lease_owner=dict(type="str"),
    lease_seconds=dict(type="float", default=3600),
    journal_path=dict(type="str", default=journal.DEFAULT_PATH),
    run_id=dict(type="str"),
    record_path=dict(type="str", default=cutover.RECORD_PATH),
)


class Node(cutover.NodeOps):
    """The cutover's side effects on this node, through the collection's module_utils."""

    def __init__(self, module: AnsibleModule, reader: ProcReader):
        self.module = module
        self.params = module.params
        self.reader = reader
        self.systemctl = systemd.Systemctl(module.run_command, module.get_bin_path("systemctl", required=True))
        # one journal for the teardown and the rollback's: every signal under the switch's run id
        self.journal = journal.Journal(self.params["journal_path"] or None,
                                       self.params["run_id"] or self.params["lease_owner"] or journal.new_run_id("engine_cutover"),
                                       "engine_cutover", reader)

    def preflight(self, request: preflight.Request) -> dict:
        return preflight_node.outcome(*preflight_node.run_checks(request, preflight_node.NodeProbe(lambda: pynvml, restart_policy=self.restart_policy)))

    def write_files(self, wanted: list) -> dict:
        reload = self.systemctl.daemon_reload if any(item.reload for item in wanted) else None
        written = files.converge(wanted, 0o755, False, reload)  # raises Error naming the file
        written.pop("diff", None)
        return written

    def prewarm(self, paths: list[str], timeout: float) -> dict:
        try:
            return prewarm.warm(paths, timeout, self.params["prewarm_margin_mib"])
        except OSError as exc:
            raise Error(f"reading the weight files: {exc}") from None

    def drain(self, engine: cutover.Engine, timeout: float) -> dict:
        request = readiness.DrainRequest(engine=engine.engine, url=engine.url, timeout=timeout, interval=0.25, fail_on_timeout=False)
        return readiness.wait_drained(request, http.HttpClient(engine.url, timeout=5))

    def stop_units(self, units: list[str], stop_timeout: float) -> dict:
        requests = [systemd.stop_request(dict(name=unit, stop_timeout=stop_timeout, kill_timeout=self.params["kill_timeout"], must_exist=False,
                                              disable=False, allow_protected=False, settle=self.params["settle"])) for unit in units]
        results, failures = systemd.stop_units(requests, self.systemctl, self.reader, False, self.module.warn, journal=self.journal)
        if failures:
            raise cutover.TeardownFailed("; ".join(failures), units={"results": results})
        return {"results": results}

    def kill_holders(self, units: list[str]) -> dict:
        params = dict(gpus=self.params["gpus"], device_paths=self.params["device_paths"], sources=None, protected=self.params["protected"],
                      protected_pids=[], term_timeout=self.params["term_timeout"], kill_timeout=self.params["kill_timeout"],
                      max_targets=self.params["max_targets"], ambiguous="report", nvml_timeout=10, lock_timeout=60,
                      units=[systemd.normalize_unit_name(unit) for unit in units], outside_units=self.params["outside_units"],
                      owners=self.params["owners"])
        request = holders_kill.KillRequest.from_params(params, self.reader)
        return holders_kill.kill_holders(request, lambda timeout: NvmlClient(lambda: pynvml, timeout), self.reader, self.restart_policy,
                                         False, self.module.warn, self.module.log, journal=self.journal)

    def restart_policy(self, unit: str) -> tuple[str, int]:
        return systemd.restart_policy_reader(self.systemctl)(unit)

    def memory(self, wait: bool, left_pids: tuple[int, ...] = ()) -> dict:
        request = memory.MemoryRequest.from_params(dict(
            gpus=self.params["gpus"], expected_count=self.params["expected_gpu_count"], max_used_mib=self.params["max_used_mib"],
            max_processes=None, timeout=self.params["memory_timeout"] if wait else 0, interval=0.1, nvml_timeout=10, v1_reserve_mib=1024,
            device_paths=self.params["device_paths"], left_pids=list(left_pids)))
        if wait:
            return memory.assert_free(request, lambda: pynvml)
        try:
            return memory.assert_free(request, lambda: pynvml)
        except CheckFailed as exc:  # the reading before the teardown: busy GPUs are expected
            return dict(exc.context, msg=None)

    def reset_failed(self, units: list[str]) -> None:
        try:
            self.systemctl.reset_failed(units)
        except CommandFailed as exc:  # a unit that is not failed (any more) is no reason to stop
            self.module.warn(exc.msg)

    def restore(self, files: list[dict]) -> None:
        for item in files:
            if os.path.exists(item["src"]):
                shutil.copy2(item["src"], item["dest"])
        self.systemctl.daemon_reload()

    def start(self, unit: str) -> None:
        self.systemctl.start(unit)

    def set_boot(self, enable: str | None, units: list[str]) -> dict:
        return self.systemctl.set_boot(enable, units)

    def wait_ready(self, engine: cutover.Engine, timeout: float) -> dict:
        request = readiness.ReadyRequest(engine=engine.engine, url=engine.url, model=engine.model, api_key=engine.api_key, unit=engine.unit,
                                         timeout=timeout, interval=self.params["interval"], completion=True, min_spec_acceptance=None,
                                         probe_requests=1)
        started = time.monotonic()
        try:
            report = readiness.wait_ready(request, http.HttpClient(engine.url, engine.api_key, timeout=5), self.systemctl.unit_state,
                                          journal=self.systemctl.journal)
        except EngineExited as exc:
            raise cutover.NotServing(cutover.not_serving_message(engine, time.monotonic() - started, exc.context.get("unit_state"), exc.msg),
                                     **exc.context) from None
        if not report["ready"]:
            detail = f"still waiting for {report['waiting_for']}" if report.get("waiting_for") else "readiness"
            raise cutover.NotServing(cutover.not_serving_message(engine, report["elapsed"], report.get("unit_state"), detail), **report)
        return report

    def soak(self, engine: cutover.Engine, seconds: float) -> dict:
        request = readiness.ReadyRequest(engine=engine.engine, url=engine.url, model=engine.model, api_key=engine.api_key, unit=engine.unit,
                                         timeout=0, interval=self.params["soak_interval"], completion=True, min_spec_acceptance=None,
                                         probe_requests=1, soak=seconds)
        # the plain clock: like the rest of the cutover, the soak goes on to its end without its controller
        return readiness.soak(request, http.HttpClient(engine.url, engine.api_key, timeout=5), self.unit_properties)

    def unit_properties(self, unit: str) -> dict:
        try:
            return self.systemctl.show(unit).properties
        except CommandFailed:
            return {}


def finish(result: dict, params: dict, store: lease.LeaseStore, request: cutover.CutoverRequest) -> None:
    """What the caller asked done once the cutover ended: its marks cleared when an engine serves, the node's record of
    it written (read by the next run, whatever became of this one's controller), the lease given back."""
    if result["result"] in ("switched", "rolled_back"):
        for path in params["clear_paths"]:
            if os.path.lexists(path):
                os.unlink(path)
    result["record"] = None
    if params["record_path"]:
        record = cutover.node_record(request, result, params["run_id"] or params["lease_owner"], time.time())
        try:
            files.write_atomically(params["record_path"], json.dumps(record) + "\n", 0o644)
            result["record"] = record
        except OSError as exc:  # the engine serves (or the rollback's does): the record is for the next run's report
            result["record_error"] = f"{params['record_path']}: {exc.strerror or exc}"
    result["lease_released"] = bool(params["release_lease"] and params["lease_owner"] and store.release(params["lease_owner"]))


def validated(name: str, value: dict, options: dict) -> dict:
    """A dict option checked against another module's options (their types, defaults and choices); a null value is
    one not given, as for a module's own options."""
    checked = ArgumentSpecValidator(options).validate({key: item for key, item in value.items() if item is not None})
    if checked.error_messages:
        raise InvalidInput(f"{name}: {'; '.join(checked.error_messages)}")
    return checked.validated_parameters


def preflight_request(value: dict | None) -> preflight.Request | None:
    return preflight.Request.from_params(validated("preflight", value, preflight_node.OPTIONS)) if value else None


def hide_secrets(module: AnsibleModule) -> None:
    """A secret file's content is never returned, even where another option's error ends the run before its entry
    is checked: every failure returns the module's arguments."""
    for item in module.params["files"]:
        if isinstance(item, dict) and item.get("content") and boolean(item.get("secret", False), strict=False):
            module.no_log_values.add(str(item["content"]))


def wanted_files(module: AnsibleModule) -> list:
    return [files.WantedFile.from_params(validated(f"files[{index}]", item, files.FILE_OPTIONS)) for index, item in enumerate(module.params["files"])]


def plan(request: cutover.CutoverRequest, systemctl: systemd.Systemctl) -> dict:
    """Check mode: which units would be stopped and which started."""
    active = [unit for unit in request.units if systemctl.unit_state(unit) not in ("inactive", "failed", "unknown")]
    return dict(changed=True, result="would_switch", units_to_stop=active, unit_to_start=request.target.unit, marks=[],
                engine_start_s=None, reason=None, rollback_error=None, drain=None, teardown=None, rollback_teardown=None, soak=None, prewarm=None,
                boot=None, boot_error=None, lease_released=False, preflight=None, files=None, record=None)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    hide_secrets(module)
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    try:
        params = module.params
        request = cutover.CutoverRequest(
            units=[systemd.normalize_unit_name(unit) for unit in params["units"]],
            target=cutover.Engine.from_params("target", dict(params["target"], unit=systemd.normalize_unit_name(params["target"]["unit"]))),
            previous=cutover.Engine.from_params("previous", params["previous"] and dict(
                params["previous"], unit=systemd.normalize_unit_name(params["previous"]["unit"]))),
            drain_timeout=params["drain_timeout"], stop_grace=params["stop_grace"], stop_timeout=params["stop_timeout"],
            restore=params["restore"], boot=params["boot"], soak=params["soak"], prewarm_paths=params["prewarm_paths"],
            prewarm_timeout=params["prewarm_timeout"], preflight=preflight_request(params["preflight"]), files=wanted_files(module))
        node = Node(module, ProcReader())
        if module.check_mode:
            module.exit_json(longest_run=request.longest_run, **plan(request, node.systemctl))
        store = lease.LeaseStore(lease.LeaseRequest.from_params(dict(
            name=params["lease_name"], owner=params["lease_owner"] or "-", state="acquired", lease_seconds=params["lease_seconds"],
            wait_timeout=0, break_owner=None)).name)
        if params["lease_owner"]:
            renewed = store.acquire(params["lease_owner"], params["lease_seconds"], 0)
            if renewed.holder["owner"] != params["lease_owner"]:
                module.exit_json(changed=False, result="lease_lost", holder=renewed.holder, marks=[], longest_run=request.longest_run,
                                 lease_released=False, record=None,
                                 reason=f"{params['lease_name']} is held by {renewed.holder['owner']}: nothing was touched")
        # a controller interrupted or gone mid-cutover must not leave the node half switched: the cutover goes on to its
        # end (the target serving, or the previous engine again), and the work lock makes the next run wait for it
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        with host_lock(store.work_path, 5):
            result = cutover.cutover(request, node, Clock(), time.time())
        finish(result, params, store, request)
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(longest_run=request.longest_run, **result)


if __name__ == "__main__":
    main()
