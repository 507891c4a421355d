"""haproxy_join against a real HAProxy (the Debian package make setup installs): a server in maintenance whose
backend answers is back UP at once, well inside one `rise x inter` of its health checks; a missing server and a
name that would smuggle a second command are refused."""

from __future__ import annotations

import http.server
import shutil
import socket
import subprocess
import threading
import time

import pytest

from ansible_collections.gpufleet.serving.plugins.module_utils._errors import CheckFailed, InvalidInput
from ansible_collections.gpufleet.serving.plugins.module_utils._switch import haproxy

pytestmark = pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is installed by make setup")

CONFIG = """global
    stats socket {socket} mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 10s
    timeout server 10s
backend engines
    option httpchk GET /health
    default-server inter 10s fall 2 rise 3
    server node1 127.0.0.1:{port} check
frontend front
    bind 127.0.0.1:{front}
    default_backend engines
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - the stdlib's name
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def balancer(tmp_path):
    engine = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=engine.serve_forever, daemon=True).start()
    path = tmp_path / "admin.sock"
    config = tmp_path / "haproxy.cfg"
    config.write_text(CONFIG.format(socket=path, port=engine.server_address[1], front=free_port()))
    process = subprocess.Popen(["haproxy", "-f", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    admin = haproxy.AdminSocket(str(path))
    deadline = time.monotonic() + 10
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    yield admin
    process.terminate()
    process.wait(10)
    engine.shutdown()


def test_a_server_in_maintenance_is_back_up_without_waiting_for_its_checks(balancer):
    assert balancer.command("set server engines/node1 state maint").strip() == ""
    assert haproxy.server_status(balancer.command("show stat"), "engines", "node1") == "MAINT"
    result = haproxy.join(balancer, "engines", "node1", timeout=5)
    assert result["status_before"] == "MAINT" and haproxy.serving(result["status"]) and result["changed"]
    # rise 3 x inter 10 s: HAProxy's own checks could not have brought it back within the 5 s allowed
    assert result["elapsed"] < 5


def test_a_missing_server_and_a_smuggled_command_are_refused(balancer):
    with pytest.raises(CheckFailed, match="no server engines/node9"):
        haproxy.join(balancer, "engines", "node9", timeout=1)
    with pytest.raises(InvalidInput, match="not a HAProxy name"):
        haproxy.checked_name("server", "node1; disable frontend front")


def test_status_is_read_from_show_stat_csv():
    stat = "# pxname,svname,status,weight\nengines,FRONTEND,OPEN,\nengines,node1,UP 1/3,1\nengines,BACKEND,UP,1\n"
    assert haproxy.server_status(stat, "engines", "node1") == "UP 1/3"
    assert haproxy.serving("UP 1/3") and not haproxy.serving("DOWN 1/2") and not haproxy.serving("MAINT") and not haproxy.serving(None)
    assert haproxy.server_status(stat, "engines", "node2") is None
