"""Names every layer shares: pools, APIs, prompt classes.

The bottom of the package: it imports nothing from the gateway, and everything else may import it.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar, dataclass_transform

_T = TypeVar("_T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def record(cls: type[_T]) -> type[_T]:
    """A value made per request and never changed: a slotted dataclass, frozen for the type checker.

    ``mypy --strict`` refuses every assignment to its fields, as for ``frozen=True``. At run time it is
    a plain slotted dataclass: a frozen one's ``__init__`` stores each field through
    ``object.__setattr__`` (around its own ``__setattr__``, which refuses), a call with an argument
    tuple per field, about a thousand instructions each; the decisions, features, predictions and
    outcomes made per request cost 56,000 instructions less this way. Such values are not hashable
    (none is used as a key). The classifier, which stands alone, has the same decorator
    (``classifiers.request.record``).
    """
    return dataclass(slots=True)(cls)


PoolName = Literal["speculative", "baseline"]
"""The two pools: the same target model with speculative decoding on, and without it."""

POOL_NAMES: tuple[PoolName, PoolName] = ("speculative", "baseline")

OTHER_POOL: dict[PoolName, PoolName] = {"speculative": "baseline", "baseline": "speculative"}
"""Where a request fails over to: both pools serve the same model, so only the speed changes."""

Api = Literal["completions", "chat"]
"""The OpenAI APIs the gateway classifies and routes."""

Route = Literal[
    "completions",
    "chat",
    "responses",
    "embeddings",
    "tokenize",
    "detokenize",
    "audio",
    "score",
    "rerank",
    "classify",
    "pooling",
    "lora",
    "other",
]
"""Every route the gateway serves, as its metrics and access log name it: a bounded set, whatever the
path (an unknown ``/v1/*`` route passed through is ``other``)."""

RUN_TOKEN_ENV = "SPECROUTE_RUN_TOKEN"
"""Set by :mod:`gateway.stack` for each process it starts; the process echoes it on ``/health``."""

RUN_TOKEN_HEADER = "x-specroute-run"
"""The ``/health`` response header carrying the run token: proof that the process answering a port is
the one just started, not another server that was already there."""

CONTENT_CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}
"""The HTTP content codings the gateway decodes, in either direction, with zlib's window setting for each:
a gzip member, or zlib's own format (what ``deflate`` means in HTTP; 32 + lets zlib tell it from gzip by
its header). A client's compressed request body is decoded before it is read; an upstream's compressed
answer (sent although the gateway asks for ``identity``) before it is relayed."""


def window_bits(wbits: int, start: bytes) -> int:
    """zlib's window setting for a body coded as :data:`CONTENT_CODINGS` says and starting with ``start``.

    Some servers send ``deflate`` as the raw deflate stream, without zlib's two-byte header (browsers and
    other clients read it either way); a ``deflate`` body whose first two bytes are neither a zlib header
    nor gzip's is read as that.
    """
    if wbits != CONTENT_CODINGS["deflate"] or len(start) < 2:
        return wbits
    zlib_header = start[0] & 0x0F == 8 and (start[0] << 8 | start[1]) % 31 == 0
    return wbits if zlib_header or start[:2] == b"\x1f\x8b" else -zlib.MAX_WBITS


PromptClass = Literal["structured", "open-ended"]
"""What the classifier says of a prompt: predictable output (speculation helps) or open-ended prose."""


CLIENT_SCOPE_KEY = "specroute.client"
"""The ASGI scope key under which the gateway's HTTP protocol (:mod:`gateway.connections`) puts the
request's :class:`ClientState`; under another server the key is absent."""
#: set in the scope of a request on a connection beyond ``server.max_connections``: the application
#: answers it 503 (but ``/health``, a liveness probe) and counts it; the connection then closes
REFUSED_SCOPE_KEY = "specroute.refused"


class ChunkWriter(Protocol):
    """Writes a response straight to the client's connection: a piece of a streamed body, a stream's head
    and end, or a whole answer.

    An ASGI message goes through every ``send`` wrapper and the server's checks before its bytes reach
    the socket: a message dictionary and four calls per piece, paid for each chunk of every stream the
    gateway relays, and for a head two regular-expression searches per header. The gateway's HTTP
    protocol hands the responses this instead; each method declines (returns False) where only a
    message may go, and the message then goes as before.
    """

    def write(self, body: bytes) -> bool:
        """Write ``body`` as the response's next piece, or do nothing and return False when only an ASGI
        message may carry it now (the client is not reading, the response is not chunked or is over)."""
        ...

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """Write a whole response (its status, ``headers`` with their ``content-length``, ``body``) at once,
        or do nothing and return False when only ASGI messages may carry it."""
        ...

    def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> bool:
        """Start a chunked response (no ``content-length`` in ``headers``), or return False as above."""
        ...

    def end(self) -> bool:
        """End the chunked response this writer started or carried, or return False as above."""
        ...

    def progress(self) -> tuple[bool, bool, bool]:
        """Whether the response has started, whether it is complete (however they went out), and whether
        this writer started it as an event stream."""
        ...


class ClientState:
    """What the connection knows of a request's client that ASGI only tells by waiting.

    ASGI learns that a body has arrived, or that the client went away, from ``receive()``: a timer
    around the body's read, and a task waiting on ``receive()`` beside every upstream wait, created and
    cancelled per request. The protocol that parses the request and sees the connection go knows both
    at no cost: whether the whole body was already there when the request's task started (no time
    limit needed), and when the client is gone (it cancels the one task that waits, if any). It also
    hands a stream's relay a :class:`ChunkWriter` for the response's pieces.
    """

    __slots__ = ("body_complete", "lost", "transport", "waiting", "writer")

    def __init__(
        self, writer: ChunkWriter | None = None, transport: asyncio.WriteTransport | None = None
    ) -> None:
        self.body_complete = False
        self.lost = False
        self.waiting: asyncio.Task[Any] | None = None  # the request's task while it awaits upstream
        self.writer = writer
        self.transport = transport  # the client's connection, to drop it (see abort)

    def abort(self) -> None:
        """Drop the connection at once, with what is queued for it (a client that stopped reading); the
        request counts as the client's loss from now on. Nothing where the connection is not known here."""
        if self.transport is not None:
            self.lost = True
            self.transport.abort()

    def gone(self) -> None:
        """The connection is lost: cancel the waiting task (later waits see ``lost`` at once)."""
        if self.lost:
            return
        self.lost = True
        if self.waiting is not None:
            self.waiting.cancel()
