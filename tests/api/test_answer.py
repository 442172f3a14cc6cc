"""The completion routes build their response heads themselves: the same bytes as Starlette's."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from starlette.responses import Response, StreamingResponse

from gateway.api.errors import sse_error_event
from gateway.api.routes import Answer, Exchange, Relay, decision_headers
from gateway.errors import UpstreamBroken
from gateway.routing.policy import Decision

DECISIONS = [
    Decision("speculative", "structured", "predicted-gain", 0.91, "code", predicted_speedup=1.8349),
    Decision("baseline", "open-ended", "no-gain", 0.12, "qa", predicted_speedup=0.615),
    Decision("baseline", "open-ended", "forced", 0.12, "qa"),
]


async def _nothing() -> AsyncIterator[bytes]:
    yield b""


def _exchange(decision: Decision | None) -> Exchange:
    return Exchange(gw=None, api="completions", started=0.0, request_id="caf\xe9-42", decision=decision)  # type: ignore[arg-type]


@pytest.mark.parametrize("decision", [*DECISIONS, None])
@pytest.mark.parametrize("pool", ["speculative", "baseline", None])
@pytest.mark.parametrize("status", [200, 204, 304, 400, 503])
@pytest.mark.parametrize("media_type", ["application/json", "text/plain", "text/html; Charset=latin-1"])
def test_a_whole_body_has_starlettes_head(
    decision: Decision | None, pool: str | None, status: int, media_type: str
) -> None:
    ex = _exchange(decision)
    body = b'{"ok":true}'
    ours = Answer(body, status, ex.encoded_headers(pool), media_type, lambda: None)
    theirs = Response(body, status, headers=ex.headers(pool), media_type=media_type)
    assert ours.raw_headers == theirs.raw_headers
    assert ours.body == theirs.body and ours.status_code == theirs.status_code


@pytest.mark.parametrize("decision", DECISIONS)
@pytest.mark.parametrize("media_type", ["text/event-stream", "application/json"])
def test_a_relay_has_starlettes_head(decision: Decision, media_type: str) -> None:
    ex = _exchange(decision)
    ours = Relay.encoded(_nothing(), 200, ex.encoded_headers("speculative"), media_type)
    theirs = StreamingResponse(_nothing(), 200, headers=ex.headers("speculative"), media_type=media_type)
    assert ours.raw_headers == theirs.raw_headers


def test_the_headers_say_a_failover_and_format_the_speedup() -> None:
    headers = decision_headers(DECISIONS[0], "baseline", "r1")
    assert headers == {
        "x-specroute-class": "structured",
        "x-specroute-reason": "predicted-gain,failover",
        "x-request-id": "r1",
        "x-specroute-pool": "baseline",
        "x-specroute-predicted-speedup": "1.83",
    }


async def test_the_bookkeeping_runs_once_the_body_is_out() -> None:
    sent: list[Any] = []
    ran: list[int] = []

    async def send(message: Any) -> None:
        sent.append(message["type"])

    async def receive() -> Any:
        raise AssertionError("an answer reads nothing")

    answer = Answer(b"{}", 200, [], "application/json", lambda: ran.append(len(sent)))
    await answer({"type": "http"}, receive, send)
    assert sent == ["http.response.start", "http.response.body"] and ran == [2]


async def _breaking() -> AsyncIterator[bytes]:
    yield b"data: 1\n\n"
    raise UpstreamBroken("upstream connection broke; the response is incomplete")


async def test_a_broken_relay_ends_with_its_error_event_then_the_streams_end() -> None:
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append((message.get("body"), message.get("more_body")))

    relay = Relay.encoded(_breaking(), 200, [], "text/event-stream", sse_error_event)
    await relay.stream_response(send)
    assert sent == [
        (None, None),  # the head
        (b"data: 1\n\n", True),
        (sse_error_event(502, "upstream connection broke; the response is incomplete"), True),
        (b"", False),
    ]
    bare = Relay(_breaking(), 200, media_type="text/event-stream")
    with pytest.raises(UpstreamBroken):
        await bare.stream_response(send)


class _Writer:
    """A chunk writer that takes the pieces it is told to and declines the others; the stream's start and
    end only when told to as well."""

    def __init__(self, takes: list[bool], bounds: bool = False) -> None:
        self.takes = takes
        self.bounds = bounds
        self.written: list[bytes] = []

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        if self.bounds:
            self.written.append(b"<start %d>" % status)
        return self.bounds

    def end(self) -> bool:
        if self.bounds:
            self.written.append(b"<end>")
        return self.bounds

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        return False

    def progress(self) -> tuple[bool, bool, bool]:
        return False, False, False

    def write(self, body: bytes) -> bool:
        if not self.takes.pop(0):
            return False
        self.written.append(body)
        return True


async def _pieces(n: int) -> AsyncIterator[bytes]:
    for i in range(n):
        yield b"data: %d\n\n" % i


async def test_a_relay_writes_each_chunk_once_by_the_writer_or_else_as_a_message() -> None:
    sent: list[tuple[Any, Any]] = []

    async def send(message: Any) -> None:
        sent.append((message.get("body"), message.get("more_body")))

    # the writer takes some pieces and declines others (a client not reading, say): every piece
    # reaches the client exactly once, in order, and the stream's start and end are messages
    writer = _Writer([True, False, False, True, True, False])
    relay = Relay.encoded(_pieces(6), 200, [], "text/event-stream", sse_error_event)
    await relay.stream_response(send, writer)
    assert writer.written == [b"data: 0\n\n", b"data: 3\n\n", b"data: 4\n\n"]
    assert sent == [
        (None, None),
        (b"data: 1\n\n", True),
        (b"data: 2\n\n", True),
        (b"data: 5\n\n", True),
        (b"", False),
    ]
    # a broken stream's error event is a message after whatever the writer took
    writer = _Writer([True])
    relay = Relay.encoded(_breaking(), 200, [], "text/event-stream", sse_error_event)
    sent.clear()
    await relay.stream_response(send, writer)
    assert writer.written == [b"data: 1\n\n"]
    assert sent == [
        (None, None),
        (sse_error_event(502, "upstream connection broke; the response is incomplete"), True),
        (b"", False),
    ]
    # a writer that takes the start and the end leaves only the pieces it declined to messages
    writer = _Writer([True, False, True], bounds=True)
    relay = Relay.encoded(_pieces(3), 200, [], "text/event-stream", sse_error_event)
    sent.clear()
    await relay.stream_response(send, writer)
    assert writer.written == [b"<start 200>", b"data: 0\n\n", b"data: 2\n\n", b"<end>"]
    assert sent == [(b"data: 1\n\n", True)]
