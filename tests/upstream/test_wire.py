"""The lean forwarding client against raw loopback servers that decide every byte and every close.

Every test runs on asyncio's loop and on uvloop's, which the gateway runs on (see conftest.py).
"""

from __future__ import annotations

import asyncio
import gzip
import tracemalloc
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable

import aiohttp
import pytest

from gateway.upstream.wire import (
    MAX_HEAD_BYTES,
    PAUSE_BYTES,
    BodyBroken,
    ConnectFailed,
    Dropped,
    Malformed,
    WirePool,
    _request_head,
)
from tests.upstream.scripted import read_request

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


class Server:
    """A loopback server running ``handler`` per connection; records connections and request heads."""

    def __init__(self, handler: Handler):
        self.handler = handler
        self.connections = 0
        self.heads: list[bytes] = []
        self.bodies: list[bytes] = []
        self.closed = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            await self.handler(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()
            self.closed.set()

    async def read_request(self, reader: asyncio.StreamReader) -> bytes:
        head, body = await read_request(reader)
        self.heads.append(head)
        self.bodies.append(body)
        return body

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[Server]]]:
    servers: list[Server] = []

    async def start(handler: Handler) -> Server:
        server = Server(handler)
        server.server = await asyncio.start_server(server._handle, "127.0.0.1", 0)
        servers.append(server)
        return server

    yield start
    for s in servers:
        assert s.server is not None
        s.server.close()


def _answer(body: bytes, extra: bytes = b"") -> bytes:
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n%scontent-length: %d\r\n\r\n%s" % (
        extra,
        len(body),
        body,
    )


async def test_requests_share_one_keepalive_connection_and_go_out_as_given(serve):
    async def keepalive(reader, writer):
        while True:
            body = await server.read_request(reader)
            writer.write(_answer(b'{"echo":' + body + b"}"))

    server = await serve(keepalive)
    pool = WirePool(connect_s=1.0)
    for i in range(3):
        body = b'{"n":%d}' % i
        r = await pool.request("POST", "127.0.0.1", server.port, "/v1/completions?x=1", {"x-a": "b"}, body)
        assert r.status == 200
        assert r.headers.get("Content-Type") == "application/json"
        assert await r.read() == b'{"echo":' + body + b"}"
        r.release()
    assert server.connections == 1
    lines = server.heads[0].split(b"\r\n")
    assert lines[0] == b"POST /v1/completions?x=1 HTTP/1.1"
    assert b"x-a: b" in lines and b"content-length: 7" in lines
    assert any(line.startswith(b"host: 127.0.0.1:") for line in lines)
    assert server.bodies == [b'{"n":0}', b'{"n":1}', b'{"n":2}']
    pool.close()


async def test_a_chunked_response_arrives_piece_by_piece_decoded(serve):
    sent_second = asyncio.Event()

    async def chunked(reader, writer):
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
        )
        writer.write(b"6\r\ndata: \r\n")
        await writer.drain()
        await sent_second.wait()
        writer.write(b"3\r\nabc\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()  # keep the connection open

    server = await serve(chunked)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("GET", "127.0.0.1", server.port, "/s", {}, b"")
    chunks = r.chunks()
    assert await anext(chunks) == b"data: "  # before the rest was even sent
    assert not r.arrived
    sent_second.set()
    assert [piece async for piece in chunks] == [b"abc"]
    assert r.arrived
    r.release()
    assert b"content-length" not in server.heads[0]  # a GET without a body says nothing of one
    assert await _reused(pool, server)
    pool.close()
    await asyncio.wait_for(server.closed.wait(), 5)


async def _reused(pool: WirePool, server: Server) -> bool:
    """Whether the pool holds an idle connection to ``server`` (taken and put back if so)."""
    conn = pool._take("127.0.0.1", server.port)
    if conn is None:
        return False
    pool.put_back(conn)
    return True


async def test_a_body_that_ends_with_the_connection_is_complete_and_the_connection_not_reused(serve):
    async def until_close(reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\nall of it")

    server = await serve(until_close)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
    assert await r.read() == b"all of it"
    r.release()
    assert not await _reused(pool, server)


async def test_the_answer_to_head_is_whole_at_its_head_whatever_length_it_announces(serve):
    async def head(reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n")
        await writer.drain()
        await reader.read()  # no body follows, and the connection stays open

    server = await serve(head)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("HEAD", "127.0.0.1", server.port, "/v1/models", {}, b"")
    assert r.status == 200 and r.headers.get("content-length") == "100"
    assert await asyncio.wait_for(r.read(), 5) == b""
    r.release()
    assert not await _reused(pool, server)  # its parser still waits for 100 bytes: not used again
    pool.close()


async def test_connection_close_from_the_server_is_honoured(serve):
    async def close_after(reader, writer):
        await server.read_request(reader)
        writer.write(_answer(b"{}", b"connection: close\r\n"))
        await writer.drain()
        await reader.read()

    server = await serve(close_after)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
    assert await r.read() == b"{}"
    r.release()
    assert not await _reused(pool, server)
    await asyncio.wait_for(server.closed.wait(), 5)  # the gateway's side closed it


async def test_a_connection_cut_mid_body_raises_a_payload_error(serve):
    async def cut(reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly part")
        await writer.drain()

    server = await serve(cut)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
    with pytest.raises(BodyBroken) as raised:
        await r.read()
    assert isinstance(raised.value, aiohttp.ClientPayloadError)
    r.release()  # a broken response never goes back to the pool
    assert not await _reused(pool, server)


async def test_a_connection_closed_before_the_head_raises_dropped(serve):
    async def drop(reader, writer):
        await server.read_request(reader)

    server = await serve(drop)
    pool = WirePool(connect_s=1.0)
    with pytest.raises(Dropped) as raised:
        await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
    assert isinstance(raised.value, aiohttp.ServerDisconnectedError)


@pytest.mark.parametrize(
    "answer",
    [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n",
    ],
    ids=["head", "body"],
)
async def test_a_malformed_response_is_malformed_not_a_dropped_connection(serve, answer):
    raised = await _failure(serve, answer, Malformed)
    assert not isinstance(raised, (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError))
    assert raised.args[0].startswith("malformed response")  # in the head or the body alike


async def _failure(serve, answer: bytes, error: type[BaseException]) -> BaseException:
    """What reading a response answered with ``answer`` raises (it must be ``error``); the connection
    is closed, not kept for another request."""

    async def answering(reader, writer):
        await server.read_request(reader)
        writer.write(answer)
        await reader.read()

    server = await serve(answering)
    pool = WirePool(connect_s=1.0)
    with pytest.raises(error) as raised:
        response = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
        await response.read()
    await asyncio.wait_for(server.closed.wait(), 5)
    pool.close()
    return raised.value


async def test_a_refused_connection_raises_connect_failed():
    probe = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
    port = probe.sockets[0].getsockname()[1]
    probe.close()
    await probe.wait_closed()
    pool = WirePool(connect_s=1.0)
    with pytest.raises(ConnectFailed) as raised:
        await pool.request("POST", "127.0.0.1", port, "/", {}, b"x")
    assert isinstance(raised.value, aiohttp.ClientConnectionError)
    assert not isinstance(raised.value, aiohttp.ServerDisconnectedError)  # not retried as a stale one


async def test_a_header_with_a_line_break_is_refused_before_anything_is_sent(serve):
    async def never(reader, writer):
        await server.read_request(reader)

    server = await serve(never)
    pool = WirePool(connect_s=1.0)
    with pytest.raises(ValueError, match="line break"):
        await pool.request("POST", "127.0.0.1", server.port, "/", {"x-id": "a\r\nx-evil: 1"}, b"x")
    assert server.connections == 0


def _keeping_alive(server: Callable[[], Server]) -> Handler:
    """A handler that answers every request of a connection and never closes it itself."""

    async def keepalive(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            await server().read_request(reader)
            writer.write(_answer(b"{}"))

    return keepalive


async def test_an_idle_connection_past_its_keepalive_is_not_reused(serve):
    server = await serve(_keeping_alive(lambda: server))
    pool = WirePool(connect_s=1.0, keepalive_s=0.05)
    for _ in range(2):
        r = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
        await r.read()
        r.release()
        await asyncio.sleep(0.1)
    assert server.connections == 2


async def test_idle_connections_are_closed_past_their_keepalive_without_another_request(serve):
    # a server (or a balancer before it) that never closes an idle connection, and an endpoint that gets
    # no more requests: its connections must not stay open for good
    server = await serve(_keeping_alive(lambda: server))
    other = await serve(_keeping_alive(lambda: other))
    pool = WirePool(connect_s=1.0, keepalive_s=0.2)
    responses = [
        await pool.request("POST", "127.0.0.1", port, "/", {}, b"x")
        for port in (server.port, server.port, other.port)
    ]
    for r in responses:
        await r.read()
        r.release()
    assert len(pool._all) == 3
    await asyncio.sleep(0.1)
    later = await pool.request("POST", "127.0.0.1", other.port, "/", {}, b"x")  # reused, then idle again
    await later.read()
    later.release()
    await asyncio.sleep(0.15)  # the first two are past their keep-alive; the reused one is not
    assert len(pool._all) == 1 and not pool._idle.get(("127.0.0.1", server.port))
    await asyncio.sleep(0.15)
    assert not pool._all and not pool._idle
    pool.close()


async def test_an_unread_response_stops_the_socket_and_reading_resumes_it(serve):
    size = 64 * PAUSE_BYTES  # more than the kernel's socket buffers hold
    wrote = asyncio.Event()

    async def big(reader, writer):
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
        writer.write(b"x" * size)
        await writer.drain()
        wrote.set()
        await reader.read()

    server = await serve(big)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
    await asyncio.sleep(0.2)
    assert r._conn._paused
    assert r.buffered < 2 * PAUSE_BYTES  # what the reader has not taken is bounded
    assert not wrote.is_set()  # so the server is held back
    assert len(await r.read()) == size
    r.release()
    pool.close()
    await asyncio.wait_for(server.closed.wait(), 5)


async def test_a_cancelled_request_closes_its_connection(serve):
    async def slow(reader, writer):
        await server.read_request(reader)
        await reader.read()

    server = await serve(slow)
    pool = WirePool(connect_s=1.0)
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.1):
            await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
    await asyncio.wait_for(server.closed.wait(), 5)  # the upstream sees the request aborted
    assert not await _reused(pool, server)


def test_the_host_header_names_an_ipv6_endpoint_in_brackets():
    head = _request_head("GET", "::1", 8000, "/v1/models", {}, b"", "specroute")
    assert b"\r\nhost: [::1]:8000\r\n" in head
    head = _request_head("GET", "vllm-0.vllm", 8000, "/v1/models", {}, b"", "specroute")
    assert b"\r\nhost: vllm-0.vllm:8000\r\n" in head


async def test_chunks_that_arrived_together_after_the_first_are_read_as_one_piece(serve):
    more = asyncio.Event()

    async def bursty(reader, writer):
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            + b"".join(b"%x\r\ndata: %d\n\n\r\n" % (len(b"data: %d\n\n" % i), i) for i in range(5))
        )
        await writer.drain()
        await more.wait()
        writer.write(b"9\r\ndata: 5\n\n\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    server = await serve(bursty)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("GET", "127.0.0.1", server.port, "/s", {}, b"")
    assert len(r._pieces) == 5  # parsed from the head's own write, before any is read
    chunks = r.chunks()
    assert await anext(chunks) == b"data: 0\n\n"  # the first by itself, the others together
    assert await anext(chunks) == b"".join(b"data: %d\n\n" % i for i in range(1, 5))
    assert r.buffered == 0
    more.set()
    assert [piece async for piece in chunks] == [b"data: 5\n\n"]
    r.release()
    pool.close()


def _compressed(data: bytes, coding: str) -> bytes:
    if coding == "raw-deflate":  # deflate without zlib's header, as some servers send "deflate"
        encoder = zlib.compressobj(wbits=-zlib.MAX_WBITS)
        return encoder.compress(data) + encoder.flush()
    return gzip.compress(data) if coding in ("gzip", "x-gzip") else zlib.compress(data)


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "raw-deflate"])
async def test_a_compressed_body_is_read_decoded_and_the_connection_kept(serve, coding):
    """An upstream that compresses although asked for ``identity``: the forwarder reads plain bytes."""
    body = b'{"choices": [{"text": "' + b"hello " * 200 + b'"}]}'

    async def compressing(reader, writer):
        while True:
            await server.read_request(reader)
            extra = b"content-encoding: %s\r\n" % coding.removeprefix("raw-").upper().encode()
            writer.write(_answer(_compressed(body, coding), extra))

    server = await serve(compressing)
    pool = WirePool(connect_s=1.0)
    for _ in range(2):
        r = await pool.request("POST", "127.0.0.1", server.port, "/v1/completions", {}, b"{}")
        assert "content-encoding" not in r.headers  # what is read is no longer encoded
        assert await r.read() == body
        r.release()
    assert server.connections == 1
    pool.close()


async def test_a_compressed_stream_is_decoded_piece_by_piece(serve):
    events = [b'data: {"n": %d}\n\n' % i for i in range(3)]
    encoder = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    frames = [encoder.compress(e) + encoder.flush(zlib.Z_SYNC_FLUSH) for e in events]
    frames[-1] += encoder.flush()
    step = asyncio.Event()

    async def streaming(reader, writer):
        await server.read_request(reader)
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncontent-encoding: gzip\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        for frame in frames:
            writer.write(b"%x\r\n%s\r\n" % (len(frame), frame))
            await writer.drain()
            await step.wait()
            step.clear()
        writer.write(b"0\r\n\r\n")
        await reader.read()

    server = await serve(streaming)
    pool = WirePool(connect_s=1.0)
    r = await pool.request("POST", "127.0.0.1", server.port, "/v1/completions", {}, b"{}")
    chunks = r.chunks()
    for event in events:
        assert await anext(chunks) == event  # each event as soon as its frame arrives
        step.set()
    assert [piece async for piece in chunks] == []
    assert r.arrived
    r.release()
    pool.close()


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (_answer(b"\x1b\x00\x00", b"content-encoding: br\r\n"), Malformed),  # not decodable here
        (_answer(b"not gzip at all", b"content-encoding: gzip\r\n"), Malformed),
        (_answer(gzip.compress(b"x" * 1000)[:-12], b"content-encoding: gzip\r\n"), BodyBroken),  # cut short
    ],
    ids=["unknown-coding", "not-compressed", "truncated"],
)
async def test_a_compressed_body_that_cannot_be_read_fails_the_response(serve, answer, error):
    await _failure(serve, answer, error)


async def test_a_response_head_that_never_ends_is_malformed_past_its_bound(serve):
    # a header line written on and on would otherwise grow until the first-byte time-out
    endless = b"HTTP/1.1 200 OK\r\nx-filler: " + b"a" * (MAX_HEAD_BYTES + 1)
    raised = await _failure(serve, endless, Malformed)
    assert "head is over" in raised.args[0]
    # a large head within the bound is read
    big = b"x-filler: %s\r\n" % (b"a" * (MAX_HEAD_BYTES // 2))
    assert await _read(serve, _answer(b"{}", big)) == b"{}"


async def _read(serve, answer: bytes, limit: int | None = None, **pool_args) -> bytes:
    async def answering(reader, writer):
        await server.read_request(reader)
        writer.write(answer)
        await reader.read()

    server = await serve(answering)
    pool = WirePool(connect_s=1.0, **pool_args)
    try:
        response = await pool.request("POST", "127.0.0.1", server.port, "/", {}, b"x")
        return await response.read(limit)
    finally:
        pool.close()


async def test_a_compressed_body_is_decoded_only_as_far_as_it_may_be_held(serve):
    # 200 MB of zeros compress to 200 KB: decoded in one call, the gateway's memory would take it all
    encoder = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
    bomb = b"".join(encoder.compress(bytes(1024 * 1024)) for _ in range(200)) + encoder.flush()
    tracemalloc.start()
    try:
        with pytest.raises(Malformed, match="over 4194304 bytes unread"):
            await _read(serve, _answer(bomb, b"content-encoding: gzip\r\n"), max_unread=4 * 1024 * 1024)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024  # the bound and the compressed answer, not 200 MB


async def test_a_read_with_a_limit_is_malformed_past_it_and_whole_within_it(serve):
    body = b"z" * 100_000
    assert await _read(serve, _answer(body), limit=100_000) == body
    with pytest.raises(Malformed, match="over 99999 bytes"):
        await _read(serve, _answer(body), limit=99_999)
