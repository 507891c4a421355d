"""The answer check on its own: the comparison with a golden record and the degenerate-answer detector, with garbage
as the issues report it (vllm PR 54235: '!!!!!!!!!!!!' after a level-2 wake; replacement characters from a wrong
tokenizer; empty answers; one token over and over)."""

from __future__ import annotations

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import answers
from ansible_collections.gpufleet.serving.plugins.module_utils._errors import InvalidInput

PARIS = answers.Answer("The capital of France is", " Paris, the city of light.", [" Paris", ",", " the", " city", " of", " light", "."],
                       [-0.11, -1.2, -0.9, -0.4, -0.01, -0.3, -0.7])
RECORD = [PARIS.to_dict()]


@pytest.mark.parametrize("text, tokens, why", [
    ("!!!!!!!!!!!!", ["!"] * 12, "one character repeated"),                      # vllm PR 54235, after a level-2 wake
    ("", [], "an empty answer"),
    ("   \n", ["\n"], "an empty answer"),
    ("\ufffd\ufffd\ufffd a\ufffd\ufffd", ["\ufffd"] * 6, "mostly replacement"),  # a GGUF read with another tokenizer
    (" the the the the the the the", [" the"] * 7, "the same token repeated"),
    (" Paris Paris Paris Paris Paris Paris", [], "the same word repeated"),
    ("\x00\x01\x02\x03abc", [], "non-printable"),
])
def test_garbage_is_named(text, tokens, why):
    assert why in answers.degenerate(answers.Answer("p", text, tokens))


@pytest.mark.parametrize("text", [" Paris, the city of light.", "\n    if n < 2:\n        return n", " 100 degrees Celsius at sea level", "!"])
def test_sense_is_not_garbage(text):
    assert answers.degenerate(answers.Answer("p", text, text.split())) is None


def test_the_same_tokens_within_the_tolerance_pass_and_the_first_difference_is_named():
    assert answers.compare(RECORD, [PARIS], 0.05) is None
    drifted = answers.Answer(PARIS.prompt, PARIS.text, PARIS.tokens, [value + 0.04 for value in PARIS.logprobs])
    assert answers.compare(RECORD, [drifted], 0.05) is None and answers.drift(RECORD, [drifted]) == pytest.approx(0.04)
    other = answers.Answer(PARIS.prompt, " Lyon, the city", [" Lyon", ",", " the", " city"], [-0.5, -1.0, -0.9, -0.4])
    assert answers.compare(RECORD, [other], 0.05).startswith("token 1 of probe 1: ' Lyon' where the record has ' Paris'")
    far = answers.Answer(PARIS.prompt, PARIS.text, PARIS.tokens, PARIS.logprobs[:6] + [-2.7])
    assert answers.compare(RECORD, [far], 0.05) == "logprob of token 7 of probe 1: -2.7000 where the record has -0.7000 (drift 2.0000, tolerance 0.05)"
    short = answers.Answer(PARIS.prompt, " Paris", [" Paris"], [-0.11])
    assert answers.compare(RECORD, [short], 0.05) == "probe 1: 1 token(s), the record has 7"
    assert answers.compare(RECORD, [PARIS, PARIS], 0.05) == "2 probe(s) answered, the record has 1"


def test_without_logprobs_the_text_is_compared():
    record = [{"prompt": "p", "text": " Paris.", "tokens": [], "logprobs": []}]
    assert answers.compare(record, [answers.Answer("p", " Paris.")], 0.05) is None
    assert answers.compare(record, [answers.Answer("p", " Lyon.")], 0.05) == "probe 1: ' Lyon.' where the record has ' Paris.'"


def test_the_sanity_check_quotes_the_answer_and_the_operators_expectation():
    checks = [answers.Expectation.from_params(0, {"prompt": "The capital of France is", "expect": "Paris"})]
    assert answers.sanity([PARIS], checks, [PARIS]) is None
    lyon = answers.Answer(PARIS.prompt, " Lyon.", [" Lyon", "."], [-0.2, -0.3])
    assert answers.sanity([PARIS], checks, [lyon]) == "'The capital of France is' was answered ' Lyon.', which does not match 'Paris'"
    bang = answers.Answer("Water boils at", "!!!!!!!!!!!!", ["!"] * 12, [-0.01] * 12)
    assert answers.sanity([PARIS, bang], [], []) == "probe 2 ('Water boils at') answered one character repeated ('!!!!!!!!!!!!'): '!!!!!!!!!!!!'"


def test_expectations_and_completions_are_read_strictly():
    with pytest.raises(InvalidInput, match=r"answer_checks\[0\]: give prompt and expect"):
        answers.Expectation.from_params(0, {"prompt": "x"})
    with pytest.raises(InvalidInput, match="not a regular expression"):
        answers.Expectation.from_params(1, {"prompt": "x", "expect": "("})
    with pytest.raises(InvalidInput, match="unknown key"):
        answers.Expectation.from_params(2, {"prompt": "x", "expect": "y", "temperature": 1})
    body = {"choices": [{"text": " Paris.", "logprobs": {"tokens": [" Paris", "."], "token_logprobs": [-0.1, -0.2], "top_logprobs": None}}]}
    assert answers.Answer.from_completion("p", body) == answers.Answer("p", " Paris.", [" Paris", "."], [-0.1, -0.2])
    with pytest.raises(InvalidInput, match="no choice"):
        answers.Answer.from_completion("p", {"choices": []})


def test_a_record_belongs_to_one_engine_model_version_and_command():
    one = answers.identity("vllm", "/m", "0.33.0", ["vllm", "serve", "/m", "--tensor-parallel-size", "8"])
    assert one == answers.identity("vllm", "/m", "0.33.0", "vllm serve /m --tensor-parallel-size 8")
    assert one["key"] != answers.identity("vllm", "/m", "0.34.0", "vllm serve /m --tensor-parallel-size 8")["key"]
    assert one["key"] != answers.identity("vllm", "/m", "0.33.0", "vllm serve /m --tensor-parallel-size 4")["key"]
    assert answers.record_path("/var/lib/x/", one) == f"/var/lib/x/vllm-{one['key']}.json"


def test_with_the_degenerate_check_off_only_the_expectations_judge_a_first_answer():
    noise = answers.Answer("p", "", ["token_id:604"] * 24, [-6.0] * 24)  # the lab's tiny real model, random weights
    ident = answers.identity("vllm", "tiny-llama", "0.32.0", "vllm serve /m")
    assert answers.judge(ident, None, [noise], [], [], 0.05)["passed"] is False
    assert answers.judge(ident, None, [noise], [], [], 0.05, degenerate_check=False)["passed"] is True
    expect = answers.Expectation.from_params(0, {"prompt": "p", "expect": "Paris"})
    assert answers.judge(ident, None, [noise], [expect], [noise], 0.05, degenerate_check=False)["passed"] is False


@pytest.mark.parametrize(("timeout", "errors"), [(None, []), (60, []), ("90", []), (0, ["switch_engine_answer_timeout: 1 to 3600 seconds, got 0"]),
                                                 ("soon", ["switch_engine_answer_timeout: 1 to 3600 seconds, got 'soon'"])])
def test_the_probe_timeout_is_checked_before_any_node_is_touched(timeout, errors):
    from ansible_collections.gpufleet.serving.plugins.filter.arguments import answer_check_errors
    variables = {} if timeout is None else {"switch_engine_answer_timeout": timeout}
    assert answer_check_errors(variables) == errors
