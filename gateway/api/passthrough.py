"""Routes forwarded without classification: embeddings, (de)tokenising, any other ``/v1/*`` route, and
vLLM's routes outside ``/v1`` that serve a model (:data:`ROOT_PATHS`).

Both pools serve the same models, so these go to the baseline pool (speculation does nothing for
them) and fail over to the speculative pool like any request. ``/v1/embeddings``, ``/tokenize`` and
``/detokenize`` are JSON and idempotent: the body and its ``model`` are checked, and a failed try is
sent again. Any other ``/v1/*`` route (audio, score, rerank, a route a newer vLLM adds) is passed
through as it came, in either direction, with the caller's content type (and so are vLLM's scoring,
reranking, classification and pooling routes outside ``/v1``, and ``GET /version``): its ``model`` is checked
when the body names one (JSON or a multipart form), a ``GET`` is sent again like any idempotent
request, and a ``POST`` only when no endpoint took it. Metrics label these by a bounded route name
(:func:`route_label`), never by the raw path.

vLLM's LoRA adapter routes are not passed through: they go to every endpoint, for the operator
(:mod:`gateway.api.adapters`).

A stored Responses-API response's routes (``GET /v1/responses/{id}``, ``POST /v1/responses/{id}/cancel``,
any other under the id) go first to the endpoint that made it, then to the others while they answer
404: vLLM keeps it in that server's memory alone (:mod:`gateway.upstream.stored`).
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.api import state
from gateway.api.adapters import ADAPTER_PATHS, manage
from gateway.api.edge import (
    now,
    observe,
    read_checked,
    upstream_headers,
    without_slash,
)
from gateway.api.errors import APIError, error_response, openai_shaped, route_missing_body
from gateway.api.request import check_model, json_object, request_id, trace_id
from gateway.api.routes import CUT_AT_SHUTDOWN, Relay, relayed_status, unless_disconnected
from gateway.types import Route
from gateway.upstream.forward import Sent
from gateway.upstream.pool import Endpoint

#: the gateway's own routes under /v1 and the methods they take: never passed through (another method on
#: them is a 405 that names these in ``Allow``, as HTTP asks). vLLM's adapter routes are among them: they
#: go to every endpoint, for the operator (:mod:`gateway.api.adapters`)
OWN_PATHS: dict[str, str] = {
    "/v1/completions": "POST",
    "/v1/chat/completions": "POST",
    "/v1/models": "GET, HEAD",
    "/v1/responses": "POST",
    "/v1/embeddings": "POST",
    **ADAPTER_PATHS,
}

_LABELS: dict[str, Route] = {
    "audio": "audio",
    "score": "score",
    "rerank": "rerank",
    "classify": "classify",
    "pooling": "pooling",
    "load_lora_adapter": "lora",
    "unload_lora_adapter": "lora",
}

#: vLLM's routes outside ``/v1`` passed through like the rest of ``/v1/*``: those that serve a model
#: (``/score``, ``/rerank`` and ``/v2/rerank``, ``/classify``, ``/pooling``: some only at the root), and
#: its version. Not ``/invocations`` (SageMaker's entry, which vLLM hands to the completion routes by the
#: body's shape): a completion that came that way would go unrouted and unmeasured
ROOT_PATHS: dict[str, str] = {
    "/score": "POST",
    "/rerank": "POST",
    "/v2/rerank": "POST",
    "/classify": "POST",
    "/pooling": "POST",
    "/version": "GET",
}

_STORED = "/v1/responses/"  # a stored response's routes: its id, then its sub-route if any
_DOT_SEGMENTS = frozenset((".", ".."))
_SLASHES = re.compile(r"/{2,}")
_IDEMPOTENT = frozenset(("GET", "HEAD", "PUT", "DELETE", "OPTIONS"))
# a part's header lines are a few (Content-Disposition, Content-Type): bounded, so that each occurrence of
# the name reads a few lines ahead, not the rest of the body (quadratic on a body of such lines)
_FORM_MODEL = re.compile(rb'name="model"\r\n(?:[^\r\n]+\r\n){0,8}\r\n([^\r\n]*)\r\n')


def route_label(path: str) -> Route:
    """The metrics label of a passed-through path: its first segment after the API version (``/v1``,
    ``/v2``, or none) when it is a known vLLM route."""
    parts = path.lstrip("/").split("/", 2)
    head = parts[1] if parts[0] in ("v1", "v2") and len(parts) > 1 else parts[0]
    return _LABELS.get(head, "other")


def stored_id(path: str) -> str | None:
    """The response id of a stored response's route (``/v1/responses/{id}``, ``.../cancel``); else None."""
    if not path.startswith(_STORED):
        return None
    return path[len(_STORED) :].split("/", 1)[0] or None


async def embeddings(request: Request) -> Response:
    return await _json_route(request, "/v1/embeddings", "embeddings")


async def tokenize(request: Request) -> Response:
    return await _json_route(request, "/tokenize", "tokenize")


async def detokenize(request: Request) -> Response:
    return await _json_route(request, "/detokenize", "detokenize")


async def _json_route(request: Request, path: str, route: Route) -> Response:
    """A JSON route served by any endpoint of the model: checked, forwarded, answered as it came."""
    gw = state.of(request)
    started, rid, trace = now(), request_id(request), trace_id(request)
    tried: list[Endpoint] = []  # the endpoints it was sent to, in order
    try:
        body = await read_checked(request, gw)
        payload = json_object(body)
        check_model(payload.get("model"), gw.models)
        headers = upstream_headers(request, gw, rid, "application/json")
        fetched = gw.upstreams.fetch(
            path, body, headers, "baseline", first_byte_s=gw.settings.timeouts.total_s, tried=tried
        )
        sent, content = await unless_disconnected(request, fetched)
    except asyncio.CancelledError:  # cut at the end of the shutdown grace period (a client gone is a 499)
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=CUT_AT_SHUTDOWN)
        raise
    except APIError as e:
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=e.status, tried=tried)
        return _error(e, rid)
    status = sent.response.status
    observe(gw, rid=rid, trace=trace, route=route, started=started, status=status, sent=sent, content=content)
    if status in (404, 405) and not openai_shaped(content):
        # a model whose server has no such route (embeddings from a generative model): FastAPI's
        # {"detail": "Not Found"}, which no OpenAI client reads as an error, becomes the API's own
        return _route_missing(request, status, _headers(sent, rid))
    return Response(
        content,
        status,
        headers=_headers(sent, rid),
        media_type=sent.response.headers.get("content-type", "application/json"),
    )


async def passthrough(request: Request) -> Response:
    """Any other ``/v1/*`` route, or one of :data:`ROOT_PATHS`, to an endpoint of the model the body names
    (or of the baseline pool)."""
    gw = state.of(request)
    path = request.url.path
    if path.endswith("/") and path.rstrip("/") in OWN_PATHS:
        return without_slash(request, path.rstrip("/"))
    if "/." in path and _DOT_SEGMENTS.intersection(path.split("/")):
        # "/v1/%2e%2e/sleep" reaches the upstream as written; a proxy in front of vLLM that normalises
        # paths (nginx does) would serve "/sleep": never a route of the API, so never forwarded
        raise APIError(400, f"the path {path!r} holds a '.' or '..' segment")
    merged = _SLASHES.sub("/", path).rstrip("/") if "//" in path else path
    if merged in ADAPTER_PATHS and request.method == "POST":
        # "/v1//load_lora_adapter": a proxy in front of vLLM that merges slashes (nginx does) serves the
        # adapter route, so it is the operator's and goes to every endpoint as that route does
        return await manage(request, merged)
    allowed = OWN_PATHS.get(path)
    if allowed is not None:
        headers = {"allow": allowed, "x-request-id": request_id(request)}
        return error_response(405, f"method {request.method} is not allowed on {path}", None, headers)
    started, rid, trace, route = now(), request_id(request), trace_id(request), route_label(path)
    tried: list[Endpoint] = []  # the endpoints it was sent to, in order
    method = request.method
    try:
        body = await read_checked(request, gw)
        content_type = request.headers.get("content-type")
        check_model(_model(body, content_type), gw.models)
        headers = upstream_headers(request, gw, rid, content_type)
        if "accept" in request.headers:
            headers["accept"] = request.headers["accept"]
        raw = request.scope.get("raw_path")  # as the client encoded it (%2F stays %2F)
        target = raw.decode("latin-1") if isinstance(raw, bytes) and raw else path
        target += f"?{request.url.query}" if request.url.query else ""
        deadline = gw.upstreams.deadline()  # the tries, the first byte and the answer together
        sending = gw.upstreams.send(
            target,
            body,
            headers,
            "baseline",
            first_byte_s=gw.settings.timeouts.total_s,
            method=method,
            idempotent=method in _IDEMPOTENT,
            deadline=deadline,
            tried=tried,
            stored=stored_id(path),
        )
        sent = await unless_disconnected(request, sending)
    except asyncio.CancelledError:  # as above
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=CUT_AT_SHUTDOWN)
        raise
    except APIError as e:
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=e.status, tried=tried)
        return _error(e, rid)
    status = sent.response.status
    if status in (404, 405):
        return await _no_route(request, gw, sent, rid, trace, route, started)

    def done(s: Sent, failed: int | None) -> None:
        status_now = relayed_status(request, failed) or status
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=status_now, sent=s)

    media_type = sent.response.headers.get("content-type")
    return Relay(
        gw.upstreams.relay(sent, None, done, deadline=deadline),
        status,
        headers=_headers(sent, rid),
        media_type=media_type,
        deadline=deadline,
    )


async def _no_route(
    request: Request, gw: state.Gateway, sent: Sent, rid: str, trace: str | None, route: Route, started: float
) -> Response:
    """An upstream that has no such route (or method): its own error if OpenAI-shaped, else ours.

    vLLM answers an unknown route with FastAPI's ``{"detail": "Not Found"}``; the client gets the
    gateway's error format, as for every other bad request.
    """
    status = sent.response.status
    try:
        content = await unless_disconnected(request, gw.upstreams.read_all(sent))
    except asyncio.CancelledError:  # as above
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=CUT_AT_SHUTDOWN, sent=sent)
        raise
    except APIError as e:
        observe(gw, rid=rid, trace=trace, route=route, started=started, status=e.status, sent=sent)
        return _error(e, rid)
    observe(gw, rid=rid, trace=trace, route=route, started=started, status=status, sent=sent)
    if openai_shaped(content):
        media_type = sent.response.headers.get("content-type", "application/json")
        return Response(content, status, headers=_headers(sent, rid), media_type=media_type)
    return _route_missing(request, status, _headers(sent, rid))


def _route_missing(request: Request, status: int, headers: dict[str, str]) -> Response:
    """The API's error for an upstream's 404 or 405 that is not OpenAI-shaped."""
    body = route_missing_body(status, request.method, request.url.path)
    return Response(body, status, headers=headers, media_type="application/json")


def _model(body: bytes, content_type: str | None) -> Any:
    """The ``model`` a passed-through body names: a JSON object's member or a multipart form's field."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    if kind == "application/json" or (not kind and body[:1] == b"{"):
        payload = json_object(body) if body else {}
        return payload.get("model")
    if kind == "multipart/form-data":
        found = _FORM_MODEL.search(body[:65536])
        return found.group(1).decode("utf-8", "replace") if found else None
    return None


def _headers(sent: Sent, rid: str) -> dict[str, str]:
    return {"x-specroute-pool": sent.pool, "x-request-id": rid}


def _error(e: APIError, rid: str) -> Response:
    message = f"{e.message} (request id {rid})" if e.status >= 500 else e.message
    return error_response(e.status, message, e.param, {**e.headers, "x-request-id": rid}, e.body)
