"""What the routes beyond completions and chat share: reading a JSON body, headers upstream, bookkeeping.

The two completion routes keep their own, tuned path (:mod:`gateway.api.routes`); these helpers serve
``/v1/responses``, ``/v1/embeddings``, ``/tokenize``, ``/detokenize`` and the routes passed through,
with the same rules: the caller's key, the body's size and time limits, OpenAI-shaped errors naming
the field at fault, and one observed record per request.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.api.request import check_key, read_body, request_id
from gateway.api.state import Gateway
from gateway.routing.policy import Decision
from gateway.types import Route
from gateway.upstream.forward import Sent
from gateway.upstream.pool import Endpoint
from gateway.upstream.stream import StreamMeter


async def read_checked(request: Request, gw: Gateway) -> bytes:
    """The caller's key, then the body: at most ``limits.max_body_bytes``, in ``server.body_timeout_s``."""
    check_key(request, gw.settings.auth.api_keys)
    return await read_body(request, gw.settings.limits.max_body_bytes, gw.settings.server.body_timeout_s)


def without_slash(request: Request, path: str) -> Response:
    """The redirect vLLM's server (FastAPI) answers a known route asked for with a trailing slash: a 307
    to ``path``, keeping the method, the body and the query (an upstream's own would name its address)."""
    query = f"?{request.url.query}" if request.url.query else ""
    return Response(status_code=307, headers={"location": path + query, "x-request-id": request_id(request)})


def upstream_headers(request: Request, gw: Gateway, rid: str, content_type: str | None) -> dict[str, str]:
    """Headers for the upstream: the body's type, the request id, the caller's W3C trace context, and
    (when configured) the caller's key.

    vLLM started with ``--otlp-traces-endpoint`` makes its spans children of the ``traceparent`` it
    receives, so passing the caller's on keeps one trace from the client to the engine.
    """
    headers = {"content-type": content_type} if content_type else {}
    headers["accept-encoding"] = "identity"
    headers["x-request-id"] = rid
    forward_key = gw.forward_client_key
    for key, value in request.scope["headers"]:
        if key == b"traceparent" or key == b"tracestate" or (forward_key and key == b"authorization"):
            # the first value, as a single-valued header is read; an upstream key configured for the
            # endpoint replaces the caller's (see upstream.credentials)
            headers.setdefault(key.decode("latin-1"), value.decode("latin-1"))
    return headers


def observe(
    gw: Gateway,
    *,
    rid: str,
    route: Route,
    started: float,
    status: int,
    sent: Sent | None = None,
    decision: Decision | None = None,
    payload: dict[str, Any] | None = None,
    meter: StreamMeter | None = None,
    content: bytes | None = None,
    trace: str | None = None,
    tried: Sequence[Endpoint] = (),
) -> None:
    """One finished request to the metrics, the policy's feedback (routed requests) and the access log;
    ``tried``: the endpoints it was sent to, which name the one that failed last when none answered."""
    record = gw.observer.record(
        request_id=rid,
        trace_id=trace,
        api=route,
        started=started,
        status=status,
        decision=decision,
        payload=payload,
        sent=sent,
        meter=meter,
        content=content,
        tried=tried,
    )
    gw.observer.observe(record)


def now() -> float:
    return perf_counter()
