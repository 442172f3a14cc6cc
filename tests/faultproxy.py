"""A fault-injecting HTTP proxy for tests: one in front of each upstream endpoint, on loopback.

It forwards every request to its target and, for completion requests (``POST``), draws from a
seeded RNG whether to break it instead, in one of the ways an inference server breaks:

* ``error``: a 500 with vLLM's JSON error body;
* ``busy``: a 503 "busy" answer (an overloaded server or a load balancer in front of it);
* ``reset``: the connection is reset (RST) once the request has arrived, before any response byte;
* ``reset_mid_body``: the response starts (headers and part of the body, or the first stream chunk
  for a stream) and then the connection is reset;
* ``hang``: nothing for ``hang_s`` seconds, then a reset.

Health checks and ``/metrics`` (``GET``) always pass through, so the gateway's active checks see the
endpoint as the real one behind it. Each proxy counts what it did in :attr:`FaultProxy.injected`.
"""

from __future__ import annotations

import asyncio
import random
import socket
import struct
import threading
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

FAULTS = ("error", "busy", "reset", "reset_mid_body", "hang")
_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


@dataclass(frozen=True, kw_only=True)
class Faults:
    """Probability of each fault per completion request (drawn in this order, at most one)."""

    error: float = 0.0
    busy: float = 0.0
    reset: float = 0.0
    reset_mid_body: float = 0.0
    hang: float = 0.0
    hang_s: float = 2.0


@dataclass
class FaultProxy:
    """A proxy on ``127.0.0.1:port`` (a free one when 0) forwarding to ``target``."""

    target: str
    faults: Faults
    seed: int = 0
    port: int = 0
    injected: dict[str, int] = field(default_factory=lambda: dict.fromkeys(FAULTS, 0))
    forwarded: int = 0
    _rng: random.Random = field(init=False)
    _runner: web.AppRunner | None = field(default=None, init=False)
    _session: aiohttp.ClientSession | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=2),
            auto_decompress=False,
            trust_env=False,
        )
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, reuse_address=True)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
        if self._session is not None:
            await self._session.close()

    def _draw(self) -> str | None:
        r = self._rng.random()
        for name in FAULTS:
            p = getattr(self.faults, name)
            if r < p:
                return name
            r -= p
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        fault = self._draw() if request.method == "POST" else None
        if fault is not None:
            self.injected[fault] += 1
        if fault == "error":
            return _error(500, "Emulated internal server error (fault proxy).", "InternalServerError")
        if fault == "busy":
            return _error(
                503, "The server is busy; try again later (fault proxy).", "ServiceUnavailableError"
            )
        if fault == "reset":
            _reset(request)
            return web.Response()
        if fault == "hang":
            await asyncio.sleep(self.faults.hang_s)
            _reset(request)
            return web.Response()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with await self._forward(request, body, headers) as upstream:
            self.forwarded += 1
            out_headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _HOP}
            if fault == "reset_mid_body" or upstream.headers.get("content-length") is None:
                return await self._stream(request, upstream, out_headers, cut=fault == "reset_mid_body")
            content = await upstream.read()
            return web.Response(body=content, status=upstream.status, headers=out_headers)

    async def _forward(
        self, request: web.Request, body: bytes, headers: dict[str, str]
    ) -> aiohttp.ClientResponse:
        """The request sent on to the target; once more if a pooled connection was found closed
        (the proxy's own faults are the ones drawn, not its connection pool's)."""
        assert self._session is not None
        url = self.target + request.path_qs
        try:
            return await self._session.request(request.method, url, data=body, headers=headers)
        except aiohttp.ServerDisconnectedError:
            return await self._session.request(request.method, url, data=body, headers=headers)

    async def _stream(
        self,
        request: web.Request,
        upstream: aiohttp.ClientResponse,
        headers: dict[str, str],
        cut: bool,
    ) -> web.StreamResponse:
        """Pass a body through as it comes; with ``cut``, reset the connection part-way."""
        length = upstream.headers.get("content-length")
        response = web.StreamResponse(status=upstream.status, headers=headers)
        if length is not None:
            response.content_length = int(length)
        await response.prepare(request)
        if cut and length is not None:
            content = await upstream.read()
            await response.write(content[: max(1, len(content) // 2)])
            _reset(request)
            return response
        async for piece in upstream.content.iter_any():
            await response.write(piece)
            if cut:
                _reset(request)
                return response
        await response.write_eof()
        return response


def _error(status: int, message: str, etype: str) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": etype, "param": None, "code": status}}, status=status
    )


def _reset(request: web.Request) -> None:
    """Close the client's connection with a TCP RST rather than an orderly FIN."""
    transport = request.transport
    if transport is None:
        return
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()


class Proxies:
    """Fault proxies run on their own event loop in a thread, so that a test blocking its own loop
    (starting a server process, say) does not stall them; a context manager."""

    def __init__(self, targets: list[str], faults: Faults, seed: int = 0):
        self.proxies = [FaultProxy(t, faults, seed=seed + i) for i, t in enumerate(targets)]
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxies", daemon=True)

    def __enter__(self) -> Proxies:
        self._thread.start()
        for p in self.proxies:
            asyncio.run_coroutine_threadsafe(p.start(), self._loop).result(10)
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.proxies:
            asyncio.run_coroutine_threadsafe(p.stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies]

    def injected(self) -> dict[str, int]:
        return {name: sum(p.injected[name] for p in self.proxies) for name in FAULTS}
