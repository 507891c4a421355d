#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: haproxy_join
short_description: Put a HAProxy server back in rotation at once, for an engine already seen serving
version_added: 0.5.0
description:
  - Through HAProxy's runtime API (the admin socket) sets the server's state C(ready) (out of maintenance or drain) and
    forces its health C(up), then waits until C(show stat) shows it C(UP) - without waiting C(rise) x C(inter) for
    HAProxy's own health checks to find out what the caller's readiness check just proved.
  - The health checks keep running, and take an engine that stops answering out again as C(fall) says.
  - The switch's built-in C(haproxy) rotation hook runs it, delegated to the balancer's host.
author:
  - gpufleet.serving contributors (@gpufleet)
extends_documentation_fragment:
  - gpufleet.serving.attributes
  - ansible.builtin.action_common_attributes
attributes:
  check_mode:
    support: full
    details: Reads the server's status and changes nothing.
options:
  socket:
    description: Path of HAProxy's admin socket (C(stats socket ... level admin)).
    type: path
    required: true
  backend:
    description: The backend holding the server.
    type: str
    required: true
  server:
    description: The server's name in the backend.
    type: str
    required: true
  timeout:
    description: Seconds to wait for HAProxy to show the server UP.
    type: float
    default: 10
seealso:
  - module: community.general.haproxy
"""

EXAMPLES = r"""
---
- name: Back in rotation now that the engine serves
  gpufleet.serving.haproxy_join:
    socket: /run/haproxy/admin.sock
    backend: engines
    server: node1
  delegate_to: balancer1
"""

RETURN = r"""
status_before:
  description: The server's status before (C(MAINT), C(DRAIN), C(DOWN), C(UP) ...).
  returned: always
  type: str
  sample: MAINT
status:
  description: Its status at the end.
  returned: always
  type: str
  sample: UP
elapsed:
  description: Seconds from the commands to HAProxy showing it serving.
  returned: always
  type: float
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils import _haproxy as haproxy
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error

ARGUMENT_SPEC = dict(
    socket=dict(type="path", required=True),
    backend=dict(type="str", required=True),
    server=dict(type="str", required=True),
    timeout=dict(type="float", default=10),
)


def main() -> None:
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    try:
        backend = haproxy.checked_name("backend", module.params["backend"])
        server = haproxy.checked_name("server", module.params["server"])
        admin = haproxy.AdminSocket(module.params["socket"])
        if module.check_mode:
            status = haproxy.server_status(admin.command("show stat"), backend, server)
            module.exit_json(changed=not haproxy.serving(status), status_before=status, status=status, elapsed=0.0)
        result = haproxy.join(admin, backend, server, module.params["timeout"])
    except Error as exc:
        module.fail_json(msg=exc.msg, **exc.context)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
