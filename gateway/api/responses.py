"""``POST /v1/responses``: classified and routed like a chat, forwarded as a Responses request.

The classifier and the acceptance model read chats, so a Responses request is shown to them as the
chat it amounts to (:func:`chat_view`): ``instructions`` as the system message, ``input`` as the
messages, ``text.format`` as ``response_format``, ``tools``, ``temperature`` and the output limit.
The request itself goes upstream unchanged. A stream (vLLM's named events) is relayed byte for byte
and metered by :class:`~gateway.upstream.events.EventMeter` (TTFT at the first delta, the usage of
the final event); a stream that breaks ends with an ``error`` event, as the Responses API reports one.

vLLM keeps the responses it stores in the memory of the server that made it, so where each was made
is noted (:mod:`gateway.upstream.stored`), and a request that continues one (``previous_response_id``)
runs on that endpoint, whatever the classifier says: its pool is forced (reason ``affinity``), and
an id this process never saw is looked for on every endpoint.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.api import state
from gateway.api.edge import (
    now,
    observe,
    read_checked,
    upstream_headers,
)
from gateway.api.errors import (
    APIError,
    error_response,
    responses_error_event,
)
from gateway.api.fields import SCALARS, lax, whole
from gateway.api.request import check_model, forced_pool, json_object, request_id, trace_id
from gateway.api.routes import CUT_AT_SHUTDOWN, Relay, decision_headers, relayed_status, unless_disconnected
from gateway.routing.policy import AFFINITY, Decision, RouteRequest
from gateway.types import PoolName
from gateway.upstream.events import EventMeter
from gateway.upstream.forward import Sent, Upstreams
from gateway.upstream.pool import Endpoint
from gateway.upstream.stored import response_id

PATH = "/v1/responses"

#: the JSON type of each Responses field the gateway reads or the classifier sees
_TYPES: dict[str, tuple[type, ...]] = {
    "model": (str,),
    "input": (str, list),
    "instructions": (str,),
    "stream": (bool,),
    "max_output_tokens": (int,),
    "temperature": (int, float),
    "top_p": (int, float),
    "tools": (list,),
    "tool_choice": (str, dict),
    "text": (dict,),
    "metadata": (dict,),
    "parallel_tool_calls": (bool,),
    "previous_response_id": (str,),
    "store": (bool,),
    "user": (str,),
    "seed": (int,),
}
_NAMES = {str: "a string", list: "an array", bool: "a boolean", int: "an integer", dict: "an object"}
#: the scalar fields vLLM's request model reads leniently, by the JSON type :func:`lax` reads them as
_LAX_AS: dict[tuple[type, ...], tuple[str, ...]] = {
    (bool,): ("boolean",),
    (int,): ("integer",),
    (int, float): ("number",),
}


def check_fields(payload: dict[str, Any]) -> None:
    """A 400 naming the first field of the wrong JSON type; ``input`` is required. A scalar written as
    another scalar that vLLM's request model reads (``"temperature": "0.5"``, ``"stream": "true"``,
    ``"max_output_tokens": 100.0``) is read as vLLM reads it, as on the completion routes: the gateway
    routes and meters on what vLLM will do (the body still goes upstream as the client sent it)."""
    if payload.get("input") is None:
        raise APIError(400, "'input' is a required property", param="input")
    for name, types in _TYPES.items():
        value = payload.get(name)
        if value is None:
            continue
        if types == (int,) and (n := whole(value)) is not None:
            payload[name] = value = n
        elif (
            (as_json := _LAX_AS.get(types)) is not None
            and type(value) in SCALARS
            and type(value) not in types
        ):
            read = lax(value, as_json)
            if read is not None:
                payload[name] = value = read
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            expected = "a number" if float in types else " or ".join(_NAMES[t] for t in types)
            raise APIError(400, f"'{name}' must be {expected}", param=name)


def chat_view(payload: Mapping[str, Any]) -> dict[str, Any]:
    """The chat a Responses request amounts to, for the classifier and the acceptance model."""
    messages: list[dict[str, Any]] = []
    if isinstance(payload.get("instructions"), str):
        messages.append({"role": "system", "content": payload["instructions"]})
    items = payload.get("input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
    elif isinstance(items, list):
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("role"), str):
                messages.append({"role": item["role"], "content": _text(item.get("content"))})
    view: dict[str, Any] = {"messages": messages}
    # min_p and logit_bias: the speculative pool refuses them (gateway.speculation.refused_by_speculation)
    for key in ("model", "temperature", "top_p", "tools", "stream", "min_p", "logit_bias"):
        if key in payload:
            view[key] = payload[key]
    if payload.get("max_output_tokens") is not None:
        view["max_tokens"] = payload["max_output_tokens"]
    text = payload.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if isinstance(fmt, dict) and isinstance(fmt.get("type"), str):
        view["response_format"] = {"type": fmt["type"]}
    return view


def _holder_pool(upstreams: Upstreams, previous: str | None) -> PoolName | None:
    """The pool of the endpoint known to hold the response a request continues; None when unknown."""
    if previous is None:
        return None
    holder = upstreams.stored.holder(previous, upstreams.pools)
    return None if holder is None else holder.pool


def _affinity(view: dict[str, Any], pool: PoolName) -> RouteRequest:
    """The routing request of one that must run where its previous response is: vLLM answers 404 on
    any other endpoint, so that pool is forced, over the classifier and a pool the client named."""
    return RouteRequest(view, "chat", pool, AFFINITY)


def _remember(upstreams: Upstreams, made: str | None, endpoint: Endpoint) -> None:
    """Note that ``endpoint`` made the response ``made`` (vLLM stores what it answers when asked to)."""
    if made is not None:
        upstreams.stored.remember(made, endpoint)


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


async def responses(request: Request) -> Response:
    """Validate → classify and decide (as a chat) → forward to ``/v1/responses`` → observe."""
    gw = state.of(request)
    started, rid, trace = now(), request_id(request), trace_id(request)
    tried: list[Endpoint] = []  # the endpoints it was sent to, in order
    decision: Decision | None = None
    view: dict[str, Any] | None = None
    try:
        body = await read_checked(request, gw)
        payload = json_object(body)
        check_fields(payload)
        check_model(payload.get("model"), gw.models)
        view = chat_view(payload)
        forced = forced_pool(request, gw.settings.routing.allow_pool_override)
        previous = payload.get("previous_response_id") or None  # a string (check_fields)
        held_in = _holder_pool(gw.upstreams, previous)
        route = RouteRequest(view, "chat", forced) if held_in is None else _affinity(view, held_in)
        decision = gw.policy.decide(route)
        gw.observer.decided(decision, gw.policy.strategy)
        headers = upstream_headers(request, gw, rid, "application/json")
        stores = payload.get("store") is not False
        if payload.get("stream") is not True:
            fetched = gw.upstreams.fetch(
                PATH,
                body,
                headers,
                decision.pool,
                allow_failover=not decision.baseline_only,
                first_byte_s=gw.settings.timeouts.total_s,
                tried=tried,
                stored=previous,
            )
            sent, content = await unless_disconnected(request, fetched)
            gw.observer.forwarded(decision, sent.pool)
            status = sent.response.status
            if stores and status < 300:
                _remember(gw.upstreams, response_id(content), sent.endpoint)
            observe(
                gw, rid=rid, trace=trace, route="responses", started=started, status=status, sent=sent,
                decision=decision, payload=view, content=content,
            )  # fmt: skip
            media_type = sent.response.headers.get("content-type", "application/json")
            return Response(
                content, status, headers=decision_headers(decision, sent.pool, rid), media_type=media_type
            )
        deadline = gw.upstreams.deadline()  # the tries, the first byte and the stream together
        sending = gw.upstreams.send(
            PATH,
            body,
            headers,
            decision.pool,
            allow_failover=not decision.baseline_only,
            deadline=deadline,
            tried=tried,
            stored=previous,
        )
        sent = await unless_disconnected(request, sending)
    except asyncio.CancelledError:  # cut at the end of the shutdown grace period (a client gone is a 499)
        observe(
            gw, rid=rid, trace=trace, route="responses", started=started, status=CUT_AT_SHUTDOWN,
            decision=decision, payload=view,
        )  # fmt: skip
        raise
    except APIError as e:
        observe(
            gw,
            rid=rid,
            trace=trace,
            route="responses",
            started=started,
            status=e.status,
            decision=decision,
            payload=view,
            tried=tried,
        )
        message = f"{e.message} (request id {rid})" if e.status >= 500 else e.message
        # no pool's answer reached the client: no x-specroute-pool, as on the completion routes
        extra = decision_headers(decision, None, rid) if decision else {"x-request-id": rid}
        return error_response(e.status, message, e.param, {**e.headers, **extra}, e.body)
    gw.observer.forwarded(decision, sent.pool)
    status = sent.response.status
    meter = EventMeter(started) if status < 300 else None
    if meter is not None and stores:
        made_on = sent.endpoint
        meter.on_created = lambda created: _remember(gw.upstreams, created, made_on)
    chosen = decision

    def done(s: Sent, failed: int | None) -> None:
        observe(
            gw, rid=rid, trace=trace, route="responses", started=started,
            status=relayed_status(request, failed) or status, sent=s, decision=chosen, payload=view,
            meter=meter,
        )  # fmt: skip

    chunks = gw.upstreams.relay(sent, meter, done, deadline=deadline)
    media_type = sent.response.headers.get("content-type", "text/event-stream")
    headers = decision_headers(decision, sent.pool, rid)
    return Relay(
        chunks,
        status,
        headers=headers,
        media_type=media_type,
        ending=responses_error_event,
        deadline=deadline,
    )
