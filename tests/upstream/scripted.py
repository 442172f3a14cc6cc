"""Raw asyncio upstreams that answer completion requests as a shared script says, on loopback.

Several servers share one :class:`Script`: the n-th completion request, whichever server gets it,
is answered the n-th way, so a test knows which answer a retry meets without depending on which
endpoint the balancer tries first. ``GET`` requests (health checks, ``/metrics``) always get a 200.
Every answer closes its connection, so the gateway's pool never holds a half-read one.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import struct
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from typing import Literal

import orjson


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request off a connection: its head (up to the blank line) and its ``content-length`` body."""
    head = await reader.readuntil(b"\r\n\r\n")
    sizes = [
        int(ln.split(b":", 1)[1]) for ln in head.split(b"\r\n") if ln.lower().startswith(b"content-length:")
    ]
    body = await reader.readexactly(sizes[0]) if sizes and sizes[0] else b""
    return head, body


SLOW_S = 0.6  # how long a "slow_ok" answer waits before its head
DRIP_S = 0.05  # the pause between the bytes of a "drip" answer

Answer = Literal[
    "ok",
    "cut_body",
    "stall_body",
    "cut_stream",
    "early_end",
    "busy",
    "error",
    "error_event",
    "error_first",
    "cut_after_done",
    "malformed",
    "empty",
    "cut_after_head",
    "model_missing",
    "no_route",
    "busy_for_7s",
    "slow_ok",
    "cut_after_finish",
    "cut_after_usage",
    "reset_until_close",
    "not_json",
    "cut_json",
    "stall_head",
    "drip",
    "huge",
    "long_stream",
]

#: how large "huge" and "long_stream" answers are: above the limit the tests set, far below the default
HUGE_BYTES = 300_000

#: vLLM's answer for a model it does not serve, in the shape of its 404 (written here, model renamed)
MODEL_MISSING = (
    b'{"error":{"message":"The model `m` does not exist. Valid aliases: other.",'
    b'"type":"NotFoundError","param":"model","code":404}}'
)


def completion(model: str = "m") -> bytes:
    return orjson.dumps(
        {
            "id": "cmpl-0123456789abcdef",
            "object": "text_completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "text": "Hello there", "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2},
        }
    )


def stream_events(model: str = "m") -> list[bytes]:
    """A completion stream as vLLM sends it with continuous usage: two tokens, usage, ``[DONE]``."""

    def chunk(text: str, finish: str | None, tokens: int) -> bytes:
        usage = {"prompt_tokens": 3, "total_tokens": 3 + tokens, "completion_tokens": tokens}
        body = {
            "id": "cmpl-0123456789abcdef",
            "object": "text_completion",
            "created": 1,
            "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": usage,
        }
        return b"data: " + orjson.dumps(body) + b"\n\n"

    return [chunk("Hello", None, 1), chunk(" there", "length", 2), b"data: [DONE]\n\n"]


@dataclass
class Script:
    """How the n-th completion request is answered (the last entry repeats)."""

    answers: list[Answer]
    log: list[tuple[str, Answer]] = field(default_factory=list)  # (server name, answer) per request

    def next(self, server: str) -> Answer:
        answer = self.answers[min(len(self.log), len(self.answers) - 1)]
        self.log.append((server, answer))
        return answer


@dataclass
class Scripted:
    name: str
    script: Script
    server: asyncio.Server | None = None
    https: bool = False

    @property
    def url(self) -> str:
        assert self.server is not None
        scheme = "https" if self.https else "http"
        return f"{scheme}://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head, body = await read_request(reader)
            if head.startswith(b"GET"):
                writer.write(_response(200, b"{}"))
            else:
                await self._answer(reader, writer, self.script.next(self.name), b'"stream":true' in body)
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, answer: Answer, stream: bool
    ) -> None:
        if answer == "slow_ok":  # a whole answer, as "ok", after a queue's wait (SLOW_S) before its head
            await asyncio.sleep(SLOW_S)
            answer = "ok"
        if answer == "stall_head":  # nothing at all until the client gives up and closes
            await reader.read()
            return
        if answer == "busy":
            writer.write(_response(503, b'{"error":{"message":"busy","code":503}}'))
        elif answer == "busy_for_7s":  # an overloaded server (or the balancer before it) says when to return
            writer.write(_response(503, b'{"error":{"message":"busy","code":503}}', b"retry-after: 7\r\n"))
        elif answer == "error":
            writer.write(_response(500, b'{"error":{"message":"engine failed","code":500}}'))
        elif answer == "malformed":  # not HTTP: a status line the parser refuses
            writer.write(b"HTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
        elif answer == "model_missing":  # this endpoint serves another model
            writer.write(_response(404, MODEL_MISSING))
        elif answer == "no_route":  # FastAPI's answer for a path it does not have
            writer.write(_response(404, b'{"detail":"Not Found"}'))
        elif answer == "empty":  # a success with nothing in it
            writer.write(_response(200, b""))
        elif answer == "cut_after_head":  # the head, then the connection closes before any of the body
            writer.write(_response(200, completion())[: -len(completion())])
        elif answer == "not_json":  # a proxy's page, said to be JSON
            writer.write(_response(200, b"<html>upstream unavailable</html>"))
        elif answer == "cut_json":  # half a JSON body, its length announced as that half
            writer.write(_response(200, completion()[: len(completion()) // 2]))
        elif answer == "reset_until_close":  # a body delimited by the connection's end, reset midway
            body = completion()
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n")
            writer.write(body[: len(body) // 2])
            await writer.drain()
            sock = writer.get_extra_info("socket")
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = RST
            writer.transport.abort()
        elif answer == "drip":  # never silent for long, never done in time: a byte every DRIP_S
            body = completion()
            writer.write(_response(200, body)[: -len(body)])
            for i in range(len(body)):
                writer.write(body[i : i + 1])
                await writer.drain()
                await asyncio.sleep(DRIP_S)
        elif answer == "huge" and not stream:  # a whole, valid answer larger than the gateway may hold
            text = b"x" * HUGE_BYTES
            writer.write(_response(200, completion().replace(b"Hello there", text)))
        elif answer == "huge":  # one event that never ends, written on and on
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            piece = b'data: {"choices": [{"text": "' + b"x" * 16_000
            for _ in range(HUGE_BYTES // len(piece) + 1):
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
                piece = b"x" * 16_000
            await reader.read()  # open until the client closes
        elif answer == "long_stream":  # a stream of many whole chunks, longer in all than "huge"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            first, last, done = stream_events()
            chunk = first.replace(b'"Hello"', b'"' + b"y" * 1000 + b'"')
            events = [chunk] * (HUGE_BYTES // len(chunk) + 1) + [last, done]
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
            writer.write(b"0\r\n\r\n")
        elif not stream:
            body = completion()
            if answer == "ok":
                writer.write(_response(200, body))
            else:  # cut_body / stall_body: the full length announced, half of it sent
                writer.write(_response(200, body)[: -len(body) // 2])
                if answer == "stall_body":  # silent until the client gives up and closes
                    await writer.drain()
                    await reader.read()
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                b"transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
            )
            events = stream_events()
            if answer in ("cut_stream", "early_end"):
                events = events[:1]
            elif answer == "cut_after_finish":  # the last token's chunk (finish_reason) came; no [DONE]
                events = events[:2]
            elif answer == "cut_after_usage":  # include_usage's chunk came too; no [DONE]
                usage = {"prompt_tokens": 3, "total_tokens": 5, "completion_tokens": 2}
                final = {"id": "cmpl-0123456789abcdef", "object": "text_completion", "created": 1,
                         "model": "m", "choices": [], "usage": usage}  # fmt: skip
                events = [*events[:2], b"data: " + orjson.dumps(final) + b"\n\n"]
            elif answer in ("error_event", "error_first"):  # vLLM's error event in a stream, then [DONE]
                error = b'{"error":{"message":"CUDA error at /srv/engine/worker.py:42","code":500}}'
                before = [] if answer == "error_first" else [events[0]]  # first: before any token
                events = [*before, b"data: " + error + b"\n\n", events[-1]]
            for event in events:
                writer.write(b"%x\r\n%s\r\n" % (len(event), event))
                await writer.drain()
            if answer not in ("cut_stream", "cut_after_done", "cut_after_finish", "cut_after_usage"):
                writer.write(b"0\r\n\r\n")


def _response(status: int, body: bytes, extra: bytes = b"") -> bytes:
    return (
        b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
        b"%sconnection: close\r\n\r\n%s" % (status, len(body), extra, body)
    )


@asynccontextmanager
async def serving(
    script: Script, *names: str, tls: ssl.SSLContext | None = None
) -> AsyncIterator[list[Scripted]]:
    """One listening :class:`Scripted` per name, sharing ``script``, over TLS with ``tls``; closed on exit."""
    async with AsyncExitStack() as stack:
        servers = []
        for name in names:
            s = Scripted(name, script, https=tls is not None)
            s.server = await asyncio.start_server(s.handle, "127.0.0.1", 0, ssl=tls)
            stack.push_async_callback(s.server.wait_closed)
            stack.callback(s.server.close)
            servers.append(s)
        yield servers
