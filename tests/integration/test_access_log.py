"""A real ``specroute serve``'s logs: one whole access-log line per request, in order, all out at SIGTERM,
and every other line in the gateway's format, from every worker.

The lines are written by a thread in batches (``gateway.accesslog``); a stop must not lose the batch
still gathering, and with several workers sharing stdout no line may be cut by another's.
"""

from __future__ import annotations

import re
import signal
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import orjson
import pytest

from gateway import stack

MODEL = "demo-model"
REQUESTS = 240


@pytest.fixture(scope="module")
def emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[stack.Process]:
    extra = ["--served-model-name", MODEL, "--time-scale", "0"]
    proc = stack.start_emulator("baseline", extra=extra, log_dir=tmp_path_factory.mktemp("emulator"))
    with stack.running(proc):
        yield proc


def _send(url: str, n: int) -> list[str]:
    """``n`` completions, 8 at a time; the request ids that came back 200."""

    def one(i: int) -> str | None:
        rid = f"req-{i:04d}"
        body = {"model": MODEL, "prompt": f"Say {i}.", "max_tokens": 2}
        resp = client.post(url + "/v1/completions", json=body, headers={"x-request-id": rid})
        return rid if resp.status_code == 200 else None

    with httpx.Client(timeout=30) as client, ThreadPoolExecutor(8) as pool:
        return [rid for rid in pool.map(one, range(n)) if rid]


def _access_lines(log: str) -> list[dict[str, object]]:
    """Every access-log line; anything else starting with ``{`` would be a cut or merged line."""
    out = []
    for line in log.splitlines():
        if line.startswith("{"):
            rec = orjson.loads(line)  # a partial or interleaved line fails here
            assert isinstance(rec, dict)
            out.append(rec)
    return out


@pytest.mark.parametrize("workers", [1, 2])
def test_every_line_is_whole_and_out_once_the_gateway_stops(
    emulator: stack.Process, tmp_path: Path, workers: int
) -> None:
    config = stack.demo_config(
        [emulator.url], [emulator.url], stack.free_port(), MODEL, "always-baseline",
        extra={"server": {"workers": workers}},
    )  # fmt: skip
    gateway = stack.start_gateway(config, tmp_path)
    with stack.running(gateway):
        ids = _send(gateway.url, REQUESTS)
        assert len(ids) == REQUESTS
        # SIGTERM right after the last answer: the last batch is still gathering. uvicorn re-raises the
        # signal once shut down (one worker), or its supervisor exits 0 (several)
        assert gateway.stop() in (0, -signal.SIGTERM)
    lines = [rec for rec in _access_lines(gateway.log()) if str(rec.get("request_id", "")).startswith("req-")]
    assert sorted(str(rec["request_id"]) for rec in lines) == sorted(ids)  # each once, none lost
    if workers == 1:
        # one writer: lines in the order the requests finished
        stamps = [float(str(rec["ts"])) for rec in lines]
        assert stamps == sorted(stamps)


#: the gateway's log format (``gateway.observability.configure_logging``)
LOG_LINE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) [\w.]+: \S")


@pytest.mark.parametrize("workers", [1, 2])
def test_every_process_logs_in_the_gateways_format_uvicorn_included(
    emulator: stack.Process, tmp_path: Path, workers: int
) -> None:
    down = f"http://127.0.0.1:{stack.free_port()}"  # nothing listens: each worker warns that it is unhealthy
    config = stack.demo_config(
        [down], [emulator.url], stack.free_port(), MODEL, "always-baseline",
        extra={"server": {"workers": workers}},
    )  # fmt: skip
    gateway = stack.start_gateway(config, tmp_path)
    with stack.running(gateway):
        with socket.create_connection(("127.0.0.1", int(gateway.url.rsplit(":", 1)[1]))) as sock:
            sock.sendall(b"NOT HTTP\r\n\r\n")  # uvicorn logs a warning of its own
            assert sock.recv(65536).startswith(b"HTTP/1.1 400")
        assert gateway.stop() in (0, -signal.SIGTERM)
    lines = [line for line in gateway.log().splitlines() if line and not line.startswith("{")]
    assert [line for line in lines if "is unhealthy" in line], "no worker warned of the endpoint that is down"
    assert [line for line in lines if "uvicorn.error: Invalid HTTP request received" in line]
    assert all(LOG_LINE.match(line) for line in lines), [line for line in lines if not LOG_LINE.match(line)]
