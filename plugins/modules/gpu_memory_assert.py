#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os
import time

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus import memory
from ansible_collections.gpufleet.serving.plugins.module_utils._gpus.nvml import PYNVML_IMPORT_ERROR, pynvml
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import abandoning_clock

ARGUMENT_SPEC = dict(
    gpus=dict(type="list", elements="str"),
    expected_count=dict(type="int"),
    max_used_mib=dict(type="int"),
    max_used_percent=dict(type="float"),
    max_processes=dict(type="int"),
    timeout=dict(type="float", default=60),
    interval=dict(type="float", default=0.5),
    nvml_timeout=dict(type="float", default=10),
    v1_reserve_mib=dict(type="int", default=1024),
    device_paths=dict(type="list", elements="str", default=["/dev/nvidia*", "/dev/nvidia-caps/*"]),
    left_pids=dict(type="list", elements="int", default=[]),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    if pynvml is None:
        module.fail_json(msg=missing_required_lib("nvidia-ml-py"), exception=PYNVML_IMPORT_ERROR)
    started = time.monotonic()
    try:
        # a poll for a controller that was interrupted ends at its next sleep
        result = memory.assert_free(memory.MemoryRequest.from_params(module.params), lambda: pynvml, abandoning_clock(parent=os.getppid()))
    except Error as exc:
        module.fail_json(msg=exc.msg, **dict({"passed": False, "elapsed": time.monotonic() - started}, **exc.context))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
