#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: engine_files
short_description: Write an engine's unit, secrets and marks in one step, reloading systemd when the unit changed
version_added: 0.5.0
description:
  - Compares each file of O(files) - content, mode, owner, group - with what is on the node, writes those that differ
    (whole, to a temporary file beside it renamed into place, its mode and owner set first), and runs one
    C(systemctl daemon-reload) when a file marked O(files[].reload) changed.
  - One module run for what would otherwise be a copy or template task per file and a reload. The engine roles write
    an engine's unit and secrets file with it, and C(playbooks/switch_engine.yml) stages the target's files with it
    before the drain.
  - Missing parent directories are created, owned by root, with O(directory_mode).
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Compares and reports what would be written (RV(files)); writes and reloads nothing.
  diff_mode:
    support: full
    details: The before and after text of each file that differs, except O(files[].secret) ones.
options:
  files:
    description: The files, each at most once.
    type: list
    elements: dict
    required: true
    suboptions:
      name:
        description: The key of this file in RV(files) (default its path).
        type: str
      path:
        description: Absolute path.
        type: path
        required: true
      content:
        description: The whole content.
        type: str
        required: true
      mode:
        description: Octal mode, as a string.
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
        description: Its content is never returned, logged or shown in a diff.
        type: bool
        default: false
      reload:
        description: A change of this file runs C(systemctl daemon-reload) (a unit file).
        type: bool
        default: false
  directory_mode:
    description: Mode of parent directories created.
    type: str
    default: "0755"
requirements:
  - systemd (for O(files[].reload))
seealso:
  - module: ansible.builtin.copy
  - module: ansible.builtin.template
"""

EXAMPLES = r"""
- name: The engine's unit and secrets
  gpufleet.serving.engine_files:
    files:
      - {name: unit, path: /etc/systemd/system/vllm.service, content: "{{ lookup('ansible.builtin.template', 'engine.service.j2') }}", reload: true}
      - {name: secrets, path: /etc/gpufleet/vllm.env, content: "VLLM_API_KEY={{ key }}\n", mode: "0600", secret: true}
  register: written
"""

RETURN = r"""
files:
  description: By name, what differed - C(absent), C(content), C(mode), C(owner); an empty list for a file already as wanted.
  returned: always
  type: dict
  sample: {unit: [content], secrets: []}
reloaded:
  description: Whether systemd reloaded its units.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _files as files
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._systemd import Systemctl

ARGUMENT_SPEC = dict(
    files=dict(type="list", elements="dict", required=True, options=files.FILE_OPTIONS),
    directory_mode=dict(type="str", default="0755"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    for item in module.params["files"]:
        if item["secret"]:
            module.no_log_values.add(item["content"])
    try:
        wanted = [files.WantedFile.from_params(item) for item in module.params["files"]]
        directory_mode = files.parse_mode("directory_mode", module.params["directory_mode"])
        reload = Systemctl(module.run_command, module.get_bin_path("systemctl", required=True)).daemon_reload if any(w.reload for w in wanted) else None
        result = files.converge(wanted, directory_mode, module.check_mode, reload)
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    diff = result.pop("diff")
    if module._diff:
        result["diff"] = diff
    module.exit_json(**result)


if __name__ == "__main__":
    main()
