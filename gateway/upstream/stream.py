"""Looking inside an upstream SSE stream while passing it through.

The gateway asks every streamed upstream request for ``continuous_usage_stats`` so that each
chunk carries the cumulative completion-token count: that is how it measures TTFT, TPOT per token
(not per chunk) and, under speculation, tokens per engine step. What the client did not ask for
is removed again, leaving the bytes the upstream would have sent without it. Events are framed by
:mod:`gateway.upstream.sse` (any line ends); when nothing is to be removed the upstream bytes are
relayed unchanged, whole events at a time. An event is re-encoded only when it must be changed, and
then by cutting the exact ``"usage":{...}`` bytes out rather than re-serialising the chunk.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any, Protocol

import orjson

from gateway.errors import RequestNotEncodable
from gateway.upstream.sse import EventBuffer, data_object, data_of, with_data


class Transcript(Protocol):
    """Whatever keeps a record of the chunks the client received (:mod:`gateway.upstream.resume`)."""

    def record(self, chunk: dict[str, Any]) -> None: ...

    @property
    def blocked(self) -> str | None:
        """Why the stream could not be continued elsewhere ("finished": its one choice ended)."""
        ...


_DONE = b"[DONE]"
DONE_EVENT = b"data: [DONE]\n\n"  # a chat or completion stream's last event
_ERROR = b'"error"'

log = logging.getLogger("specroute.upstream")


def server_error(error: dict[str, Any]) -> bool:
    """Whether an upstream's error event reports a failure of its own (a 5xx code, or none) rather than
    the request's (a 4xx code: the client's to read)."""
    code = error.get("code")
    return not (isinstance(code, int) and code < 500)


def leading_error(first: bytes) -> dict[str, Any] | None:
    """The error a stream opens with, when its first event, whole in ``first``, is vLLM's error event
    (``data: {"error": {...}}``, sent with a 200 when the request fails once its stream has begun);
    else None. Nothing of such a stream has reached a client: it can be sent again elsewhere."""
    if first.find(_ERROR, 0, 64) < 0:  # a chunk names its id first; an error event opens with it
        return None
    events, _ = EventBuffer().feed(first)
    obj = data_object(data_of(events[0])) if events else None
    error = obj.get("error") if obj is not None else None
    return error if isinstance(error, dict) else None


def _client_safe(event: bytes, error: dict[str, Any]) -> bytes:
    """An upstream error event as the client may see it: a server error's text (a trace, a path, an
    address) goes to the log, and the client gets its status and type with a generic message; a client
    error (4xx) is the client's to read and passes as it came."""
    if not server_error(error):
        return event
    code = error.get("code")
    log.warning("upstream error event in a stream: %r", str(error.get("message"))[:2000])
    status = code if isinstance(code, int) else 500
    kind = error.get("type") if isinstance(error.get("type"), str) else "InternalServerError"
    safe = {"message": f"the upstream reported an error (HTTP {status})", "type": kind, "param": None}
    return with_data(event, orjson.dumps({"error": {**safe, "code": status}}))


def encode_body(payload: Any) -> bytes:
    """A request body as JSON bytes: orjson's, or the standard library's where orjson will not go.

    orjson reads JSON nested up to 1,024 levels but writes only 254, so a body it parsed (a deep
    ``json_schema``, deep ``vllm_xargs``) could not be rewritten by it; nor does it write an integer past
    64 bits (the API edge parses those exactly: a ``const`` in a schema, an id in ``vllm_xargs``). The
    standard library's encoder writes both (compact, the same values, integers digit for digit) up to
    Python's recursion limit. Past that, or for anything else neither can write,
    :class:`~gateway.errors.RequestNotEncodable`.
    """
    try:
        return orjson.dumps(payload)
    except orjson.JSONEncodeError:
        pass
    try:
        return json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
    except (RecursionError, ValueError, TypeError) as e:
        raise RequestNotEncodable(str(e)) from None


def request_usage(payload: dict[str, Any]) -> tuple[bytes, bool, bool]:
    """Rewrite a streamed request body to ask for per-chunk usage.

    Returns the new body and what the client itself asked for (include_usage, continuous).
    """
    opts = payload.get("stream_options")
    opts = opts if isinstance(opts, dict) else {}
    wants_usage = bool(opts.get("include_usage"))
    wants_continuous = wants_usage and bool(opts.get("continuous_usage_stats"))
    if wants_continuous:
        return encode_body(payload), True, True
    new = dict(payload)
    new["stream_options"] = {**opts, "include_usage": True, "continuous_usage_stats": True}
    return encode_body(new), wants_usage, wants_continuous


def _cut_usage(data: bytes, usage: Any) -> bytes:
    """``data`` (one JSON chunk) without its ``usage`` member."""
    needle = b'"usage":' + orjson.dumps(usage)
    i = data.find(needle)
    if i > 0:
        j = i + len(needle)
        if data[i - 1 : i] == b",":
            return data[: i - 1] + data[j:]
        if data[j : j + 1] == b",":
            return data[:i] + data[j + 1 :]
    obj = orjson.loads(data)
    obj.pop("usage", None)
    return orjson.dumps(obj)


@dataclass(slots=True)
class StreamMeter:
    """Frames SSE events, records token counts per chunk and strips unrequested usage."""

    started: float
    keep_usage_chunk: bool = True
    keep_continuous: bool = True
    first_token_at: float | None = None
    last_at: float | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    chunks: int = 0
    token_steps: list[int] = field(default_factory=list)
    spec_metrics: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    collect: list[dict[str, Any]] | None = None  # every parsed chunk, when a body is to be assembled
    transcript: Transcript | None = None  # what the client got, when the stream may be resumed
    strip_token_ids: bool = False  # the gateway asked for token ids the client did not
    done: bool = False
    usage_out: bool = False  # the usage chunk the client asked for (``include_usage``) has gone out
    _sse: EventBuffer = field(default_factory=EventBuffer)
    _held: bytes | None = None

    def feed(self, raw: bytes) -> bytes:
        """Take raw upstream bytes; return the bytes to send to the client now."""
        events, span = self._sse.feed(raw)
        # ``find``, not ``in``: a bytes ``in`` first tries its operand as an int and clears the TypeError
        # (1,600 instructions a read)
        plain = self.keep_continuous and self.keep_usage_chunk and not self.strip_token_ids
        if plain and span.find(_ERROR) < 0:
            # Nothing to strip: forward the events as they came, frame only for measurement. Only
            # whole events go out, so that a stream that breaks can be resumed (or end with an error
            # event) on an event boundary.
            for event in events:
                self._event(event)
            return span
        out: list[bytes] = []
        for event in events:
            kept = self._event(event)
            if kept is not None:
                out.append(kept + b"\n\n")
        return b"".join(out)

    def answered(self) -> bool:
        """Whether a stream that broke had already given the client its whole answer: its one choice
        finished (the transcript of a resumable stream says so), and the usage chunk the client asked
        for, if it did, has gone out too; what is lost is only what the gateway asked for itself, or
        ``[DONE]``, which the gateway then writes."""
        t = self.transcript
        return (self.usage_out or not self.keep_usage_chunk) and t is not None and t.blocked == "finished"

    def unfinished(self) -> int:
        """How many bytes of an unfinished event the meter holds (until more bytes end it)."""
        return self._sse.unfinished()

    def end(self) -> bytes:
        """At the body's end, its last event if it came whole but for the blank line that ends an event
        (``data: [DONE]`` and then nothing): completed, taken as any event, and returned to send on.

        Whole means its data is ``[DONE]`` or a JSON value: a body cut inside an event (half a chunk's
        JSON) is a broken stream, whose unfinished event the client must never see; it stays unfinished
        for :meth:`discard_partial`.
        """
        rest = self._sse.unfinished_bytes()
        event = rest.rstrip(b"\r\n")
        data = data_of(event) if event.strip() else None
        if data is None or not _whole(data):
            return b""
        self._sse.rest()
        return self.feed(event + b"\n\n")

    def discard_partial(self) -> None:
        """Forget the unfinished event of a stream that broke: the client never saw any of it."""
        self._sse.rest()

    def flush(self) -> bytes:
        rest = self._sse.rest()
        held, self._held = self._held, None
        return held + b"\n\n" + rest if held is not None else rest

    def _release(self, event: bytes | None) -> bytes | None:
        """Emit a held-back finishing chunk ahead of ``event``."""
        held, self._held = self._held, None
        if held is None:
            return event
        return held if event is None else held + b"\n\n" + event

    def _event(self, event: bytes) -> bytes | None:
        data = self._sse.data(event)
        if data is None:
            return event
        if data == _DONE:
            self.done = True
            return self._release(event)
        now = perf_counter()
        self.last_at = now
        obj = data_object(data)
        if obj is None:
            return event
        if self.collect is not None:
            self.collect.append(obj)
        if self.transcript is not None:
            self.transcript.record(obj)
        if "error" in obj:
            self.error = obj["error"] if isinstance(obj["error"], dict) else {"message": str(obj["error"])}
            return _client_safe(event, self.error)
        usage = obj.get("usage")
        choices = obj.get("choices")
        metrics = obj.get("metrics")
        if isinstance(metrics, dict) and isinstance(metrics.get("speculative_decoding"), dict):
            self.spec_metrics = metrics["speculative_decoding"]
        if isinstance(usage, dict):
            tokens = usage.get("completion_tokens")
            if isinstance(tokens, int):
                if choices:
                    prev = self.completion_tokens or 0
                    if tokens > prev:
                        if self.first_token_at is None:
                            self.first_token_at = now
                        self.token_steps.append(tokens - prev)
                self.completion_tokens = tokens
            if isinstance(usage.get("prompt_tokens"), int):
                self.prompt_tokens = usage["prompt_tokens"]
        if choices:
            self.chunks += 1
            if self.first_token_at is None and usage is None and has_output(choices):
                self.first_token_at = now
        elif usage is not None and self.keep_usage_chunk:
            self.usage_out = True  # the stream's last chunk but [DONE], for the client as it came
        elif usage is not None and not self.keep_usage_chunk:
            # Without usage, vLLM puts the final chunk's extra members (system_fingerprint) on the
            # last chunk with a finish_reason, which was held back for this; the per-request
            # ``metrics`` come with the usage only, and go with it.
            extras = {k: v for k, v in obj.items() if k not in _USAGE_ONLY}
            held = self._held
            held_data = data_of(held) if held is not None else None
            if extras and held is not None and held_data is not None:
                self._held = with_data(held, held_data[:-1] + b"," + orjson.dumps(extras)[1:])
            return self._release(None)
        if usage is not None and choices and not self.keep_continuous:
            event = self._sse.with_data(event, _cut_usage(data, usage))
        if self.strip_token_ids and choices:
            event = _null_ids(event)
        if not self.keep_usage_chunk and choices and _finished(choices):
            previous = self._release(None)
            self._held = event
            return previous
        return self._release(event) if self._held is not None else event


_ID_LISTS = (b'"prompt_token_ids":[', b'"token_ids":[')


def _null_ids(event: bytes) -> bytes:
    """``event`` with its token-id lists put back to the ``null`` vLLM sends when not asked for them.

    A list of ids holds only digits and commas, so it ends at the first ``]``.
    """
    for needle in _ID_LISTS:
        start = 0
        while (i := event.find(needle, start)) >= 0:
            j = event.find(b"]", i)
            if j < 0:
                break
            cut = i + len(needle) - 1
            event = event[:cut] + b"null" + event[j + 1 :]
            start = cut + 4
    return event


def _whole(data: bytes) -> bool:
    """Whether an event's data is whole: ``[DONE]`` or a JSON value."""
    if data == _DONE:
        return True
    try:
        orjson.loads(data)
    except orjson.JSONDecodeError:
        return False
    return True


#: a usage chunk's members that a stream without usage does not move onto its finishing chunk
_USAGE_ONLY = frozenset(("id", "object", "created", "model", "choices", "usage", "metrics"))


def _finished(choices: Any) -> bool:
    for c in choices:  # noqa: SIM110 - a loop, not any() over a generator: this runs for every chunk
        if isinstance(c, dict) and c.get("finish_reason") is not None:
            return True
    return False


def has_output(choices: Any) -> bool:
    """Whether a chunk's choices carry output (text, content or a tool call), not just a role or usage."""
    for c in choices:
        if isinstance(c, dict):
            delta = c.get("delta")
            if c.get("text") or (
                isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls"))
            ):
                return True
    return False
