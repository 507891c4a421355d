# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The unit_states filter: `systemctl show -p ... UNIT...` output, one block per unit, as a mapping by unit."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.module_utils._systemd.units import parse_show


def unit_states(stdout: str, units: list) -> dict:
    """systemctl prints one block of KEY=VALUE lines per unit asked, in the order asked, blocks apart by a blank line."""
    blocks = str(stdout).strip("\n").split("\n\n")
    if len(blocks) != len(units):
        raise AnsibleFilterError(f"systemctl show printed {len(blocks)} block(s) for {len(units)} unit(s): {stdout!r}")
    return {unit: parse_show(block) for unit, block in zip(units, blocks)}


class FilterModule:
    def filters(self):
        return {"unit_states": unit_states}
