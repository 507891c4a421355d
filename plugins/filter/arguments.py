# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Filters that check an operator's variables before any node is touched, on the controller, each error a whole line.

role_argument_errors: a role's variables against its argument specs. Ansible's own check of a role's arguments fails
with the whole argument spec in its result (kilobytes on one line); callers that check first can name just the
variable at fault and the form it takes. engine_variable_errors: an engine role's variables as its facts entry point
reads them (ranges, forms, combinations), for a host, without the role (whose own check runs in a task that hides
its output: it carries the API key). unknown_variables: a variable with a role's prefix that no role or playbook of
the collection reads - a typo - with the closest real name.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping

import yaml
from ansible.errors import AnsibleFilterError
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers as _answers
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput
from ansible_collections.gpufleet.serving.plugins.plugin_utils import _engines

# libyaml's loader where PyYAML has it: ten times faster on the specs, read on every switch
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
ROLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "roles")


def _options(role: str, entry_point: str) -> dict:
    path = os.path.join(ROLES, role, "meta", "argument_specs.yml")
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=SAFE_LOADER)["argument_specs"][entry_point]["options"]
    except (OSError, KeyError, TypeError) as error:
        raise AnsibleFilterError(f"no argument specs for role {role!r}, entry point {entry_point!r}: {error}") from None


def _plain(value):
    """The value as plain dicts and lists: the validator deep-copies what it checks, and a lazy container of
    Ansible's templating carries its whole variable context with it (seconds per host to copy)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value


def role_argument_errors(role: str, variables, entry_point: str = "main", only_given: bool = False) -> list[str]:
    """Errors of the role's variables that are set (inventory, extra vars), as '<role> role: <message>' lines.
    ``only_given``: the options a playbook sets itself (required ones) are not asked for."""
    options = _options(role, entry_point)
    dropped = ("description", "version_added") + (("required",) if only_given else ())
    spec = {name: {key: value for key, value in option.items() if key not in dropped} for name, option in options.items()}
    given = {name: _plain(variables[name]) for name in spec if name in variables}
    result = ArgumentSpecValidator(spec).validate(given)
    return [f"{role} role: {message}" for message in result.error_messages]


def _yaml(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=SAFE_LOADER) or {}
    except FileNotFoundError:
        return {}


REFERENCE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)")


def _engine_config(engine: str, variables) -> dict:
    """The configuration the engine's role builds (its vars/main.yml, one role variable a key) from the host's
    variables and the role's defaults; a default made of other variables is filled in from them."""
    defaults = _yaml(os.path.join(ROLES, engine, "defaults", "main.yml"))
    mapping = _yaml(os.path.join(ROLES, engine, "vars", "main.yml")).get(f"__{engine}_config") or {}

    def value(name: str):
        if name in variables:
            return _plain(variables[name])
        default = defaults.get(name)
        if isinstance(default, str) and "{{" in default:
            return re.sub(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}", lambda match: str(value(match.group(1))), default)
        return default

    config = {}
    for key, template in mapping.items():
        found = REFERENCE.search(str(template))
        if found:
            config[key] = value(found.group(1))
            if config[key] is None and "default('')" in str(template):
                config[key] = ""
    return config


def engine_facts_errors(config: dict, engine: str) -> list[str]:
    """The error an engine's configuration (as its role builds it) would raise in its facts, never a secret."""
    try:
        _engines.engine_facts(_plain(config), engine)
    except _engines.EngineArgsError as error:
        return [f"{engine} role: {error}"]
    return []


def engine_variable_errors(variables, engine: str) -> list[str]:
    """The first error of the engine role's variables, as its facts entry point would raise it (never a secret)."""
    return engine_facts_errors(_engine_config(engine, variables), engine)


PREFIXES = ("switch_engine_", "gpu_teardown_", "gpu_cleanup_", "vllm_", "sglang_", "engine_common_")
# read by the playbooks (their headers), or published by the roles, besides the roles' argument specs
PLAYBOOK_VARIABLES = ("switch_engine_hosts", "switch_engine_report_dir", "switch_engine_serial", "switch_engine_max_fail_percentage",
                      "switch_engine_run_id", "switch_engine_started", "switch_engine_report", "gpu_cleanup_hosts", "gpu_cleanup_report_dir",
                      "gpu_cleanup_max_fail_percentage", "gpu_cleanup_started", "gpu_cleanup_run_id", "gpu_teardown_report", "vllm_facts",
                      "sglang_facts")


def _known_variables() -> set[str]:
    known = set(PLAYBOOK_VARIABLES)
    for role in sorted(os.listdir(ROLES)):
        specs = _yaml(os.path.join(ROLES, role, "meta", "argument_specs.yml")).get("argument_specs") or {}
        for entry in specs.values():
            known.update((entry or {}).get("options") or {})
        known.update(_yaml(os.path.join(ROLES, role, "defaults", "main.yml")))
    return known


def unknown_variables(names) -> list[str]:
    """A warning for each name with a role's prefix that nothing of the collection reads, with the closest real one."""
    known = _known_variables()
    warnings = []
    for name in sorted(set(names)):
        if not isinstance(name, str) or not name.startswith(PREFIXES) or name in known:
            continue
        closest = difflib.get_close_matches(name, known, n=1, cutoff=0.75)
        hint = f"; did you mean {closest[0]}?" if closest else ""
        warnings.append(f"{name} is not a variable of gpufleet.serving (it is ignored){hint}")
    return warnings


def fleet_variable_errors(hostvars, hosts: list, roles: list) -> list[str]:
    """Every error of the hosts' variables for the roles a playbook runs ([role, entry point] pairs; an engine role's
    facts read too), the hosts that share a message named together: one line a message, whole."""
    by_message: dict[str, list[str]] = {}
    for host in hosts:
        variables = hostvars[host]
        errors = [error for role, entry_point in roles for error in role_argument_errors(role, variables, entry_point, only_given=True)]
        if not errors:  # the facts read assumes the documented forms
            errors = [error for role, entry_point in roles if role in _engines.ENGINES and entry_point == "facts"
                      for error in engine_variable_errors(variables, role)]
            errors += answer_check_errors(variables) if any(role == "switch_engine" for role, _entry in roles) else []
        for error in errors:
            by_message.setdefault(error, []).append(host)
    return [f"{', '.join(names)}: {message}" for message, names in by_message.items()]


def answer_check_errors(variables: Mapping) -> list[str]:
    """switch_engine_answer_checks as the cutover reads them (a prompt and a regular expression each), and the probe's
    timeout; before any node is touched."""
    errors = []
    for index, item in enumerate(variables.get("switch_engine_answer_checks") or []):
        try:
            _answers.Expectation.from_params(index, item)
        except InvalidInput as error:
            errors.append(f"switch_engine_{error}")
    try:
        _answers.CheckSettings.from_params({"probe_timeout": variables.get("switch_engine_answer_timeout")})
    except (InvalidInput, TypeError, ValueError):
        errors.append(f"switch_engine_answer_timeout: 1 to 3600 seconds, got {variables.get('switch_engine_answer_timeout')!r}")
    return errors


def fleet_unknown_variables(hostvars, hosts: list) -> list[str]:
    """unknown_variables over the hosts (inventory and extra vars), each warning once."""
    return list(dict.fromkeys(warning for host in hosts for warning in unknown_variables(list(hostvars[host].keys()))))


class FilterModule:
    def filters(self):
        return {"role_argument_errors": role_argument_errors, "engine_variable_errors": engine_variable_errors,
                "engine_facts_errors": engine_facts_errors, "unknown_variables": unknown_variables,
                "fleet_variable_errors": fleet_variable_errors,
                "fleet_unknown_variables": fleet_unknown_variables}
