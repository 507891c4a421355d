# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.report_files: a run's JSON report and its HTML page written (or removed) on the
controller in the controller's own process - no module run, so no Python started for each file."""

from __future__ import annotations

import json
import os
import tempfile

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.text.converters import to_native
from ansible.plugins.action import ActionBase

from ansible_collections.gpufleet.serving.plugins.plugin_utils import _html_report

STATES = ("present", "absent")


def page_path(path: str) -> str:
    """The HTML page beside the JSON report: reports/switch_engine.json -> reports/switch_engine.html."""
    return (path[: -len(".json")] if path.endswith(".json") else path) + ".html"


def write_atomically(path: str, text: str) -> None:
    """Readers never see half a report: written beside, then renamed over."""
    directory = os.path.dirname(path)
    descriptor, partial = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=directory)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    except BaseException:
        if os.path.exists(partial):
            os.unlink(partial)
        raise


def write(path: str, document: dict) -> dict:
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    # the same text to_nice_json gives: sorted keys, four spaces
    write_atomically(path, json.dumps(document, indent=4, sort_keys=True, separators=(",", ": ")) + "\n")
    write_atomically(page_path(path), _html_report.page(document))
    return {"json": path, "html": page_path(path)}


def remove(path: str) -> dict:
    removed = []
    for name in (path, page_path(path)):
        if os.path.lexists(name):
            os.unlink(name)
            removed.append(name)
    return {"json": path, "html": page_path(path), "removed": removed}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("path", "document", "state"))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        args = self._task.args
        path, state, document = args.get("path"), args.get("state", "present"), args.get("document")
        if not isinstance(path, str) or not os.path.isabs(path) or not path.endswith(".json"):
            raise AnsibleActionFail(f"path: give the JSON report's absolute path, ending in .json (got {path!r})")
        if state not in STATES:
            raise AnsibleActionFail(f"state: {state!r} is not one of {', '.join(STATES)}")
        if state == "present" and not isinstance(document, dict):
            raise AnsibleActionFail(f"document: give the report as a mapping (got {type(document).__name__})")
        try:
            written = write(path, document) if state == "present" else remove(path)
        except OSError as exc:
            raise AnsibleActionFail(f"{path}: {to_native(exc)}") from exc
        # a record of the run on the controller, not a change to the fleet (written in check mode too)
        result.update(changed=False, **written)
        return result
