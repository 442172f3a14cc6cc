"""The OpenAI routes: validate → classify → decide → forward (with measurement) → observe."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable
from time import perf_counter
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from gateway.api.errors import APIError, error_response
from gateway.api.request import check_key, forced_pool, parse_body, read_body
from gateway.observability import access_log
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


async def _handle(request: Request, api: Api) -> Response:
    gw = _gateway(request)
    started = perf_counter()
    request_id = request.headers.get("x-request-id") or os.urandom(8).hex()
    decision: Decision | None = None
    try:
        check_key(request, gw.settings.auth.api_keys)
        body = await read_body(request, gw.settings.limits.max_body_bytes)
        payload = parse_body(body, api, gw.models)
        forced = forced_pool(request, gw.settings.routing.allow_pool_override)
        decision = gw.policy.decide(RouteRequest(payload, api, forced))
        gw.metrics.decisions.labels(gw.policy.strategy.value, decision.pool, decision.reason).inc()
        if decision.predicted_speedup is not None:
            gw.metrics.predicted_speedup.labels(decision.prompt_class).observe(decision.predicted_speedup)
        if decision.explore:
            gw.metrics.exploration.labels(decision.kind).inc()
        stream = payload.get("stream") is True
        headers = {
            "content-type": "application/json",
            "accept-encoding": "identity",
            "x-request-id": request_id,
        }
        if not gw.settings.auth.api_keys and "authorization" in request.headers:
            headers["authorization"] = request.headers["authorization"]
        meter: StreamMeter | None = None
        if stream:
            body, wants_usage, wants_continuous = request_usage(payload)
            meter = StreamMeter(started, keep_usage_chunk=wants_usage, keep_continuous=wants_continuous)
        elif decision.pool == "speculative" and can_assemble(payload, api):
            # stream from upstream to measure acceptance; the client still gets one JSON body
            body = stream_body(payload)
            meter = StreamMeter(started, collect=[])
        first_byte = None if meter is not None else gw.settings.timeouts.total_s
        sent = await _unless_disconnected(
            request, gw.upstreams.send(PATHS[api], body, headers, decision.pool, first_byte_s=first_byte)
        )
    except APIError as e:
        extra = (
            _decision_headers(decision, decision.pool, request_id)
            if decision
            else {"x-request-id": request_id}
        )
        _finish(gw, api, decision, None, e.status, started, None, request_id)
        return error_response(e.status, e.message, e.param, {**e.headers, **extra})

    out_headers = _decision_headers(decision, sent.pool, request_id)
    if sent.pool != decision.pool:
        gw.metrics.failovers.labels(decision.pool, sent.pool).inc()
    status = sent.response.status_code
    media_type = sent.response.headers.get("content-type", "application/json")
    if meter is not None and status < 300 and meter.collect is not None:
        return await _assembled(request, gw, api, decision, sent, meter, started, request_id, out_headers)
    if meter is not None and status < 300:

        def done(s: Sent, failed: int | None) -> None:
            _finish(gw, api, decision, s, failed or status, started, meter, request_id)

        return StreamingResponse(
            gw.upstreams.relay(sent, meter, done), status, headers=out_headers, media_type=media_type
        )
    try:
        content = await _unless_disconnected(request, gw.upstreams.read_all(sent))
    except APIError as e:
        _finish(gw, api, decision, sent, e.status, started, None, request_id)
        return error_response(e.status, e.message, e.param, out_headers)
    _finish(gw, api, decision, sent, status, started, None, request_id, content)
    return Response(content, status, headers=out_headers, media_type=media_type)


async def _assembled(
    request: Request,
    gw: Gateway,
    api: Api,
    decision: Decision,
    sent: Sent,
    meter: StreamMeter,
    started: float,
    request_id: str,
    headers: dict[str, str],
) -> Response:
    """Read a stream started for a non-streamed request and answer with the assembled body."""
    failed: list[int | None] = []

    async def drain() -> None:
        async for _ in gw.upstreams.relay(sent, meter, lambda s, f: failed.append(f)):
            pass

    try:
        await _unless_disconnected(request, drain())
    except APIError as e:
        _finish(gw, api, decision, sent, e.status, started, None, request_id)
        return error_response(e.status, e.message, e.param, headers)
    status = failed[0] if failed and failed[0] else 200
    body = assemble(meter.collect or [], api) if status == 200 and meter.error is None else None
    if body is None:
        err = meter.error or {}
        code = err.get("code")
        status = code if isinstance(code, int) and 400 <= code < 600 else (status if status != 200 else 502)
        _finish(gw, api, decision, sent, status, started, None, request_id)
        if meter.error is not None:
            return Response(
                orjson.dumps({"error": meter.error}), status, headers=headers, media_type="application/json"
            )
        return error_response(status, "upstream stream ended without a complete response", None, headers)
    _finish(gw, api, decision, sent, status, started, meter, request_id)
    return Response(orjson.dumps(body), status, headers=headers, media_type="application/json")


async def _unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    """Run ``work`` but cancel it (and so the upstream request) if the client goes away."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, watch), return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
    if not task.done():
        task.cancel()
        raise APIError(499, "client closed the request")
    return task.result()


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


def _finish(
    gw: Gateway,
    api: Api,
    decision: Decision | None,
    sent: Sent | None,
    status: int,
    started: float,
    meter: StreamMeter | None,
    request_id: str,
    content: bytes | None = None,
) -> None:
    """Observe one finished request: metrics, the policy's feedback, the access log."""
    end = perf_counter()
    e2e = end - started
    pool = sent.pool if sent else (decision.pool if decision else "none")
    cls = decision.prompt_class if decision else "none"
    gw.metrics.requests.labels(api, pool, cls, str(status)).inc()
    ttft = tokens = None
    chunks = 0
    if meter is not None:
        tokens, chunks = meter.completion_tokens, meter.chunks
        if meter.first_token_at is not None:
            ttft = meter.first_token_at - started
    elif content is not None and status < 300:
        usage = _usage_of(content)
        if usage and isinstance(usage.get("completion_tokens"), int):
            tokens = usage["completion_tokens"]
    tpot = None
    measured = None
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
        gw.policy.observe(
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
            {
                "ts": round(time.time(), 3),
                "request_id": request_id,
                "route": api,
                "status": status,
                "pool": pool,
                "endpoint": sent.endpoint.name if sent else None,
                "class": cls,
                "reason": decision.reason if decision else None,
                "p_structured": round(decision.p_structured, 4) if decision else None,
                "predicted_speedup": decision.predicted_speedup if decision else None,
                "ttft_ms": round(ttft * 1000, 2) if ttft is not None else None,
                "tpot_ms": round(tpot * 1000, 3) if tpot is not None else None,
                "e2e_ms": round(e2e * 1000, 2),
                "completion_tokens": tokens,
                "acceptance": round(measured.rate, 4) if measured else None,
                "alpha": round(measured.alpha, 4) if measured else None,
                "spec_steps": measured.steps if measured else None,
                "acceptance_source": measured.source if measured else None,
            }
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
            gw.metrics.inflight.labels(pool.name, ep.name).set(ep.outstanding)
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)


async def admin_routing(request: Request) -> Response:
    """Live routing state: estimates per kind, the speedup model, endpoints as scraped, decision counts."""
    gw = _gateway(request)
    key = gw.settings.auth.admin_key
    if key:
        check_key(request, [key], "admin key")
    snapshot = getattr(gw.policy, "snapshot", None)
    state: dict[str, Any] = snapshot() if callable(snapshot) else {"strategy": gw.policy.strategy.value}
    return Response(orjson.dumps(state), media_type="application/json")
