"""SIGTERM on a real ``specroute serve`` process while a stream from a time-scaled emulator is running.

Kubernetes sends SIGTERM and, ``terminationGracePeriodSeconds`` later, SIGKILL: in-flight streams
must end intact within ``server.shutdown_grace_s``, new connections must go elsewhere, and the
process must be gone in time even when a stream is longer than the grace period.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
import httpx
import orjson
import pytest
import uvicorn
import yaml

from gateway import stack
from gateway.app import create_app
from gateway.config import load_settings
from gateway.server import DrainingServer

MODEL = "demo-model"
TOKENS = 80  # one token per 45 ms step on the baseline emulator at time scale 1: a stream of ~4 s
#: what the deployment allows beyond the grace period for the lifespan shutdown and interpreter exit
EXIT_MARGIN_S = 5.0


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("shutdown")


@pytest.fixture(scope="module")
def emulator(workdir) -> Iterator[stack.Process]:
    extra = ["--served-model-name", MODEL, "--time-scale", "1", "--max-num-seqs", "8"]
    proc = stack.start_emulator("baseline", extra=extra, log_dir=workdir)
    with stack.running(proc):
        yield proc


def _config(emulator: stack.Process, grace_s: float) -> dict[str, object]:
    return stack.demo_config(
        [emulator.url],
        [emulator.url],
        stack.free_port(),
        MODEL,
        "always-baseline",
        extra={"server": {"shutdown_grace_s": grace_s}},
    )


STREAMED = {
    "model": MODEL,
    "prompt": "Write a long story about a lighthouse keeper.",
    "max_tokens": TOKENS,
    "ignore_eos": True,
    "stream": True,
    "stream_options": {"include_usage": True},
}


class Stream(threading.Thread):
    """A streamed completion (or another route's stream) read in the background, chunk by chunk."""

    def __init__(self, url: str, path: str = "/v1/completions", payload: dict[str, object] = STREAMED):
        super().__init__(daemon=True)
        self.url = url
        self.path = path
        self.payload = payload
        self.body = b""
        self.error: Exception | None = None
        self.started = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream("POST", self.url + self.path, json=self.payload, timeout=60) as r:
                assert r.status_code == 200
                for chunk in r.iter_raw():
                    self.body += chunk
                    self.started.set()
        except Exception as e:
            self.error = e
        finally:
            self.started.set()

    def events(self) -> list[bytes]:
        return [e.removeprefix(b"data: ") for e in self.body.split(b"\n\n") if e]


def _refused(url: str) -> bool:
    parts = urlsplit(url)
    try:
        with socket.create_connection((parts.hostname, parts.port), timeout=1.0):
            return False
    except (ConnectionRefusedError, ConnectionResetError):  # reset: it was in the closing listener's queue
        return True


def _idle_keepalive(url: str) -> socket.socket:
    """A connection that has finished one request and stays open, as a client's pool keeps it."""
    parts = urlsplit(url)
    sock = socket.create_connection((parts.hostname, parts.port), timeout=5.0)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(65536)
    head, _, body = reply.partition(b"\r\n\r\n")
    length = int(
        next(h for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")).split(b":")[1]
    )
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
    return sock


def _start_stream(gateway: stack.Process) -> Stream:
    stream = Stream(gateway.url)
    stream.start()
    assert stream.started.wait(30) and stream.error is None, stream.error
    assert stream.is_alive(), "the stream ended before the test could interrupt it"
    return stream


def test_sigterm_lets_a_live_stream_finish_and_refuses_new_connections(emulator, workdir):
    grace_s = 20.0
    gateway = stack.start_gateway(_config(emulator, grace_s), workdir, "gateway-grace")
    with stack.running(gateway):
        idle = _idle_keepalive(gateway.url)
        stream = _start_stream(gateway)

        gateway.popen.send_signal(signal.SIGTERM)
        terminated = time.monotonic()

        refused_while_streaming = False
        while stream.is_alive() and not refused_while_streaming:
            refused_while_streaming = _refused(gateway.url)
            time.sleep(0.05)
        assert refused_while_streaming, "a new connection was accepted after SIGTERM"

        idle.settimeout(grace_s)
        assert idle.recv(1) == b"", "an idle keep-alive connection was left open"
        idle.close()

        stream.join(grace_s)
        assert not stream.is_alive() and stream.error is None, stream.error
        events = stream.events()
        assert events[-1] == b"[DONE]"
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert chunks[-1]["usage"]["completion_tokens"] == TOKENS
        assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"

        gateway.popen.wait(max(0.0, grace_s - (time.monotonic() - terminated)))
        assert gateway.popen.returncode == 0, gateway.log()[-2000:]  # a drained stop is a clean exit
    assert "timeout graceful shutdown exceeded" not in gateway.log()


def test_sighup_drains_like_sigterm_and_the_learned_state_is_written_at_the_end(emulator, workdir):
    """SIGHUP (a closed terminal, a service manager's reload) used to end the process at once, mid-stream."""
    state = workdir / "learned.json"
    config = _config(emulator, 20.0)
    config["routing"] = {**config["routing"], "state_file": str(state)}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, "gateway-hup")
    with stack.running(gateway):
        stream = _start_stream(gateway)
        gateway.popen.send_signal(signal.SIGHUP)
        stream.join(20.0)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.events()[-1] == b"[DONE]"
        gateway.popen.wait(20.0)
        assert gateway.popen.returncode == 0, gateway.log()[-2000:]
    saved = orjson.loads(state.read_bytes())
    assert saved["format"] == 1 and saved["deployment"]["speculative_models"] == [MODEL]
    assert saved["policy"]["residence_s"]["baseline"] > 0  # the stream that drained was learned from


def test_several_workers_refuse_new_connections_while_a_stream_drains(emulator, workdir):
    """With ``server.workers`` above 1 the supervisor holds the listening socket too: it must let it go
    at SIGTERM, else new connections are accepted by the kernel and wait, unanswered, for the drain."""
    config = _config(emulator, 20.0)
    config["server"] = {**config["server"], "workers": 2}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, "gateway-workers")
    with stack.running(gateway):
        stream = _start_stream(gateway)

        gateway.popen.send_signal(signal.SIGTERM)

        refused_while_streaming = False
        while stream.is_alive() and not refused_while_streaming:
            refused_while_streaming = _refused(gateway.url)
            time.sleep(0.05)
        assert refused_while_streaming, "a new connection was accepted after SIGTERM"

        stream.join(20)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.events()[-1] == b"[DONE]"
        assert gateway.popen.wait(20) == 0, gateway.log()[-2000:]


def test_sighup_to_several_workers_replaces_them_one_at_a_time_with_the_changed_configuration(
    emulator, workdir
):
    """The supervisor's SIGHUP: each new worker reads the configuration file again and serves before
    the old one drains, so a stream in flight ends whole and no request is refused meanwhile."""
    config = _config(emulator, 20.0)
    config["server"] = {**config["server"], "workers": 2}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, "gateway-reload")
    with stack.running(gateway):
        stream = _start_stream(gateway)
        config["routing"] = {**config["routing"], "strategy": "always-speculative"}  # type: ignore[dict-item]
        (workdir / "gateway-reload.yaml").write_text(yaml.safe_dump(config))
        gateway.popen.send_signal(signal.SIGHUP)
        streak, deadline = 0, time.monotonic() + 30
        while streak < 6 and time.monotonic() < deadline:
            # every request answered, by an old worker or a new one, while they are replaced
            r = httpx.get(gateway.url + "/admin/routing", timeout=10, headers={"connection": "close"})
            assert r.status_code == 200
            streak = streak + 1 if r.json()["strategy"] == "always-speculative" else 0
            time.sleep(0.1)
        assert streak == 6, "the workers did not take up the changed configuration"
        stream.join(20)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.events()[-1] == b"[DONE]"
        assert gateway.popen.poll() is None  # still serving
        log = gateway.log()
        assert "SIGHUP: replacing the 2 workers one at a time" in log
        assert "a replacement was started" not in log  # workers retired by the reload did not die


def _workers(supervisor: int) -> set[int]:
    """The supervisor's worker processes (its other child is multiprocessing's resource tracker)."""
    children = Path(f"/proc/{supervisor}/task/{supervisor}/children").read_text().split()
    return {
        int(pid) for pid in children if b"resource_tracker" not in Path(f"/proc/{pid}/cmdline").read_bytes()
    }


@pytest.mark.parametrize("supervisor_too", [False, True], ids=["workers", "every-process"])
def test_sighup_to_the_workers_themselves_drains_them_and_the_supervisor_replaces_them(
    emulator, workdir, supervisor_too
):
    """``pkill -HUP specroute`` (or a service manager signalling every process) reaches the workers:
    each drains as on SIGTERM (its stream ends whole) and the supervisor starts another in its place,
    also while the supervisor, signalled with them, replaces its workers itself."""
    config = _config(emulator, 20.0)
    config["server"] = {**config["server"], "workers": 2}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, f"gateway-worker-hup-{supervisor_too}")
    with stack.running(gateway):
        stream = _start_stream(gateway)
        first = _workers(gateway.popen.pid)
        assert len(first) == 2
        if supervisor_too:  # a service manager signals the unit's process group: multiprocessing's
            os.killpg(gateway.popen.pid, signal.SIGHUP)  # resource tracker too
        else:
            for pid in first:
                os.kill(pid, signal.SIGHUP)
        stream.join(20)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.events()[-1] == b"[DONE]"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (len(now := _workers(gateway.popen.pid)) < 2 or now & first):
            time.sleep(0.2)
        assert len(now) == 2 and not now & first, (first, now)
        r = httpx.post(gateway.url + "/v1/completions", json={**PLAIN, "max_tokens": 2}, timeout=30)
        assert r.status_code == 200
        assert gateway.popen.poll() is None  # the supervisor still serving
        if not supervisor_too:
            # each worker's end is a line: a clean exit once drained (one still starting, its handlers not
            # yet set, dies of the signal), and one killed by the kernel; the line comes once the
            # supervisor has started the replacement, which may show first
            ended = re.compile(
                r"worker (\d+) (exited with status 0|was killed by SIGHUP); a replacement was started"
            )
            deadline = time.monotonic() + 30
            while not first <= {int(m.group(1)) for m in ended.finditer(gateway.log())}:
                assert time.monotonic() < deadline, gateway.log()[-3000:]
                time.sleep(0.2)
            killed = min(now)
            os.kill(killed, signal.SIGKILL)
            line = f"worker {killed} was killed by SIGKILL; a replacement was started"
            deadline = time.monotonic() + 30
            while line not in gateway.log():
                assert time.monotonic() < deadline, gateway.log()[-3000:]
                time.sleep(0.2)
    assert "resource_tracker" not in gateway.log()  # it ignores SIGHUP, rather than dying of it


def test_workers_whose_supervisor_is_killed_drain_and_free_the_port(emulator, workdir):
    """A supervisor killed outright cannot stop its workers: they drain on their own (a live stream ends
    whole) and exit, so the port is free for the gateway's next start instead of held by orphans."""
    config = _config(emulator, 20.0)
    config["server"] = {**config["server"], "workers": 2}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, "gateway-orphans")
    with stack.running(gateway):
        stream = _start_stream(gateway)
        workers = _workers(gateway.popen.pid)
        assert len(workers) == 2
        gateway.popen.kill()
        stream.join(30)
        assert not stream.is_alive() and stream.error is None, stream.error
        assert stream.events()[-1] == b"[DONE]"
        deadline = time.monotonic() + 30
        while alive := {pid for pid in workers if Path(f"/proc/{pid}").exists()}:
            if time.monotonic() > deadline:
                for pid in alive:
                    os.kill(pid, signal.SIGKILL)
                raise AssertionError(f"workers {alive} outlived their supervisor:\n{gateway.log()[-3000:]}")
            time.sleep(0.2)
        assert _refused(gateway.url)
        assert "its supervisor" in gateway.log() and "is gone; draining" in gateway.log()


PLAIN = {"model": MODEL, "prompt": "Tell a long story.", "max_tokens": TOKENS, "ignore_eos": True}
SHORT = {"model": MODEL, "prompt": "Say hi.", "max_tokens": 2}


def _post_on(sock: socket.socket, payload: dict[str, object]) -> tuple[bytes, bytes]:
    """POST a completion on an open connection and read the whole answer: its head and body."""
    body = orjson.dumps(payload)
    sock.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    reply = b""
    while b"\r\n\r\n" not in reply:
        chunk = sock.recv(65536)
        assert chunk, f"the connection ended without an answer: {reply!r}"
        reply += chunk
    head, _, rest = reply.partition(b"\r\n\r\n")
    length = int(
        next(h for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")).split(b":")[1]
    )
    while len(rest) < length:
        chunk = sock.recv(65536)
        assert chunk, "the connection ended in the middle of the answer"
        rest += chunk
    return head, rest


def test_a_request_on_an_idle_keepalive_connection_as_the_workers_drain_is_answered(emulator, workdir):
    """A drain closed idle keep-alive connections at once: a client (an ingress's pooled connection)
    sending its next request at that moment had it reset, and a POST is not sent again. The request
    that arrives on one during the drain is answered in full, with ``Connection: close``."""
    config = _config(emulator, 20.0)
    config["server"] = {**config["server"], "workers": 2}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, "gateway-idle-drain")
    with stack.running(gateway):
        idle = _idle_keepalive(gateway.url)
        gateway.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        while not _refused(gateway.url) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _refused(gateway.url)  # every process has let the listener go: the workers are draining
        head, body = _post_on(idle, SHORT)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), head
        assert orjson.loads(body)["usage"]["completion_tokens"] == 2
        idle.settimeout(10)
        assert idle.recv(1) == b""  # then closed, cleanly
        idle.close()
        assert gateway.popen.wait(20) == 0, gateway.log()[-2000:]


def _alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` still running (or not yet reaped by the supervisor)."""
    return {pid for pid in pids if Path(f"/proc/{pid}").exists()}


async def _until(done: Callable[[], bool], within_s: float = 30.0) -> None:
    """Wait, letting the clients run, until ``done()`` (no process here offers an event to wait on)."""
    for _ in range(int(within_s / 0.05)):
        if done():
            return
        await asyncio.sleep(0.05)


async def _keep_posting(
    url: str, stop: asyncio.Event, answered: list[int], failed: list[str], opened: list[object]
) -> None:
    """One client on one keep-alive connection at a time, posting short completions until ``stop``;
    each connection it opens is noted in ``opened``."""

    async def note(*args: object) -> None:
        opened.append(args)

    trace = aiohttp.TraceConfig()
    trace.on_connection_create_end.append(note)
    connector = aiohttp.TCPConnector(limit=1)
    async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as session:
        while not stop.is_set():
            try:
                async with session.post(url + "/v1/completions", json=SHORT) as r:
                    await r.read()
                    if r.status == 200:
                        answered.append(r.status)
                    else:
                        failed.append(f"HTTP {r.status}")
            except aiohttp.ClientError as e:
                failed.append(repr(e))


@pytest.mark.load  # thousands of requests across a reload: `make test-timing`
async def test_keep_alive_clients_lose_no_request_while_sighup_replaces_the_workers(workdir):
    """8 clients posting over keep-alive connections while the supervisor's SIGHUP replaces both
    workers: every request is answered (3-6 of ~1,900 were reset as the old workers drained)."""
    extra = ["--served-model-name", MODEL, "--time-scale", "0", "--max-num-seqs", "64"]
    quick = stack.start_emulator("baseline", extra=extra, log_dir=workdir)
    config = _config(quick, 20.0)
    config["server"] = {**config["server"], "workers": 2}  # type: ignore[dict-item]
    gateway = stack.start_gateway(config, workdir, "gateway-reload-load")
    with stack.running(quick, gateway):
        first = _workers(gateway.popen.pid)
        stop = asyncio.Event()
        answered: list[int] = []
        failed: list[str] = []
        opened: list[object] = []
        clients = [
            asyncio.create_task(_keep_posting(gateway.url, stop, answered, failed, opened)) for _ in range(8)
        ]
        await _until(lambda: len(answered) >= 100)
        gateway.popen.send_signal(signal.SIGHUP)
        # until both old workers have drained and exited (each new one serves before an old one drains)
        await _until(lambda: not _alive(first))
        stop.set()
        await asyncio.gather(*clients)
        assert not _alive(first), first
        assert gateway.popen.poll() is None  # the supervisor still serving
    assert failed == [], f"{len(failed)} of {len(answered) + len(failed)} requests failed: {failed[:5]}"
    assert len(opened) > 8  # the old workers' connections ended and the clients opened new ones


class Plain(threading.Thread):
    """A non-streamed completion (or another route's request) waited for in the background."""

    def __init__(self, url: str, path: str = "/v1/completions", payload: dict[str, object] = PLAIN):
        super().__init__(daemon=True)
        self.url = url
        self.path = path
        self.payload = payload
        self.response: httpx.Response | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            self.response = httpx.post(self.url + self.path, json=self.payload, timeout=60)
        except Exception as e:
            self.error = e


def _running(emulator: stack.Process) -> int:
    return int(httpx.get(emulator.url + "/emulator/state", timeout=5).json()["counters"]["running"])


def test_requests_longer_than_the_grace_period_end_in_the_apis_format_without_delaying_exit(
    emulator, workdir
):
    grace_s = 1.0
    gateway = stack.start_gateway(_config(emulator, grace_s), workdir, "gateway-short")
    with stack.running(gateway):
        stream = _start_stream(gateway)
        plain = Plain(gateway.url)
        _cut_both(gateway, emulator, grace_s, stream, plain)
        assert not stream.is_alive() and not plain.is_alive()
        # the stream was cut: an error event, then the end of the stream
        assert stream.error is None, stream.error
        events = stream.events()
        assert events[-1] == b"[DONE]"
        assert orjson.loads(events[-2])["error"]["code"] == 503
        # the non-streamed request: an OpenAI-shaped 503, not uvicorn's plain-text 500
        assert plain.error is None and plain.response is not None, plain.error
        assert plain.response.status_code == 503
        assert plain.response.headers["content-type"] == "application/json"
        assert plain.response.json()["error"]["type"] == "ServiceUnavailableError"
    # uvicorn's line for it, a routine end of a rollout with long streams, is a warning, not an error
    assert "WARNING uvicorn.error: Cancel" in gateway.log() and " ERROR " not in gateway.log()
    # each is logged once, as the 503 the client got (not a 499, "client closed", nor left out)
    lines = _access_log(gateway)
    assert sorted(line["status"] for line in lines) == [503, 503], lines
    # under the id the client was told, so that its answer can be found in the log
    assert plain.response.headers["x-request-id"] in {line["request_id"] for line in lines}
    assert all(line["decided_pool"] == "baseline" for line in lines), lines


def test_a_responses_request_cut_at_the_end_of_the_grace_period_is_logged_as_its_503(emulator, workdir):
    grace_s = 1.0
    gateway = stack.start_gateway(_config(emulator, grace_s), workdir, "gateway-responses")
    body = {"model": MODEL, "input": "Tell a long story.", "max_output_tokens": TOKENS}
    with stack.running(gateway):
        stream = Stream(gateway.url, "/v1/responses", {**body, "stream": True})
        stream.start()
        plain = Plain(gateway.url, "/v1/responses", body)
        _cut_both(gateway, emulator, grace_s, stream, plain)
        assert plain.response is not None and plain.response.status_code == 503
    lines = _access_log(gateway, "responses")
    assert sorted(line["status"] for line in lines) == [503, 503], lines


def _cut_both(
    gateway: stack.Process, emulator: stack.Process, grace_s: float, stream: Stream, plain: Plain
) -> None:
    """Start ``plain`` beside the running ``stream``, then SIGTERM once both are in flight upstream."""
    plain.start()
    deadline = time.monotonic() + 30
    while _running(emulator) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(emulator) >= 2
    gateway.popen.send_signal(signal.SIGTERM)
    gateway.popen.wait(grace_s + EXIT_MARGIN_S)
    stream.join(10)
    plain.join(10)


def _access_log(process: stack.Process, route: str = "completions") -> list[dict[str, object]]:
    """The access-log lines of the requests of ``route`` a process served (its stdout's JSON lines)."""
    lines = [orjson.loads(line) for line in process.log().splitlines() if line.startswith("{")]
    return [line for line in lines if line.get("route") == route]


async def test_ready_turns_503_once_the_server_is_told_to_exit(emulator):
    settings = load_settings(overrides=_config(emulator, 5.0))
    app = create_app(settings)
    server = DrainingServer(uvicorn.Config(app), app)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            assert (await client.get("/ready")).status_code == 200
            server.handle_exit(signal.SIGTERM, None)
            assert server.should_exit
            assert (await client.get("/ready")).status_code == 503
