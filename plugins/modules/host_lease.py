#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._node import lease
from ansible_collections.gpufleet.serving.plugins.module_utils._polling import requester_gone

ARGUMENT_SPEC = dict(
    name=dict(type="str", required=True),
    owner=dict(type="str", required=True),
    state=dict(type="str", choices=["acquired", "released"], default="acquired"),
    lease_seconds=dict(type="float", default=3600),
    wait_timeout=dict(type="float", default=0),
    break_owner=dict(type="str"),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    parent = os.getppid()
    try:
        request = lease.LeaseRequest.from_params(module.params)
        store = lease.LeaseStore(request.name)
        if request.state == "released":
            result = dict(changed=store.release(request.owner, dry_run=module.check_mode), holder=None, recovered=None, waited=0.0)
        else:
            # a wait whose controller was interrupted must not take the lease later for a run that no longer exists
            result = lease.take(request, store, module.check_mode, still_wanted=lambda: not requester_gone(parent=parent))
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
