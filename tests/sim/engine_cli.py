"""A parser with the options, arities and choices of the real engines, rebuilt from their extracted specs.

`parse("vllm", argv)` accepts what `vllm serve` 0.33.0 accepts and rejects (EngineCliError) what it rejects:
unknown options, missing or extra values, values outside `choices`, ambiguous abbreviations. Types are
checked where the spec names a plain int or float. vLLM's FlexibleArgumentParser extras (underscores in
option names, dotted JSON sub-keys such as --speculative-config.method) are accepted as it accepts them.
"""

from __future__ import annotations

import argparse
import json
from functools import cache
from pathlib import Path

SPECS = {"vllm": "vllm-0.33.0-cli.json", "sglang": "sglang-0.5.23-cli.json"}
SPEC_DIR = Path(__file__).with_name("engines")
PLAIN_TYPES = {"int": int, "float": float}


class EngineCliError(ValueError):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise EngineCliError(message)


class _Flag(argparse.Action):
    """Zero-argument options: --x sets True, its negated forms (--no-x, --disable-x) set False."""

    def __init__(self, option_strings, dest, **kwargs):
        kwargs.pop("nargs", None)
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        negated = option_string.startswith(("--no-", "--disable-")) and not self.option_strings[0].startswith(("--no-", "--disable-"))
        setattr(namespace, self.dest, not negated)


@cache
def spec(engine: str) -> dict:
    return json.loads((SPEC_DIR / SPECS[engine]).read_text())


@cache
def build_parser(engine: str) -> argparse.ArgumentParser:
    data = spec(engine)
    parser = _Parser(prog=engine, add_help=False, allow_abbrev=data["allow_abbrev"])
    for action in data["actions"]:
        if action["action"] == "_HelpAction":
            continue
        kwargs = {"dest": action["dest"], "default": None}
        if action["nargs"] == 0:
            kwargs["action"] = _Flag
        else:
            if action["nargs"] is not None:
                kwargs["nargs"] = action["nargs"]
            if action["choices"]:
                kwargs["choices"] = action["choices"]
            if action["type"] in PLAIN_TYPES:
                kwargs["type"] = PLAIN_TYPES[action["type"]]
            if action["action"] == "_AppendAction":
                kwargs["action"] = "append"
        if action["opts"]:
            parser.add_argument(*action["opts"], **kwargs)
        else:
            kwargs.pop("dest")
            parser.add_argument(action["dest"], **kwargs)
    return parser


def _vllm_flexible(argv: list[str]) -> list[str]:
    """FlexibleArgumentParser: --max_model_len -> --max-model-len; --speculative-config.method X -> JSON sub-key."""
    normalized = []
    dotted: dict[str, dict] = {}
    iterator = iter(argv)
    for arg in iterator:
        if arg.startswith("--") and not arg.startswith("---"):
            name, eq, value = arg.partition("=")
            name = "--" + name[2:].replace("_", "-")
            if "." in name:
                option, _dot, key = name.partition(".")
                if not eq:
                    value = next(iterator, None)
                    if value is None:
                        raise EngineCliError(f"argument {option}.{key}: expected one argument")
                dotted.setdefault(option, {})[key.replace("-", "_")] = value
                continue
            arg = name + (eq + value if eq else "")
        normalized.append(arg)
    for option, values in dotted.items():
        normalized += [option, json.dumps(values)]
    return normalized


def parse(engine: str, argv: list[str]) -> argparse.Namespace:
    """Parse the arguments after the entry point (`vllm serve`, `python -m sglang.launch_server`, `sglang serve`)."""
    if engine == "vllm":
        argv = _vllm_flexible(argv)
    return build_parser(engine).parse_args(argv)


def option_names(engine: str) -> set[str]:
    return {opt for action in spec(engine)["actions"] for opt in action["opts"]}
