# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""The engine_facts, engine_secrets and unauthenticated_binds filters: an engine's unit, command line, URL and secrets from its role's variables.

See plugins/plugin_utils/_engines.py; the vllm and sglang roles publish its result as vllm_facts / sglang_facts.
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engines


def engine_facts(config: dict, engine: str) -> dict:
    try:
        return _engines.engine_facts(config, engine)
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


class FilterModule:
    def filters(self):
        return {"engine_facts": engine_facts, "engine_secrets": engine_secrets, "unauthenticated_binds": unauthenticated_binds}
