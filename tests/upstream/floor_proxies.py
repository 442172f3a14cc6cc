"""Proxies that do nothing but forward: the floor under what any Python gateway can cost per request.

    python -m tests.upstream.floor_proxies MODE PORT UPSTREAM_URL

MODE:
  raw           asyncio protocols with httptools on both sides, on uvloop: no framework, no client
                library (non-streamed bodies buffered, streams relayed chunk by chunk);
  asgi-wire     uvicorn (uvloop + httptools) and a bare ASGI app forwarding with the gateway's own
                upstream client (``gateway.upstream.wire``);
  asgi-aiohttp  the same app forwarding with an aiohttp session (what the gateway used before).

Plug one into the side-by-side harness like any proxy, from the repository root:

    $PY ../shared/tools/peer_bench/bench.py --peer floor-raw \\
        --cmd "$PWD/.venv/bin/python -m tests.upstream.floor_proxies raw {port} {upstream}" ...

(run it with the working directory set so that ``tests`` and ``gateway`` import: ``env -C $PWD`` or
a wrapper script). Not a test, and not a gateway: no validation, errors or time-outs.
"""

from __future__ import annotations

import asyncio
import sys
from typing import Any
from urllib.parse import urlsplit

import httptools
import uvloop

from gateway.upstream.wire import WirePool

_TASKS: set[asyncio.Future[None]] = set()


class _Upstream(asyncio.Protocol):
    """raw: one keep-alive upstream connection, relaying one response at a time to its client."""

    def __init__(self, idle: list[_Upstream]):
        self.idle = idle
        self.parser = httptools.HttpResponseParser(self)
        self.client: _Client | None = None
        self.transport: Any = None
        self.ctype = b"application/json"
        self.body: list[bytes] = []
        self.stream = False

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)

    def on_message_begin(self) -> None:
        self.ctype, self.body = b"application/json", []

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() == b"content-type":
            self.ctype = value

    def on_headers_complete(self) -> None:
        self.stream = self.ctype.startswith(b"text/event-stream")
        if self.stream and self.client is not None:
            self.client.transport.write(
                b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ntransfer-encoding: chunked\r\n\r\n"
                % (self.parser.get_status_code(), self.ctype)
            )

    def on_body(self, body: bytes) -> None:
        if self.stream and self.client is not None:
            self.client.transport.write(b"%x\r\n%s\r\n" % (len(body), body))
        else:
            self.body.append(body)

    def on_message_complete(self) -> None:
        client, self.client = self.client, None
        if client is not None:
            if self.stream:
                client.transport.write(b"0\r\n\r\n")
            else:
                data = b"".join(self.body)
                client.transport.write(
                    b"HTTP/1.1 %d OK\r\ncontent-type: %s\r\ncontent-length: %d\r\n\r\n%s"
                    % (self.parser.get_status_code(), self.ctype, len(data), data)
                )
        self.idle.append(self)


class _Client(asyncio.Protocol):
    """raw: one client connection; each request goes out on an idle upstream connection."""

    def __init__(self, host: str, port: int, idle: list[_Upstream]):
        self.host, self.port, self.idle = host, port, idle
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.url = b"/"
        self.body: list[bytes] = []

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        body, self.body = b"".join(self.body), []
        task = asyncio.ensure_future(self._forward(self.url, body))
        _TASKS.add(task)
        task.add_done_callback(_TASKS.discard)

    async def _forward(self, url: bytes, body: bytes) -> None:
        if self.idle:
            up = self.idle.pop()
        else:
            loop = asyncio.get_running_loop()
            _, up = await loop.create_connection(lambda: _Upstream(self.idle), self.host, self.port)
        up.client = self
        up.transport.write(
            b"POST %s HTTP/1.1\r\nhost: upstream\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (url, len(body), body)
        )


async def _raw(port: int, host: str, upstream_port: int) -> None:
    idle: list[_Upstream] = []
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Client(host, upstream_port, idle), "127.0.0.1", port, backlog=2048
    )
    await server.serve_forever()


def _asgi(mode: str, port: int, base: str) -> None:
    import aiohttp
    import uvicorn

    url = urlsplit(base)
    host, upstream_port = url.hostname or "127.0.0.1", url.port or 80
    state: dict[str, Any] = {}

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {"content-type": "application/json"}
        if mode == "asgi-wire":
            pool = state.setdefault("wire", WirePool(connect_s=5.0))
            r = await pool.request("POST", host, upstream_port, scope["path"], headers, body)
            status, ctype, chunks = r.status, r.headers.get("content-type", "application/json"), r.chunks()
        else:
            if "session" not in state:
                state["session"] = aiohttp.ClientSession(auto_decompress=False)
            r2 = await state["session"].post(base + scope["path"], data=body, headers=headers)
            status, ctype, chunks = r2.status, r2.headers.get("content-type", "application/json"), None
        if ctype.startswith("text/event-stream"):
            await send(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [(b"content-type", ctype.encode())],
                }
            )
            async for piece in chunks if chunks is not None else r2.content.iter_any():
                await send({"type": "http.response.body", "body": piece, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:
            data = b"".join([p async for p in chunks]) if chunks is not None else await r2.read()
            start_headers = [(b"content-type", ctype.encode()), (b"content-length", str(len(data)).encode())]
            await send({"type": "http.response.start", "status": status, "headers": start_headers})
            await send({"type": "http.response.body", "body": data})
        if chunks is not None:
            r.release()
        else:
            r2.release()

    uvicorn.run(app, host="127.0.0.1", port=port, loop="uvloop", http="httptools", log_level="warning")


def main() -> None:
    mode, port, base = sys.argv[1], int(sys.argv[2]), sys.argv[3].rstrip("/")
    if mode == "raw":
        url = urlsplit(base)
        uvloop.run(_raw(port, url.hostname or "127.0.0.1", url.port or 80))
    elif mode in ("asgi-wire", "asgi-aiohttp"):
        _asgi(mode, port, base)
    else:
        raise SystemExit(f"unknown mode {mode!r}: raw, asgi-wire or asgi-aiohttp")


if __name__ == "__main__":
    main()
