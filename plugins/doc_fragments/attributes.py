# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Attributes every module of the collection shares; each module adds its own check_mode."""

    # No diffs (nothing these modules change is a file); they run on the GPU node, any POSIX host with systemd.
    DOCUMENTATION = r"""
options: {}
attributes:
  diff_mode:
    support: none
  platform:
    support: full
    platforms: posix
"""
