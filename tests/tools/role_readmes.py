"""Each role's README.md, rendered from its meta/argument_specs.yml (the one source of its variables).

    python tests/tools/role_readmes.py          write roles/*/README.md
    python tests/tools/role_readmes.py --check  exit 1 naming the READMEs that differ (tests/unit/roles/test_role_readmes.py)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


MARKUP = re.compile(r"\b[COV]\(([^)]*)\)")  # Ansible's C(code), O(option), V(value)


def _text(value) -> str:
    lines = value if isinstance(value, list) else [value]
    return MARKUP.sub(r"`\1`", " ".join(str(line).strip() for line in lines if line is not None))


def _default(option: dict) -> str:
    if "default" not in option:
        return "required" if option.get("required") else "-"
    value = option["default"]
    return f"`{json.dumps(value) if isinstance(value, (bool, dict, list)) or value in ('', None) else value}`"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(role: str) -> str:
    specs = yaml.safe_load((REPO / "roles" / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]
    main = specs.get("main", {})
    out = [f"# gpufleet.serving.{role}", "", _text(main.get("short_description", "")), ""]
    description = main.get("description") or []
    for paragraph in description if isinstance(description, list) else [description]:
        out += [f"- {_text(paragraph)}"]
    if description:
        out.append("")
    out += ["Generated from `meta/argument_specs.yml` by `tests/tools/role_readmes.py`; a test keeps them equal.", ""]
    for entry, spec in specs.items():
        title = "Variables" if entry == "main" else f"Entry point `{entry}` (`tasks_from: {entry}`)"
        out += [f"## {title}", ""]
        if entry != "main":
            out += [_text(spec.get("short_description", "")), ""]
        options = spec.get("options") or {}
        if not options:
            out += ["No variables of its own.", ""]
            continue
        out += ["| variable | type | default | description |", "|---|---|---|---|"]
        for name, option in options.items():
            kind = option.get("type", "str") + (f" of {option['elements']}" if option.get("elements") else "")
            if option.get("choices"):
                kind += " (" + ", ".join(str(choice) for choice in option["choices"]) + ")"
            out.append(f"| `{name}` | {kind} | {_default(option)} | {_cell(_text(option.get('description', '')))} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def roles() -> list[str]:
    return sorted(path.parent.parent.name for path in (REPO / "roles").glob("*/meta/argument_specs.yml"))


def main(argv: list[str]) -> int:
    stale = []
    for role in roles():
        readme = REPO / "roles" / role / "README.md"
        text = render(role)
        if "--check" in argv:
            if not readme.exists() or readme.read_text() != text:
                stale.append(str(readme.relative_to(REPO)))
        else:
            readme.write_text(text)
    if stale:
        print("out of date (run python tests/tools/role_readmes.py): " + ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
