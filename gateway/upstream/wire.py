"""A lean HTTP/1.1 client for forwarding: keep-alive connections, one request at a time, httptools parsing.

Forwarding needs little of an HTTP client: the body is bytes already, the headers a handful of
strings, and the response is read as raw pieces by the forwarder, which enforces its own time-outs.
aiohttp's ``ClientSession.request`` does much more per request (a request object, multidicts both
ways, timers, traces, a payload writer, a stream reader): 59 µs of CPU per forwarded completion against
12-13 µs for this client, system calls included (``python -m tests.upstream.wire_microbench``), about a
tenth of the gateway's whole cost per request. This client writes the request in one ``write`` and
parses the answer with the C parser uvicorn uses for the other side (``httptools``).

Scope: plain ``http://`` endpoints and the methods forwarding uses; TLS endpoints go through aiohttp
(certificates and SNI are its business). Failures are raised as aiohttp's exception types, so the
forwarder handles both clients' failures alike:

- :class:`ConnectFailed` (a ``ClientConnectionError``): refused, unreachable or the connect time-out;
  nothing was sent;
- :class:`Dropped` (a ``ServerDisconnectedError``): the connection closed or reset before the response's
  head arrived, typically a pooled keep-alive connection the server closed as the request went out;
- :class:`BodyBroken` (a ``ClientPayloadError``): it closed, reset or sent something unparsable in the
  middle of the response.

The gateway asks for ``accept-encoding: identity``, but a server or a proxy in front of it may compress
anyway. A ``gzip`` or ``deflate`` body is decoded here, as aiohttp decodes it on the TLS path, so the
forwarder always reads the body itself (it relays only the content type, never the encoding); any other
coding is :class:`Malformed`, since the gateway could neither read nor relay it.

A response is read to its end and :meth:`WireResponse.release`-d, which puts its connection back in the
pool (when both sides keep it alive), or :meth:`WireResponse.close`-d, which closes the connection and
so aborts the upstream request. Idle connections are reused most recent first and closed after
``keepalive_s`` unused (vLLM's uvicorn closes them after 5 s), so a reused one is rarely found dead; one
timer per pool closes them whether or not another request goes to their endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast, overload

import aiohttp
import httptools

from gateway.types import CONTENT_CODINGS, window_bits

PAUSE_BYTES = 256 * 1024
"""A response that has this much unread stops the socket's reading until the reader catches up."""

MAX_HEAD_BYTES = 64 * 1024
"""A response head (status line and headers) longer than this is :class:`Malformed`: vLLM's are a few
hundred bytes, and one that never ends would otherwise grow in memory until the first-byte time-out."""

MAX_UNREAD_BYTES = 256 * 1024 * 1024
"""The default of :class:`WirePool`'s ``max_unread``: the most of a body held unread at once.

A plain body never comes near it (reading pauses at :data:`PAUSE_BYTES`); a compressed one is decoded
only so far, since a few kilobytes can decode to gigabytes in one call."""


class ConnectFailed(aiohttp.ClientConnectionError):
    """No connection could be made: nothing was sent."""


class Dropped(aiohttp.ServerDisconnectedError):
    """The connection ended before the response's head arrived."""


class BodyBroken(aiohttp.ClientPayloadError):
    """The connection ended before the response's end."""


class Malformed(aiohttp.ClientError):
    """The upstream's answer is not valid HTTP/1.1 (its head, or its body's framing).

    Neither a connection that failed nor one that dropped: the upstream answered, wrongly. It is sent
    elsewhere like any failed try and, when every try ends so, reported as a bad gateway (502).
    """


class Headers(dict[str, str]):
    """Response headers by lower-cased name (a repeated header keeps its last value)."""

    @overload  # type: ignore[override]
    def get(self, key: str, /) -> str | None: ...
    @overload
    def get(self, key: str, /, default: str) -> str: ...
    def get(self, key: str, /, default: str | None = None) -> str | None:
        return super().get(key.lower(), default)


class _Connection(asyncio.Protocol):
    """One keep-alive connection; carries one response at a time."""

    def __init__(self, pool: WirePool, key: tuple[str, int], loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        self.key = key
        # the connection's own loop: ``asyncio.get_running_loop()`` is a getpid system call on Python 3.11,
        # and a stream waits for its next read once a chunk
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.response: WireResponse | None = None
        self.closed = False
        self.idle_since = 0.0
        self.head_read = -1  # bytes read of the awaited head (-1: none awaited)
        self._paused = False

    # -- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one, not by inheritance
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as e:
            self._fail(f"malformed response: {e}", malformed=True)
            self.abort()
            return
        if self.head_read >= 0:  # the head is still awaited after these bytes
            self.head_read += len(data)
            if self.head_read > MAX_HEAD_BYTES:
                self._fail(f"the upstream's response head is over {MAX_HEAD_BYTES} bytes", malformed=True)
                self.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        response = self.response
        if response is not None and not response.done:
            if response.until_close and response.head.done() and exc is None:
                response.finish()  # a body delimited by the connection's end (a reset is no end)
            else:
                self._fail("the upstream closed the connection" if exc is None else str(exc))

    def pause_writing(self) -> None:  # requests are small: nothing to hold back
        pass

    def resume_writing(self) -> None:
        pass

    # -- httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        response = self.response
        if response is not None:
            response.headers[name.decode("latin-1").lower()] = value.decode("latin-1")

    def on_headers_complete(self) -> None:
        response = self.response
        if response is None:
            return
        response.status = self.parser.get_status_code()
        if response.status < 200:  # an interim response (100 Continue): the real head follows
            response.headers.clear()
            return
        self.head_read = -1
        headers = response.headers
        coding = headers.pop("content-encoding", "identity").strip().lower()
        if coding not in ("identity", ""):
            if coding not in CONTENT_CODINGS:
                self._fail(f"the upstream's answer has content-encoding {coding!r}", malformed=True)
                self.abort()
                return
            response.wbits = CONTENT_CODINGS[coding]
        response.until_close = (
            "content-length" not in headers
            and "chunked" not in (headers.get("transfer-encoding") or "").lower()
            and response.status not in (204, 304)
        )
        if not response.head.done():
            response.head.set_result(None)
        if response.head_only:
            # the parser, not told the request was HEAD, would wait for the body the head announces:
            # the answer is whole now, and the connection is not used again (keep_alive stays False)
            response.finish()

    def on_body(self, body: bytes) -> None:
        response = self.response
        if response is not None and not response.done:
            if response.wbits:
                if response.decoder is None:
                    response.decoder = zlib.decompressobj(window_bits(response.wbits, body))
                # decoded only up to what may be held unread: a few kilobytes can decode to gigabytes
                room = self.pool.max_unread - response.buffered + 1
                try:
                    body = response.decoder.decompress(body, room)
                except zlib.error as e:
                    self._fail(f"the upstream's compressed body cannot be decoded: {e}", malformed=True)
                    self.abort()
                    return
                if not body:
                    return
                if response.buffered + len(body) > self.pool.max_unread:
                    why = f"the upstream's answer is over {self.pool.max_unread} bytes unread"
                    self._fail(why, malformed=True)
                    self.abort()
                    return
            response.feed(body)
            if response.buffered > PAUSE_BYTES and not self._paused and self.transport is not None:
                self._paused = True
                self.transport.pause_reading()

    def on_message_complete(self) -> None:
        response = self.response
        if response is not None and response.status >= 200:
            response.keep_alive = self.parser.should_keep_alive()
            response.finish()

    # -- the reader's side
    def resume(self) -> None:
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    def abort(self) -> None:
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, why: str, malformed: bool = False) -> None:
        response = self.response
        if response is None or response.done:
            return
        if not response.head.done():
            response.head.set_exception(Malformed(why) if malformed else Dropped(why))
        else:
            response.fail(Malformed(why) if malformed else BodyBroken(why))


class WireResponse:
    """A response whose head has arrived; its body is read with :meth:`chunks` or :meth:`read`."""

    __slots__ = (
        "_conn",
        "_error",
        "_pieces",
        "_waiter",
        "buffered",
        "decoder",
        "done",
        "head",
        "head_only",
        "headers",
        "keep_alive",
        "status",
        "until_close",
        "wbits",
    )

    def __init__(self, conn: _Connection, head: asyncio.Future[None]):
        self._conn = conn
        self.head = head
        self.status = 0
        self.headers = Headers()
        self.until_close = False
        self.head_only = False  # the answer to HEAD: no body, whatever its head announces
        self.keep_alive = False
        self.done = False
        self.buffered = 0
        self.wbits = 0  # a compressed body's zlib window setting (0: not compressed)
        self.decoder: zlib._Decompress | None = None  # from its first byte
        self._pieces: deque[bytes] = deque()
        self._waiter: asyncio.Future[None] | None = None
        self._error: BaseException | None = None

    # -- fed by the connection
    def feed(self, body: bytes) -> None:
        self._pieces.append(body)
        self.buffered += len(body)
        self._wake()

    def finish(self) -> None:
        if self.done:
            return
        decoder = self.decoder
        if decoder is not None:
            if not decoder.eof:  # the compressed stream stops short: its end never came
                self.fail(BodyBroken("the upstream's compressed body ended before its end"))
                self._conn.abort()
                return
            rest = decoder.flush()
            if rest:
                self.feed(rest)
        self.done = True
        self._wake()

    def fail(self, error: BaseException) -> None:
        if self.done:
            return
        self._error = error
        self.done = True
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    # -- read by the forwarder
    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives (``aiohttp``'s ``content.iter_any()``): after its first piece, all
        that has arrived in one piece.

        Chunks an upstream wrote together (a stream's events that piled up while the gateway was busy)
        are read, metered and passed on once, not once each; the first goes on by itself, so that a
        stream's first event never waits for the metering of those that came with it.
        """
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[bytes]:
        pieces = self._pieces
        first = True
        while True:
            if pieces:
                if first or len(pieces) == 1:
                    piece = pieces.popleft()
                    first = False
                else:
                    piece = b"".join(pieces)
                    pieces.clear()
                self.buffered -= len(piece)
                if self.buffered < PAUSE_BYTES // 4:
                    self._conn.resume()
                yield piece
                continue
            if self._error is not None:
                raise self._error
            if self.done:
                return
            self._waiter = self._conn.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    async def read(self, limit: int | None = None) -> bytes:
        """The rest of the body; :class:`Malformed` when it is over ``limit`` bytes."""
        return await read_within(self._iterate(), limit)

    @property
    def arrived(self) -> bool:
        """The whole body is here (reading the rest will not wait)."""
        return self.done and self._error is None

    def release(self) -> None:
        """Done with a response read to its end: its connection goes back to the pool."""
        conn = self._conn
        if conn.response is not self:
            return
        conn.response = None
        if self.done and self._error is None and self.keep_alive and not conn.closed and not self._pieces:
            conn.pool.put_back(conn)
        else:
            conn.abort()

    def close(self) -> None:
        """Done with a response, read or not: its connection is closed (an unfinished request aborts)."""
        conn = self._conn
        if conn.response is self:
            conn.response = None
        conn.abort()


class WirePool:
    """Keep-alive connections per (host, port), and the requests sent over them."""

    def __init__(
        self,
        connect_s: float,
        keepalive_s: float = 4.0,
        user_agent: str = "specroute",
        max_unread: int = MAX_UNREAD_BYTES,
    ) -> None:
        self.connect_s = connect_s
        # the most of a body held unread: more is Malformed (never below what pausing lets through)
        self.max_unread = max(max_unread, 4 * PAUSE_BYTES)
        self.keepalive_s = keepalive_s
        self.user_agent = user_agent
        self._idle: dict[tuple[str, int], deque[_Connection]] = {}
        self._all: set[_Connection] = set()  # open connections, idle or busy (closed at shutdown)
        self._sweep: asyncio.TimerHandle | None = None  # closes the idle ones past keepalive_s

    async def request(
        self,
        method: str,
        host: str,
        port: int,
        target: str,
        headers: Mapping[str, str],
        body: bytes,
        fresh: bool = False,
    ) -> WireResponse:
        """Send one request and wait for its response's head; the body follows through the response.

        ``target`` is the request target (path and query); ``headers`` must not carry ``host``,
        ``content-length`` or ``transfer-encoding``, which this client writes itself. ``fresh`` sends it
        on a new connection, not an idle one (a request resent after its pooled connection dropped: the
        others idle beside it may have been closed by the same server at the same moment).
        """
        head = _request_head(method, host, port, target, headers, body, self.user_agent)
        conn = None if fresh else self._take(host, port)
        if conn is None:
            conn = await self._connect(host, port)
        response = WireResponse(conn, conn.loop.create_future())
        response.head_only = method == "HEAD"
        conn.response = response
        conn.head_read = 0
        try:
            assert conn.transport is not None
            try:
                conn.transport.write(head + body if body else head)
            except RuntimeError as e:  # the transport closed under us
                raise Dropped(str(e)) from None
            await response.head
        except BaseException:
            # failed, timed out or cancelled mid-request: the connection's state is unknown
            response.close()
            raise
        return response

    def put_back(self, conn: _Connection) -> None:
        conn.idle_since = time.monotonic()
        idle = self._idle.get(conn.key)
        if idle is None:
            idle = self._idle[conn.key] = deque()
        idle.append(conn)
        if self._sweep is None:
            self._sweep = conn.loop.call_later(self.keepalive_s, self._close_idle)

    def _close_idle(self) -> None:
        """Close every connection idle for ``keepalive_s``, whatever its endpoint, and look again while
        some stay idle: an endpoint that gets no more requests (ejected, or gone from discovery) would
        otherwise keep its connections, and a server or balancer that never closes them its sockets."""
        self._sweep = None
        now = time.monotonic()
        oldest = None
        for key, idle in list(self._idle.items()):
            while idle and (idle[0].closed or now - idle[0].idle_since >= self.keepalive_s):
                idle.popleft().abort()
            if not idle:
                del self._idle[key]
            elif oldest is None or idle[0].idle_since < oldest:
                oldest = idle[0].idle_since
        if oldest is not None:
            loop = asyncio.get_running_loop()
            self._sweep = loop.call_later(oldest + self.keepalive_s - now, self._close_idle)

    def forget(self, conn: _Connection) -> None:
        """A connection has closed (the server's end or ours): it is no longer this pool's."""
        self._all.discard(conn)

    def close(self) -> None:
        """Close every connection, idle or busy."""
        if self._sweep is not None:
            self._sweep.cancel()
            self._sweep = None
        for conn in list(self._all):
            conn.abort()
        self._all.clear()
        self._idle.clear()

    def _take(self, host: str, port: int) -> _Connection | None:
        idle = self._idle.get((host, port))
        if not idle:
            return None
        now = time.monotonic()
        while idle:
            conn = idle.pop()
            if not conn.closed and now - conn.idle_since < self.keepalive_s and not _closing(conn):
                # the older ones have been idle longer: close those past their time
                while idle and now - idle[0].idle_since >= self.keepalive_s:
                    idle.popleft().abort()
                return conn
            conn.abort()
        return None

    async def _connect(self, host: str, port: int) -> _Connection:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.connect_s):
                _, conn = await loop.create_connection(
                    lambda: _Connection(self, (host, port), loop), host, port
                )
        except TimeoutError:
            raise ConnectFailed(f"no connection to {host}:{port} within {self.connect_s} s") from None
        except OSError as e:
            raise ConnectFailed(f"cannot connect to {host}:{port}: {e.strerror or e}") from e
        if not conn.closed:
            self._all.add(conn)
        return conn


async def read_within(pieces: AsyncIterator[bytes], limit: int | None) -> bytes:
    """All of ``pieces`` joined; :class:`Malformed` as soon as they are over ``limit`` bytes."""
    if limit is None:
        return b"".join([piece async for piece in pieces])
    parts = []
    size = 0
    async for piece in pieces:
        size += len(piece)
        if size > limit:
            raise Malformed(f"the upstream's answer is over {limit} bytes")
        parts.append(piece)
    return b"".join(parts)


def _closing(conn: _Connection) -> bool:
    return conn.transport is None or conn.transport.is_closing()


def _request_head(
    method: str,
    host: str,
    port: int,
    target: str,
    headers: Mapping[str, str],
    body: bytes,
    user_agent: str,
) -> bytes:
    authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # an IPv6 literal in brackets
    lines = [f"{method} {target} HTTP/1.1\r\nhost: {authority}\r\nuser-agent: {user_agent}\r\n"]
    for name, value in headers.items():
        # a line break in a header would smuggle another header or request: refuse it
        if "\n" in value or "\r" in value or "\n" in name or "\r" in name:
            raise ValueError(f"the request header {name!r} holds a line break")
        lines.append(f"{name}: {value}\r\n")
    if body or method in ("POST", "PUT", "PATCH"):
        lines.append(f"content-length: {len(body)}\r\n")
    lines.append("\r\n")
    if "\n" in target or "\r" in target or " " in target:
        raise ValueError("the request target holds a space or a line break")
    return "".join(lines).encode("latin-1")
