"""Does the unit's main process run with exactly the arguments and environment its variables say? Byte for byte.

    process_matches.py UNIT EXPECTED.json     EXPECTED: {"args": [...], "extra_args": [...], "environment": {...}}

"args" are the engine's arguments (after its launcher, which the lab's wrappers replace on exec); "extra_args"
must end them; every "environment" variable must be in the process's environment with exactly that value.
Prints what differs as JSON; exits 1 when anything does.
"""

import json
import subprocess
import sys

unit, expected_path = sys.argv[1:3]
with open(expected_path, encoding="utf-8") as handle:
    expected = json.load(handle)
pid = subprocess.run(["systemctl", "show", "-p", "MainPID", "--value", unit], capture_output=True, text=True, check=True).stdout.strip()
with open(f"/proc/{pid}/cmdline", "rb") as handle:
    argv = handle.read().split(b"\0")[:-1]
with open(f"/proc/{pid}/environ", "rb") as handle:
    environ = dict(entry.split(b"=", 1) for entry in handle.read().split(b"\0") if entry)

problems = []
args = [arg.encode() for arg in expected["args"]]
extra = [arg.encode() for arg in expected["extra_args"]]
if argv[-len(args):] != args:
    problems.append({"argv": [arg.decode(errors="backslashreplace") for arg in argv], "expected args": expected["args"]})
if argv[-len(extra):] != extra:
    problems.append({"argv tail": [arg.decode(errors="backslashreplace") for arg in argv[-len(extra):]], "expected": expected["extra_args"]})
for name, value in expected["environment"].items():
    found = environ.get(name.encode())
    if found != value.encode():
        problems.append({"variable": name, "found": None if found is None else found.decode(errors="backslashreplace"), "expected": value})
print(json.dumps({"pid": int(pid), "argc": len(argv), "variables": len(expected["environment"]), "problems": problems}, ensure_ascii=False))
sys.exit(1 if problems else 0)
