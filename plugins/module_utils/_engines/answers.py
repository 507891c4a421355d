# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Whether an engine answers right, not only whether it answers: a fixed probe set sent greedily (temperature 0, one
request at a time), compared with the answers the same engine, model, version and command gave before (its golden
record) - or, where there is no record yet, checked for sense (every probe answers, nothing degenerate, the operator's
own expectations). Pure: the requests and the record's file are the caller's."""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils import _paths as paths
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

# a few prompts of different kinds, greedy, a few dozen tokens: under a second on an idle engine
PROBES = ("The capital of France is", "def fibonacci(n):\n   ", "Water boils at a temperature of")
PROBE_TOKENS = 24
RECORD_DIR = paths.ANSWERS_DIR
# the largest drift of a chosen token's logprob between two starts of one configuration, allowed (docs/switch.md)
DEFAULT_TOLERANCE = 0.05


@dataclass(frozen=True)
class Answer:
    """One probe's answer: the text, the chosen tokens and their logprobs (OpenAI completions' logprobs)."""
    prompt: str
    text: str
    tokens: list = field(default_factory=list)
    logprobs: list = field(default_factory=list)

    @classmethod
    def from_completion(cls, prompt: str, body: dict) -> Answer:
        """From a /v1/completions answer; raises InvalidInput when it holds no choice."""
        choices = body.get("choices") or []
        if not choices:
            raise InvalidInput(f"no choice in the answer to {prompt!r}")
        choice = choices[0]
        logprobs = choice.get("logprobs") or {}
        return cls(prompt=prompt, text=str(choice.get("text") or ""), tokens=[str(t) for t in logprobs.get("tokens") or []],
                   logprobs=[None if value is None else float(value) for value in logprobs.get("token_logprobs") or []])

    def to_dict(self) -> dict:
        return {"prompt": self.prompt, "text": self.text, "tokens": list(self.tokens), "logprobs": list(self.logprobs)}


@dataclass(frozen=True)
class Expectation:
    """An operator's own check: the answer to ``prompt`` must match ``expect`` (a regular expression)."""
    prompt: str
    expect: str
    max_tokens: int = 16

    @classmethod
    def from_params(cls, index: int, value: dict) -> Expectation:
        if not isinstance(value, dict) or not value.get("prompt") or not value.get("expect"):
            raise InvalidInput(f"answer_checks[{index}]: give prompt and expect (a regular expression the answer must match)")
        unknown = sorted(set(value) - {"prompt", "expect", "max_tokens"})
        if unknown:
            raise InvalidInput(f"answer_checks[{index}]: unknown key(s) {', '.join(unknown)}; known: prompt, expect, max_tokens")
        try:
            re.compile(value["expect"])
        except re.error as exc:
            raise InvalidInput(f"answer_checks[{index}].expect: {value['expect']!r} is not a regular expression: {exc}") from None
        max_tokens = int(value.get("max_tokens") or 16)
        if not 1 <= max_tokens <= 512:
            raise InvalidInput(f"answer_checks[{index}].max_tokens: 1 to 512, got {max_tokens}")
        return cls(prompt=str(value["prompt"]), expect=str(value["expect"]), max_tokens=max_tokens)


def identity(engine: str, model: str, version: str | None, command: list[str] | str) -> dict:
    """What a record belongs to: another engine, model, version or command line (parallelism, quantization, dtype)
    may answer otherwise, rightly, and starts with no record."""
    argv = command if isinstance(command, str) else " ".join(command)
    key = json.dumps([engine, model, version or "", argv])
    return {"engine": engine, "model": model, "version": version or None, "command": argv,
            "key": hashlib.sha256(key.encode()).hexdigest()[:16]}


def record_path(directory: str, ident: dict) -> str:
    return f"{directory.rstrip('/')}/{ident['engine']}-{ident['key']}.json"


def degenerate(answer: Answer) -> str | None:
    """Why an answer is garbage, or None: empty, one token (or one character) repeated, mostly replacement or
    non-printable characters - what wrong answers from a healthy-looking server look like."""
    text = answer.text
    if not text.strip():
        return "an empty answer"
    bad = sum(1 for char in text if char == "\ufffd" or (unicodedata.category(char).startswith("C") and char not in "\n\t\r"))
    if bad / len(text) > 0.3:
        return f"mostly replacement or non-printable characters ({bad} of {len(text)})"
    stripped = text.strip()
    if len(stripped) >= 6 and len(set(stripped)) == 1:
        return f"one character repeated ({stripped[:12]!r})"
    tokens = [token for token in answer.tokens if token.strip()]
    if len(tokens) >= 6:
        most = max(tokens.count(token) for token in set(tokens))
        if most / len(tokens) >= 0.8:
            top = max(set(tokens), key=tokens.count)
            return f"the same token repeated ({top!r}, {most} of {len(tokens)})"
    words = stripped.split()
    if len(words) >= 6 and len(set(words)) == 1:
        return f"the same word repeated ({words[0]!r})"
    return None


def compare(record: list[dict], answers: list[Answer], tolerance: float) -> str | None:
    """The first difference from the record, in words, or None: every chosen token must be the recorded one, and its
    logprob within ``tolerance`` of the recorded one."""
    if len(record) != len(answers):
        return f"{len(answers)} probe(s) answered, the record has {len(record)}"
    for number, (want, got) in enumerate(zip(record, answers), 1):
        tokens = list(want.get("tokens") or [])
        if not tokens:  # an engine that gives no logprobs: its text is compared
            if want.get("text") != got.text:
                return f"probe {number}: {_shown(got.text)} where the record has {_shown(want.get('text') or '')}"
            continue
        for index, (expected, token) in enumerate(zip(tokens, got.tokens), 1):
            if expected != token:
                return (f"token {index} of probe {number}: {token!r} where the record has {expected!r} "
                        f"(answer {_shown(got.text)}, recorded {_shown(want.get('text') or '')})")
        if len(got.tokens) != len(tokens):
            return f"probe {number}: {len(got.tokens)} token(s), the record has {len(tokens)}"
        for index, (expected, value) in enumerate(zip(want.get("logprobs") or [], got.logprobs), 1):
            if expected is not None and value is not None and abs(expected - value) > tolerance:
                return (f"logprob of token {index} of probe {number}: {value:.4f} where the record has {expected:.4f} "
                        f"(drift {abs(expected - value):.4f}, tolerance {tolerance:g})")
    return None


def drift(record: list[dict], answers: list[Answer]) -> float:
    """The largest logprob difference from the record over every chosen token (0 with none to compare)."""
    largest = 0.0
    for want, got in zip(record, answers):
        for expected, value in zip(want.get("logprobs") or [], got.logprobs):
            if expected is not None and value is not None:
                largest = max(largest, abs(expected - value))
    return round(largest, 6)


def sanity(answers: list[Answer], expectations: list[Expectation], expected_answers: list[Answer], degenerate_check: bool = True) -> str | None:
    """With no record: every probe answers with something that is not garbage (unless the operator turned that part
    off: a model whose right answers look degenerate), and the operator's expectations match."""
    for number, answer in enumerate(answers if degenerate_check else [], 1):
        why = degenerate(answer)
        if why:
            return f"probe {number} ({answer.prompt!r}) answered {why}: {_shown(answer.text)}"
    for expectation, answer in zip(expectations, expected_answers):
        if not re.search(expectation.expect, answer.text):
            return f"{expectation.prompt!r} was answered {_shown(answer.text)}, which does not match {expectation.expect!r}"
    return None


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


DEFAULT_PROBE_TIMEOUT = 120.0


@dataclass(frozen=True)
class CheckSettings:
    """The switch's answer check: the operator's expectations (for the target only), the tolerance, where the records
    are kept, whether to take a new record on purpose, and each engine's version (part of a record's identity)."""
    expectations: tuple = ()
    tolerance: float = DEFAULT_TOLERANCE
    record_dir: str = RECORD_DIR
    refresh: bool = False
    versions: dict = field(default_factory=dict)
    probes: tuple = PROBES
    degenerate_check: bool = True  # with no record: refuse garbage (off: only the expectations judge a first answer)
    # seconds one probe may take: an engine's first request may compile kernels first (vLLM's CPU build: a minute)
    probe_timeout: float = DEFAULT_PROBE_TIMEOUT

    @property
    def longest_run(self) -> float:
        """The most one check waits on failing probes: a probe that times out, then its one retry (a second failure
        ends the check); answered probes take a fraction of a second."""
        return 2 * self.probe_timeout + 1.0

    @classmethod
    def from_params(cls, params: dict | None) -> CheckSettings | None:
        if not params:
            return None
        tolerance = float(params.get("tolerance", DEFAULT_TOLERANCE))
        if not 0 <= tolerance <= 10:
            raise InvalidInput(f"answer_check.tolerance: 0 to 10 (a logprob difference), got {tolerance:g}")
        expectations = tuple(Expectation.from_params(index, item) for index, item in enumerate(params.get("expectations") or []))
        probe_timeout = float(DEFAULT_PROBE_TIMEOUT if params.get("probe_timeout") is None else params["probe_timeout"])
        if not 1 <= probe_timeout <= 3600:
            raise InvalidInput(f"answer_check.probe_timeout: 1 to 3600 seconds, got {probe_timeout:g}")
        return cls(expectations=expectations, tolerance=tolerance, record_dir=str(params.get("record_dir") or RECORD_DIR),
                   refresh=bool(params.get("refresh")), versions=dict(params.get("versions") or {}),
                   degenerate_check=bool(params.get("degenerate_check", True)), probe_timeout=probe_timeout)


def new_record(ident: dict, answers: list[Answer], created: float) -> dict:
    """The golden record an engine's answers become once it served through its soak."""
    return dict(ident, created=round(created), probes=[answer.to_dict() for answer in answers])


def record_for(ident: dict, records: list) -> dict | None:
    """The golden record an engine's answers are compared with: the one of its identity (engine, model, version,
    command), else none - a sanity check. The one rule for the plan (--check says which check) and the run."""
    return next((record for record in records if record and record.get("key") == ident["key"]), None)


def judge(ident: dict, record: dict | None, answers: list[Answer], expectations: list[Expectation], expected: list[Answer],
          tolerance: float, degenerate_check: bool = True) -> dict:
    """The check's verdict: a golden comparison where the record is this engine's, else a sanity check."""
    record = record_for(ident, [record])
    if record:
        mismatch = compare(record.get("probes") or [], answers, tolerance)
        return {"kind": "golden", "passed": mismatch is None, "mismatch": mismatch, "drift": drift(record.get("probes") or [], answers),
                "recorded_at": record.get("created")}
    mismatch = sanity(answers, expectations, expected, degenerate_check)
    return {"kind": "sanity", "passed": mismatch is None, "mismatch": mismatch, "drift": None, "recorded_at": None}
