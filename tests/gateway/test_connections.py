"""Hostile clients against a real uvicorn on 127.0.0.1: slow heads and bodies, idle and surplus connections.

Short limits and assertions on what the server does (answers, closes), never on how long it took.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import openai
import orjson
import uvicorn
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.app import create_app, fast_path
from gateway.config import load_settings
from gateway.connections import (
    MAX_PIPELINED,
    ConnectionLimits,
    CycleWriter,
    GuardedHttpProtocol,
    HeadWithBody,
)
from gateway.server import DrainingServer, guard_connections, uvicorn_options
from gateway.stack import demo_config, free_port

NOWHERE = "http://127.0.0.1:9"  # the routes under test never reach an upstream
#: bounds how long a test waits for the server to act; far above every limit configured here
PATIENCE_S = 20.0


@contextmanager
def serving(upstream: str = NOWHERE, extra: dict[str, Any] | None = None, **server: float) -> Iterator[int]:
    """The gateway as ``specroute serve`` runs it (same protocol and options), in a thread; ``extra``:
    more of its configuration."""
    with serving_server(upstream, extra, **server) as (port, _, _):
        yield port


@contextmanager
def serving_server(
    upstream: str = NOWHERE, extra: dict[str, Any] | None = None, **server: float
) -> Iterator[tuple[int, DrainingServer, threading.Thread]]:
    """:func:`serving`, with the server (to tell it to drain) and the thread it runs in (to see it end)."""
    port = free_port()
    config = demo_config([upstream], [upstream], port, extra={**(extra or {}), "server": server})
    settings = load_settings(overrides=config)
    previous = GuardedHttpProtocol.limits
    guard_connections(settings.server)
    app = create_app(settings)
    uv = DrainingServer(uvicorn.Config(fast_path(app), **uvicorn_options(settings)), app)
    thread = threading.Thread(target=uv.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + PATIENCE_S
        while not uv.started and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.02)  # uvicorn offers no start-up event to wait on
        assert uv.started
        yield port, uv, thread
    finally:
        uv.should_exit = True
        thread.join(PATIENCE_S)
        GuardedHttpProtocol.limits = previous


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S)
    return sock


def _read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def _response(sock: socket.socket) -> tuple[bytes, bytes]:
    """One response with a Content-Length: its head and body; the connection stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the connection closed before a response"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(h.split(b":")[1]) for h in head.lower().split(b"\r\n") if h.startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head, body


def _error(body: bytes) -> dict[str, object]:
    err = orjson.loads(body)["error"]
    assert isinstance(err, dict) and err["message"]
    return err


HEALTH = b"GET /health HTTP/1.1\r\nHost: gateway\r\n\r\n"
_PROMPT = orjson.dumps({"model": "demo-model", "prompt": "x" * 200_000})
CHAT = b"POST /v1/completions HTTP/1.1\r\nHost: gateway\r\ncontent-length: %d\r\n\r\n%s" % (
    len(_PROMPT),
    _PROMPT,
)


def test_slow_heads_idle_connections_and_slow_bodies_are_cut() -> None:
    with serving(header_timeout_s=0.5, body_timeout_s=0.5, keep_alive_s=0.5, max_header_bytes=2048) as port:
        # a head within the limit is served; one beyond it gets a 431 and the connection is closed
        fits = _connect(port)
        fits.sendall(HEALTH.replace(b"\r\n\r\n", b"\r\nx-pad: " + b"a" * 1500 + b"\r\n\r\n"))
        assert _response(fits)[0].startswith(b"HTTP/1.1 200")
        huge = _connect(port)
        huge.sendall(b"GET /health HTTP/1.1\r\nHost: gateway\r\nx-pad: " + b"a" * 4000)
        received = _read_until_closed(huge)
        assert received.startswith(b"HTTP/1.1 431"), received[:100]
        assert _error(received.partition(b"\r\n\r\n")[2])["code"] == 431

        # a head sent a byte at a time never completes: 408, then closed
        slow = _connect(port)
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\n")
        slow.settimeout(0.1)
        received = b""
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            try:
                slow.sendall(b"x")
                received += slow.recv(65536)
                if received:
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        slow.settimeout(PATIENCE_S)
        received += _read_until_closed(slow)
        assert received.startswith(b"HTTP/1.1 408"), received
        assert _error(received.partition(b"\r\n\r\n")[2])["code"] == 408

        # a connection that never sends a byte is closed without an answer
        assert _read_until_closed(_connect(port)) == b""

        # an idle keep-alive connection is closed after its response
        idle = _connect(port)
        idle.sendall(HEALTH)
        head, _ = _response(idle)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        assert _read_until_closed(idle) == b""

        # a body that stops arriving: 408 in the API's format, and the connection is closed
        body = _connect(port)
        body.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: gateway\r\ncontent-type: application/json\r\n"
            b"content-length: 100\r\n\r\n" + b'{"messages": ['
        )
        received = _read_until_closed(body)
        head, _, rest = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408") and b"connection: close" in head.lower(), head
        assert _error(rest)["code"] == 408


def _head_of(size: int, path: bytes = b"/health") -> bytes:
    """A request head of exactly ``size`` bytes, up to and including its blank line."""
    head = b"GET %s HTTP/1.1\r\nHost: gateway\r\nx-pad: \r\n\r\n" % path
    return head.replace(b"x-pad: ", b"x-pad: " + b"a" * (size - len(head)))


def _refused_as_too_large(sock: socket.socket) -> None:
    received = _read_until_closed(sock)  # answered, then closed by the server
    head, _, body = received.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 431") and b"connection: close" in head.lower(), received[:200]
    assert _error(body)["code"] == 431


def test_a_head_over_the_limit_gets_a_431_however_it_arrives() -> None:
    limit = 2048
    with serving(max_header_bytes=limit, header_timeout_s=PATIENCE_S) as port:
        # whole, in one write: at the limit it is served, one byte over it is not
        with _connect(port) as sock:
            sock.sendall(_head_of(limit))
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        with _connect(port) as sock:
            sock.sendall(_head_of(limit + 1))
            _refused_as_too_large(sock)

        # in two writes, neither over the limit alone
        with _connect(port) as sock:
            head = _head_of(limit + 1000)
            sock.sendall(head[:1500])
            time.sleep(0.05)  # most likely two reads; the answer is the same if they arrive as one
            sock.sendall(head[1500:])
            _refused_as_too_large(sock)

        # the second request of a kept-alive connection, in a read of its own
        with _connect(port) as sock:
            sock.sendall(_head_of(limit))
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")
            sock.sendall(_head_of(limit + 1))
            _refused_as_too_large(sock)

        # pipelined behind a request in the same write: the first is answered, then the 431
        with _connect(port) as sock:
            sock.sendall(HEALTH + _head_of(limit + 1))
            received = _read_until_closed(sock)
            first, _, rest = received.partition(b"\r\n\r\n")
            assert first.startswith(b"HTTP/1.1 200"), received[:200]
            assert rest.startswith(b'{"status":"ok"}HTTP/1.1 431'), received[:300]


def test_the_default_limit_holds_for_a_head_that_arrives_in_one_write() -> None:
    with serving() as port:
        with _connect(port) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n")
            _refused_as_too_large(sock)
        with _connect(port) as sock:
            sock.sendall(_head_of(65536))
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")


def test_connections_beyond_the_cap_are_refused_while_open_ones_keep_working() -> None:
    with serving(max_connections=3, keep_alive_s=60, header_timeout_s=60) as port:
        held = [_connect(port) for _ in range(3)]
        for sock in held:
            sock.sendall(HEALTH)
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")

        metrics = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
        for request in (metrics, CHAT):  # with a body too: the answer is read, not lost to a reset
            surplus = _connect(port)
            surplus.sendall(request)
            received = _read_until_closed(surplus)
            head, _, rest = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 503") and b"connection: close" in head.lower(), head
            assert b"x-request-id:" in head.lower()
            assert _error(rest)["type"] == "ServiceUnavailableError"
        # a liveness probe is answered however busy the gateway is (failing it would restart the
        # gateway and cut every stream it holds); the connection closes all the same
        surplus = _connect(port)
        surplus.sendall(HEALTH)
        head, _, rest = _read_until_closed(surplus).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), head

        for sock in held:  # the connections already open are served as before
            sock.sendall(HEALTH)
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        held[1].sendall(metrics)  # the refusals are counted like any answer
        text = _response(held[1])[1]
        refused = [
            line
            for line in text.splitlines()
            if line.startswith(b"specroute_requests_total{") and b'status="503"' in line
        ]
        assert any(b'route="completions"' in line for line in refused), refused
        assert any(b'route="other"' in line for line in refused), refused
        held[0].close()
        # with one closed, a new connection is served again (closing is seen asynchronously: poll)
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            again = _connect(port)
            again.sendall(metrics)
            head, _, _ = _read_head(again)
            if head.startswith(b"HTTP/1.1 200"):
                break
        assert head.startswith(b"HTTP/1.1 200")


def test_the_open_connections_are_counted_for_operators() -> None:
    """What ``server.max_connections`` bounds, in ``/metrics``: a gateway near its cap shows before it
    refuses (idle keep-alive connections count)."""

    def open_now(sock: socket.socket) -> float:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        text = _response(sock)[1]
        (line,) = [x for x in text.splitlines() if x.startswith(b"specroute_open_connections ")]
        return float(line.split()[1])

    with serving(keep_alive_s=60, header_timeout_s=60) as port:
        asking = _connect(port)
        assert open_now(asking) == 1.0
        held = [_connect(port) for _ in range(4)]
        for sock in held:  # accepted once they have been answered
            sock.sendall(HEALTH)
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        assert open_now(asking) == 5.0
        for sock in held:
            sock.close()
        deadline = time.monotonic() + PATIENCE_S  # a close is seen asynchronously: poll
        while open_now(asking) != 1.0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert open_now(asking) == 1.0


def _read_head(sock: socket.socket) -> tuple[bytes, bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data.partition(b"\r\n\r\n")


def test_a_connection_answered_before_its_body_arrived_is_closed_not_held_by_a_dripping_body() -> None:
    """A body announced but not sent (a refused request, a route that reads none): after the answer the
    connection closes, however the client goes on dripping bytes of it."""
    with serving(keep_alive_s=60, body_timeout_s=60) as port:
        for head in (
            b"GET /health HTTP/1.1\r\nHost: gateway\r\ncontent-length: 100000000\r\n\r\n",
            b"POST /v1/nope HTTP/1.1\r\nHost: gateway\r\ncontent-length: 100000000\r\n\r\n{",
        ):
            sock = _connect(port)
            sock.sendall(head)
            answer, _ = _response(sock)
            assert answer.startswith((b"HTTP/1.1 200", b"HTTP/1.1 4"))
            with contextlib.suppress(OSError):  # the server may have closed already
                sock.sendall(b"x")
            sock.settimeout(10)
            try:
                rest = _read_until_closed(sock)
            except ConnectionResetError:  # closed with the dripped byte unread: the kernel says reset
                rest = b""
            assert rest == b""  # closed by the server, long before its 60 s limits
            sock.close()
        # a request whose body came whole keeps its connection for the next one
        sock = _connect(port)
        for _ in range(2):
            sock.sendall(HEALTH)
            assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        sock.close()


def _refused(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=PATIENCE_S):
            return False
    except ConnectionRefusedError:
        return True


def test_a_drain_answers_a_request_on_an_idle_connection_and_ends_the_silent_ones() -> None:
    """A drain (SIGTERM, a SIGHUP replacing the workers) closed idle keep-alive connections at once: a
    client sending its next request on one at that moment met a closed socket (a reset, "Server
    disconnected") and lost a request it could not safely send again. Now the request is answered, with
    ``Connection: close``, and the connection ends after it; a connection that sends nothing is ended
    (without a reset, though its client keeps it open) and does not hold the drain for the grace period."""
    with serving_server(shutdown_grace_s=3600) as (port, uv, thread):
        idle = _connect(port)
        idle.sendall(HEALTH)
        head, _ = _response(idle)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower()
        silent = _connect(port)  # opened and never used, as a pool's spare connection

        uv.should_exit = True
        # uvicorn closes the listener in the same turn as it tells the connections to drain
        deadline = time.monotonic() + PATIENCE_S
        while not _refused(port) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _refused(port)

        idle.sendall(HEALTH)  # the next request of a client that knows nothing of the drain
        head, body = _response(idle)
        assert head.startswith(b"HTTP/1.1 200") and b"connection: close" in head.lower(), head
        assert orjson.loads(body)
        assert _read_until_closed(idle) == b""  # closed after the answer, cleanly
        idle.close()

        assert _read_until_closed(silent) == b""  # ended by the server: an end, not a reset
        thread.join(PATIENCE_S)  # with the silent connection still open on this side
        assert not thread.is_alive(), "an idle connection held the drain"
        silent.close()


def test_limits_default_to_safe_values() -> None:
    settings = load_settings(overrides=demo_config([NOWHERE], [NOWHERE], 8000))
    options = uvicorn_options(settings)
    assert options["http"] is GuardedHttpProtocol and options["timeout_keep_alive"] == 120.0
    assert ConnectionLimits().header_timeout_s == settings.server.header_timeout_s == 10.0
    assert settings.server.max_connections == 2048 and settings.server.body_timeout_s == 30.0


def test_the_default_keep_alive_outlives_the_common_clients_own_idle_expiry() -> None:
    """A client drops its idle pooled connection before the gateway does: else the two race.

    Where the server closes an idle connection at the moment the client sends its next request on it, that
    request fails with no answer (httpx: ``RemoteProtocolError``/``ReadError``; a POST is not resent). It
    cannot happen while the client gives up on the connection first.
    """
    default = load_settings(overrides=demo_config([NOWHERE], [NOWHERE], 8000)).server.keep_alive_s
    expiries = {
        "httpx": httpx.Limits().keepalive_expiry,
        "openai": openai.DEFAULT_CONNECTION_LIMITS.keepalive_expiry,
        "aiohttp": 15.0,  # TCPConnector's documented keepalive_timeout
        "go": 90.0,  # net/http DefaultTransport's IdleConnTimeout (k6, vegeta, hey and Go services)
    }
    assert all(e is not None and default > e for e in expiries.values()), (default, expiries)


def test_a_connection_idle_for_longer_than_httpx_keeps_one_is_still_served() -> None:
    """With the defaults, a connection idle past httpx's own expiry (5 s) still gets its next answer."""
    idle_s = (httpx.Limits().keepalive_expiry or 5.0) + 0.5
    with serving() as port:
        sock = _connect(port)
        sock.sendall(HEALTH)
        assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        time.sleep(idle_s)  # no timing is asserted: the connection is either still open or closed
        sock.sendall(HEALTH)
        assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        sock.close()


class _Recorder(asyncio.Transport):
    """A transport that records what is written to it, call by call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, bytes]] = []
        self.closed = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.calls.append(("write", bytes(data)))

    def writelines(self, list_of_data: Iterable[bytes | bytearray | memoryview]) -> None:
        self.calls.append(("writelines", b"".join(list_of_data)))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


async def test_a_response_head_leaves_with_the_first_body_bytes() -> None:
    raw = _Recorder()
    out = HeadWithBody(raw, asyncio.get_running_loop())
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert raw.calls == []  # held
    out.write(b"body-1")
    out.write(b"body-2")
    await asyncio.sleep(0)  # the held head's own turn comes and finds nothing left to write
    assert raw.calls == [("writelines", b"HTTP/1.1 200 OK\r\n\r\nbody-1"), ("write", b"body-2")]


async def test_a_head_without_body_goes_out_at_the_next_turn_or_at_close() -> None:
    raw = _Recorder()
    out = HeadWithBody(raw, asyncio.get_running_loop())
    out.write(b"HTTP/1.1 204 No Content\r\n\r\n")
    await asyncio.sleep(0)
    assert raw.calls == [("write", b"HTTP/1.1 204 No Content\r\n\r\n")]
    raw2 = _Recorder()
    out2 = HeadWithBody(raw2, asyncio.get_running_loop())
    out2.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out2.close()
    assert raw2.calls == [("write", b"HTTP/1.1 200 OK\r\n\r\n")] and raw2.closed


def _cycle(method: str = "POST") -> tuple[RequestResponseCycle, _Recorder]:
    raw = _Recorder()
    scope: Any = {"method": method, "type": "http"}
    log = logging.getLogger("test")
    cycle = RequestResponseCycle(
        scope, raw, FlowControl(raw), log, log, False, [], asyncio.Event(), False, True, lambda: None
    )
    return cycle, raw


def _wire(raw: _Recorder) -> bytes:
    return b"".join(data for _, data in raw.calls)


STREAM_HEAD = [(b"content-type", b"text/event-stream")]
PIECES = [b"data: 1\n\n", b"data: two\n\ndata: 3\n\n", b"", b"x" * 70_000]


async def test_a_chunk_written_directly_is_what_uvicorn_would_send_for_it() -> None:
    by_messages, wire_a = _cycle()
    direct, wire_b = _cycle()
    writer = CycleWriter(direct)
    for cycle in (by_messages, direct):
        await cycle.send({"type": "http.response.start", "status": 200, "headers": STREAM_HEAD})
    for piece in PIECES:
        await by_messages.send({"type": "http.response.body", "body": piece, "more_body": True})
        assert writer.write(piece)
    for cycle in (by_messages, direct):
        await cycle.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert _wire(wire_a) == _wire(wire_b)
    assert _wire(wire_b).endswith(b"0\r\n\r\n") and direct.response_complete
    assert not writer.write(b"late")  # the response is over: nothing more goes out
    assert _wire(wire_a) == _wire(wire_b)


async def test_the_direct_writer_declines_wherever_uvicorn_would_not_write_at_once() -> None:
    cycle, raw = _cycle()
    writer = CycleWriter(cycle)
    assert not writer.write(b"a")  # no response started
    await cycle.send({"type": "http.response.start", "status": 200, "headers": STREAM_HEAD})
    cycle.flow.pause_writing()  # the client is not reading: the message waits for it to drain
    assert not writer.write(b"a")
    cycle.flow.resume_writing()
    assert writer.write(b"a")
    cycle.disconnected = True
    assert not writer.write(b"b")
    # a whole body with its length, and a HEAD response, are not chunked
    length, _ = _cycle()
    await length.send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"5")]})
    assert not CycleWriter(length).write(b"abcde")
    head, head_raw = _cycle("HEAD")
    await head.send({"type": "http.response.start", "status": 200, "headers": STREAM_HEAD})
    assert not CycleWriter(head).write(b"abc")
    assert _wire(raw).endswith(b"\r\n\r\n1\r\na\r\n")  # the head, then the one piece taken
    assert _wire(head_raw).endswith(b"\r\n\r\n")  # the head alone


def test_responses_on_one_keep_alive_connection_arrive_whole() -> None:
    with serving() as port, _connect(port) as sock:
        for _ in range(3):
            sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            data = b""
            while not data.endswith(b'{"status":"ok"}'):
                chunk = sock.recv(65536)
                assert chunk, data
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200") and orjson.loads(body) == {"status": "ok"}


class HoldingUpstream:
    """An upstream that answers ``GET`` (health checks) and holds every ``POST`` without answering,
    recording when the gateway closes the held connection."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.held = threading.Event()
        self.released = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            head, blank, rest = _read_head(conn)
            if not blank:
                return
            if not head.startswith(b"POST"):
                conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
                return
            self._post(conn, head, rest)

    def _post(self, conn: socket.socket, head: bytes, rest: bytes) -> None:
        """A ``POST`` whose ``head`` and the first bytes of its body (``rest``) have been read."""
        self.held.set()
        conn.settimeout(PATIENCE_S)
        with contextlib.suppress(OSError):
            while conn.recv(65536):  # the body, then nothing until the gateway lets go
                pass
            self.released.set()

    def close(self) -> None:
        self.listener.close()


def _counted_499(port: int) -> bool:
    """Whether the gateway's metrics count a request answered 499, within :data:`PATIENCE_S`."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline:
        with _connect(port) as probe:
            probe.sendall(b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n")
            _, text = _response(probe)
        if any(
            line.startswith(b"specroute_requests_total{") and b'status="499"' in line
            for line in text.splitlines()
        ):
            return True
    return False


def test_a_client_that_goes_away_cancels_its_upstream_request_and_is_counted() -> None:
    """The connection's loss, seen by the protocol, cancels the request waiting on the upstream."""
    upstream = HoldingUpstream()
    try:
        with serving(upstream.url) as port:
            body = orjson.dumps({"model": "demo-model", "prompt": "Say hello.", "max_tokens": 4})
            client = _connect(port)
            client.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert upstream.held.wait(PATIENCE_S), "the request never reached the upstream"
            client.close()
            assert upstream.released.wait(PATIENCE_S), "the upstream request outlived its client"
            assert _counted_499(port), "the abandoned request was not recorded as 499"
    finally:
        upstream.close()


class StreamingUpstream(HoldingUpstream):
    """An upstream that answers every ``POST`` with the same short SSE stream, then closes."""

    EVENTS = [b'data: {"choices":[{"index":0,"text":"%d"}]}\n\n' % i for i in range(3)] + [
        b"data: [DONE]\n\n"
    ]

    def _post(self, conn: socket.socket, head: bytes, rest: bytes) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        for event in self.EVENTS:
            conn.sendall(event)
            time.sleep(0.01)  # apart, as a model server sends them, so each is relayed on its own


def test_a_relayed_stream_goes_out_by_the_direct_writer_and_arrives_whole(monkeypatch: Any) -> None:
    taken: list[bytes] = []
    write = CycleWriter.write

    def counting(self: CycleWriter, body: bytes) -> bool:
        took = write(self, body)
        if took:
            taken.append(body)
        return took

    monkeypatch.setattr(CycleWriter, "write", counting)
    upstream = StreamingUpstream()
    try:
        with serving(upstream.url) as port:
            body = {"model": "demo-model", "prompt": "Count.", "max_tokens": 4, "stream": True}
            with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/completions", json=body) as r:
                got = b"".join(r.iter_bytes())
            assert r.status_code == 200 and r.headers["transfer-encoding"] == "chunked"
            assert got == b"".join(StreamingUpstream.EVENTS)
            assert b"".join(taken) == got  # every piece went by the writer, none as an ASGI message
    finally:
        upstream.close()


def test_a_client_that_leaves_while_sending_its_body_is_a_499_not_an_error(caplog: Any) -> None:
    with serving() as port:
        client = _connect(port)
        client.sendall(
            b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b'content-length: 100\r\n\r\n{"model": "demo-model", '
        )
        time.sleep(0.2)  # the request's task is reading the body when the connection goes
        client.close()
        assert _counted_499(port), "the abandoned request was not recorded as 499"
    assert not [r for r in caplog.records if r.levelname == "ERROR"], (
        "a client leaving was logged as an error"
    )


def test_bytes_that_are_not_http_get_an_api_shaped_400_and_the_connection_closes() -> None:
    with serving() as port:
        for garbage in (b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n", b"GET / HTTP/9.9 x\r\n\r\n"):
            with _connect(port) as sock:
                sock.sendall(garbage)
                received = _read_until_closed(sock)  # closed by the server
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 400") and b"content-type: application/json" in head
            assert _error(body) == {
                "message": "the request is not valid HTTP/1.1",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }


def test_a_client_that_writes_its_whole_body_before_reading_gets_the_early_answer() -> None:
    """A request refused before its body was read (a 413 from its length, a 401 without a key): the
    body is read after the answer and dropped, so a client that writes all of it before reading
    (``http.client``, ``requests``) reads the answer instead of a reset, and the connection goes on."""
    extra = {"limits": {"max_body_bytes": 1 << 20}, "auth": {"api_keys": ["sk-test"]}}
    body = b'{"model": "demo-model", "prompt": "%s"}' % (b"x" * (3 << 20))
    with serving(extra=extra) as port:
        for key, status, param in (("sk-test", 413, None), (None, 401, None)):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=PATIENCE_S)
            headers = {"content-type": "application/json"}
            if key:
                headers["authorization"] = f"Bearer {key}"
            conn.request("POST", "/v1/completions", body=body, headers=headers)
            r = conn.getresponse()
            assert r.status == status, r.status
            assert _error(r.read())["param"] == param
            sock = conn.sock
            conn.request("GET", "/health", headers={"authorization": "Bearer sk-test"})
            again = conn.getresponse()
            assert again.status == 200 and again.read() == b'{"status":"ok"}'
            assert conn.sock is sock  # the same connection: it went on once the body had been read
            conn.close()


class AnsweringUpstream(HoldingUpstream):
    """An upstream that answers every ``POST`` with one small completion body, then closes."""

    BODY = (
        b'{"id":"cmpl-1","object":"text_completion","model":"demo-model","choices":[{"index":0,"text":"hi"}]}'
    )

    def _post(self, conn: socket.socket, head: bytes, rest: bytes) -> None:
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(self.BODY), self.BODY)
        )


def test_with_cors_on_the_completions_answers_carry_its_headers_on_the_real_server() -> None:
    """The connection's own writer writes past every middleware: with CORS on, the completion routes'
    answers (whole or streamed) leave as ASGI messages, which the CORS middleware marks."""
    origin = {"origin": "https://app.example"}
    extra = {"cors": {"allow_origins": ["https://app.example"]}, "routing": {"strategy": "always-baseline"}}
    for upstream, stream in ((AnsweringUpstream(), False), (StreamingUpstream(), True)):
        try:
            with serving(upstream.url, extra=extra) as port:
                body = {"model": "demo-model", "prompt": "Count.", "max_tokens": 4, "stream": stream}
                url = f"http://127.0.0.1:{port}/v1/completions"
                with httpx.stream("POST", url, json=body, headers=origin) as r:
                    got = b"".join(r.iter_bytes())
                assert r.status_code == 200, got
                assert r.headers["access-control-allow-origin"] == "https://app.example"
                assert "x-specroute-pool" in r.headers["access-control-expose-headers"]
                want = b"".join(StreamingUpstream.EVENTS) if stream else AnsweringUpstream.BODY
                assert got == want
        finally:
            upstream.close()


class EndlessUpstream(HoldingUpstream):
    """An upstream that answers every ``POST`` with a stream that never ends, until the gateway closes it."""

    EVENT = b'data: {"id":"c","object":"text_completion","choices":[{"index":0,"text":"%s"}]}\n\n' % (
        b"y" * 16_000
    )

    def _post(self, conn: socket.socket, head: bytes, rest: bytes) -> None:
        self.held.set()
        conn.settimeout(PATIENCE_S)
        with contextlib.suppress(OSError):
            conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
            while True:
                conn.sendall(self.EVENT)
        self.released.set()


def test_a_client_that_stops_reading_its_stream_loses_it_at_the_requests_deadline(caplog: Any) -> None:
    """Waiting for a client to take more is bounded by the request's time (``timeouts.total_s``) like
    every upstream wait: then its connection is dropped, the upstream request ends, and the request
    counts as the client's loss (499)."""
    upstream = EndlessUpstream()
    try:
        with serving(upstream.url, extra={"timeouts": {"total_s": 2.0}}) as port:
            client = socket.socket()
            client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            client.connect(("127.0.0.1", port))
            body = orjson.dumps({"model": "demo-model", "prompt": "Go on.", "stream": True})
            client.sendall(
                b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                b"content-length: %d\r\n\r\n%s" % (len(body), body)
            )
            assert upstream.held.wait(PATIENCE_S), "the request never reached the upstream"
            # the client reads nothing from here on
            assert upstream.released.wait(PATIENCE_S), "the stream outlived its request's time"
            assert _counted_499(port), "the stalled request was not recorded as 499"
            client.settimeout(PATIENCE_S)
            with contextlib.suppress(ConnectionResetError):
                while client.recv(1 << 20):  # what was queued before the drop, then the end
                    pass
            client.close()
    finally:
        upstream.close()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], "the drop was logged as an error"


def test_a_client_that_pipelines_far_ahead_of_its_answers_is_dropped_a_few_ahead_are_served() -> None:
    """Each request waiting its turn on a connection holds memory; one read can carry thousands."""
    with serving() as port:
        with _connect(port) as sock:
            sock.sendall(HEALTH * 10)
            answers = b""
            while answers.count(b'{"status":"ok"}') < 10:
                chunk = sock.recv(65536)
                assert chunk, "the connection closed before the tenth answer"
                answers += chunk
        with _connect(port) as sock:
            sock.sendall(HEALTH * 2000)
            answers = b""
            with contextlib.suppress(ConnectionResetError):  # dropped with requests unread: a reset
                while chunk := sock.recv(65536):
                    answers += chunk
            assert answers.count(b'{"status":"ok"}') <= MAX_PIPELINED + 1  # dropped, not served to the end
