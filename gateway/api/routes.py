"""The OpenAI routes: validate → classify → decide → forward (with measurement) → observe."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from gateway.api.errors import APIError, error_response
from gateway.api.request import check_key, forced_pool, parse_body, read_body
from gateway.observability import access_log, access_record, render
from gateway.routing.acceptance import Measured, from_server, from_token_steps
from gateway.routing.policy import Api, Decision, Outcome, RouteRequest
from gateway.upstream.assemble import assemble, can_assemble, stream_body
from gateway.upstream.forward import Sent
from gateway.upstream.pool import Endpoint
from gateway.upstream.stream import StreamMeter, request_usage

if TYPE_CHECKING:
    from gateway.app import Gateway

log = logging.getLogger("specroute.api")
T = TypeVar("T")
PATHS: dict[Api, str] = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


def _gateway(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


async def completions(request: Request) -> Response:
    return await _handle(request, "completions")


async def chat_completions(request: Request) -> Response:
    return await _handle(request, "chat")


def _decision_headers(decision: Decision, pool: str, request_id: str) -> dict[str, str]:
    reason = decision.reason if pool == decision.pool else f"{decision.reason},failover"
    headers = {
        "x-specroute-pool": pool,
        "x-specroute-class": decision.prompt_class,
        "x-specroute-reason": reason,
        "x-request-id": request_id,
    }
    if decision.predicted_speedup is not None:
        headers["x-specroute-predicted-speedup"] = f"{decision.predicted_speedup:.2f}"
    return headers


@dataclass(slots=True)
class Exchange:
    """One client request on its way through the gateway."""

    gw: Gateway
    api: Api
    started: float
    request_id: str
    payload: dict[str, Any] | None = None
    decision: Decision | None = None

    def headers(self, pool: str) -> dict[str, str]:
        if self.decision is None:
            return {"x-request-id": self.request_id}
        return _decision_headers(self.decision, pool, self.request_id)


async def _handle(request: Request, api: Api) -> Response:
    gw = _gateway(request)
    ex = Exchange(gw, api, perf_counter(), request.headers.get("x-request-id") or os.urandom(8).hex())
    try:
        check_key(request, gw.settings.auth.api_keys)
        body = await read_body(request, gw.settings.limits.max_body_bytes)
        payload = ex.payload = parse_body(body, api, gw.models)
        forced = forced_pool(request, gw.settings.routing.allow_pool_override)
        decision = ex.decision = gw.policy.decide(RouteRequest(payload, api, forced))
        gw.metrics.decisions.labels(gw.policy.strategy.value, decision.pool, decision.reason).inc()
        if decision.predicted_speedup is not None:
            gw.metrics.predicted_speedup.labels(decision.prompt_class).observe(decision.predicted_speedup)
        if decision.explore:
            gw.metrics.exploration.labels(decision.kind).inc()
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "x-request-id": ex.request_id,
        }
        if not gw.settings.auth.api_keys and "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        meter: StreamMeter | None = None
        if payload.get("stream") is True:
            body, wants_usage, wants_continuous = request_usage(payload)
            meter = StreamMeter(ex.started, keep_usage_chunk=wants_usage, keep_continuous=wants_continuous)
        elif decision.pool == "speculative" and can_assemble(payload, api):
            # stream from upstream to measure acceptance; the client still gets one JSON body
            body = stream_body(payload)
            meter = StreamMeter(ex.started, collect=[])
        first_byte = None if meter is not None else gw.settings.timeouts.total_s
        sent = await _unless_disconnected(
            request, gw.upstreams.send(PATHS[api], body, headers, decision.pool, first_byte_s=first_byte)
        )
    except APIError as e:
        _finish(ex, None, e.status)
        pool = ex.decision.pool if ex.decision else ""
        return error_response(e.status, e.message, e.param, {**e.headers, **ex.headers(pool)})

    out_headers = ex.headers(sent.pool)
    if sent.pool != decision.pool:
        gw.metrics.failovers.labels(decision.pool, sent.pool).inc()
    status = sent.response.status
    media_type = sent.response.headers.get("content-type", "application/json")
    if meter is not None and status < 300 and meter.collect is not None:
        return await _assembled(request, ex, sent, meter, out_headers)
    if meter is not None and status < 300:

        def done(s: Sent, failed: int | None) -> None:
            _finish(ex, s, failed or status, meter)

        return Relay(
            gw.upstreams.relay(sent, meter, done), status, headers=out_headers, media_type=media_type
        )
    try:
        content = await _unless_disconnected(request, gw.upstreams.read_all(sent))
    except APIError as e:
        _finish(ex, sent, e.status)
        return error_response(e.status, e.message, e.param, out_headers)
    return Response(
        content,
        status,
        headers=out_headers,
        media_type=media_type,
        background=_later(ex, sent, status, content=content),
    )


async def _assembled(
    request: Request, ex: Exchange, sent: Sent, meter: StreamMeter, headers: dict[str, str]
) -> Response:
    """Read a stream started for a non-streamed request and answer with the assembled body."""
    failed: list[int | None] = []

    async def drain() -> None:
        async for _ in ex.gw.upstreams.relay(sent, meter, lambda s, f: failed.append(f)):
            pass

    try:
        await _unless_disconnected(request, drain())
    except APIError as e:
        _finish(ex, sent, e.status)
        return error_response(e.status, e.message, e.param, headers)
    status = failed[0] if failed and failed[0] else 200
    body = assemble(meter.collect or [], ex.api) if status == 200 and meter.error is None else None
    if body is None:
        err = meter.error or {}
        code = err.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else (status if status != 200 else 502)
        _finish(ex, sent, status)
        if meter.error is not None:
            return Response(
                orjson.dumps({"error": meter.error}), status, headers=headers, media_type="application/json"
            )
        return error_response(status, "upstream stream ended without a complete response", None, headers)
    return Response(
        orjson.dumps(body),
        status,
        headers=headers,
        media_type="application/json",
        background=_later(ex, sent, status, meter),
    )


class Relay(StreamingResponse):
    """A stream to the client that a disconnect cancels, and with it the upstream request.

    Starlette's own runs the stream in a second task beside a disconnect listener in an anyio task
    group: ~40 µs more per request than one watcher, and one more turn of the loop before the first
    byte. This runs the stream in the request's task, watched like every other upstream wait.
    """

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        with contextlib.suppress(APIError):  # 499: the relay saw the cancellation and closed upstream
            await _unless_disconnected(Request(scope, receive), self.stream_response(send))


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Await ``work`` but cancel it (and so the upstream request) if the client goes away.

    One watcher task per request: on a disconnect it cancels the request's own task.
    """
    task = asyncio.current_task()
    assert task is not None
    watch = asyncio.ensure_future(_disconnected(request))
    watch.add_done_callback(lambda w: None if w.cancelled() else task.cancel())
    try:
        return await work
    except asyncio.CancelledError:
        if watch.done() and not watch.cancelled():
            task.uncancel()
            raise APIError(499, "client closed the request") from None
        raise
    finally:
        watch.cancel()


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


def _usage_of(content: bytes) -> dict[str, Any] | None:
    try:
        obj = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return usage if isinstance(usage, dict) else None


def _spec_k(gw: Gateway, endpoint: Endpoint) -> int | None:
    configured = gw.upstreams.pools["speculative"].num_speculative_tokens
    if configured:
        return configured
    return gw.scraper.of(endpoint).k if gw.scraper is not None else None


def _measure(gw: Gateway, sent: Sent, meter: StreamMeter) -> Measured | None:
    """The request's acceptance: the server's own summary when it sent one, else tokens per chunk."""
    k = _spec_k(gw, sent.endpoint)
    measured = from_server(meter.spec_metrics, k) if meter.spec_metrics else None
    return measured or from_token_steps(meter.token_steps, k)


def _prompt(payload: dict[str, Any] | None) -> object | None:
    if payload is None:
        return None
    return payload.get("messages") if "messages" in payload else payload.get("prompt")


def _later(
    ex: Exchange, sent: Sent, status: int, meter: StreamMeter | None = None, content: bytes | None = None
) -> BackgroundTask:
    """:func:`_finish` once the response has gone out: the client does not wait for the bookkeeping.

    It runs in the request's own task right after the last byte is written, before the event loop
    serves anything else, so a client that reads its response and then scrapes ``/metrics`` sees it.
    """

    async def observe() -> None:
        _finish(ex, sent, status, meter, content)

    return BackgroundTask(observe)


def _finish(
    ex: Exchange,
    sent: Sent | None,
    status: int,
    meter: StreamMeter | None = None,
    content: bytes | None = None,
) -> None:
    """Observe one finished request: metrics, the policy's feedback, the access log."""
    gw, decision = ex.gw, ex.decision
    e2e = perf_counter() - ex.started
    pool = sent.pool if sent else (decision.pool if decision else "none")
    cls = decision.prompt_class if decision else "none"
    gw.metrics.requests.labels(ex.api, pool, cls, str(status)).inc()
    ttft = tokens = tpot = measured = feedback = None
    chunks = 0
    if meter is not None:
        tokens, chunks = meter.completion_tokens, meter.chunks
        if meter.first_token_at is not None:
            ttft = meter.first_token_at - ex.started
    elif content is not None and status < 300:
        usage = _usage_of(content)
        if usage and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
    if decision is not None and sent is not None and status < 300:
        gw.metrics.e2e.labels(pool, cls).observe(e2e)
        if ttft is not None:
            gw.metrics.ttft.labels(pool, cls).observe(ttft)
            if tokens and tokens > 1:
                tpot = (e2e - ttft) / (tokens - 1)
                gw.metrics.tpot.labels(pool, cls).observe(tpot)
        if meter is not None and sent.pool == "speculative":
            measured = _measure(gw, sent, meter)
        accepted = steps = drafted = None
        if measured is not None:
            accepted, steps, drafted = int(measured.accepted), int(measured.steps), int(measured.draft_tokens)
            gw.metrics.request_acceptance.labels(cls).observe(measured.rate)
            gw.metrics.accepted_tokens.labels(cls).inc(accepted)
            gw.metrics.draft_tokens.labels(cls).inc(drafted)
        feedback = gw.policy.observe(
            Outcome(
                decision,
                sent.pool,
                sent.endpoint.name,
                status,
                ttft,
                e2e,
                tokens,
                chunks,
                accepted,
                drafted,
                steps,
            )
        )
    if gw.settings.logging.access_log:
        access_log(
            access_record(
                ts=time.time(),
                request_id=ex.request_id,
                route=ex.api,
                status=status,
                pool=pool,
                decided_pool=decision.pool if decision else None,
                endpoint=sent.endpoint.name if sent else None,
                prompt_class=cls,
                kind=decision.kind if decision else None,
                reason=decision.reason if decision else None,
                explore=decision.explore if decision else False,
                p_structured=decision.p_structured if decision else None,
                alpha_hat=decision.alpha if decision else None,
                predicted_speedup=decision.predicted_speedup if decision else None,
                alpha_sd=decision.alpha_sd if decision else None,
                measured_speedup=feedback.speedup if feedback else None,
                acceptance=measured.rate if measured else None,
                alpha=measured.alpha if measured else None,
                spec_steps=measured.steps if measured else None,
                acceptance_source=measured.source if measured else None,
                ttft_s=ttft,
                tpot_s=tpot,
                e2e_s=e2e,
                completion_tokens=tokens,
                prompt=_prompt(ex.payload) if gw.settings.logging.log_prompts else None,
            )
        )


async def models(request: Request) -> Response:
    """One entry per served model, with the upstream's own fields where an endpoint answers."""
    gw = _gateway(request)
    check_key(request, gw.settings.auth.api_keys)
    entries: dict[str, dict[str, Any]] = {}
    for pool in gw.upstreams.pools.values():
        ep = pool.pick()
        if ep is None:
            continue
        try:
            resp = await gw.upstreams.client.get(ep.base_url + "/v1/models", timeout=2.0)
            for m in resp.json().get("data", []):
                if isinstance(m, dict) and m.get("id") in gw.models:
                    entries.setdefault(m["id"], m)
        except Exception:  # an unreachable endpoint only loses the detail, never the entry
            continue
    now = int(time.time())
    for name in gw.settings.served_models():
        entries.setdefault(name, {"id": name, "object": "model", "created": now, "owned_by": "specroute"})
    data = [entries[name] for name in gw.settings.served_models()]
    return Response(orjson.dumps({"object": "list", "data": data}), media_type="application/json")


async def health(request: Request) -> Response:
    return Response(b'{"status":"ok"}', media_type="application/json")


async def ready(request: Request) -> Response:
    gw = _gateway(request)
    pools = {name: [e.name for e in p.available()] for name, p in gw.upstreams.pools.items()}
    missing = [
        m
        for m in gw.models
        if not any(m in p.models and p.has_available() for p in gw.upstreams.pools.values())
    ]
    body = orjson.dumps(
        {"ready": not missing, "available_endpoints": pools, "models_without_endpoint": missing}
    )
    return Response(body, 200 if not missing and not gw.draining else 503, media_type="application/json")


async def metrics(request: Request) -> Response:
    gw = _gateway(request)
    if gw.scraper is not None:
        gw.scraper.export()
    for pool in gw.upstreams.pools.values():
        for ep in pool.endpoints:
            gw.metrics.endpoint_up.labels(pool.name, ep.name).set(1.0 if ep.available() else 0.0)
    body, content_type = render(gw.metrics)
    return Response(body, media_type=content_type)


async def admin_routing(request: Request) -> Response:
    """Live routing state: estimates per kind, the speedup model, endpoints as scraped, decision counts."""
    gw = _gateway(request)
    key = gw.settings.auth.admin_key
    if key:
        check_key(request, [key], "admin key")
    snapshot = getattr(gw.policy, "snapshot", None)
    state: dict[str, Any] = snapshot() if callable(snapshot) else {"strategy": gw.policy.strategy.value}
    return Response(orjson.dumps(state), media_type="application/json")
