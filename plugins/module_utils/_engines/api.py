# Copyright (c) 2026, gpufleet.serving contributors
# GNU General Public License v3.0+ (see COPYING or https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
#
# PRIVATE to the collection: may change at any time. Do not use from other collections.

"""Talking to an engine's HTTP surface: readiness, running requests, speculative-decoding acceptance.

Metric names are those of vLLM 0.33.0 and SGLang 0.5.23. The HTTP client is the one seam tests replace.
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CommandFailed

DEFAULT_PORTS = {"vllm": 8000, "sglang": 30000}
HEALTH_PATHS = {"vllm": "/health", "sglang": "/health_generate"}
RUNNING_METRICS = {"vllm": "vllm:num_requests_running", "sglang": "sglang:num_running_reqs"}
WAITING_METRICS = {"vllm": "vllm:num_requests_waiting", "sglang": "sglang:num_queue_reqs"}
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


@dataclass
class Response:
    status: int | None  # None: no connection (refused, reset, timed out)
    body: str = ""
    error: str = ""


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect is the engine's answer, not somewhere to go (it comes back as an HTTPError with its 3xx status)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None


# the engine is on this node: a proxy from the environment must not be in the way. The standard library's client, not
# ansible.module_utils.urls: that one's imports (TLS, mail, certificates) cost each module run about 0.1 s on the node
# and more to pack on the controller, for features these loopback calls do not use.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}), _NoRedirect())


class HttpClient:
    """GETs and POSTs with a per-request timeout; connection failures become Response(None, error=...)."""

    def __init__(self, base_url: str, api_key: str | None = None, timeout: float = 10.0):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout

    def request(self, method: str, path: str, payload: dict | None = None) -> Response:
        data = json.dumps(payload).encode() if payload is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        try:
            with _OPENER.open(urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method),
                              timeout=self.timeout) as reply:
                return Response(reply.status, reply.read().decode("utf-8", errors="replace"))
        except urllib.error.HTTPError as error:
            return Response(error.code, error.read().decode("utf-8", errors="replace"))
        except (urllib.error.URLError, OSError) as error:
            return Response(None, error=str(getattr(error, "reason", error)))
        except http.client.HTTPException as error:  # an engine that died mid-answer: a bad status line, a cut body
            return Response(None, error=f"{type(error).__name__}: {error}")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text: the sum over label sets of each metric name."""
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        if match:
            try:
                totals[match.group(1)] = totals.get(match.group(1), 0.0) + float(match.group(3))
            except ValueError:
                continue
    return totals


@dataclass
class Readiness:
    ready: bool
    checks: dict = field(default_factory=dict)
    waiting_for: str = ""


def check_ready(engine: str, client: HttpClient, model: str, completion: bool = True) -> Readiness:
    """Health, then the model listed, then a one-token completion: the first that fails is what we wait for."""
    checks = {}
    health = client.request("GET", HEALTH_PATHS[engine])
    checks["health"] = health.status if health.status is not None else f"no connection ({health.error})"
    if health.status != 200:
        return Readiness(False, checks, f"{HEALTH_PATHS[engine]}: {checks['health']}")
    models = client.request("GET", "/v1/models")
    served = _model_ids(models)
    checks["models"] = served if models.status == 200 else models.status
    if models.status != 200 or model not in served:
        return Readiness(False, checks, f"/v1/models: {model!r} not listed (got {checks['models']})")
    if completion:
        reply = client.request("POST", "/v1/completions", {"model": model, "prompt": "The capital of France is", "max_tokens": 1})
        ok = reply.status == 200 and bool(_json(reply.body).get("choices"))
        checks["completion"] = "ok" if ok else (reply.status or reply.error)
        if not ok:
            return Readiness(False, checks, f"/v1/completions: {checks['completion']}")
    return Readiness(True, checks)


def greedy_completion(client: HttpClient, model: str, prompt: str, max_tokens: int, engine: str = "") -> dict:
    """One completion at temperature 0 with the chosen tokens' logprobs (OpenAI completions' ``logprobs: 1``, which both
    engines return); raises CommandFailed with the status or the error when there is no answer. vLLM is asked for the
    tokens as their ids (``return_tokens_as_token_ids``: "token_id:N"), so that two tokens that decode alike differ."""
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "logprobs": 1, "seed": 0}
    if engine == "vllm":
        payload["return_tokens_as_token_ids"] = True
    reply = client.request("POST", "/v1/completions", payload)
    body = _json(reply.body)
    if reply.status != 200 or not body.get("choices"):
        raise CommandFailed(f"/v1/completions for {prompt!r}: {reply.status or reply.error} {reply.body[:200] if reply.body else ''}".rstrip())
    return body


def _json(text: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _model_ids(response: Response) -> list[str]:
    return [card.get("id") for card in _json(response.body).get("data", []) if isinstance(card, dict)]


def running_requests(engine: str, client: HttpClient) -> float | None:
    reply = client.request("GET", "/metrics")
    if reply.status != 200:
        return None
    metrics = parse_metrics(reply.body)
    if RUNNING_METRICS[engine] not in metrics:
        return None
    return metrics[RUNNING_METRICS[engine]] + metrics.get(WAITING_METRICS[engine], 0.0)


def spec_counters(engine: str, client: HttpClient) -> dict[str, float]:
    reply = client.request("GET", "/metrics")
    return parse_metrics(reply.body) if reply.status == 200 else {}


def spec_acceptance(engine: str, before: dict[str, float], after: dict[str, float]) -> float | None:
    """vLLM: accepted / drafted tokens over the probe (its counters); SGLang: its accept-rate gauge after the probe."""
    if engine == "vllm":
        drafted = after.get("vllm:spec_decode_num_draft_tokens_total", 0.0) - before.get("vllm:spec_decode_num_draft_tokens_total", 0.0)
        accepted = after.get("vllm:spec_decode_num_accepted_tokens_total", 0.0) - before.get("vllm:spec_decode_num_accepted_tokens_total", 0.0)
        return accepted / drafted if drafted > 0 else None
    return after.get("sglang:spec_accept_rate")
