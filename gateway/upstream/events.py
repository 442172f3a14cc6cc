"""Metering a stream of named SSE events (vLLM's Responses API) while passing it through unchanged.

A Responses stream is ``event: <type>`` and ``data: <json>`` lines per event, ending with
``response.completed`` (or ``response.incomplete`` / ``response.failed``) and no ``[DONE]``. The
first ``*.delta`` event is the first token (TTFT); each delta is one engine output (a chunk); the
final event carries the usage (``output_tokens``). The ``response.created`` event names the response's
id, which ``on_created`` is told (where it was made is noted for the stored response's later
requests: :mod:`gateway.upstream.stored`). Whole events only go out, as for chat streams, framed
by the same decoder (:mod:`gateway.upstream.sse`).
An ``error`` event that reports a server error reaches the client with a generic message (its text, a
trace or an address, goes to the log), as inside chat streams; a client error passes as it came.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import orjson

from gateway.upstream.sse import parse, with_data
from gateway.upstream.stream import StreamMeter

_DELTA = ".delta"
_CREATED = "response.created"
_FINAL = frozenset(("response.completed", "response.incomplete", "response.failed"))

log = logging.getLogger("specroute.upstream")


@dataclass(slots=True)
class EventMeter(StreamMeter):
    """A :class:`StreamMeter` for named events: measures, never rewrites."""

    on_created: Callable[[str], None] | None = None  # told the response's id, once it is known

    def feed(self, raw: bytes) -> bytes:
        events, span = self._sse.feed(raw)
        safe = [self._look(event) for event in events]
        if all(s is e for s, e in zip(safe, events, strict=True)):
            return span  # nothing changed: the upstream bytes as they came
        return b"".join(e + b"\n\n" for e in safe)

    def _look(self, event: bytes) -> bytes:
        """Measure one event; return it as the client may see it."""
        parsed = parse(event)
        kind, data = parsed.event, parsed.data or b""
        if kind.endswith(_DELTA):
            now = perf_counter()
            if self.first_token_at is None:
                self.first_token_at = now
            self.last_at = now
            self.chunks += 1
        elif kind in _FINAL:
            self.done = True
            try:
                response = orjson.loads(data).get("response")
            except (orjson.JSONDecodeError, AttributeError):
                return event
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                out, inp = usage.get("output_tokens"), usage.get("input_tokens")
                self.completion_tokens = out if isinstance(out, int) else None
                self.prompt_tokens = inp if isinstance(inp, int) else None
        elif kind == _CREATED and self.on_created is not None:
            created = _response_id(data)
            if created is not None:
                self.on_created(created)
        elif kind == "error":
            try:
                error = orjson.loads(data)
            except orjson.JSONDecodeError:
                error = {"message": "error event"}
            self.error = error if isinstance(error, dict) else {"message": str(error)}
            return _client_safe(event, self.error)
        return event


def _response_id(data: bytes) -> str | None:
    """The ``response.id`` of a ``response.created`` event's data; None when it names none."""
    try:
        response = orjson.loads(data).get("response")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    rid = response.get("id") if isinstance(response, dict) else None
    return rid if isinstance(rid, str) and rid else None


def _client_safe(event: bytes, error: dict[str, Any]) -> bytes:
    """A client error (a 4xx ``code``) as it came; anything else with its code and a generic message."""
    code = error.get("code")
    status = int(code) if isinstance(code, int | str) and str(code).isdigit() else None
    if status is not None and 400 <= status < 500:
        return event
    # %r: the text may repeat the client's input, whose line breaks and escapes must not reach the log raw
    log.warning("upstream error event in a Responses stream: %r", str(error.get("message"))[:2000])
    shown = status or 500
    safe = {"type": "error", "code": str(code) if code is not None else "500", "param": None}
    safe["message"] = f"the upstream reported an error (HTTP {shown})"
    if "sequence_number" in error:
        safe["sequence_number"] = error["sequence_number"]
    return with_data(event, orjson.dumps(safe))
