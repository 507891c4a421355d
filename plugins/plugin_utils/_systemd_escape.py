# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Values written for systemd, escaped by the rules of the directive that reads them.

Each directive reads its value its own way (systemd.syntax(7), systemd.exec(5), systemd.service(5)):

- ``ExecStart=``: words; quotes and C escapes are undone, ``%`` specifiers resolved, ``$VAR``/``${VAR}`` expanded
  and a lone ``;`` separates commands. Hence ``%%``, ``$$`` and ``\\;``.
- ``Environment=``: quoted assignments; quotes and C escapes are undone and ``%`` specifiers resolved, but ``$`` has
  no meaning there, so it is written as it is (``$$`` would reach the process as two dollars).
- ``EnvironmentFile=``: shell-like lines; inside double quotes a backslash escapes only ``\\ " ` $``, and nothing
  is expanded.

Every function returns exactly what the process will see, or raises SystemdEscapeError naming the problem.
"""

from __future__ import annotations

import re

ENVIRONMENT_REFERENCE = re.compile(r"^\$\{[A-Za-z_][A-Za-z0-9_]*\}$")
ENVIRONMENT_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class SystemdEscapeError(ValueError):
    pass


def _c_escape(text: str) -> str:
    """Backslash, double quote and control characters as C escapes, which quoted systemd words undo."""
    out = []
    for char in text:
        if char == "\0":
            raise SystemdEscapeError("a NUL character cannot reach a process through systemd")
        if char in '\\"':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\x{ord(char):02x}")
        else:
            out.append(char)
    return "".join(out)


def exec_word(arg, expand: bool = False) -> str:
    """One ExecStart= argument, exactly as given; with ``expand``, a ``${NAME}`` word systemd replaces by its value."""
    text = str(arg)
    if expand:
        if not ENVIRONMENT_REFERENCE.match(text):
            raise SystemdEscapeError(f"{text!r} is not a ${{NAME}} reference")
        return f'"{text}"'
    if text == ";":
        return "\\;"  # a lone ';', quoted or not, would end the command
    return '"{}"'.format(_c_escape(text).replace("%", "%%").replace("$", "$$"))


def exec_line(argv: list, expand: frozenset = frozenset()) -> str:
    """ExecStart= from an argv; the words at the indexes in ``expand`` are references systemd expands."""
    if not argv:
        raise SystemdEscapeError("an empty command line")
    return " ".join(exec_word(arg, index in expand) for index, arg in enumerate(argv))


def check_environment_name(name) -> str:
    name = str(name)
    if not ENVIRONMENT_NAME.match(name):
        raise SystemdEscapeError(f"{name!r} is not a valid environment variable name (letters, digits and _, not starting with a digit)")
    return name


def environment_assignment(name, value) -> str:
    """The value of one Environment= line: a quoted NAME=VALUE."""
    return '"{}={}"'.format(check_environment_name(name), _c_escape(str(value)).replace("%", "%%"))


def environment_file_line(name, value) -> str:
    """One line of an EnvironmentFile=: NAME="VALUE", with only the four characters systemd unescapes escaped."""
    text = str(value)
    if "\0" in text:
        raise SystemdEscapeError(f"{name}: a NUL character cannot reach a process through systemd")
    escaped = re.sub(r'([\\"`$])', r"\\\1", text)
    return f'{check_environment_name(name)}="{escaped}"'


def description(text: str) -> str:
    """A Description= value: one line, specifiers kept literal."""
    return "".join(" " if ord(char) < 0x20 or ord(char) == 0x7F else char for char in str(text)).replace("%", "%%")
