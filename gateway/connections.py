"""Client connections the gateway will not hold forever: a time limit on request heads, a cap on count.

uvicorn closes a keep-alive connection that stays idle after a response (``timeout_keep_alive``),
but its timer stops at the first byte received and never runs on a connection that has not sent a
request yet: a client that opens connections and sends nothing, or sends its headers a byte at a
time, holds each one for as long as it likes. Its ``limit_concurrency`` answers a plain-text 503
and counts tasks as well as connections. This protocol (uvicorn's httptools one, which the gateway
runs) adds both rules:

- from the moment a connection opens, and from the first byte of each further request, the request
  line and headers must arrive within ``server.header_timeout_s``; if not, the client gets a 408
  (when it had begun a request) and the connection is closed;
- a request head longer than ``server.max_header_bytes`` gets a 431 and the connection is closed
  (httptools sets no limit of its own: the head would grow for as long as the time-out allows),
  however the head was split into reads and whichever request of the connection it is. A head
  still incomplete after a read is cut as soon as the bytes it surely holds pass the limit; a
  complete one is measured when it could be too long (its reads add up to more than the limit, which
  nearly no request's do) as the request line and header lines written in the usual form
  (``Name: value``, CRLF endings, the blank line), which is what the gateway holds of it, and is
  answered in its turn on the connection;
- bytes that are not an HTTP/1.1 request get an OpenAI-shaped 400 (uvicorn's is plain text) and the
  connection is closed;
- a connection with more than :data:`MAX_PIPELINED` requests waiting behind the one being answered
  (HTTP/1.1 pipelining, sent without reading the answers) is dropped: each waiting request holds
  memory, and one read can carry thousands;
- a connection opened while ``server.max_connections`` are already open gets one OpenAI-shaped 503
  answer to its first request, with ``Connection: close``, and is closed (the application answers it,
  so that it is counted and logged like any answer, and serves ``/health`` there: a liveness probe
  must not fail because the gateway is busy). Connections already open are not disturbed.

When the server drains (SIGTERM, SIGINT, SIGHUP: a rollout, a reload replacing the workers) uvicorn
closed every idle keep-alive connection at once. A client that was sending its next request on one at
that moment wrote it into a closed socket: a reset (``ECONNRESET``, "Can not write request body",
"Server disconnected"), and a POST is not sent again. Here a drain (:meth:`GuardedHttpProtocol.shutdown`)
closes no connection under a request that may be on its way: the next request on an idle connection is
answered in full, with ``Connection: close``, and the connection closes after it, as one in flight does;
one that stays idle for :data:`DRAIN_IDLE_S` (at most half the grace period) is half-closed (the client
reads its end, no reset) and closed when the client closes or :data:`REFUSE_DRAIN_S` later, so an idle
connection does not hold the drain until the end of ``server.shutdown_grace_s``.

The keep-alive time-out is one timer per idle period rather than one per response: uvicorn arms a
timer when a response ends and cancels it at the next request's first byte, a timer armed and
cancelled per request. Here the response's end notes the time and arms a timer only when none is
armed; a timer that fires on a busy connection ends, one that fires early (the connection was busy
and went idle again since) waits for the rest, so an idle connection closes when uvicorn's would.

Each request's scope carries a :class:`~gateway.types.ClientState`: the application reads from it
whether the whole body had arrived before its task started (no timer around reading it), and a
client that goes away mid-request cancels the request's task from :meth:`connection_lost` (no task
per request waiting on ``receive()`` to notice it).

The body is the application's to time (``server.body_timeout_s`` in :func:`gateway.api.request.read_body`).

Each response also leaves in one write instead of two: uvicorn writes the response head as soon as
the application starts the response and the body with the next message, a system call each, and on
a connection with ``TCP_NODELAY`` two packets that wake the client twice. :class:`HeadWithBody`
holds the head until the body's first bytes (they follow within the same turn of the event loop:
the gateway always has them when it starts a response) and writes both together.

A stream's chunks go out through :class:`CycleWriter`, which the request's ``ClientState`` carries: the
bytes uvicorn writes for a chunked body message, without the message, its wrappers and checks; a
stream's head and end too (:meth:`CycleWriter.start`, :meth:`CycleWriter.end`). A whole answer goes
out through it as well (:meth:`CycleWriter.respond`): the head and body uvicorn writes for a start
message and one body message, checked as uvicorn checks them but all at once, in one write.
"""

from __future__ import annotations

import asyncio
import contextlib
import urllib.parse
from dataclasses import dataclass
from typing import Any, ClassVar

import httptools
from starlette.types import Receive, Scope, Send
from uvicorn.protocols.http.flow_control import service_unavailable
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from gateway.api.errors import error_body
from gateway.observability import GaugeChild
from gateway.types import CLIENT_SCOPE_KEY, REFUSED_SCOPE_KEY, ClientState


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    header_timeout_s: float = 10.0
    max_connections: int = 2048
    max_header_bytes: int = 65536


#: the bytes uvicorn refuses in a response header's name (``HEADER_RE``) and value (``HEADER_VALUE_RE``),
#: for ``bytes.translate``: one pass in C, where a search with the regex tests a character class per byte
#: (some 5,000 instructions over a response's names or values)
_REFUSED_IN_NAMES = bytes([*range(0x20), 0x7F]) + b'()<>@,;:[]={} \t\\"'
_REFUSED_IN_VALUES = bytes([*range(0x09), *range(0x0A, 0x20), 0x7F])

_REFUSED = error_body(503, "the gateway has too many open connections; try again shortly")
_HEAD_TIMEOUT = error_body(408, "the request headers did not arrive in time")
_HEAD_TOO_LARGE = error_body(431, "the request line and headers are too large")
_NOT_HTTP = error_body(400, "the request is not valid HTTP/1.1")


def _closing_response(status: bytes, body: bytes) -> bytes:
    return (
        b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
        % (status, len(body), body)
    )


#: the most requests a connection may have waiting behind the one being answered (HTTP/1.1 pipelining;
#: clients that pipeline at all send a few): past it the connection is dropped
MAX_PIPELINED = 64

#: how long a refused request's body is read before the answer, and the body of a request answered
#: before it arrived after the answer, so that closing the connection on unread bytes (which resets it)
#: does not destroy the answer before the client reads it
REFUSE_DRAIN_S = 1.0

#: how long a connection idle while the server drains stays open for a request already on its way: a
#: client that uses the connection gets its answer (with ``Connection: close``) well within it; one idle
#: this long is likely idle in its pool, and closing it then is the ordinary keep-alive race
DRAIN_IDLE_S = 2.0


async def drain_and_answer(
    receive: Receive, send: Send, status: int, body: bytes, extra: list[tuple[bytes, bytes]]
) -> None:
    """Read the request's body (for at most :data:`REFUSE_DRAIN_S`), then answer ``status`` with
    ``body`` and ``Connection: close``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(REFUSE_DRAIN_S):
            while (await receive()).get("more_body", False):
                pass
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
        *extra,
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def refuse(receive: Receive, send: Send, request_id: str) -> None:
    """The answer a request on a connection beyond the cap gets (the application counts it)."""
    extra = [(b"retry-after", b"1"), (b"x-request-id", request_id.encode("latin-1"))]
    await drain_and_answer(receive, send, 503, _REFUSED, extra)


async def head_too_large(scope: Scope, receive: Receive, send: Send) -> None:
    """The answer to a complete request head over ``server.max_header_bytes``; the connection closes."""
    await drain_and_answer(receive, send, 431, _HEAD_TOO_LARGE, [])


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a request-head timeout and a connection cap.

    The limits are class-wide: uvicorn builds the protocol from a class (passed by name to worker
    processes), so each process sets them once before serving (see :mod:`gateway.server`).
    """

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    #: counts the open connections (``specroute_open_connections``): set by the app once its metrics exist
    open_gauge: ClassVar[GaugeChild | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._counted: GaugeChild | None = None  # the gauge this connection was counted in
        self._head_timer: asyncio.TimerHandle | None = None
        self._in_head = False
        self._in_message = False  # between a request's first byte and its body's end
        self._begun = 0  # requests begun on this connection
        # of a head still incomplete after a read: the bytes it surely holds, and at most
        self._head_bytes = 0
        self._head_bound = 0
        self._measure = False  # whether a head completed in the current read could be over the limit
        self._idle_since: float | None = None  # when the last response ended, while no byte came since
        self._drain_timer: asyncio.TimerHandle | None = None  # a body read after its answer; half-closed
        self._dropped = False  # pipelined too far ahead: closed, nothing more of it parsed is served
        self._refusing = False  # opened beyond server.max_connections (see connection_made)
        self._draining = False  # the server drains: every request from now on closes its connection
        self._half_closed = False  # drained while idle: our end is closed, whatever comes is dropped

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        counted = self._counted = self.open_gauge
        if counted is not None:
            counted.inc()
        self._held = HeadWithBody(transport, self.loop)  # every response's writes, one after another
        # beyond the cap: every request is answered 503 but /health (a liveness probe), then it closes
        self._refusing = len(self.connections) > self.limits.max_connections
        self._arm_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted is not None:
            self._counted.inc(-1)
            self._counted = None
        self._cancel_head_timer()
        self._cancel_drain_timer()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            client = cycle.scope.get(CLIENT_SCOPE_KEY)
            if isinstance(client, ClientState):
                client.gone()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._half_closed:
            return  # read and dropped (not left unread, which would make the final close a reset)
        size = len(data)
        limit = self.limits.max_header_bytes
        begun, in_message = self._begun, self._in_message
        # a head that completes in this read holds at most what it had before it and this read: only
        # when that passes the limit is it measured (in on_headers_complete)
        self._measure = self._head_bound + size > limit
        super().data_received(data)
        if self._in_head and not self.transport.is_closing():
            if self._head_timer is None:
                # a head still incomplete after the read that began it: from now on it is timed (a
                # head that arrives whole, nearly all of them, never arms a timer)
                self._arm_head_timer()
            if self._begun == begun:  # the head went on through the whole read
                self._head_bytes += size
                self._head_bound += size
            else:
                # it began in this read: at its first byte when no request was under way before and
                # it is the read's only one; else after another request's bytes, of unknown length
                # (a pipelined request), which the lower count leaves out
                self._head_bound = size
                self._head_bytes = size if self._begun == begun + 1 and not in_message else 0
            if self._head_bytes > limit:
                self._cancel_head_timer()
                self.transport.write(
                    _closing_response(b"431 Request Header Fields Too Large", _HEAD_TOO_LARGE)
                )
                self.transport.close()

    def send_400_response(self, msg: str) -> None:
        """What uvicorn answers bytes that are not HTTP with (it logs ``msg``), in the API's format."""
        self.transport.write(_closing_response(b"400 Bad Request", _NOT_HTTP))
        self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = self._in_message = True
        self._begun += 1

    def on_headers_complete(self) -> None:
        """uvicorn's, with the cycle built from positional arguments (keywords cost it some 5,000
        instructions a request), writing through the connection's :class:`HeadWithBody`, and carrying
        the request's :class:`~gateway.types.ClientState` in its scope."""
        self._in_head = False
        self._head_bound = 0
        self._cancel_head_timer()
        if self._dropped:
            return  # the rest of a read that overran the pipeline (below) is not served
        if len(self.pipeline) >= MAX_PIPELINED:
            # each request waiting its turn holds its scope, cycle and headers, and one read can hold
            # thousands of small ones: a client that sends this far ahead of its answers, reading none,
            # would grow the process by megabytes a read, on any number of connections
            self._dropped = True
            self.logger.warning(
                "a client sent more than %d requests ahead of their answers on one connection: dropped",
                MAX_PIPELINED,
            )
            self.transport.abort()
            return
        app = self.app
        if self._measure and self._head_size() > self.limits.max_header_bytes:
            # answered by its own cycle, so that a response still going out on this connection
            # (a pipelined request's) is not cut by it
            app = head_too_large
        parser = self.parser
        http_version = parser.get_http_version()
        scope = self.scope
        scope["method"] = parser.get_method().decode("ascii")
        if http_version != "1.1":
            scope["http_version"] = http_version
        if parser.should_upgrade() and self._should_upgrade():
            return
        parsed_url = httptools.parse_url(self.url)
        raw_path = parsed_url.path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        scope["path"] = self.root_path + path
        scope["raw_path"] = self.root_path.encode("ascii") + raw_path
        scope["query_string"] = parsed_url.query or b""
        if self.limit_concurrency is not None and (
            len(self.connections) >= self.limit_concurrency or len(self.tasks) >= self.limit_concurrency
        ):
            app = service_unavailable
            self.logger.warning("Exceeded concurrency limit.")
        existing = self.cycle
        cycle = self.cycle = RequestResponseCycle(
            scope,
            self._held,
            self.flow,
            self.logger,
            self.access_logger,
            self.access_log,
            self.server_state.default_headers,
            asyncio.Event(),
            self.expect_100_continue,
            http_version != "1.0" and parser.should_keep_alive() and not (self._refusing or self._draining),
            self.on_response_complete,
        )
        if self._refusing:
            scope[REFUSED_SCOPE_KEY] = True  # type: ignore[literal-required]
        # the request's task finds the signal in its scope
        scope[CLIENT_SCOPE_KEY] = ClientState(CycleWriter(cycle), self.transport)  # type: ignore[literal-required]
        if existing is None or existing.response_complete:
            self._start_asgi_task(cycle, app)
        else:  # a pipelined request waits for the responses before it
            self.flow.pause_reading()
            self.pipeline.appendleft((cycle, app))

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        self._held.next_response()  # the response before it is over
        super()._start_asgi_task(cycle, app)

    def on_response_complete(self) -> None:
        """uvicorn's, but for the keep-alive timer (see the module's description) and a request answered
        before its body arrived (a 401, a 413, /health, a refused request).

        The rest of such a body is read and dropped for at most :data:`REFUSE_DRAIN_S`; the connection
        goes on if it ends by then and is closed if not. Closing at once, on bytes not yet read, resets
        the connection, and a client that writes its whole body before reading (Python's
        ``http.client`` and ``requests``, most non-streaming clients) then sees the reset instead of the
        answer. Not waiting for the body to end would let a client that sends a byte now and then hold
        the connection (and a place under ``max_connections``) for ever, each read cancelling the
        keep-alive timer.
        """
        if self._in_message and not self.pipeline and not self.transport.is_closing():
            self._cancel_drain_timer()
            self._drain_timer = self.loop.call_later(REFUSE_DRAIN_S, self._drain_timed_out)
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._went_idle()

    def shutdown(self) -> None:
        """The server drains: uvicorn's closed an idle connection at once, under a request the client may
        be sending on it at that moment (which then met a closed socket, and was lost).

        A request being answered, or the last one waiting behind it, is the connection's last: it closes
        after that answer (``Connection: close``). A request arriving or yet to arrive is answered likewise
        (see :meth:`on_headers_complete`). An idle connection is given :meth:`_idle_limit` for a request
        on its way, then half-closed (:meth:`timeout_keep_alive_handler`).
        """
        self._draining = True
        cycle = self.cycle
        if self.pipeline:
            self.pipeline[0][0].keep_alive = False  # the last in line (appended on the left)
        elif cycle is not None and not cycle.response_complete:
            cycle.keep_alive = False
        elif not self.transport.is_closing():
            if self.timeout_keep_alive_task is not None:  # armed for timeout_keep_alive
                self.timeout_keep_alive_task.cancel()
                self.timeout_keep_alive_task = None
            if not self._in_message:  # idle: the period starts now (else when the request's body ends)
                self._went_idle()

    def _went_idle(self) -> None:
        """Nothing to answer: the keep-alive period starts now."""
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self._idle_limit(), self.timeout_keep_alive_handler
            )

    def _idle_limit(self) -> float:
        """How long the connection may stay idle: ``timeout_keep_alive``, or while the server drains
        :data:`DRAIN_IDLE_S`, at most half the grace period (an idle connection must not hold it)."""
        if not self._draining:
            return float(self.timeout_keep_alive)
        grace = self.config.timeout_graceful_shutdown
        return DRAIN_IDLE_S if grace is None else min(DRAIN_IDLE_S, grace / 2)

    def _close_idle(self) -> None:
        """Close an idle connection; while the server drains, half-close it.

        A request the client sends as the connection closes finds, after a full close, a socket that
        answers with a reset. After a half-close (our end only, ``shutdown(SHUT_WR)``) it is read and
        dropped, and the client sees the connection end cleanly; the client's own close then closes
        ours (``eof_received``), or :data:`REFUSE_DRAIN_S` later at the latest. Over TLS, which cannot
        half-close, it closes.
        """
        transport = self.transport
        if not self._draining or not transport.can_write_eof():
            transport.close()
            return
        self._half_closed = True
        self._cancel_head_timer()
        transport.write_eof()
        self._cancel_drain_timer()
        self._drain_timer = self.loop.call_later(REFUSE_DRAIN_S, transport.close)

    def _drain_timed_out(self) -> None:
        """The body of a request answered early is still coming: close (see :meth:`on_response_complete`)."""
        self._drain_timer = None
        if self._in_message and not self.transport.is_closing():
            self.transport.close()

    def _cancel_drain_timer(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
            self._drain_timer = None

    def _unset_keepalive_if_required(self) -> None:
        """A byte arrived (uvicorn cancels the keep-alive timer here): the connection is busy; a timer
        still armed finds that out when it fires."""
        self._idle_since = None

    def timeout_keep_alive_handler(self) -> None:
        """Close the connection if it has been idle for :meth:`_idle_limit` since its last response (or
        since the server began to drain)."""
        self.timeout_keep_alive_task = None
        idle = self._idle_since
        if idle is None:  # busy: the end of its response arms the timer again
            return
        left = idle + self._idle_limit() - self.loop.time()
        if left > 0.001:  # it was busy meanwhile: the rest of the period from its last response
            self.timeout_keep_alive_task = self.loop.call_later(left, self.timeout_keep_alive_handler)
        elif not self.transport.is_closing() and not self._half_closed:
            self._close_idle()

    def on_message_complete(self) -> None:
        self._in_message = False
        if self._drain_timer is not None:
            # the body of a request answered early ended in time: the connection goes on, idle
            self._cancel_drain_timer()
            if not self.pipeline and self.cycle.response_complete:
                self._went_idle()
        super().on_message_complete()
        client = self.cycle.scope.get(CLIENT_SCOPE_KEY)
        if isinstance(client, ClientState):
            client.body_complete = True

    def _head_size(self) -> int:
        """The complete head's length as ``METHOD target HTTP/1.1``, ``Name: value`` lines, CRLFs and the
        blank line: its bytes as sent, less any spaces before a header's value (httptools drops them)."""
        size = len(self.parser.get_method()) + len(self.url) + 14  # 2 spaces, "HTTP/1.1", 2 CRLFs
        for name, value in self.headers:
            size += len(name) + len(value) + 4  # ": " and CRLF
        return size

    def _arm_head_timer(self) -> None:
        self._head_timer = self.loop.call_later(self.limits.header_timeout_s, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # a pipelined request's head is arriving while the previous response is still going out:
            # that response is not cut; the head gets another period
            self._arm_head_timer()
            return
        if self._in_head:
            self.transport.write(_closing_response(b"408 Request Timeout", _HEAD_TIMEOUT))
        self.transport.close()


class CycleWriter:
    """A :class:`~gateway.types.ChunkWriter` for one request's response on this protocol.

    It writes what uvicorn's ``send`` writes for the messages of a response, without the messages,
    their wrappers and the checks made per header, and only where that ``send`` would write at once
    and accept them: a whole response (:meth:`respond`), a chunked response's head (:meth:`start`),
    a piece of its body (:meth:`write`) and its end (:meth:`end`). The cycle's state (started,
    complete, keep-alive, the protocol told of the end) changes as that ``send`` changes it.
    Everywhere else it declines, and the caller's ASGI message goes the usual way (waiting for a slow
    client to drain, a HEAD response, a head uvicorn would refuse or treat otherwise).

    Bound to its request's cycle, not to the connection's current one: a pipelined request gets a cycle
    of its own while this one is still being answered.
    """

    __slots__ = ("_cycle", "_event_stream")

    def __init__(self, cycle: RequestResponseCycle):
        self._cycle = cycle
        self._event_stream = False

    def progress(self) -> tuple[bool, bool, bool]:
        """Whether the response has started, whether it is complete (however they went out), and whether
        this writer started it as an event stream."""
        cycle = self._cycle
        return cycle.response_started, cycle.response_complete, self._event_stream

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write a whole response, or do nothing and return False where only ASGI messages may carry it.

        The bytes are those uvicorn's ``send`` writes for a start message with ``headers`` and one body
        message with ``body`` (the status line, the server's default headers, ``headers``, a
        ``connection: close`` when the connection is not kept alive, the blank line, the body), in one
        ``writelines``, and the cycle ends as that ``send`` ends it (complete, the connection closed if
        not kept alive, the protocol told). Taken only where uvicorn would write them at once and
        accept them (see :meth:`_head`), with a ``content-length`` of ``body``'s length.
        """
        cycle = self._cycle
        head = self._head(status, headers, len(body))
        if head is None:
            return False
        cycle.chunked_encoding = False
        cycle.expected_content_length = 0
        transport = cycle.transport
        if isinstance(transport, HeadWithBody):
            transport.write_whole(head, body)
        else:
            transport.writelines((head, body))
        self._complete()
        return True

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """Start a chunked response, or do nothing and return False where only an ASGI message may.

        The bytes are those uvicorn's ``send`` writes for a start message with ``headers`` and neither a
        length nor a transfer coding (``transfer-encoding: chunked`` added after them), written as that
        ``send`` writes them (on this protocol: held until the body's first piece, see
        :class:`HeadWithBody`).
        """
        head = self._head(status, headers, None)
        if head is None:
            return False
        cycle = self._cycle
        cycle.chunked_encoding = True
        cycle.expected_content_length = 0
        cycle.transport.write(head)
        for name, value in headers:
            if name == b"content-type":
                self._event_stream = value.startswith(b"text/event-stream")
        return True

    def end(self) -> bool:
        """End a chunked response (the last, empty piece), or return False where only a message may."""
        cycle = self._cycle
        if not self._chunks_open(cycle):
            return False
        cycle.transport.write(b"0\r\n\r\n")
        self._complete()
        return True

    def write(self, body: bytes) -> bool:
        cycle = self._cycle
        if not self._chunks_open(cycle):
            return False
        if body:
            cycle.transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        return True

    @staticmethod
    def _chunks_open(cycle: RequestResponseCycle) -> bool:
        """Whether uvicorn's ``send`` would write a chunked body's piece (or its end) at once: the response
        chunked and not over, the client connected and reading, the request not HEAD."""
        return not (
            cycle.chunked_encoding is not True
            or cycle.response_complete
            or cycle.disconnected
            or cycle.flow.write_paused
            or cycle.scope["method"] == "HEAD"
        )

    def _head(self, status: int, headers: list[tuple[bytes, bytes]], length: int | None) -> bytes | None:
        """The head uvicorn writes for a start message with ``headers``, the response marked started; or
        None, nothing changed, where it would not write it at once or would treat it otherwise.

        Taken only where nothing has started, the client is connected and reading, the request is not
        HEAD, the status has a body, ``headers`` are in lower case with neither ``transfer-encoding`` nor
        ``connection``, a ``content-length`` of ``length`` (with ``length``) or none (without: the head
        then ends with uvicorn's ``transfer-encoding: chunked``), and no name or value uvicorn would
        refuse (checked joined, one pass each, instead of two searches per header).
        """
        cycle = self._cycle
        if (
            cycle.response_started
            or cycle.disconnected
            or cycle.flow.write_paused
            or cycle.access_log
            or cycle.scope["method"] == "HEAD"
            or status < 200
            or status in (204, 304)
            or status not in STATUS_LINE
            or not headers
        ):
            return None
        names, values = zip(*headers, strict=True)
        joined = b"".join(names)
        value_bytes = b"".join(values)
        if (
            len(joined.translate(None, _REFUSED_IN_NAMES)) != len(joined)
            or not joined.islower()
            or len(value_bytes.translate(None, _REFUSED_IN_VALUES)) != len(value_bytes)
            or b"transfer-encoding" in names
            or b"connection" in names
        ):
            return None
        if length is None:
            if b"content-length" in names:
                return None
            end = b"\r\ntransfer-encoding: chunked\r\n\r\n"
        elif b"content-length" not in names or values[names.index(b"content-length")] != b"%d" % length:
            return None
        else:
            end = b"\r\n\r\n"
        default = cycle.default_headers
        head = [STATUS_LINE[status]]
        if default:
            head.append(b"".join([b"%s: %s\r\n" % (name.lower(), value) for name, value in default]))
        head.append(b"\r\n".join(map(b": ".join, headers)))
        if not cycle.keep_alive:
            head.append(b"\r\nconnection: close")
        head.append(end)
        cycle.response_started = True
        cycle.waiting_for_100_continue = False
        return b"".join(head)

    def _complete(self) -> None:
        """The end of the response, as uvicorn's ``send`` ends it."""
        cycle = self._cycle
        cycle.response_complete = True
        cycle.message_event.set()
        if not cycle.keep_alive:
            cycle.transport.close()
        cycle.on_response()


class HeadWithBody(asyncio.Transport):
    """The responses' side of the connection: each response's first write (the head) waits for its second.

    Both go out in one ``writelines`` (one ``writev``). A head that no body follows within the same
    turn of the event loop goes out on its own at the next turn, so nothing waits longer than that.
    Only what uvicorn's response cycle calls (write, close, is_closing) is needed; the rest passes on.
    One per connection: its responses go out one after another, and :meth:`next_response` (when the
    next one's task starts) writes what is still held of the one before.
    """

    __slots__ = ("_first", "_head", "_loop", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop):
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._first = True
        self._head: bytes | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if self._first:
            self._first = False
            self._head = bytes(data)
            self._loop.call_soon(self._flush)
            return
        head = self._head
        if head is None:
            self._transport.write(data)
        else:
            self._head = None
            self._transport.writelines((head, data))

    def next_response(self) -> None:
        """The next response's first write will be its head: the one before (a HEAD request's, say, with no
        body write) goes out first if it is still held."""
        self._flush()
        self._first = True

    def write_whole(self, head: bytes, body: bytes) -> None:
        """A whole response at once, nothing held (:meth:`CycleWriter.respond`)."""
        self._first = False
        self._transport.writelines((head, body))

    def _flush(self) -> None:
        head, self._head = self._head, None
        if head is not None and not self._transport.is_closing():
            self._transport.write(head)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def abort(self) -> None:
        self._transport.abort()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)
