"""The gateway app in-process (``httpx.ASGITransport``) over two emulators serving on 127.0.0.1.

Everything runs on one event loop in a background thread, so synchronous tests (hypothesis drives
them) send requests with :meth:`InProcess.request` while the emulators and the gateway's own tasks
(health checks, scrapes) keep running between them.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import httpx
import orjson
import pytest
import uvicorn
from fastapi import FastAPI

from gateway.api.passthrough import ROOT_PATHS
from gateway.app import create_app, fast_path
from gateway.config import Settings, load_settings
from gateway.emulator.config import EmulatorConfig
from gateway.emulator.server import EmulatorApp
from gateway.stack import demo_config, free_port

MODEL = "demo-model"
API_KEY = "test-key"
T = TypeVar("T")


async def read_body(receive: Any) -> bytes:
    """A request's whole body from its ASGI messages."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


class KeyedUpstream:
    """An upstream as ``vllm serve --api-key`` runs it: ``/v1/*`` needs the key; every header is noted."""

    def __init__(self, app: EmulatorApp, key: str | None):
        self.app = app
        self.key = key
        self.seen: list[tuple[str, str | None]] = []
        self.heads: list[tuple[str, dict[bytes, bytes]]] = []  # every request's path and headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            self.heads.append((scope["path"], headers))
            auth = headers.get(b"authorization")
            self.seen.append((scope["path"], auth.decode() if auth is not None else None))
            if self.key and scope["path"].startswith("/v1/") and auth != f"Bearer {self.key}".encode():
                body = b'{"error":"Unauthorized"}'
                headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
                await send({"type": "http.response.start", "status": 401, "headers": headers})
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


class InProcess:
    def __init__(
        self,
        overrides: dict[str, Any] | None = None,
        emulator: dict[str, Any] | None = None,
        upstream_key: str | None = None,
    ):
        self.overrides = overrides or {}
        self.emulator = emulator or {}
        self.upstream_key = upstream_key
        self.upstreams: list[KeyedUpstream] = []
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.ready = threading.Event()
        self.stop: asyncio.Event | None = None
        self.client: httpx.AsyncClient | None = None
        self.settings: Settings | None = None
        self.failure: BaseException | None = None
        self.main: asyncio.Future[None] | None = None
        self.app: FastAPI | None = None

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        assert self.client is not None
        return self.run(self.client.request(method, path, **kwargs))

    def flush_access_log(self) -> None:
        """Wait until the access-log lines of the requests so far are on stdout (``capsys`` reads them)."""
        assert self.app is not None
        access_log = self.app.state.gateway.observer.access_log
        assert access_log is not None
        access_log.flush()

    def __enter__(self) -> InProcess:
        self.thread.start()
        self.main = asyncio.run_coroutine_threadsafe(self._serve(), self.loop)
        if not self.ready.wait(60):
            raise RuntimeError("the in-process stack did not start")
        if self.failure is not None:
            raise self.failure
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.stop is not None and self.main is not None
        self.loop.call_soon_threadsafe(self.stop.set)
        self.main.result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    async def _serve(self) -> None:
        self.stop = asyncio.Event()
        servers = []
        try:
            urls = []
            for mode in ("speculative", "baseline"):
                cfg = EmulatorConfig(
                    mode=mode, served_model_names=[MODEL], time_scale=0.0, max_model_len=512, **self.emulator
                )
                upstream = KeyedUpstream(EmulatorApp(cfg), self.upstream_key)
                self.upstreams.append(upstream)
                # listening before uvicorn starts: connections wait in the backlog until it accepts
                sock = socket.create_server(("127.0.0.1", 0))
                server = uvicorn.Server(uvicorn.Config(upstream, log_level="error", lifespan="on"))
                servers.append((server, asyncio.create_task(server.serve(sockets=[sock]))))
                urls.append(f"http://127.0.0.1:{sock.getsockname()[1]}")
            config = demo_config([urls[0]], [urls[1]], free_port(), MODEL, extra=self.overrides)
            self.settings = load_settings(overrides=config)
            app = self.app = create_app(self.settings)
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=fast_path(app))
                async with httpx.AsyncClient(transport=transport, base_url="http://gateway", timeout=30) as c:
                    self.client = c
                    self.ready.set()
                    await self.stop.wait()
        except BaseException as e:
            self.failure = e
            raise
        finally:
            self.ready.set()
            for server, task in servers:
                server.should_exit = True
                await task


@pytest.fixture(scope="package")
def gateway() -> Iterator[InProcess]:
    """The gateway with API keys set, as a hostile client finds it."""
    with InProcess({"auth": {"api_keys": [API_KEY]}, "logging": {"access_log": False}}) as stack:
        yield stack


class Echo:
    """A stub upstream route beside the emulator's: ``/v1/score``, ``/v1/audio/*`` and vLLM's routes outside
    ``/v1`` echo the request."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        echoed = path == "/v1/score" or path.startswith("/v1/audio/") or path in ROOT_PATHS
        if scope["type"] != "http" or not echoed:
            await self.inner(scope, receive, send)
            return
        self.calls += 1
        body = await read_body(receive)
        headers = dict(scope["headers"])
        echo = {
            "method": scope["method"],
            "path": path,
            "query": scope["query_string"].decode(),
            "content_type": headers.get(b"content-type", b"").decode(),
            "body": body.decode(errors="replace"),
        }
        out = orjson.dumps(echo)
        response_headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def echoing() -> Iterator[InProcess]:
    """The gateway with API keys over emulators that also serve the :class:`Echo` routes."""
    with InProcess({"auth": {"api_keys": [API_KEY]}, "logging": {"access_log": False}}) as stack:
        for upstream in stack.upstreams:
            upstream.app = Echo(upstream.app)  # type: ignore[assignment]
        yield stack


def metric(stack: InProcess, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels``, as ``/metrics`` shows them now."""
    text = stack.request("GET", "/metrics", headers={"authorization": f"Bearer {API_KEY}"}).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total
