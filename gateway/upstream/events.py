"""Metering a stream of named SSE events (vLLM's Responses API) while passing it through unchanged.

A Responses stream is ``event: <type>`` and ``data: <json>`` lines per event, ending with
``response.completed`` (or ``response.incomplete`` / ``response.failed``) and no ``[DONE]``. The
first ``*.delta`` event is the first token (TTFT); each delta is one engine output (a chunk); the
final event carries the usage (``output_tokens``). Whole events only go out, as for chat streams.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

import orjson

from gateway.upstream.stream import StreamMeter

_EVENT = b"event:"
_DATA = b"data:"
_DELTA = b".delta"
_FINAL = frozenset((b"response.completed", b"response.incomplete", b"response.failed"))


@dataclass(slots=True)
class EventMeter(StreamMeter):
    """A :class:`StreamMeter` for named events: measures, never rewrites."""

    def feed(self, raw: bytes) -> bytes:
        buf = self._buf + raw if self._buf else raw
        end = buf.rfind(b"\n\n")
        if end < 0:
            self._buf = buf
            return b""
        self._buf = buf[end + 2 :]
        for event in buf[:end].split(b"\n\n"):
            self._look(event)
        return buf[: end + 2]

    def _look(self, event: bytes) -> None:
        kind = data = b""
        for line in event.split(b"\n"):
            if line.startswith(_EVENT):
                kind = line[len(_EVENT) :].strip()
            elif line.startswith(_DATA):
                data = line[len(_DATA) :].strip()
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
                return
            usage = response.get("usage") if isinstance(response, dict) else None
            if isinstance(usage, dict):
                out, inp = usage.get("output_tokens"), usage.get("input_tokens")
                self.completion_tokens = out if isinstance(out, int) else None
                self.prompt_tokens = inp if isinstance(inp, int) else None
        elif kind == b"error":
            try:
                error = orjson.loads(data)
            except orjson.JSONDecodeError:
                error = {"message": "error event"}
            self.error = error if isinstance(error, dict) else {"message": str(error)}
