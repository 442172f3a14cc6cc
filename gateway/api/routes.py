"""The OpenAI routes: validate → classify → decide → forward (with measurement) → observe."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from time import perf_counter
from typing import Any, TypeVar

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.api import state
from gateway.api.edge import upstream_headers, without_slash
from gateway.api.errors import (
    APIError,
    client_error_body,
    error_response,
    from_upstream,
    openai_shaped,
    route_missing_body,
    sse_error_event,
)
from gateway.api.request import (
    body_request_id,
    check_key,
    check_model,
    check_operator,
    forced_pool,
    has_key,
    header,
    parse_body,
    read_body,
    request_id,
    trace_id,
)
from gateway.api.state import Gateway
from gateway.errors import (
    RequestNotEncodable,
    UpstreamBroken,
    UpstreamError,
    UpstreamStatus,
    UpstreamTooLarge,
)
from gateway.observability import render
from gateway.routing.measurement import ASSEMBLED
from gateway.routing.policy import Api, Decision, RouteRequest
from gateway.speculation import sequences
from gateway.types import CLIENT_SCOPE_KEY, RUN_TOKEN_ENV, RUN_TOKEN_HEADER, ChunkWriter, ClientState
from gateway.upstream.assemble import assemble, can_assemble, stream_body
from gateway.upstream.forward import Sent
from gateway.upstream.pool import Endpoint
from gateway.upstream.resume import Resumption, refusal
from gateway.upstream.stream import StreamMeter, request_usage

log = logging.getLogger("specroute.api")
T = TypeVar("T")

#: how a non-streamed speculative request that cannot be rebuilt from a stream is measured: it is not
#: (:func:`~gateway.upstream.assemble.can_assemble`)
UNMEASURABLE = "unmeasurable"
PATHS: dict[Api, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _gateway(request: Request) -> Gateway:
    return state.of(request)


async def completions(request: Request) -> Response:
    return await _handle(request, "completions")


async def chat_completions(request: Request) -> Response:
    return await _handle(request, "chat")


def _decision_headers(decision: Decision, pool: str | None, request_id: str) -> dict[str, str]:
    """The decision's headers; ``x-specroute-pool`` only when a pool's answer is what the client gets."""
    return {k.decode(): v.decode("latin-1") for k, v in _encoded_decision_headers(decision, pool, request_id)}


def _encoded_decision_headers(
    decision: Decision, pool: str | None, request_id: str
) -> list[tuple[bytes, bytes]]:
    """:func:`_decision_headers` as the raw pairs of an ASGI response head, in the same order."""
    reason = decision.reason if pool in (None, decision.pool) else f"{decision.reason},failover"
    raw = [
        (b"x-specroute-class", decision.prompt_class.encode("latin-1")),
        (b"x-specroute-reason", reason.encode("latin-1")),
        (b"x-request-id", request_id.encode("latin-1")),
    ]
    if pool is not None:
        raw.append((b"x-specroute-pool", pool.encode("latin-1")))
    if decision.predicted_speedup is not None:
        raw.append((b"x-specroute-predicted-speedup", b"%.2f" % decision.predicted_speedup))
    return raw


@dataclass(slots=True)
class Exchange:
    """One client request on its way through the gateway."""

    gw: Gateway
    api: Api
    started: float
    request_id: str
    trace_id: str | None = None
    payload: dict[str, Any] | None = None
    decision: Decision | None = None
    measurement: str | None = None  # how a speculative request's acceptance is measured (access log)
    deadline: float = float("inf")  # when the upstream's answer must be over, on the loop's clock
    # the endpoints it was sent to, in order: the access log names the last one when none answered
    tried: list[Endpoint] = field(default_factory=list)

    def headers(self, pool: str | None) -> dict[str, str]:
        if self.decision is None:
            return {"x-request-id": self.request_id}
        return _decision_headers(self.decision, pool, self.request_id)

    def encoded_headers(self, pool: str | None) -> list[tuple[bytes, bytes]]:
        """:meth:`headers` as the raw pairs of a response head (for :class:`Answer` and :class:`Relay`)."""
        if self.decision is None:
            return [(b"x-request-id", self.request_id.encode("latin-1"))]
        return _encoded_decision_headers(self.decision, pool, self.request_id)


async def _handle(request: Request, api: Api) -> Response:
    """One request's path, top to bottom: validate → classify and decide → forward (measure) → observe."""
    gw = _gateway(request)
    ex = Exchange(gw, api, perf_counter(), request_id(request), trace_id(request))
    try:
        raw, payload = await _validate(request, ex)
        ex.payload = payload
        if "request_id" in payload and (rid := body_request_id(request, payload)) is not None:
            ex.request_id = rid
        forced = forced_pool(request, gw.allow_pool_override)
        decision = ex.decision = gw.policy.decide(RouteRequest(payload, api, forced))
        gw.observer.decided(decision, gw.policy.strategy)
        try:
            out = _upstream_request(request, ex, raw, payload)
        except RequestNotEncodable:
            out = _as_sent(ex, raw, payload, upstream_headers(request, gw, ex.request_id, "application/json"))
        if out.meter is None:
            # vLLM sends a non-streamed response's headers only when it is complete: its first byte
            # may take as long as the whole request may (timeouts.total_s).
            fetched = gw.upstreams.fetch(
                PATHS[api],
                out.body,
                out.headers,
                decision.pool,
                allow_failover=not decision.baseline_only,
                first_byte_s=gw.total_s,
                tried=ex.tried,
            )
            sent, content = await _unless_disconnected(request, fetched)
            gw.observer.forwarded(decision, sent.pool)
            return _complete(ex, sent, content)
        tried = ex.tried
        # a non-streamed request streamed upstream to be measured waits for its first byte as long as
        # when its bytes pass as they came (above): how it is measured never decides whether it times out
        first_byte_s = gw.total_s if out.meter.collect is not None else None
        # timeouts.total_s bounds the tries, the first byte's wait and the stream together
        ex.deadline = gw.upstreams.deadline()
        sent = await _unless_disconnected(request, _send(ex, out, first_byte_s, tried))
    except asyncio.CancelledError:
        _finish(ex, None, CUT_AT_SHUTDOWN)
        raise
    except APIError as e:
        _finish(ex, None, e.status)
        return _failed(ex, e)

    gw.observer.forwarded(decision, sent.pool)
    status = sent.response.status
    if status >= 300:
        return await _passed_through(request, ex, sent)
    meter = out.meter
    if meter.collect is not None:  # a non-streamed request streamed upstream to be measured
        return await _assembled(request, ex, sent, tried, partial(_send, ex, out, first_byte_s, tried))

    def done(s: Sent, failed: int | None) -> None:
        _finish(ex, s, _relayed_status(request, failed) or status, meter, resumption=out.resume)

    chunks = gw.upstreams.relay(sent, meter, done, out.resume, ex.deadline)
    media_type = sent.response.headers.get("content-type", "application/json")
    headers = ex.encoded_headers(sent.pool)
    return Relay.encoded(chunks, status, headers, media_type, sse_error_event, ex.deadline)


def _send(
    ex: Exchange,
    out: UpstreamRequest,
    first_byte_s: float | None,
    tried: list[Endpoint],
    error: UpstreamError | None = None,
) -> Awaitable[Sent]:
    """The request to its decided pool, within its deadline; again, after ``error``, to one not ``tried``."""
    assert ex.decision is not None
    return ex.gw.upstreams.send(
        PATHS[ex.api],
        out.body,
        out.headers,
        ex.decision.pool,
        allow_failover=not ex.decision.baseline_only,
        first_byte_s=first_byte_s,
        tried=tried,
        last_error=error,
        deadline=ex.deadline,
    )


def _failed(ex: Exchange, e: APIError) -> Response:
    """The client's answer when no pool's answer reached it: the upstream failed in a way the gateway
    could not hide, or the request never got that far.

    No x-specroute-pool (naming the decided pool would blame one that may never have been tried, and a
    failover reason one that served nothing); a server error names the request id, to find it in the log.
    """
    message = f"{e.message} (request id {ex.request_id})" if e.status >= 500 else e.message
    return error_response(e.status, message, e.param, {**e.headers, **ex.headers(None)}, e.body)


async def _validate(request: Request, ex: Exchange) -> tuple[bytes, dict[str, Any]]:
    """The caller's key, then the body: read within its limits, JSON, every field of the right type."""
    gw = ex.gw
    check_key(request, gw.api_keys)
    body = await read_body(request, gw.max_body_bytes, gw.body_timeout_s)
    return body, parse_body(body, ex.api, ex.gw.models)


@dataclass(slots=True)
class UpstreamRequest:
    """What goes upstream for one client request, and how its answer is measured."""

    body: bytes
    headers: dict[str, str]
    meter: StreamMeter | None = None  # streams (and measured non-streamed requests) are metered
    resume: Resumption | None = None  # a stream that may go on elsewhere if it breaks


def _as_sent(ex: Exchange, raw: bytes, payload: dict[str, Any], headers: dict[str, str]) -> UpstreamRequest:
    """The client's bytes, unmeasured: for a stream of several sequences, and a body whose JSON nests
    deeper than the encoder goes, which the gateway cannot rewrite to ask for usage (vLLM reads up to 1,024
    levels). A stream passes as it comes, usage and all as the client asked, and is not resumed; a
    non-streamed answer is not assembled."""
    ex.measurement = None
    if payload.get("stream") is True:
        return UpstreamRequest(
            raw, headers, StreamMeter(ex.started, keep_usage_chunk=True, keep_continuous=True)
        )
    return UpstreamRequest(raw, headers)


def _upstream_request(request: Request, ex: Exchange, raw: bytes, payload: dict[str, Any]) -> UpstreamRequest:
    """The body and headers to send, with a meter for streams and for measured non-streamed requests.

    Streams ask for per-chunk usage (acceptance is read from it) and, when resumable, for what a
    resumption needs; a non-streamed request routed to the speculative pool is streamed upstream, to be
    measured, and assembled into one body for the client when the measurement is worth its cost
    (:mod:`gateway.routing.measurement`), else sent as the client's bytes.
    """
    gw, api = ex.gw, ex.api
    assert ex.decision is not None
    headers = upstream_headers(request, gw, ex.request_id, "application/json")
    speculative = ex.decision.pool == "speculative"
    if payload.get("stream") is True:
        if sequences(payload) > 1:
            # several interleaved sequences show no steps, and are not resumed: nothing to ask for. As the
            # client sent it, so that the stream is vLLM's own (asked for usage, vLLM moves the fingerprint
            # of every choice's finishing chunk onto the usage chunk, where one chunk cannot give it back)
            return _as_sent(ex, raw, payload, headers)
        if speculative:
            gw.measurement.streamed(ex.decision.pool, time.monotonic())
            ex.measurement = "stream"
        resume = None
        upstream_payload = payload
        if gw.settings.retries.resume_streams and refusal(payload, api == "chat") is None:
            resume = Resumption(api == "chat", PATHS[api], payload, headers)
            resume.failover = not ex.decision.baseline_only
            upstream_payload = resume.upstream_payload(gw.settings.retries.resume_with_token_ids)
        body, wants_usage, wants_continuous = request_usage(upstream_payload)
        meter = StreamMeter(ex.started, keep_usage_chunk=wants_usage, keep_continuous=wants_continuous)
        if resume is not None:
            meter.transcript = resume.transcript
            meter.strip_token_ids = resume.strip_token_ids
        return UpstreamRequest(body, headers, meter, resume)
    if speculative:
        verdict: str
        if can_assemble(payload, api):
            verdict = gw.measurement.verdict(ex.decision, ex.decision.pool, time.monotonic())
        else:  # tools, logprobs, n > 1...: counted, so that measured and passed are not read as all of it
            verdict = UNMEASURABLE
        gw.metrics.child(gw.metrics.measurements, ex.decision.pool, verdict).inc()
        ex.measurement = verdict
        if verdict in ASSEMBLED:
            return UpstreamRequest(stream_body(payload), headers, StreamMeter(ex.started, collect=[]))
    return UpstreamRequest(raw, headers)  # the client's bytes, as they came


async def _passed_through(request: Request, ex: Exchange, sent: Sent) -> Response:
    """An upstream error answer to a streamed request, read whole and passed on as it is."""
    try:
        content = await _unless_disconnected(request, ex.gw.upstreams.read_all(sent))
    except asyncio.CancelledError:
        _finish(ex, sent, CUT_AT_SHUTDOWN)
        raise
    except APIError as e:
        _finish(ex, sent, e.status)
        return _failed(ex, e)
    return _complete(ex, sent, content)


def _complete(ex: Exchange, sent: Sent, content: bytes) -> Response:
    """A whole upstream body, passed on as it is; but a server without the route (an embedding model's
    vLLM has no completions) answers FastAPI's 404 or 405, and vLLM's key check a 401 of its own shape,
    which no OpenAI client reads: those in the API's own (the upstream's text kept as the message)."""
    status = sent.response.status
    media_type = sent.response.headers.get("content-type", "application/json")
    if 400 <= status < 500 and not openai_shaped(content):
        if status == 404 or status == 405:
            content = route_missing_body(status, "POST", PATHS[ex.api])
        else:
            content = client_error_body(status, content)
        media_type = "application/json"
    return Answer(
        content,
        status,
        ex.encoded_headers(sent.pool),
        media_type,
        lambda: _finish(ex, sent, status, content=content),
    )


async def _assembled(
    request: Request,
    ex: Exchange,
    sent: Sent,
    tried: list[Endpoint],
    resend: Callable[[UpstreamError], Awaitable[Sent]],
) -> Response:
    """Read a stream started for a non-streamed request and answer with the assembled body.

    The client has seen nothing yet, so a stream that breaks, ends before ``[DONE]`` or reports a
    server error is sent again on another endpoint while ``retries.attempts`` allow.
    """
    while True:
        meter = StreamMeter(ex.started, collect=[])
        failed: list[int | None] = []
        try:
            await _unless_disconnected(request, _drain(ex, sent, meter, failed))
            if not _broken(meter, failed) or not ex.gw.upstreams.can_retry(tried):
                break
            broke = UpstreamBroken("upstream stream ended without a complete response")
            sent = await _unless_disconnected(request, resend(broke))
        except asyncio.CancelledError:
            _finish(ex, sent, CUT_AT_SHUTDOWN)
            raise
        except APIError as e:
            _finish(ex, sent, e.status)
            return _failed(ex, e)
        if sent.response.status >= 300:
            return await _passed_through(request, ex, sent)
    status = failed[0] if failed and failed[0] else 200
    whole = status == 200 and meter.error is None and meter.done  # not a stream that ended early
    body = assemble(meter.collect or [], ex.api) if whole else None
    if body is None:
        err = meter.error or {}
        code = err.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else (status if status != 200 else 502)
        if meter.error is not None and status < 500:
            # the upstream's own answer to the request (a client error): the client gets it as it is
            _finish(ex, sent, status)
            return Response(
                orjson.dumps({"error": meter.error}),
                status,
                headers=ex.headers(sent.pool),
                media_type="application/json",
            )
        if meter.error is not None:
            # a server error's text (a trace, a path, an address) is for the log, not the client, and its
            # status is told as a non-streamed answer's is
            log.warning("%s/%s stream error: %r", sent.pool, sent.endpoint.name, meter.error)
            told = from_upstream(UpstreamStatus(status, f"the upstream returned HTTP {status}"))
            _finish(ex, sent, told.status)
            return _failed(ex, told)
        _finish(ex, sent, status)
        return _failed(ex, APIError(status, "the upstream stream ended without a complete response"))
    return Answer(
        orjson.dumps(body),
        status,
        ex.encoded_headers(sent.pool),
        "application/json",
        lambda: _finish(ex, sent, status, meter),
    )


async def _drain(ex: Exchange, sent: Sent, meter: StreamMeter, failed: list[int | None]) -> None:
    try:
        async for _ in ex.gw.upstreams.relay(sent, meter, lambda s, f: failed.append(f), None, ex.deadline):
            pass
    except UpstreamTooLarge as e:  # not sent again: the same request would get the same answer
        raise from_upstream(e) from None
    except UpstreamError:  # a break is in ``failed`` (the relay's on_done) too
        pass


def _broken(meter: StreamMeter, failed: list[int | None]) -> bool:
    """An assembled stream that broke, ended before ``[DONE]`` or reported a server error."""
    if failed and failed[0]:
        return True
    code = (meter.error or {}).get("code")
    return not meter.done or (isinstance(code, int) and code >= 500)


class Relay(StreamingResponse):
    """A stream to the client that a disconnect cancels, and with it the upstream request.

    Starlette's own runs the stream in a second task beside a disconnect listener in an anyio task
    group: ~40 µs more per request than one watcher, and one more turn of the loop before the first
    byte. This runs the stream in the request's task, watched like every other upstream wait.

    ``ending`` ends a stream that broke in a way the gateway could not hide: after the whole events
    already sent, the client gets ``ending(status, message)`` (an error event in the stream's own
    format) and the stream's end. Without it such a stream stops where it broke. Chunks are bytes.

    ``deadline`` (on the loop's clock) is the request's (``timeouts.total_s``): a client that stops
    reading holds the relay where it waits for the client to take more, beyond every upstream time
    limit, and with it the upstream's request and its seat in a batch. Past the deadline the
    connection is dropped, the upstream request ends and the request counts as the client's loss (499).
    """

    body_iterator: AsyncIterator[bytes]
    ending: Callable[[int, str], bytes] | None = None
    deadline: float | None = None

    def __init__(
        self,
        chunks: AsyncIterator[bytes],
        status: int,
        headers: Mapping[str, str] | None = None,
        media_type: str | None = None,
        ending: Callable[[int, str], bytes] | None = None,
        deadline: float | None = None,
    ) -> None:
        super().__init__(chunks, status, headers=headers, media_type=media_type)
        self.ending = ending
        self.deadline = deadline

    @classmethod
    def encoded(
        cls,
        chunks: AsyncIterator[bytes],
        status: int,
        headers: list[tuple[bytes, bytes]],
        media_type: str,
        ending: Callable[[int, str], bytes] | None = None,
        deadline: float | None = None,
    ) -> Relay:
        """A relay whose head starts as ``headers``, already encoded: what Starlette's constructor
        would make of the same headers as a dict, without encoding and checking them per request."""
        relay = cls.__new__(cls)
        relay.body_iterator = chunks
        relay.status_code = status
        relay.media_type = media_type
        relay.background = None
        relay.raw_headers = _head(headers, status, None, media_type)
        relay.ending = ending
        relay.deadline = deadline
        return relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        client = scope.get(CLIENT_SCOPE_KEY)
        state = client if isinstance(client, ClientState) else None
        writer = state.writer if state is not None else None
        with contextlib.suppress(APIError):  # 499: the relay saw the cancellation and closed upstream
            await _unless_disconnected(Request(scope, receive), self.stream_response(send, writer, state))

    async def stream_response(
        self, send: Send, writer: ChunkWriter | None = None, client: ClientState | None = None
    ) -> None:
        """The stream; its head, each chunk and its end by ``writer`` where it takes them, else as ASGI
        messages; ``client``'s connection dropped if it takes none past the deadline."""
        if writer is None or not writer.start(self.status_code, self.raw_headers):
            await send(
                {"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers}
            )
        deadline = self.deadline if client is not None and client.transport is not None else None
        try:
            async for chunk in self.body_iterator:
                if writer is None or not writer.write(chunk):
                    message = {"type": "http.response.body", "body": chunk, "more_body": True}
                    if deadline is None:
                        await send(message)
                        continue
                    try:
                        async with asyncio.timeout_at(deadline):
                            await send(message)  # waits while the client's connection is full
                    except TimeoutError:
                        assert client is not None
                        await self._stalled(send, client)
                        return
        except UpstreamError as e:
            if self.ending is None:
                raise
            error = from_upstream(e)
            event = self.ending(error.status, error.message)
            await send({"type": "http.response.body", "body": event, "more_body": True})
        if writer is None or not writer.end():
            await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def _stalled(self, send: Send, client: ClientState) -> None:
        """The client took nothing more until the request's deadline: drop its connection, end the
        upstream request (the relay records it), and wait until the server has seen the connection go."""
        log.warning("a client read none of its stream until the request's time ran out: connection dropped")
        client.abort()
        close = getattr(self.body_iterator, "aclose", None)
        if close is not None:
            await close()
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class Answer(Response):
    """A whole body with its head already encoded, then the request's bookkeeping (``after``).

    The head is what Starlette's ``Response`` makes of the same headers as a dict (the same pairs in
    the same order, ``content-length`` and ``content-type`` last), built without its per-response
    encoding and checks. ``after`` runs in the request's own task right after the last byte is
    written, before the event loop serves anything else, so a client that reads its response and
    then scrapes ``/metrics`` sees it; the client does not wait for it.
    """

    def __init__(
        self,
        content: bytes,
        status: int,
        headers: list[tuple[bytes, bytes]],
        media_type: str,
        after: Callable[[], None],
    ) -> None:
        self.status_code = status
        self.media_type = media_type
        self.background = None
        self.body = self._content = content
        self.raw_headers = _head(headers, status, len(content), media_type)
        self._after = after

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The head and body by the connection's writer where it takes them (one write, no messages),
        else as the two ASGI messages; then the bookkeeping."""
        client = scope.get(CLIENT_SCOPE_KEY)
        writer = client.writer if isinstance(client, ClientState) else None
        head = self.raw_headers
        if writer is None or not writer.respond(self.status_code, head, self._content):
            await send({"type": "http.response.start", "status": self.status_code, "headers": head})
            await send({"type": "http.response.body", "body": self._content})
        self._after()


def _head(
    headers: list[tuple[bytes, bytes]], status: int, length: int | None, media_type: str
) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``content-length`` (a whole body's) and ``content-type`` added as Starlette
    adds them: no length on a status that has no body, a charset on a text type that names none."""
    if length is not None and not (status < 200 or status in (204, 304)):
        headers.append((b"content-length", b"%d" % length))
    if media_type.startswith("text/") and "charset=" not in media_type.lower():
        media_type += "; charset=utf-8"
    headers.append((b"content-type", media_type.encode("latin-1")))
    return headers


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` but cancel it (and so the upstream request) if the client goes away.

    The gateway's own HTTP protocol cancels the request's task when the connection is lost
    (:class:`~gateway.types.ClientState`); under another ASGI server a task that waits on ``receive()``
    beside ``work`` tells the same. Upstream failures come out as the :class:`APIError` the client will
    be told (:func:`from_upstream`).
    """
    client = request.scope.get(CLIENT_SCOPE_KEY)
    watch: asyncio.Future[None] | None = None
    if not isinstance(client, ClientState):
        client = ClientState()
        watch = asyncio.ensure_future(_disconnected(request))
        watch.add_done_callback(lambda w: None if w.cancelled() else client.gone())
    elif client.lost:
        if inspect.iscoroutine(work):
            work.close()
        raise APIError(499, "client closed the request")
    task = asyncio.current_task()
    assert task is not None
    client.waiting = task
    try:
        return await work
    except UpstreamError as e:
        raise from_upstream(e) from None
    except asyncio.CancelledError:
        if client.lost:
            task.uncancel()
            raise APIError(499, "client closed the request") from None
        raise
    finally:
        client.waiting = None
        if watch is not None:
            watch.cancel()


# for the other routes (gateway.api.responses, gateway.api.passthrough)
unless_disconnected = _unless_disconnected
decision_headers = _decision_headers


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


#: the status of a request cut at the end of the shutdown grace period. A client that goes away makes
#: its request an APIError 499 (:func:`_unless_disconnected`), so a cancellation that reaches a handler
#: as such is uvicorn's, which the gateway answers with a 503 (:func:`gateway.app.fast_path`)
CUT_AT_SHUTDOWN = 503


def _relayed_status(request: Request, failed: int | None) -> int | None:
    """A relay's error status; its 499 (cancelled) is the shutdown's cut while the client is still there."""
    if failed == 499:
        client = request.scope.get(CLIENT_SCOPE_KEY)
        if isinstance(client, ClientState) and not client.lost:
            return CUT_AT_SHUTDOWN
    return failed


relayed_status = _relayed_status  # for the other routes, as above


def _finish(
    ex: Exchange,
    sent: Sent | None,
    status: int,
    meter: StreamMeter | None = None,
    content: bytes | None = None,
    resumption: Resumption | None = None,
) -> None:
    """Hand the finished request to :mod:`gateway.observe`: metrics, the policy's feedback, the access log."""
    observer = ex.gw.observer
    record = observer.record(
        request_id=ex.request_id,
        api=ex.api,
        started=ex.started,
        status=status,
        decision=ex.decision,
        payload=ex.payload,
        sent=sent,
        meter=meter,
        content=content,
        resumption=resumption,
        measurement=ex.measurement,
        trace_id=ex.trace_id,
        tried=ex.tried,
    )
    observer.observe(record)
    measured = (ex.measurement == "stream" or ex.measurement in ASSEMBLED) and record.resumed_on is None
    if measured and record.served and ex.decision is not None and record.served_pool == ex.decision.pool:
        # whether measuring this pool's requests teaches anything (see gateway.routing.measurement)
        ex.gw.measurement.taught(ex.decision.pool, record.measured is not None, record.completion_tokens)


async def models(request: Request) -> Response:
    """One entry per served model, with the upstream's own fields where an endpoint answers."""
    gw = _gateway(request)
    check_key(request, gw.settings.auth.api_keys)
    entries = await _model_entries(gw, _forwarded_key(request, gw))
    data = [entries[name] for name in gw.settings.served_models()]
    return Response(
        orjson.dumps({"object": "list", "data": data}),
        headers={"x-request-id": request_id(request)},
        media_type="application/json",
    )


async def model(request: Request) -> Response:
    """One served model's entry, as in the list (the OpenAI SDK's ``models.retrieve``); a 404 otherwise.

    vLLM serves only the list: the entry comes from it, so the two always agree.
    """
    gw = _gateway(request)
    check_key(request, gw.settings.auth.api_keys)
    name = request.path_params["model"]
    if not name:  # "/v1/models/": the list's route with a trailing slash
        return without_slash(request, "/v1/models")
    check_model(name, gw.models)
    entries = await _model_entries(gw, _forwarded_key(request, gw))
    headers = {"x-request-id": request_id(request)}
    return Response(orjson.dumps(entries[name]), headers=headers, media_type="application/json")


def _forwarded_key(request: Request, gw: Gateway) -> str | None:
    """The caller's ``Authorization`` ("" for none), where the gateway passes it upstream
    (``auth.forward_client_authorization``): the upstream, not the gateway, judges it; else None."""
    return (header(request, b"authorization") or "") if gw.forward_client_key else None


async def _model_entries(gw: Gateway, authorization: str | None = None) -> dict[str, dict[str, Any]]:
    """Every served model's entry by name, with the upstream's own fields where an endpoint answers.

    With the caller's ``authorization`` forwarded, the list is asked for with it, and an endpoint that
    refuses it (vLLM's ``--api-key``, with no key of the gateway's own replacing the caller's) refuses the
    caller: as vLLM alone would answer ``/v1/models``.

    vLLM's fields are kept, but its ``root`` and ``parent`` only where they are model names: ``root`` is
    often the path of the weights on the upstream's disk (``parent`` names a LoRA adapter's base model).
    """
    entries: dict[str, dict[str, Any]] = {}
    refused = None
    for pool in gw.upstreams.pools.values():
        ep = pool.pick()
        if ep is None:
            continue
        sent = {"authorization": authorization} if authorization else {}
        try:
            resp = await gw.upstreams.client.get(ep.base_url + "/v1/models", headers=sent, timeout=2.0)
            # forwarded (even as none) and not replaced by a key of the gateway's: the caller's to answer
            caller = authorization is not None and not gw.upstreams.own_key(ep)
            if resp.status_code in (401, 403) and caller:
                refused = resp.status_code
                break
            for m in resp.json().get("data", []):
                if isinstance(m, dict) and m.get("id") in gw.models:
                    entries.setdefault(m["id"], _public_model(m))
        except Exception:  # an unreachable endpoint only loses the detail, never the entry
            continue
    if refused is not None:
        raise APIError(refused, "Unauthorized" if refused == 401 else "Forbidden")
    now = int(time.time())
    for name in gw.settings.served_models():
        entries.setdefault(name, {"id": name, "object": "model", "created": now, "owned_by": "specroute"})
    return entries


_NAMES = ("root", "parent")  # model names, or paths on the upstream's disk


def _public_model(entry: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for key, value in entry.items():
        if key not in _NAMES or value is None or (isinstance(value, str) and not _looks_like_path(value)):
            out[key] = value
    return out


def _looks_like_path(value: str) -> bool:
    """A local path (absolute, relative or Windows), as opposed to a hub name like ``org/model``."""
    return value.startswith(("/", "./", "../", "~")) or "\\" in value or (len(value) > 1 and value[1] == ":")


# the token of the run that started this process (gateway.stack), read once
_HEALTH_HEADERS = {RUN_TOKEN_HEADER: os.environ[RUN_TOKEN_ENV]} if RUN_TOKEN_ENV in os.environ else {}


async def health(request: Request) -> Response:
    headers = {**_HEALTH_HEADERS, "x-request-id": request_id(request)}
    return Response(b'{"status":"ok"}', headers=headers, media_type="application/json")


async def ready(request: Request) -> Response:
    """Whether every model has an endpoint; endpoint names only to a caller with a key.

    Unauthenticated (a load balancer's probe) it shows counts, so nothing about the upstreams'
    layout leaks; with an API or admin key it names the available endpoints.
    """
    gw = _gateway(request)
    auth = gw.settings.auth
    named = has_key(request, [*auth.api_keys, *([auth.admin_key] if auth.admin_key else [])])
    pools: dict[str, Any] = {
        name: [e.name for e in p.available()] if named else len(p.available())
        for name, p in gw.upstreams.pools.items()
    }
    missing = [
        m
        for m in gw.models
        if not any(m in p.models and p.has_available() for p in gw.upstreams.pools.values())
    ]
    body = orjson.dumps(
        {"ready": not missing, "available_endpoints": pools, "models_without_endpoint": missing}
    )
    status = 200 if not missing and not gw.draining else 503
    headers = {"x-request-id": request_id(request)}
    return Response(body, status, headers=headers, media_type="application/json")


async def metrics(request: Request) -> Response:
    """Prometheus metrics: with API keys set, for a caller with ``auth.metrics_key`` or an API key.

    ``auth.metrics_public`` opens it for scrapers that cannot send a bearer token.
    """
    gw = _gateway(request)
    auth = gw.settings.auth
    if auth.api_keys and not auth.metrics_public:
        check_key(request, [*auth.api_keys, *([auth.metrics_key] if auth.metrics_key else [])])
    elif auth.metrics_key and not auth.metrics_public:
        check_key(request, [auth.metrics_key], "metrics key")
    if gw.scraper is not None:
        gw.scraper.export()
    gw.upstreams.export_state()
    body, content_type = render(gw.metrics)
    return Response(body, headers={"x-request-id": request_id(request)}, media_type=content_type)


async def admin_routing(request: Request) -> Response:
    """Live routing state: estimates per kind, the speedup model, endpoints as scraped, decision counts.

    Needs ``auth.admin_key`` when one is set, else (with API keys set) any API key.
    """
    gw = _gateway(request)
    auth = gw.settings.auth
    check_operator(request, auth.api_keys, auth.admin_key)
    snapshot = getattr(gw.policy, "snapshot", None)
    state: dict[str, Any] = snapshot() if callable(snapshot) else {"strategy": gw.policy.strategy.value}
    state["measurement"] = gw.measurement.snapshot()
    state["learned_state"] = gw.learned.snapshot() if gw.learned is not None else None
    # with several workers each learns from the requests it serves: say whose state this is
    state["worker"] = {"pid": os.getpid(), "workers": gw.settings.server.workers}
    headers = {"x-request-id": request_id(request)}
    return Response(orjson.dumps(state), headers=headers, media_type="application/json")
