"""Server-sent events: the one decoder for every SSE stream the gateway and its load generator read.

It follows the event-stream format of the HTML standard: lines end in ``\\r\\n``, ``\\r`` or ``\\n``
(mixed within a stream, and split anywhere between reads), a blank line ends an event, ``data:`` takes
an optional single space, several ``data`` lines join with ``\\n``, lines starting with ``:`` are
comments, and ``event``, ``id`` and ``retry`` are read too.

Why not a library: the gateway relays upstream bytes unchanged and may only cut the stream on an event
boundary (a stream that breaks is resumed, or ends with an error event, between whole events), so it
needs each event's *bytes* and where they end, and it runs for every chunk of every stream. httpx-sse
reads httpx responses (upstream reads go through aiohttp), and its decoder, a private module, takes
decoded text one line per Python call and returns events without their bytes or positions; aiohttp-sse-client2
owns the connection and reconnects by itself (the gateway has its own retry and resume); sse-starlette
is server side only. This decoder works on bytes: a stream with ``\\n`` line ends (vLLM's) is framed
with one ``find``, one ``rfind`` and one ``split`` per read, and an event that is a single ``data:`` line
is read by slicing; other line ends take a regular-expression scan. ``tests/upstream/sse_microbench.py``
measures the stream meter per chunk.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import orjson

_LINE_END = re.compile(rb"\r\n|\r|\n")
_DATA = b"data:"


@dataclass(slots=True, kw_only=True)
class Event:
    """One event's fields; ``data`` is ``None`` when the event had no ``data`` line."""

    data: bytes | None = None
    event: str = ""
    id: str | None = None
    retry: int | None = None


def data_of(event: bytes) -> bytes | None:
    """The ``data`` of one event as framed by :class:`EventBuffer` (``None``: no ``data`` line)."""
    # one data line, the common case: read by slicing (``find`` is cheaper than ``in`` on bytes)
    if event.startswith(_DATA) and event.find(b"\n") < 0 and event.find(b"\r") < 0:
        return event[6:] if event[5:6] == b" " else event[5:]
    return parse(event).data


def data_object(data: bytes | None) -> dict[str, Any] | None:
    """An event's ``data`` as a JSON object; None for none, for what is not JSON, or not an object."""
    if data is None:
        return None
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    return obj if isinstance(obj, dict) else None


def parse(event: bytes) -> Event:
    """Every field of one event (its lines, without the blank line that ended it)."""
    out = Event()
    data: list[bytes] = []
    for line in _LINE_END.split(event):
        if not line or line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"data":
            data.append(value)
        elif name == b"event":
            out.event = value.decode(errors="replace")
        elif name == b"id":
            if b"\0" not in value:
                out.id = value.decode(errors="replace")
        elif name == b"retry" and value.isdigit():
            out.retry = int(value)
    if data:
        out.data = b"\n".join(data)
    return out


def with_data(event: bytes, data: bytes) -> bytes:
    """``event`` with its data replaced by ``data`` (one line): other fields and comments are kept."""
    if event.startswith(_DATA) and event.find(b"\n") < 0 and event.find(b"\r") < 0:
        return b"data: " + data
    kept = [line for line in _LINE_END.split(event) if line and line.partition(b":")[0] != b"data"]
    return b"\n".join([*kept, b"data: " + data])


class EventBuffer:
    """Frames a byte stream into whole events, whatever its line ends and however it was cut.

    :meth:`feed` takes the next bytes read and returns the events they complete, each as its own bytes
    without the blank line that ended it, and the exact input bytes those events and their blank lines
    took (what a relay passes on); an unfinished event waits for the next read.

    The reads of a large event (a first chunk with prompt logprobs can be megabytes) are kept apart
    until one of them can end it, then joined once: joining and searching the whole unfinished event
    at every read made its framing quadratic in the number of reads.
    """

    __slots__ = ("_buf", "_cr", "_more", "_more_bytes", "_plain")

    def __init__(self) -> None:
        self._buf = b""  # the unfinished event's first bytes ...
        self._more: list[bytes] = []  # ... and the reads after them, none of which can end it
        self._more_bytes = 0
        self._cr = False  # what was passed on ended in "\r": a "\n" next is the rest of that line end
        self._plain = True  # the last events returned had "\n" line ends only

    def data(self, event: bytes) -> bytes | None:
        """:func:`data_of` an event the last :meth:`feed` returned, one test cheaper on ``\\n`` streams."""
        if self._plain and event.startswith(_DATA) and event.find(b"\n") < 0:
            return event[6:] if event[5:6] == b" " else event[5:]
        return data_of(event)

    def with_data(self, event: bytes, data: bytes) -> bytes:
        """:func:`with_data` for an event the last :meth:`feed` returned, cheaper on ``\\n`` streams."""
        if self._plain and event.startswith(_DATA) and event.find(b"\n") < 0:
            return b"data: " + data
        return with_data(event, data)

    def feed(self, raw: bytes) -> tuple[list[bytes], bytes]:
        if self._buf:
            if not raw:
                return [], b""
            last = self._more[-1] if self._more else self._buf  # never empty: empty reads are not kept
            if not _may_end(last[-1:] + raw[:1], raw):
                self._more.append(raw)  # no blank line can end in it: nothing to frame yet
                self._more_bytes += len(raw)
                return [], b""
            buf = b"".join([self._buf, *self._more, raw])
            self._more.clear()
            self._more_bytes = 0
        else:
            buf = raw
        start = 0
        if self._cr and buf:
            self._cr = False
            if buf[:1] == b"\n":
                start = 1
        self._plain = buf.find(b"\r") < 0
        if self._plain:
            end = buf.rfind(b"\n\n", start)
            if end < 0:
                self._buf = buf[start:]
                return [], buf[:start]
            self._buf = buf[end + 2 :]
            events = buf[start:end].split(b"\n\n")
            return [e for e in events if e] if b"" in events else events, buf[: end + 2]
        events, done = self._scan(buf, start)
        self._buf = buf[done:]
        self._cr = done > 0 and done == len(buf) and buf[done - 1 : done] == b"\r"
        return events, buf[:done]

    def _scan(self, buf: bytes, start: int) -> tuple[list[bytes], int]:
        """Events in ``buf`` from ``start`` with any line ends, and where the last one's blank line ends."""
        events: list[bytes] = []
        event_start = line_start = done = start
        for m in _LINE_END.finditer(buf, start):
            if m.start() == line_start:  # a blank line: the event (if any) is complete
                if line_start > event_start:
                    events.append(buf[event_start:line_start].rstrip(b"\r\n"))
                event_start = done = m.end()
            line_start = m.end()
        return events, done

    def unfinished(self) -> int:
        """How many bytes of an unfinished event are held."""
        return len(self._buf) + self._more_bytes

    def unfinished_bytes(self) -> bytes:
        """The bytes of an unfinished event, kept."""
        return b"".join([self._buf, *self._more])

    def rest(self) -> bytes:
        """The bytes of an unfinished event (at the end of a stream), and forget them."""
        rest = b"".join([self._buf, *self._more])
        self._buf, self._cr = b"", False
        self._more.clear()
        self._more_bytes = 0
        return rest


def _may_end(seam: bytes, raw: bytes) -> bool:
    """Whether a blank line can end in ``raw`` read after an unfinished event whose last byte and
    ``raw``'s first are ``seam``.

    Two line ends in a row hold ``\\n\\n``, ``\\r\\r`` or ``\\n\\r`` whatever the line ends (``\\r\\n`` is
    one): without any of them in the seam or the read, the event goes on. An unfinished event never
    holds one (the framing would have ended it there).
    """
    return any(p in seam or p in raw for p in _BLANK_LINE_PAIRS)


_BLANK_LINE_PAIRS = (b"\n\n", b"\r\r", b"\n\r")
