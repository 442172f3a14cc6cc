"""The FastAPI application: routes, error handlers and the lifespan that owns upstream state."""

from __future__ import annotations

import asyncio
import gc
import logging
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from time import perf_counter

import aiohttp
import httpx
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from httpx_aiohttp import AiohttpTransport
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.accesslog import AccessLog
from gateway.api import adapters, passthrough, routes
from gateway.api.cors import with_cors
from gateway.api.edge import observe
from gateway.api.errors import APIError, error_body, error_response, sse_error_event
from gateway.api.request import request_id, trace_id
from gateway.api.responses import responses
from gateway.api.state import Gateway
from gateway.config import PoolName, Settings
from gateway.connections import GuardedHttpProtocol, refuse
from gateway.observability import GaugeChild, Metrics
from gateway.observe import Observer
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.learned import LearnedState, check_path, deployment
from gateway.routing.measurement import MeasurementGate
from gateway.routing.policy import Policy
from gateway.tls import upstream_context
from gateway.types import CLIENT_SCOPE_KEY, REFUSED_SCOPE_KEY, ClientState, Route
from gateway.upstream import discovery, health
from gateway.upstream.credentials import UpstreamKeys
from gateway.upstream.forward import Upstreams
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import Scraper

log = logging.getLogger("specroute")


def build_pools(settings: Settings) -> dict[PoolName, Pool]:
    pools: dict[PoolName, Pool] = {}
    for name, cfg in settings.pools.items():
        endpoints = discovery.static_endpoints(name, cfg)
        pools[name] = Pool(
            name, list(cfg.models), endpoints, cfg.num_speculative_tokens, cfg.draft_cost_ratio
        )
    return pools


def build_policy(
    settings: Settings,
    pools: dict[PoolName, Pool],
    scraper: Scraper | None = None,
    metrics: Metrics | None = None,
) -> Policy:
    """The routing policy for ``routing.strategy`` (one implementation learns under every strategy)."""
    from gateway.routing.adaptive import AdaptivePolicy
    from gateway.routing.classify import load_classifier

    r = settings.routing
    return AdaptivePolicy.build(r.strategy, load_classifier(), r, pools, scraper, metrics)


def speculative_k(pools: dict[PoolName, Pool], scraper: Scraper | None) -> Callable[[Endpoint], int | None]:
    """How many tokens an endpoint of the speculative pool drafts: as its per-position counters say where
    its page has them, else as configured, else as its other counters suggest.

    A configured k its own counters contradict (a server redeployed with another
    ``num_speculative_tokens``) read every stream wrong: with 7 configured and 4 drafted, a whole step
    of 4 read as one that met a rejection, and a true acceptance of 0.7 was learned as 0.64, of 0.9 as
    0.76, by the acceptance model, the estimates and the endpoint's outlier check alike.
    """
    configured = pools["speculative"].num_speculative_tokens

    def k(endpoint: Endpoint) -> int | None:
        drafted = scraper.positions(endpoint) if scraper is not None else None
        if drafted:
            return drafted
        if configured:
            return configured
        return scraper.drafts(endpoint) if scraper is not None else None

    return k


def new_session(keys: UpstreamKeys | None = None, tls: ssl.SSLContext | None = None) -> aiohttp.ClientSession:
    """The one upstream connection pool: aiohttp's.

    httpx's own pool costs about 1 ms of CPU per request here (it polls every idle connection on
    each request); aiohttp's costs a fifth of that. No connection cap: long streams must never queue
    behind each other inside the gateway. Bodies are not decompressed by default: httpx decodes its own,
    and forwarding asks for decoding per request.

    Idle connections are dropped after 4 s, before vLLM's server does (uvicorn's keep-alive, 5 s), so a
    request rarely goes out on a connection the server is just closing (forwarding then sends it again).

    With upstream API keys configured, a middleware adds each upstream's key to every call to it;
    ``tls`` (from ``upstream_tls``) checks every ``https://`` endpoint, else the system's CAs do.
    """
    return aiohttp.ClientSession(
        middlewares=(keys.middleware,) if keys else (),
        connector=aiohttp.TCPConnector(
            limit=0, keepalive_timeout=4, enable_cleanup_closed=True, ssl=True if tls is None else tls
        ),
        auto_decompress=False,
        trust_env=False,
        skip_auto_headers=("User-Agent",),
    )


def new_client(settings: Settings, session: aiohttp.ClientSession) -> httpx.AsyncClient:
    """httpx's API over the pool, for the gateway's own calls (health, scrapes, discovery, models).

    Closing it closes the session. Forwarding uses the session directly (see ``upstream.forward``).
    """
    t = settings.timeouts
    return httpx.AsyncClient(
        transport=AiohttpTransport(client=session),
        timeout=httpx.Timeout(connect=t.connect_s, read=None, write=t.connect_s, pool=t.connect_s),
        follow_redirects=False,
        trust_env=False,
    )


def freeze_heap() -> None:
    """Leave what start-up built out of garbage collection from now on.

    Modules, the app, the classifier: ~70k objects that live as long as the process. A full collection
    walks every one of them and held the event loop for 40-60 ms here, about once a second under full
    load. Frozen, they are skipped; what requests allocate is collected as before.
    """
    gc.collect()
    gc.freeze()


def create_app(settings: Settings, policy: Policy | None = None) -> FastAPI:
    metrics = Metrics()
    GuardedHttpProtocol.open_gauge = GaugeChild(metrics.open_connections)
    pools = build_pools(settings)
    keys = UpstreamKeys(settings, pools)  # read now: a missing key stops start-up, not a request
    tls = upstream_context(settings.upstream_tls)  # the same for the CA and client certificate files
    if settings.routing.state_file is not None:
        check_path(settings.routing.state_file)  # a file that could never be written stops start-up

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        session = new_session(keys, tls)
        client = new_client(settings, session)
        scraper = Scraper(
            client, pools, metrics, settings.routing.scrape_interval_s, stall_s=settings.timeouts.chunk_gap_s
        )
        routing = policy or build_policy(settings, pools, scraper, metrics)
        gw = Gateway(
            settings=settings,
            policy=routing,
            metrics=metrics,
            upstreams=Upstreams(settings, client, session, pools, metrics, keys),
            models=frozenset(settings.served_models()),
            observer=Observer(
                metrics=metrics,
                policy=routing,
                speculative_k=speculative_k(pools, scraper),
                access_log=(
                    AccessLog(on_drop=metrics.access_log_dropped.inc) if settings.logging.access_log else None
                ),
                log_prompts=settings.logging.log_prompts,
            ),
            measurement=MeasurementGate(
                interval_s=settings.routing.measure_interval_s, sd_share=settings.routing.measure_sd_share
            ),
            scraper=scraper,
        )
        app.state.gateway = gw
        if settings.routing.state_file is not None and isinstance(routing, AdaptivePolicy):
            gw.learned = LearnedState(
                routing,
                settings.routing.state_file,
                deployment(settings),
                settings.routing.state_save_interval_s,
                metrics=metrics,
            )
            gw.learned.load()
            gw.tasks.append(asyncio.create_task(gw.learned.keep()))
        await discovery.refresh(client, pools, settings)
        await health.check_all(client, list(pools.values()), settings.health)
        gw.upstreams.export_state()
        gw.tasks.append(
            asyncio.create_task(
                health.run(client, list(pools.values()), settings.health, gw.upstreams.export_state)
            )
        )
        gw.tasks.append(
            asyncio.create_task(discovery.run(client, pools, settings, on_removed=gw.upstreams.forget))
        )
        gw.tasks.append(asyncio.create_task(scraper.run()))
        freeze_heap()
        try:
            yield
        finally:
            gc.unfreeze()
            for task in gw.tasks:
                task.cancel()
            for task in gw.tasks:
                with suppress(asyncio.CancelledError):
                    await task
            gw.observer.close()  # the access-log lines still queued go out before the process ends
            if gw.learned is not None:
                gw.learned.save()  # what the last requests taught, for the next start
            gw.upstreams.close()
            await client.aclose()

    app = FastAPI(title="SpecRoute", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    app.add_route("/v1/models", routes.models, methods=["GET"])
    app.add_route("/v1/models/{model:path}", routes.model, methods=["GET"])
    app.add_route("/health", routes.health, methods=["GET"])
    app.add_route("/ready", routes.ready, methods=["GET"])
    app.add_route("/metrics", routes.metrics, methods=["GET"])
    app.add_route("/admin/routing", routes.admin_routing, methods=["GET"])
    app.add_route("/v1/responses", responses, methods=["POST"])
    app.add_route("/v1/embeddings", passthrough.embeddings, methods=["POST"])
    app.add_route("/tokenize", passthrough.tokenize, methods=["POST"])
    app.add_route("/detokenize", passthrough.detokenize, methods=["POST"])
    for path in adapters.ADAPTER_PATHS:
        app.add_route(path, adapters.adapters, methods=["POST"])
    app.add_route(
        "/v1/{rest:path}", passthrough.passthrough, methods=["GET", "POST", "PUT", "DELETE", "PATCH"]
    )
    for path, method in passthrough.ROOT_PATHS.items():
        app.add_route(path, passthrough.passthrough, methods=[method])
    app.state.cors = settings.cors
    _install_error_handlers(app)
    return app


def fast_path(app: FastAPI) -> ASGIApp:
    """Serve the two completion routes without FastAPI's middleware and router; the rest as usual.

    Every request pays for each layer of the stack; on the proxy's hot path those layers do nothing
    (the handlers validate and answer errors themselves), so they are skipped.

    A request still running when the shutdown grace period ends is cancelled by uvicorn, which
    would then answer a plain-text 500 or cut a stream mid-line; :func:`_cut_at_shutdown` answers
    in the API's format instead.

    With CORS on, responses leave as ASGI messages only: the connection's own writer
    (``gateway.connections.CycleWriter``) writes past every middleware, and the CORS middleware adds its
    headers to the messages, so a browser could pass the preflight and then not read the answer.
    """
    hot = {"/v1/completions": routes.completions, "/v1/chat/completions": routes.chat_completions}
    direct_writes = not app.state.cors.enabled

    async def asgi(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        if REFUSED_SCOPE_KEY in scope and scope["path"] != "/health":
            await _refused(app, scope, receive, send)
            return
        progress = _Progress(send)
        try:
            handler = hot.get(scope["path"]) if scope["method"] == "POST" else None
            if handler is None:
                await app(scope, receive, progress.send)
                return
            scope["app"] = app
            if not direct_writes:
                client = scope.get(CLIENT_SCOPE_KEY)
                if isinstance(client, ClientState):
                    client.writer = None
            request = Request(scope, receive, progress.send)
            try:
                response = await handler(request)
            except Exception:
                rid = request_id(request)
                log.exception("unhandled error on %r (request id %s)", scope["path"], rid)
                message = f"internal gateway error (request id {rid})"
                response = error_response(500, message, None, {"x-request-id": rid})
            await response(scope, receive, progress.send)
        except asyncio.CancelledError:
            # Only uvicorn cancels a request's task (a client's disconnect is a 499 inside the handler),
            # and only when the shutdown grace period has run out.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            progress.written_by(scope.get(CLIENT_SCOPE_KEY))
            if not progress.complete:  # else only the bookkeeping after the response was left
                await _cut_at_shutdown(progress, send, request_id(Request(scope)))
        finally:
            # the client's state holds the response's cycle, which holds this scope: let go of it, so
            # that the request's objects are freed when it ends rather than by the garbage collector
            scope.pop(CLIENT_SCOPE_KEY, None)

    return with_cors(asgi, app.state.cors)


#: the metrics label of the gateway's own routes (the rest of ``/v1/*`` as the passthrough labels it)
_ROUTES: dict[str, Route] = {
    "/v1/completions": "completions",
    "/v1/chat/completions": "chat",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/tokenize": "tokenize",
    "/detokenize": "detokenize",
}


async def _refused(app: FastAPI, scope: Scope, receive: Receive, send: Send) -> None:
    """A request on a connection beyond ``server.max_connections``: a 503, then the connection closes;
    counted (``specroute_requests_total``, status 503) and logged like any answer, so that a gateway at
    its connection cap shows in the error rate."""
    started = perf_counter()
    request = Request(scope, receive)
    rid = request_id(request)
    await refuse(receive, send, rid)
    gw: Gateway | None = getattr(app.state, "gateway", None)
    if gw is not None:
        path = scope["path"]
        passed = path.startswith("/v1/") or path in passthrough.ROOT_PATHS
        route = _ROUTES.get(path) or (passthrough.route_label(path) if passed else "other")
        observe(gw, rid=rid, route=route, started=started, status=503, trace=trace_id(request))


@dataclass(slots=True)
class _Progress:
    """How far a response has gone out: whether it started, as an event stream, and finished.

    Read from the messages sent; what the connection's writer sent past them is added when it is asked
    (:meth:`written_by`).
    """

    downstream: Send
    started: bool = False
    event_stream: bool = False
    complete: bool = False

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.started = True
            for name, value in message.get("headers", ()):
                if name.lower() == b"content-type":
                    self.event_stream = value.startswith(b"text/event-stream")
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            self.complete = True
        await self.downstream(message)

    def written_by(self, client: object) -> None:
        """Add what went out by the connection's own writer (see ``gateway.connections.CycleWriter``),
        past these messages: a whole answer, a stream's head or end."""
        if isinstance(client, ClientState) and client.writer is not None:
            started, complete, event_stream = client.writer.progress()
            self.started = self.started or started
            self.complete = self.complete or complete
            self.event_stream = self.event_stream or event_stream


SHUTDOWN_MESSAGE = "the gateway is shutting down; send the request again"


async def _cut_at_shutdown(progress: _Progress, send: Send, rid: str) -> None:
    """End a request that outlived the shutdown grace period: a 503 body (with the request's id, as the
    access log has it), or an error event in a stream."""
    log.warning("shutdown grace period over: ending request %s in flight with 503", rid)
    if not progress.started:
        body = error_body(503, SHUTDOWN_MESSAGE)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"connection", b"close"),
            (b"x-request-id", rid.encode("latin-1")),
        ]
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif progress.event_stream:
        await send({"type": "http.response.body", "body": b"\n\n" + sse_error_event(503, SHUTDOWN_MESSAGE)})
    # a plain body already under way cannot be changed: uvicorn closes the connection


def _rid(request: Request) -> dict[str, str]:
    return {"x-request-id": request_id(request)}


def _install_error_handlers(app: FastAPI) -> None:
    """Errors raised out of a route, OpenAI-shaped, each with the request's id (the caller's or a new one)
    as every answer of the routes has: a client quotes it whatever went wrong."""

    async def api_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, APIError)
        return error_response(exc.status, exc.message, exc.param, {**exc.headers, **_rid(request)}, exc.body)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            message = f"no route {request.method} {request.url.path}"
        elif exc.status_code == 405:
            message = f"method {request.method} is not allowed on {request.url.path}"
        else:
            message = str(exc.detail)
        return error_response(exc.status_code, message, None, {**(exc.headers or {}), **_rid(request)})

    async def validation_error(request: Request, exc: Exception) -> Response:
        return error_response(400, str(exc), None, _rid(request))

    async def unexpected(request: Request, exc: Exception) -> Response:
        rid = _rid(request)
        # %r: the path is the client's, percent-decoded, line breaks and terminal escapes included
        log.exception("unhandled error on %s %r (request id %s)", request.method, request.url.path, rid)
        return error_response(500, f"internal gateway error (request id {rid['x-request-id']})", None, rid)

    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, unexpected)
