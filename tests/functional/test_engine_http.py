"""The engines' HTTP client against a real HTTP server on loopback: the API key sent, errors kept as answers, a
redirect not followed, a proxy from the environment not used, a port nobody listens on answered with no status."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._engines import api as http


class Engine(BaseHTTPRequestHandler):
    seen: list = []

    def log_message(self, *args):
        pass

    def answer(self, status, body, headers=()):
        self.send_response(status)
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        self.seen.append(("GET", self.path, self.headers.get("Authorization")))
        if self.path == "/moved":
            self.answer(307, b"", [("Location", "/elsewhere")])
        elif self.path == "/health":
            self.answer(200, b"ok")
        elif self.path == "/cut":  # dies halfway through its answer
            self.send_response(200)
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b"half")
        elif self.path == "/garbled":
            self.wfile.write(b"NOT-HTTP\r\n\r\n")
        else:
            self.answer(404, b"no such route")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(("POST", self.path, self.headers.get("Authorization"), body))
        self.answer(401 if self.headers.get("Authorization") != "Bearer k" else 200, b'{"choices": []}')


@pytest.fixture
def engine():
    Engine.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), Engine)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_answers_errors_and_the_api_key(engine):
    assert http.HttpClient(engine).request("GET", "/health") == http.Response(200, "ok")
    assert http.HttpClient(engine).request("GET", "/nope").status == 404, "an error status is the engine's answer"
    assert http.HttpClient(engine, api_key="wrong").request("POST", "/v1/completions", {"max_tokens": 1}).status == 401
    assert http.HttpClient(engine, api_key="k").request("POST", "/v1/completions", {"max_tokens": 1}).status == 200
    assert Engine.seen[-1] == ("POST", "/v1/completions", "Bearer k", {"max_tokens": 1})


def test_a_redirect_is_an_answer_not_followed_and_a_proxy_from_the_environment_is_not_used(engine, monkeypatch):
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")
    assert http.HttpClient(engine).request("GET", "/moved").status == 307
    assert [hit[1] for hit in Engine.seen] == ["/moved"], "the engine's own redirect target is never fetched"


def test_nobody_listening_is_an_answer_with_no_status():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    reply = http.HttpClient(f"http://127.0.0.1:{port}", timeout=2).request("GET", "/health")
    assert reply.status is None and "refused" in reply.error.lower()


def test_an_engine_that_dies_mid_answer_is_an_answer_with_no_status(engine):
    """A cut body or a garbled status line (http.client's own errors, not OSError) is a failed probe, not a crash."""
    cut = http.HttpClient(engine, timeout=5).request("GET", "/cut")
    garbled = http.HttpClient(engine, timeout=5).request("GET", "/garbled")
    assert cut.status is None and "IncompleteRead" in cut.error
    assert garbled.status is None and "BadStatusLine" in garbled.error
