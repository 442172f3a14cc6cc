"""vLLM's LoRA adapter routes (``POST /v1/load_lora_adapter``, ``POST /v1/unload_lora_adapter``): the
operator's, and sent to every endpoint of both pools.

vLLM serves them with ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` and guards them with its ``--api-key``:
they change what the server serves, from a path on its disk. Passed through like any other ``/v1/*``
route, they would go with the gateway's own upstream key to one endpoint, for any holder of a client
key, and leave that endpoint serving an adapter the others lack. So they need ``auth.admin_key`` (else
an API key, as ``/admin/routing``), and go to every endpoint at once (both pools serve the same models),
each once: a load sent twice to one server is its error, "already loaded".

The client learns what the fleet did: every endpoint's success is the first one's answer; the same 4xx
from every endpoint (all "already loaded", all "cannot be found") is that 4xx as vLLM wrote it; anything
else is a 502 that names each endpoint (never its address) with what it answered, and is logged as a
warning when some endpoints changed and others did not. An endpoint that joins later (DNS discovery)
does not get the adapter: a fleet that scales loads its adapters with ``vllm serve --lora-modules``.
"""

from __future__ import annotations

import asyncio
import logging

import orjson
from starlette.requests import Request
from starlette.responses import Response

from gateway.api import state
from gateway.api.edge import now, observe, upstream_headers
from gateway.api.errors import APIError, error_body, error_response, openai_shaped, route_missing_body
from gateway.api.request import check_operator, read_body, request_id, trace_id
from gateway.api.routes import CUT_AT_SHUTDOWN, unless_disconnected
from gateway.upstream.forward import Delivery

log = logging.getLogger("specroute.api")

#: the adapter routes and the method they take
ADAPTER_PATHS: dict[str, str] = {
    "/v1/load_lora_adapter": "POST",
    "/v1/unload_lora_adapter": "POST",
}

# a broadcast goes on when its client leaves (an adapter half loaded across the fleet helps nobody), and
# its outcome is logged all the same: held here until it ends, since the loop keeps only weak references
_UNFINISHED: set[asyncio.Task[list[Delivery]]] = set()


async def adapters(request: Request) -> Response:
    """``POST /v1/load_lora_adapter`` or ``/v1/unload_lora_adapter``, to every endpoint."""
    return await manage(request, request.url.path)


async def manage(request: Request, path: str) -> Response:
    """The adapter route ``path`` (one of :data:`ADAPTER_PATHS`) for the operator, sent to every endpoint
    of both pools with the caller's body; the answer says what each did (:func:`answer`)."""
    gw = state.of(request)
    started, rid, trace = now(), request_id(request), trace_id(request)
    try:
        check_operator(request, gw.settings.auth.api_keys, gw.settings.auth.admin_key)
        body = await read_body(request, gw.max_body_bytes, gw.body_timeout_s)
        headers = upstream_headers(request, gw, rid, request.headers.get("content-type"))
        target = path + (f"?{request.url.query}" if request.url.query else "")
        task = asyncio.ensure_future(_everywhere(gw, request.method, target, body, headers, rid))
        _UNFINISHED.add(task)
        task.add_done_callback(_ended)
        deliveries = await unless_disconnected(request, asyncio.shield(task))
    except asyncio.CancelledError:  # cut at the end of the shutdown grace period
        observe(gw, rid=rid, trace=trace, route="lora", started=started, status=CUT_AT_SHUTDOWN)
        raise
    except APIError as e:
        observe(gw, rid=rid, trace=trace, route="lora", started=started, status=e.status)
        message = f"{e.message} (request id {rid})" if e.status >= 500 else e.message
        return error_response(e.status, message, e.param, {**e.headers, "x-request-id": rid}, e.body)
    response = answer(request.method, path, deliveries, rid)
    observe(gw, rid=rid, trace=trace, route="lora", started=started, status=response.status_code)
    return response


async def _everywhere(
    gw: state.Gateway, method: str, path: str, body: bytes, headers: dict[str, str], rid: str
) -> list[Delivery]:
    """The request at every endpoint, and its outcome in the log: a warning when some endpoints did it
    and others did not (their adapters now differ), else at info (an adapter change is worth a line)."""
    deliveries = await gw.upstreams.broadcast(path, body, headers, method)
    done = [_name(d) for d in deliveries if d.ok]
    failed = [f"{_name(d)} ({_said(d)})" for d in deliveries if not d.ok]
    if done and failed:
        log.warning(
            "%s %s succeeded on %s and failed on %s: the endpoints now differ (request id %s)",
            method,
            path,
            ", ".join(done),
            "; ".join(failed),
            rid,
        )
    else:
        outcome = f"succeeded on {', '.join(done)}" if done else f"failed on {'; '.join(failed)}"
        log.info("%s %s %s (request id %s)", method, path, outcome, rid)
    return deliveries


def _ended(task: asyncio.Task[list[Delivery]]) -> None:
    _UNFINISHED.discard(task)
    if not task.cancelled():
        task.exception()  # read, so that one whose client left is not reported as never retrieved


def answer(method: str, path: str, deliveries: list[Delivery], rid: str) -> Response:
    """What the client is told of a request every endpoint was sent.

    Every endpoint succeeded: the first one's answer (vLLM's ``Success: LoRA adapter ...``). None did,
    and all answered the same 4xx (all "already loaded"): the first of those as vLLM wrote it (FastAPI's
    ``{"detail": "Not Found"}`` of servers started without runtime adapter updates in the API's format).
    Else a 502 naming the endpoints that succeeded and how each other one failed: one that succeeded
    beside one that did not leaves them differing, which a 4xx alone would hide.
    """
    headers = {"x-request-id": rid}
    failed = [d for d in deliveries if not d.ok]
    if not failed:
        first = deliveries[0]
        return Response(first.body, first.status, headers=headers, media_type=first.content_type)
    first = failed[0]
    if len(failed) == len(deliveries) and all(d.error is None and d.status == first.status for d in failed):
        if first.status in (404, 405) and not openai_shaped(first.body):
            body = route_missing_body(first.status, method, path)
            return Response(body, first.status, headers=headers, media_type="application/json")
        return Response(first.body, first.status, headers=headers, media_type=first.content_type)
    done = ", ".join(_name(d) for d in deliveries if d.ok)
    failures = "; ".join(f"{_name(d)} ({_said(d)})" for d in failed)
    if done:
        message = f"{method} {path} succeeded on {done} and failed on {failures}: the endpoints now differ"
    else:
        message = f"{method} {path} failed on every endpoint: {failures}"
    body = error_body(502, f"{message} (request id {rid})")
    return Response(body, 502, headers=headers, media_type="application/json")


def _name(delivery: Delivery) -> str:
    return f"{delivery.endpoint.pool}/{delivery.endpoint.name}"


def _said(delivery: Delivery) -> str:
    """How one endpoint failed, in words: the gateway's account of its failure, or its status with the
    message of its 4xx (the client's to read, as any 4xx is)."""
    if delivery.error is not None:
        return delivery.error.message
    message = _message(delivery.body)
    return f"HTTP {delivery.status}: {message}" if message else f"HTTP {delivery.status}"


def _message(body: bytes) -> str | None:
    """The message of an error body: vLLM's ``{"error": {"message"}}``, FastAPI's ``{"detail": "..."}``,
    else its text when short and plain."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body[:300].decode("utf-8", "replace").strip()
        return text or None
    said = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(said, dict):
        said = said.get("message")
    elif isinstance(parsed, dict) and said is None:
        said = parsed.get("detail")
    return said[:300] if isinstance(said, str) and said else None
