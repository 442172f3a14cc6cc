"""Readiness of the processes the stack starts: a port someone else holds is named, not waited on."""

from __future__ import annotations

import http.server
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from gateway import stack


class _Healthy(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # another server, healthy, without the run's token
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def foreign() -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Healthy)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


def test_check_port_free(foreign: int) -> None:
    with pytest.raises(stack.PortInUse) as caught:
        stack.check_port_free(foreign)
    assert str(caught.value) == f"port {foreign} is in use; pass --port"
    stack.check_port_free(stack.free_port())


def test_a_healthy_server_without_the_token_is_foreign(foreign: int) -> None:
    exited = subprocess.Popen([sys.executable, "-c", "pass"])
    exited.wait()
    with pytest.raises(stack.PortInUse):
        stack.wait_healthy(f"http://127.0.0.1:{foreign}/health", exited, timeout=5, token="ours")
    with pytest.raises(stack.PortInUse):
        stack.wait_healthy(f"http://127.0.0.1:{foreign}/health", None, timeout=0.3, token="ours")
    stack.wait_healthy(f"http://127.0.0.1:{foreign}/health", None, timeout=5)  # no token asked: fine


def test_nothing_listening_is_a_timeout_not_a_port_in_use() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(TimeoutError):
        stack.wait_healthy(f"http://127.0.0.1:{port}/health", None, timeout=0.3, token="ours")
