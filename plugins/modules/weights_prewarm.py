#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: weights_prewarm
short_description: Read a model's weight files into the page cache before its engine starts
version_added: 0.2.0
description:
  - Reads every weight file (C(*.safetensors), C(*.bin), C(*.pt), C(*.gguf)) of each model directory in O(paths) once, so
    that the engine started next loads them from memory instead of disk. Run before a node stops serving, it moves the
    disk reads of a cold load out of the downtime.
  - Skipped, with the reason, when the files do not fit in the memory available (C(MemAvailable)) minus O(margin_mib), or
    when no path holds local weight files (a hub name). Stops at O(timeout) and reports how far it got; never fails for
    either.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Plans (files, bytes, whether they fit) and reads nothing.
options:
  paths:
    description: Model directories (or C(.gguf) files); paths that are not absolute (hub names) are left out.
    type: list
    elements: str
    required: true
  timeout:
    description: Seconds the reading may take.
    type: float
    default: 300
  margin_mib:
    description: MiB of available memory to leave untouched.
    type: int
    default: 8192
seealso:
  - module: gpufleet.serving.engine_preflight
"""

EXAMPLES = r"""
---
- name: Read the target's weights into the page cache (before the drain)
  gpufleet.serving.weights_prewarm:
    paths: [/models/Llama-3.3-70B-Instruct, /models/EAGLE3-LLaMA3.3-70B]
    timeout: 300
"""

RETURN = r"""
bytes:
  description: Bytes read (0 when skipped or in check mode).
  returned: always
  type: int
total_bytes:
  description: Bytes of the weight files found.
  returned: always
  type: int
files:
  description: How many weight files were found.
  returned: always
  type: int
seconds:
  description: Seconds spent reading.
  returned: always
  type: float
finished:
  description: Whether every file was read before O(timeout).
  returned: always
  type: bool
skipped_reason:
  description: Why nothing was read (does not fit, no local files, check mode); null when it read.
  returned: always
  type: str
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _prewarm as prewarm
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error

ARGUMENT_SPEC = dict(
    paths=dict(type="list", elements="str", required=True),
    timeout=dict(type="float", default=300),
    margin_mib=dict(type="int", default=8192),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    params = module.params
    try:
        result = prewarm.warm(params["paths"], params["timeout"], params["margin_mib"], dry_run=module.check_mode)
    except Error as exc:
        module.fail_json(msg=exc.msg)
    except OSError as exc:
        module.fail_json(msg=f"reading the weight files: {exc}")
    module.exit_json(changed=False, **result)


if __name__ == "__main__":
    main()
