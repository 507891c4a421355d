#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: host_lease
short_description: Take or give back a named lease on a host, so that one run at a time works on it
version_added: 0.1.0
description:
  - A lease spans many tasks (an engine switch - drain, teardown, bring-up, rollback), which no single process does, so it
    is a record under C(/run/lock) naming its owner and its expiry, read and written under a C(flock).
  - Acquiring waits up to O(wait_timeout) while another owner holds an unexpired lease, then fails naming that owner.
    A lease whose owner died is recovered once it expires (or after a reboot - the record lives in C(/run) and carries the
    boot id); RV(recovered) then names the dead run.
  - The owner renews its lease by acquiring again (unchanged), and gives it back with O(state=released).
  - A wait ends, failing and taking nothing, as soon as whoever asked for the lease is gone (the far end of the
    module's output closed, as when the controller's C(ansible-playbook) was interrupted and its SSH session ended).
  - Expiry is measured on the boot-time clock, which wall-clock steps do not move.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reports whether the lease could be taken without writing it.
options:
  name:
    description: Lease name (letters, digits, C(-), C(_), C(.)).
    type: str
    required: true
  owner:
    description: Identity of the run that holds the lease (for example a play's run id and the controller).
    type: str
    required: true
  state:
    description: V(acquired) takes or renews the lease; V(released) gives it back if O(owner) holds it.
    type: str
    choices: [acquired, released]
    default: acquired
  lease_seconds:
    description: How long the lease lasts unless renewed; an owner that dies loses it after this.
    type: float
    default: 3600
  wait_timeout:
    description: Seconds to wait for another owner's lease to be released or to expire.
    type: float
    default: 0
  break_owner:
    description:
      - An owner known to be dead (its controller was interrupted) whose lease is taken over at once, without waiting
        for it to expire. Only a lease held by exactly this owner is broken; RV(recovered) names it.
    type: str
seealso:
  - module: gpufleet.serving.engine_ready
"""

EXAMPLES = r"""
---
- name: One engine switch at a time on this node; wait up to 10 minutes for another one
  gpufleet.serving.host_lease:
    name: switch_engine
    owner: "{{ switch_run_id }}"
    lease_seconds: 3600
    wait_timeout: 600
"""

RETURN = r"""
holder:
  description: The lease record after the call (owner, acquired, expires_in), or null when released.
  returned: always
  type: dict
recovered:
  description: The lease of a dead run that was taken over - expired, or broken through O(break_owner) (C(broken) true) - if any.
  returned: always
  type: dict
waited:
  description: Seconds spent waiting for another owner.
  returned: always
  type: float
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _lease as lease
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
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
