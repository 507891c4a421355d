# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters rendering engine command lines (see plugins/plugin_utils/_engine_args.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engine_args


def engine_argv(config: dict, engine: str) -> list[str]:
    try:
        return _engine_args.engine_argv(config, engine)
    except _engine_args.EngineArgsError as error:
        raise AnsibleFilterError(f"{engine} role: {error}") from None


class FilterModule:
    def filters(self):
        return {"engine_argv": engine_argv, "systemd_quote": _engine_args.systemd_quote}
