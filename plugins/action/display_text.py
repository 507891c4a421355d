# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

"""Action of gpufleet.serving.display_text: print text on the controller as it is, whatever the stdout callback."""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible.utils.display import Display

display = Display()


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _VALID_ARGS = frozenset(("text",))

    def run(self, tmp=None, task_vars=None):
        result = super().run(tmp, task_vars)
        text = self._task.args.get("text")
        if not isinstance(text, str):
            raise AnsibleActionFail(f"text: give a string, got {type(text).__name__}")
        # a debug msg goes through the callback's result format (JSON-quoted lines by default); this is shown as written
        display.display(text)
        result.update(changed=False, lines=len(text.splitlines()))
        return result
