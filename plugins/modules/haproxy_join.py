#!/usr/bin/python
# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import Error
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import haproxy

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
