# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The engine_facts, engine_owner, engine_secrets, unauthenticated_binds, unit_command, engine_identity, matches_pin
and virtualenvs_to_prune filters: an engine's unit, command line, URL and secrets from its role's variables, and what a unit runs.

See plugins/plugin_utils/_engines.py; the vllm and sglang roles publish its result as vllm_facts / sglang_facts.
"""

from __future__ import annotations

import posixpath

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.module_utils import _versions
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engines


def engine_facts(config: dict, engine: str) -> dict:
    try:
        return _engines.engine_facts(config, engine)
    except _engines.EngineArgsError as error:
        raise AnsibleFilterError(f"{engine} role: {error}") from None


def engine_owner(config: dict, engine: str) -> dict:
    try:
        return _engines.engine_owner(config, engine)
    except _engines.EngineArgsError as error:
        raise AnsibleFilterError(f"{engine} role: {error}") from None


def engine_secrets(facts: dict, api_key: str) -> dict:
    try:
        return _engines.engine_secrets(facts, api_key)
    except _engines.EngineArgsError as error:
        raise AnsibleFilterError(f"{facts.get('engine')} role: {error}") from None


def unauthenticated_binds(hostvars, hosts: list) -> list[str]:
    """Refusals for the engines of `hosts` that would listen beyond loopback without an API key (from the inventory)."""
    settings = {}
    for host in hosts:
        variables = hostvars[host]
        settings[host] = {engine: {key: variables.get(f"{engine}_{key}") for key in ("model", "host", "api_key", "allow_unauthenticated")}
                          for engine in _engines.ENGINES}
    return _engines.unauthenticated_binds(settings)


def engine_identity(engine: str, argv: list | None, version: str | None) -> dict:
    """{engine, version, model} of an engine's command line (a unit's ExecStart words, or its rendered argv)."""
    return {"engine": engine, "version": version or None, "model": _engines.command_model(engine, argv or [])}


def virtualenvs_to_prune(found: list, root: str, keep, current: str, previous: str | None = None) -> list[str]:
    """The virtualenvs directly under ``root`` beyond the ``keep`` newest, from ansible.builtin.find's pyvenv.cfg files."""
    entries = [{"path": posixpath.dirname(str(item["path"])), "installed": float(item["mtime"])} for item in found
               if posixpath.dirname(posixpath.dirname(posixpath.normpath(str(item["path"])))) == posixpath.normpath(str(root))]
    try:
        return _versions.virtualenvs_to_prune(entries, int(keep) if str(keep).isdigit() else keep, current, previous)
    except ValueError as error:
        raise AnsibleFilterError(f"virtualenvs to keep: {error}") from None


class FilterModule:
    def filters(self):
        return {"engine_facts": engine_facts, "engine_owner": engine_owner, "engine_secrets": engine_secrets, "unauthenticated_binds": unauthenticated_binds,
                "unit_command": _engines.unit_command, "engine_identity": engine_identity, "matches_pin": _versions.matches_pin,
                "reported_version": _versions.reported_version,
                "virtualenvs_to_prune": virtualenvs_to_prune}
