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
import re
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _lease as lease

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
    params = module.params
    if not re.match(r"^[A-Za-z0-9_.-]{1,64}$", params["name"]) or params["lease_seconds"] <= 0 or params["wait_timeout"] < 0:
        module.fail_json(msg="name must be 1-64 letters, digits, '-', '_' or '.'; lease_seconds > 0; wait_timeout >= 0")
    store = lease.LeaseStore(params["name"])
    if params["state"] == "released":
        released = store.release(params["owner"], dry_run=module.check_mode)
        module.exit_json(changed=released, holder=None, recovered=None, waited=0.0)
    started = time.monotonic()
    parent = os.getppid()
    # a wait whose controller was interrupted must not take the lease later for a run that no longer exists
    outcome = store.acquire(params["owner"], params["lease_seconds"], params["wait_timeout"], dry_run=module.check_mode,
                            break_owner=params["break_owner"], still_wanted=lambda: not lease.requester_gone(parent=parent))
    waited = time.monotonic() - started
    if outcome.abandoned:
        module.fail_json(msg=f"{params['name']}: stopped waiting for {outcome.holder['owner']} after {waited:.0f}s - whoever asked for "
                             "the lease is gone (its controller was interrupted); nothing was taken", holder=outcome.holder,
                         recovered=None, waited=waited)
    if outcome.holder["owner"] != params["owner"]:
        module.fail_json(msg=f"{params['name']} is held by {outcome.holder['owner']} (taken {outcome.holder['age']:.0f}s ago, expires in "
                             f"{outcome.holder['expires_in']:.0f}s); waited {waited:.0f}s", holder=outcome.holder, recovered=None, waited=waited)
    module.exit_json(changed=outcome.taken, holder=outcome.holder, recovered=outcome.recovered, waited=waited)


if __name__ == "__main__":
    main()
