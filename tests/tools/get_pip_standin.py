"""Stand-in for pypa's get-pip.py, for `make sanity` where ansible-test cannot download that script.

ansible-test runs it inside each fresh sanity virtualenv with pip's arguments (e.g. `pip==24.2 --no-setuptools`):
take pip from the interpreter's own ensurepip, then let that pip install what was asked for from the package index.
"""

from __future__ import annotations

import subprocess
import sys

# a process of its own: ensurepip hides pip's configuration (index, certificates) from the process that runs it
subprocess.check_call([sys.executable, "-m", "ensurepip", "--upgrade"])
requested = [arg for arg in sys.argv[1:] if arg not in ("--no-setuptools", "--no-wheel")]
sys.exit(subprocess.call([sys.executable, "-m", "pip", "install", *requested]))
