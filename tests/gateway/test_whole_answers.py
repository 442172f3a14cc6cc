"""A whole answer and a stream's head and end written by the connection's own writer, and the keep-alive
timer kept per idle period.

The writer (:class:`gateway.connections.CycleWriter`) must put on the wire exactly what uvicorn's
``send`` puts there for the same messages, and leave everything else to it; the keep-alive timer
must close an idle connection when uvicorn's would, however busy it was before.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
import time
from collections import Counter
from typing import Any

import orjson
import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from gateway.connections import CycleWriter, HeadWithBody
from tests.gateway.test_connections import (
    HoldingUpstream,
    _connect,
    _read_head,
    _read_until_closed,
    _Recorder,
    _response,
    _wire,
    serving,
)

DATE = [(b"date", b"Fri, 27 Nov 2026 10:00:00 GMT")]
BODY = b'{"id":"cmpl-1","choices":[{"text":"hi"}]}'
HEAD = [
    (b"x-specroute-class", b"open_ended"),
    (b"x-specroute-reason", b"predicted"),
    (b"x-request-id", b"0123456789abcdef"),
    (b"x-specroute-pool", b"baseline"),
    (b"content-length", b"%d" % len(BODY)),
    (b"content-type", b"application/json"),
]


def _cycle(
    method: str = "POST", keep_alive: bool = True, default: list[tuple[bytes, bytes]] | None = None
) -> tuple[RequestResponseCycle, _Recorder, list[int]]:
    raw = _Recorder()
    ended: list[int] = []
    scope: Any = {"method": method, "type": "http"}
    log = logging.getLogger("test")
    cycle = RequestResponseCycle(
        scope,
        raw,
        FlowControl(raw),
        log,
        log,
        False,
        DATE if default is None else default,
        asyncio.Event(),
        False,
        keep_alive,
        lambda: ended.append(1),
    )
    return cycle, raw, ended


async def _by_messages(cycle: RequestResponseCycle, status: int, headers: Any, body: bytes) -> None:
    await cycle.send({"type": "http.response.start", "status": status, "headers": headers})
    await cycle.send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("status", [200, 400, 404, 429, 500, 503])
@pytest.mark.parametrize("default", [DATE, [], [*DATE, (b"X-Served-By", b"edge")]])
async def test_a_whole_answer_is_the_bytes_uvicorn_writes_for_its_two_messages(
    keep_alive: bool, status: int, default: list[tuple[bytes, bytes]]
) -> None:
    by_messages, wire_a, ended_a = _cycle(keep_alive=keep_alive, default=default)
    direct, wire_b, ended_b = _cycle(keep_alive=keep_alive, default=default)
    await _by_messages(by_messages, status, list(HEAD), BODY)
    assert CycleWriter(direct).respond(status, list(HEAD), BODY)
    assert _wire(wire_a) == _wire(wire_b)
    for cycle in (by_messages, direct):
        assert cycle.response_started and cycle.response_complete and cycle.message_event.is_set()
        assert cycle.chunked_encoding is False and cycle.expected_content_length == 0
    assert wire_a.closed == wire_b.closed == (not keep_alive)
    assert ended_a == ended_b == [1]


async def test_a_whole_answer_leaves_in_one_write_through_the_held_head_transport() -> None:
    raw = _Recorder()
    cycle, _, _ = _cycle()
    cycle.transport = HeadWithBody(raw, asyncio.get_running_loop())
    assert CycleWriter(cycle).respond(200, list(HEAD), BODY)
    await asyncio.sleep(0)  # nothing held for a later turn
    assert len(raw.calls) == 1 and raw.calls[0][0] == "writelines"
    assert raw.calls[0][1].endswith(b"\r\n\r\n" + BODY)


DECLINED_HEADS = {
    "a control character in a value": [*HEAD[:-1], (b"content-type", b"application/json\x01")],
    "a line break in a value": [*HEAD[:-1], (b"content-type", b"application/json\r\nx-evil: 1")],
    "a name uvicorn refuses": [(b"x bad", b"1"), *HEAD],
    "a name in capitals": [(b"X-Request-Id", b"1"), *HEAD[-2:]],
    "chunked": [(b"transfer-encoding", b"chunked"), HEAD[-1]],
    "a connection header": [(b"connection", b"close"), *HEAD],
    "no length": [HEAD[-1]],
    "a length that is not the body's": [(b"content-length", b"3"), HEAD[-1]],
    "a length that is no number": [(b"content-length", b"x"), HEAD[-1]],
    "no headers": [],
}


@pytest.mark.parametrize("case", list(DECLINED_HEADS))
async def test_a_head_uvicorn_would_refuse_or_treat_otherwise_is_declined_and_sent_as_before(
    case: str,
) -> None:
    headers = DECLINED_HEADS[case]
    direct, wire, ended = _cycle()
    assert not CycleWriter(direct).respond(200, list(headers), BODY)
    assert wire.calls == [] and not direct.response_started and ended == []
    # the messages then meet uvicorn's own checks, exactly as without the writer
    by_messages, wire_a, _ = _cycle()
    outcome_a = outcome_b = None
    try:
        await _by_messages(by_messages, 200, list(headers), BODY)
    except (RuntimeError, ValueError) as e:
        outcome_a = repr(e)
    try:
        await _by_messages(direct, 200, list(headers), BODY)
    except (RuntimeError, ValueError) as e:
        outcome_b = repr(e)
    assert outcome_a == outcome_b and _wire(wire_a) == _wire(wire)


async def test_the_writer_declines_wherever_uvicorn_would_not_write_at_once() -> None:
    started, _, _ = _cycle()
    await started.send({"type": "http.response.start", "status": 200, "headers": list(HEAD)})
    assert not CycleWriter(started).respond(200, list(HEAD), BODY)  # a response already under way
    paused, raw, _ = _cycle()
    paused.flow.pause_writing()  # the client is not reading: the message waits for it to drain
    assert not CycleWriter(paused).respond(200, list(HEAD), BODY)
    gone, raw, _ = _cycle()
    gone.disconnected = True
    assert not CycleWriter(gone).respond(200, list(HEAD), BODY) and raw.calls == []
    head, raw, _ = _cycle("HEAD")
    assert not CycleWriter(head).respond(200, list(HEAD), BODY)
    for status in (101, 204, 304, 600):
        cycle, raw, _ = _cycle()
        assert not CycleWriter(cycle).respond(status, list(HEAD), BODY) and raw.calls == []
    logged, raw, _ = _cycle()
    logged.access_log = True  # uvicorn's own access log would see the response
    assert not CycleWriter(logged).respond(200, list(HEAD), BODY)


class AnsweringUpstream(HoldingUpstream):
    """An upstream that answers every ``POST`` with one whole completion, then closes."""

    def _post(self, conn: socket.socket, head: bytes, rest: bytes) -> None:
        length = int(_fields(head)["content-length"])
        while len(rest) < length:  # the whole body, so that closing does not reset the connection
            rest += conn.recv(65536)
        conn.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(BODY), BODY)
        )


_PAYLOAD = orjson.dumps({"model": "demo-model", "prompt": "Say hello.", "max_tokens": 4})


def _completion(extra: bytes = b"", version: bytes = b"1.1") -> bytes:
    """A completion for the baseline pool (the speculative one would stream it upstream to measure it)."""
    head = b"POST /v1/completions HTTP/%s\r\nhost: x\r\ncontent-type: application/json\r\n" % version
    return head + b"x-specroute-pool: baseline\r\n%scontent-length: %d\r\n\r\n%s" % (
        extra,
        len(_PAYLOAD),
        _PAYLOAD,
    )


def _fields(head: bytes) -> dict[str, str]:
    lines = head.decode("latin-1").split("\r\n")[1:]
    return {name.lower(): value for name, _, value in (line.partition(": ") for line in lines)}


def test_a_completion_answered_whole_keeps_its_head_and_the_connection() -> None:
    upstream = AnsweringUpstream()
    try:
        with serving(upstream.url) as port, _connect(port) as sock:
            for i in range(3):  # one keep-alive connection
                sock.sendall(_completion(b"x-request-id: req-%d\r\n" % i))
                head, body = _response(sock)
                assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == BODY
                fields = _fields(head)
                assert fields["x-request-id"] == f"req-{i}" and fields["content-type"] == "application/json"
                assert fields["content-length"] == str(len(BODY)) and "date" in fields
                assert {"x-specroute-class", "x-specroute-reason", "x-specroute-pool"} <= fields.keys()
                assert "connection" not in fields and "transfer-encoding" not in fields
    finally:
        upstream.close()


def _responses(sock: socket.socket, n: int) -> list[tuple[bytes, bytes]]:
    """``n`` responses with a Content-Length, read off one connection: pipelined answers may arrive
    together in one read, so the bytes past one response belong to the next."""
    data, out = b"", []
    while len(out) < n:
        head_end = data.find(b"\r\n\r\n")
        if head_end >= 0:
            head = data[:head_end]
            length = int(_fields(head)["content-length"])
            end = head_end + 4 + length
            if len(data) >= end:
                out.append((head, data[head_end + 4 : end]))
                data = data[end:]
                continue
        chunk = sock.recv(65536)
        assert chunk, "the connection closed before the responses"
        data += chunk
    return out


def test_pipelined_completions_are_answered_in_order_on_one_connection() -> None:
    upstream = AnsweringUpstream()
    try:
        with serving(upstream.url) as port, _connect(port) as sock:
            sock.sendall(b"".join(_completion(b"x-request-id: p-%d\r\n" % i) for i in range(3)))
            for i, (head, body) in enumerate(_responses(sock, 3)):
                assert _fields(head)["x-request-id"] == f"p-{i}" and body == BODY
    finally:
        upstream.close()


@pytest.mark.parametrize(
    "request_bytes",
    [_completion(version=b"1.0"), _completion(b"connection: close\r\n")],
    ids=["http-1.0", "close"],
)
def test_a_client_that_does_not_keep_the_connection_gets_connection_close_and_the_end(
    request_bytes: bytes,
) -> None:
    upstream = AnsweringUpstream()
    try:
        with serving(upstream.url) as port, _connect(port) as sock:
            sock.sendall(request_bytes)
            received = _read_until_closed(sock)  # the server closes it after the answer
            head, _, body = received.partition(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200 OK\r\n") and body == BODY
            assert _fields(head)["connection"] == "close"
    finally:
        upstream.close()


def test_an_idle_connection_closes_a_keep_alive_period_after_its_last_response_not_its_first() -> None:
    """The timer armed at the first response fires while the second's period still runs: the connection
    stays open until that one is over too."""
    keep_alive_s = 2.0
    with serving(keep_alive_s=keep_alive_s) as port, _connect(port) as sock:
        health = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        sock.sendall(health)
        assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        time.sleep(keep_alive_s * 0.6)
        sock.sendall(health)
        assert _response(sock)[0].startswith(b"HTTP/1.1 200")
        time.sleep(keep_alive_s * 0.6)  # past the first response's period, within the second's
        sock.sendall(health)
        assert _response(sock)[0].startswith(b"HTTP/1.1 200"), "closed a period after an earlier response"
        started = time.monotonic()
        assert _read_until_closed(sock) == b""  # then, idle, it is closed
        assert time.monotonic() - started >= keep_alive_s * 0.5  # only once idle long enough


STREAM = [
    (b"x-specroute-class", b"open_ended"),
    (b"x-request-id", b"0123456789abcdef"),
    (b"content-type", b"text/event-stream; charset=utf-8"),
]
PIECES = [b"data: 1\n\n", b"", b"data: two\n\ndata: 3\n\n"]


@pytest.mark.parametrize("keep_alive", [True, False])
@pytest.mark.parametrize("held", [True, False])
async def test_a_stream_started_and_ended_by_the_writer_is_the_bytes_uvicorn_writes_for_its_messages(
    keep_alive: bool, held: bool
) -> None:
    by_messages, wire_a, ended_a = _cycle(keep_alive=keep_alive)
    direct, wire_b, ended_b = _cycle(keep_alive=keep_alive)
    if held:  # as on the gateway's protocol: the head waits for the first piece
        for cycle, wire in ((by_messages, wire_a), (direct, wire_b)):
            cycle.transport = HeadWithBody(wire, asyncio.get_running_loop())
    writer = CycleWriter(direct)
    await by_messages.send({"type": "http.response.start", "status": 200, "headers": list(STREAM)})
    assert writer.start(200, list(STREAM))
    assert writer.progress() == (True, False, True)
    for piece in PIECES:
        await by_messages.send({"type": "http.response.body", "body": piece, "more_body": True})
        assert writer.write(piece)
    await by_messages.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert writer.end()
    assert _wire(wire_a) == _wire(wire_b)  # the same bytes (uvicorn also writes the empty piece's nothing)
    assert _wire(wire_b).endswith(b"0\r\n\r\n") and b"transfer-encoding: chunked\r\n" in _wire(wire_b)
    for cycle in (by_messages, direct):
        assert cycle.response_complete and cycle.chunked_encoding is True and cycle.message_event.is_set()
    assert wire_a.closed == wire_b.closed == (not keep_alive) and ended_a == ended_b == [1]
    assert writer.progress() == (True, True, True) and not writer.end()  # over: nothing more


async def test_a_stream_head_uvicorn_would_treat_otherwise_is_declined() -> None:
    for headers in (
        [*STREAM, (b"content-length", b"5")],
        [(b"connection", b"close"), *STREAM],
        [(b"X-A", b"1")],
    ):
        cycle, raw, _ = _cycle()
        assert not CycleWriter(cycle).start(200, list(headers))
        assert raw.calls == [] and not cycle.response_started and cycle.chunked_encoding is None
    head, raw, _ = _cycle("HEAD")
    assert not CycleWriter(head).start(200, list(STREAM)) and raw.calls == []
    started, _, _ = _cycle()
    await started.send({"type": "http.response.start", "status": 200, "headers": list(STREAM)})
    assert not CycleWriter(started).start(200, list(STREAM))
    # a start that went as a message is the writer's to carry on and end, but not as its event stream
    writer = CycleWriter(started)
    assert writer.write(b"x") and writer.progress() == (True, False, False)
    started.flow.pause_writing()  # the client is not reading: the end waits for it as a message
    assert not writer.end()
    started.flow.resume_writing()
    assert writer.end()
    whole, _, _ = _cycle()
    await _by_messages(whole, 200, list(HEAD), BODY)
    assert not CycleWriter(whole).end()  # not chunked, and over


async def test_what_the_writer_sent_counts_as_sent_when_a_request_is_cut_at_shutdown() -> None:
    from gateway.app import _Progress
    from gateway.types import ClientState

    cycle, _, _ = _cycle()
    writer = CycleWriter(cycle)
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    progress = _Progress(send)
    progress.written_by(ClientState(writer))
    assert (progress.started, progress.complete, progress.event_stream) == (False, False, False)
    assert writer.start(200, list(STREAM))
    progress.written_by(ClientState(writer))
    assert (progress.started, progress.complete, progress.event_stream) == (True, False, True)
    progress.written_by(ClientState())  # another server's scope: nothing to add
    progress.written_by(None)
    assert writer.end()
    progress.written_by(ClientState(writer))
    assert progress.complete and sent == []


async def test_a_head_still_held_goes_out_before_the_next_responses_on_the_connection() -> None:
    raw = _Recorder()
    out = HeadWithBody(raw, asyncio.get_running_loop())
    out.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n")  # a HEAD request's: no body write follows
    out.next_response()
    out.write(b"HTTP/1.1 200 OK\r\n\r\n")
    out.write(b"body")
    await asyncio.sleep(0)
    assert raw.calls == [
        ("write", b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
        ("writelines", b"HTTP/1.1 200 OK\r\n\r\nbody"),
    ]


def test_a_head_request_then_others_on_one_connection_each_get_their_whole_answer() -> None:
    with serving() as port, _connect(port) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n")
        head, _, rest = _read_head(sock)
        assert head.startswith(b"HTTP/1.1 200") and rest == b""
        # pipelined: a HEAD between two GETs
        get = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"
        sock.sendall(get + b"HEAD /health HTTP/1.1\r\nhost: x\r\n\r\n" + get)
        data = b""
        while data.count(b"HTTP/1.1 200") < 3 or not data.endswith(b'{"status":"ok"}'):
            chunk = sock.recv(65536)
            assert chunk, data
            data += chunk
        assert data.count(b'{"status":"ok"}') == 2
        first, second, third = (b"HTTP/1.1 200" + part for part in data.split(b"HTTP/1.1 200")[1:])
        assert first.endswith(b'\r\n\r\n{"status":"ok"}') and second.endswith(b"\r\n\r\n")
        assert third.endswith(b'\r\n\r\n{"status":"ok"}')


def test_the_bytes_refused_in_names_and_values_are_those_uvicorns_patterns_refuse() -> None:
    from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE

    from gateway.connections import _REFUSED_IN_NAMES, _REFUSED_IN_VALUES

    for byte in range(256):
        one = bytes([byte])
        assert (HEADER_RE.search(one) is not None) == (byte in _REFUSED_IN_NAMES), byte
        assert (HEADER_VALUE_RE.search(one) is not None) == (byte in _REFUSED_IN_VALUES), byte


def test_a_request_leaves_no_reference_cycle_for_the_garbage_collector() -> None:
    """The client's state in the scope holds the response's cycle, which holds the scope: the cycle is
    broken when the request ends, so its objects are freed at once, not by a collection later."""
    upstream = AnsweringUpstream()
    try:
        with serving(upstream.url) as port, _connect(port) as sock:
            for _ in range(5):  # warm: first-time caches
                sock.sendall(_completion())
                _response(sock)
            gc.collect()
            gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds is kept in gc.garbage
            gc.disable()
            try:
                for _ in range(20):
                    sock.sendall(_completion())
                    assert _response(sock)[1] == BODY
                gc.collect()
                left = Counter(type(o).__name__ for o in gc.garbage)
            finally:
                gc.garbage.clear()
                gc.set_debug(0)
                gc.enable()
            # (this upstream closes every connection: the upstream client's closed connections are some)
            assert not {"RequestResponseCycle", "ClientState", "CycleWriter"} & left.keys(), left
    finally:
        upstream.close()
