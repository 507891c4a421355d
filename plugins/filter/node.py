# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The node_path filter: a path the collection keeps on a node, by name, from the one place the modules read them
(module_utils/_paths.py) - `'park_hold_dir' | gpufleet.serving.node_path`."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.module_utils._paths import NODE_PATHS


def node_path(name: str) -> str:
    if name not in NODE_PATHS:
        raise AnsibleFilterError(f"node_path: {name!r} is not one of {', '.join(sorted(NODE_PATHS))}")
    return NODE_PATHS[name]


class FilterModule:
    def filters(self):
        return {"node_path": node_path}
