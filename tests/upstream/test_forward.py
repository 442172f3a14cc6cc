"""Connections that drop before a response: a stale keep-alive one is retried, a dead endpoint is not hidden.

The upstream is a raw asyncio server on loopback, so the test decides exactly when a connection closes:
the gateway's real forwarding code and aiohttp pool see a real FIN on a real socket.
"""

from __future__ import annotations

import asyncio
import gzip
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager

import pytest

from gateway.config import load_settings
from gateway.errors import NoEndpoint, Unreachable, UpstreamBroken
from gateway.upstream.forward import Upstreams
from gateway.upstream.stream import StreamMeter
from tests.upstream.scripted import read_request
from tests.upstream.wiring import upstreams_for

BODY = b'{"model":"m","prompt":"hi"}'
ANSWER = b'{"id":"cmpl-1","object":"text_completion","choices":[]}'


class Upstream:
    """Answers the first ``answer_per_connection`` requests on each connection (keep-alive), then
    closes the connection when the next request arrives on it, without a byte of response."""

    def __init__(self, answer_per_connection: int):
        self.answer_per_connection = answer_per_connection
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        answered = 0
        try:
            while True:
                await read_request(reader)
                self.requests += 1
                if answered == self.answer_per_connection:
                    return  # close: the server gave up on this connection as the request came in
                answered += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def _on(handler: Handler, upstream: Upstream | None = None) -> AsyncIterator[Upstreams]:
    """A loopback server running ``handler`` per connection as the baseline pool's one endpoint (the
    speculative pool's is closed), and the forwarding parts over it; ``upstream`` is given the server."""
    server = await asyncio.start_server(handler, "127.0.0.1", 0)
    if upstream is not None:
        upstream.server = server
    endpoints = {"endpoints": [{"name": "base-0", "url": _url(server)}], "models": ["m"]}
    other = {"endpoints": [{"name": "spec-0", "url": "http://127.0.0.1:9"}], "models": ["m"]}
    settings = load_settings(overrides={"pools": {"baseline": endpoints, "speculative": other}})
    try:
        async with upstreams_for(settings) as upstreams:
            yield upstreams
    finally:
        server.close()
        await server.wait_closed()


def _url(server: asyncio.Server) -> str:
    return f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


def _serving(upstream: Upstream) -> AbstractAsyncContextManager[Upstreams]:
    return _on(upstream.handle, upstream)


@pytest.fixture
async def keepalive_closer() -> AsyncIterator[tuple[Upstreams, Upstream]]:
    upstream = Upstream(answer_per_connection=1)
    async with _serving(upstream) as upstreams:
        yield upstreams, upstream


@pytest.fixture
async def dropper() -> AsyncIterator[tuple[Upstreams, Upstream]]:
    upstream = Upstream(answer_per_connection=0)
    async with _serving(upstream) as upstreams:
        yield upstreams, upstream


async def _complete(upstreams: Upstreams) -> bytes:
    sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
    return await upstreams.read_all(sent)


def _sample(upstreams: Upstreams, name: str, **labels: str) -> float:
    return upstreams.metrics.registry.get_sample_value(name, labels) or 0.0


def _errors(upstreams: Upstreams, kind: str) -> float:
    labels = {"pool": "baseline", "endpoint": "base-0", "kind": kind}
    return _sample(upstreams, "specroute_upstream_errors_total", **labels)


async def test_a_keepalive_connection_closed_under_a_request_is_retried_at_no_cost_to_the_endpoint(
    keepalive_closer,
):
    upstreams, upstream = keepalive_closer
    endpoint = upstreams.pools["baseline"].endpoints[0]
    assert await _complete(upstreams) == ANSWER
    # The second request goes out on the pooled connection, which the server closes as it arrives.
    assert await _complete(upstreams) == ANSWER
    assert (upstream.connections, upstream.requests) == (2, 3)
    assert _errors(upstreams, "dropped_connection") == 1
    assert _errors(upstreams, "connect") == 0
    assert endpoint.consecutive_failures == 0
    assert _sample(upstreams, "specroute_upstream_retries_total", pool="baseline") == 0


async def test_an_endpoint_that_drops_every_request_is_tried_twice_then_reported(dropper):
    """It took both connections and closed them unanswered: a broken upstream (502), not one that could not
    be reached, and counted against it."""
    upstreams, upstream = dropper
    endpoint = upstreams.pools["baseline"].endpoints[0]
    with pytest.raises(UpstreamBroken, match="closed the connection before answering"):
        await _complete(upstreams)
    assert (upstream.connections, upstream.requests) == (2, 2)
    assert _errors(upstreams, "dropped_connection") == 2
    assert _errors(upstreams, "connect") == 0
    assert endpoint.consecutive_failures == 1


async def test_a_request_whose_pooled_connection_dropped_is_resent_on_a_new_one(keepalive_closer):
    """A server that closes its idle connections together (a reload, a balancer clearing them) closes
    every pooled one as requests go out on them: the request resent after the first drop must not take
    the next dead one, or it fails and the endpoint is blamed while it serves."""
    upstreams, upstream = keepalive_closer
    endpoint = upstreams.pools["baseline"].endpoints[0]
    # three requests at once: three connections, each answered once and pooled
    assert await asyncio.gather(*(_complete(upstreams) for _ in range(3))) == [ANSWER] * 3
    assert upstream.connections == 3
    assert await _complete(upstreams) == ANSWER  # a pooled one drops, a new one answers
    assert (upstream.connections, upstream.requests) == (4, 5)
    assert _errors(upstreams, "dropped_connection") == 1
    assert endpoint.consecutive_failures == 0


async def test_a_broadcast_reaches_every_endpoint_once_and_says_what_each_did(keepalive_closer):
    """vLLM's adapter routes go to every endpoint of both pools: the one that answers gives its answer, the
    one not reached (the speculative pool's closed port) its failure; neither is sent elsewhere or again,
    and neither is marked failed for it (no traffic)."""
    upstreams, upstream = keepalive_closer
    body = b'{"lora_name":"a","lora_path":"/a"}'
    deliveries = await upstreams.broadcast(
        "/v1/load_lora_adapter", body, {"content-type": "application/json"}
    )
    by_name = {d.endpoint.name: d for d in deliveries}
    assert sorted(by_name) == ["base-0", "spec-0"]
    answered, unreached = by_name["base-0"], by_name["spec-0"]
    assert answered.ok and (answered.status, answered.body) == (200, ANSWER)
    assert answered.content_type == "application/json"
    assert not unreached.ok and isinstance(unreached.error, Unreachable)
    assert (upstream.connections, upstream.requests) == (1, 1)
    assert (
        _sample(
            upstreams,
            "specroute_upstream_errors_total",
            pool="speculative",
            endpoint="spec-0",
            kind="connect",
        )
        == 1
    )
    assert all(d.endpoint.consecutive_failures == 0 and d.endpoint.outstanding == 0 for d in deliveries)


async def test_a_broadcast_with_no_endpoint_at_all_says_so(keepalive_closer):
    """Discovery may find none (and those it dropped, draining, are not sent it)."""
    upstreams, upstream = keepalive_closer
    for pool in upstreams.pools.values():
        for endpoint in pool.endpoints:
            endpoint.draining = True
    with pytest.raises(NoEndpoint):
        await upstreams.broadcast("/v1/unload_lora_adapter", b"{}", {})
    assert upstream.requests == 0


async def test_a_body_already_here_is_read_without_a_timer_and_one_still_coming_is_timed(
    keepalive_closer, monkeypatch: pytest.MonkeyPatch
):
    """A non-streamed answer that arrived whole with its head (nearly all of them) needs no gap timer;
    an answer whose body is still on its way is read under one."""
    upstreams, _ = keepalive_closer
    loop = asyncio.get_running_loop()
    armed: list[float] = []
    call_at = loop.call_at

    def counting(when: float, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        if getattr(callback, "__name__", "") != "_close_idle":  # the pool's one idle sweep is no gap timer
            armed.append(when)
        return call_at(when, callback, *args, **kwargs)

    sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
    assert sent.response.arrived
    monkeypatch.setattr(loop, "call_at", counting)
    assert await upstreams.read_all(sent) == ANSWER
    assert armed == []
    monkeypatch.undo()

    async def slow_body(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(ANSWER), ANSWER[:5]))
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(ANSWER[5:])
        await writer.drain()
        await reader.read()

    async with _on(slow_body) as slow:
        sent = await slow.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
        assert not sent.response.arrived
        monkeypatch.setattr(loop, "call_at", counting)
        assert await slow.read_all(sent) == ANSWER
        assert len(armed) >= 1  # the rest came under the gap timer


@pytest.mark.parametrize("client", ["lean", "aiohttp"])
async def test_an_answer_compressed_against_the_request_is_read_decoded_by_either_client(
    client: str, monkeypatch: pytest.MonkeyPatch
):
    """The gateway asks for ``identity`` and relays only the content type: an upstream (or a proxy in
    front of it) that gzips anyway must still give the forwarder the plain answer, on the lean client
    and on aiohttp's (which carries TLS endpoints)."""
    heads: list[bytes] = []

    async def gzipping(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        heads.append(head)
        packed = gzip.compress(ANSWER)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-encoding: gzip\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(packed), packed)
        )
        await writer.drain()
        writer.close()

    if client == "aiohttp":
        monkeypatch.setattr(Upstreams, "_target", lambda self, endpoint: None)
    async with _on(gzipping) as upstreams:
        headers = {"accept-encoding": "identity"}
        sent = await upstreams.send("/v1/completions", BODY, headers, "baseline", allow_failover=False)
        assert await upstreams.read_all(sent) == ANSWER
    assert b"accept-encoding: identity" in heads[0].lower()


async def test_a_stream_ends_at_its_requests_deadline_not_a_whole_total_time_after_its_first_byte():
    # the request's time went on tries before this one: the stream may only have what is left of it
    async def one_event_then_silence(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            b'10\r\ndata: {"a": 1}\n\n\r\n'
        )
        await writer.drain()
        await reader.read()  # silent, and open, until the gateway closes

    async with _on(one_event_then_silence) as upstreams:
        sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
        failed: list[int | None] = []
        pieces = []
        relay = upstreams.relay(
            sent, None, lambda s, f: failed.append(f), deadline=asyncio.get_running_loop().time() + 0.2
        )
        async with asyncio.timeout(10):  # the gap (60 s) and total (600 s) budgets are far off
            async for piece in relay:  # a stream relayed unmetered stops where it is cut
                pieces.append(piece)
        assert pieces == [b'data: {"a": 1}\n\n'] and failed == [504]


def _answering(body: bytes) -> Handler:
    """A server that answers one request with ``body`` as a whole event stream, then closes."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n%s" % (len(body), body)
        )
        await writer.drain()
        writer.close()

    return answer


@pytest.mark.parametrize("end", [b"data: [DONE]", b"data: [DONE]\n"])
async def test_a_stream_whose_last_event_lacks_its_blank_line_is_whole(end: bytes):
    """``data: [DONE]`` then the body's end, without the blank line that ends an event: every client that
    reads to the end has the whole answer; not a broken stream, nor a failure of the endpoint's."""
    event = b'data: {"choices": [{"index": 0, "text": "hi", "finish_reason": "stop"}]}\n\n'

    async with _on(_answering(event + end)) as upstreams:
        endpoint = upstreams.pools["baseline"].endpoints[0]
        sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
        failed: list[int | None] = []
        meter = StreamMeter(0.0)
        pieces = [p async for p in upstreams.relay(sent, meter, lambda s, f: failed.append(f))]
        assert b"".join(pieces).endswith(b"data: [DONE]\n\n") and meter.done
        assert failed == [None]
        assert _errors(upstreams, "stream") == 0 and endpoint.consecutive_failures == 0


@pytest.mark.parametrize(
    "cut",
    [
        b'data: {"choices": [{"index": 0, "text": " if", "logprobs": null',  # half a chunk's JSON
        b'event: response.output_text.delta\ndata: {"delta": " now prom',  # half a named event
        b"data: [DO",
    ],
)
async def test_a_body_that_ends_inside_an_event_is_a_broken_stream_whose_half_event_never_goes_out(
    cut: bytes,
):
    """The body ends in good order, but inside its last event: the client must not get the half event as a
    whole one (the SDK fails on its JSON); the stream is broken there (then resumed, or ended with an
    error event, by the caller)."""
    event = b'data: {"choices": [{"index": 0, "text": "hi", "finish_reason": null}]}\n\n'

    async with _on(_answering(event + cut)) as upstreams:
        sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
        failed: list[int | None] = []
        meter = StreamMeter(0.0)
        pieces: list[bytes] = []
        with pytest.raises(UpstreamBroken, match="ended before its end"):  # the caller's error event
            async for piece in upstreams.relay(sent, meter, lambda s, f: failed.append(f)):
                pieces.append(piece)
        out = b"".join(pieces)
        assert out == event and not meter.done
        assert failed == [502] and _errors(upstreams, "stream") == 1
