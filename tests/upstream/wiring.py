"""The gateway's forwarding parts wired as the app wires them; the whole app on uvicorn in the test's loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn

from gateway import stack
from gateway.app import build_pools, create_app, fast_path, new_client, new_session
from gateway.config import Settings
from gateway.observability import Metrics
from gateway.upstream.forward import Upstreams


@asynccontextmanager
async def upstreams_for(settings: Settings) -> AsyncIterator[Upstreams]:
    """:class:`Upstreams` over the configured pools and a fresh connection pool, closed on exit."""
    session = new_session()
    client = new_client(settings, session)
    upstreams = Upstreams(settings, client, session, build_pools(settings), Metrics())
    try:
        yield upstreams
    finally:
        upstreams.close()
        await client.aclose()


@asynccontextmanager
async def serving_gateway(settings: Settings, **options: Any) -> AsyncIterator[str]:
    """The app on uvicorn at a free loopback port, in this event loop; its URL; stopped on exit.

    ``options`` go to ``uvicorn.Config`` (``gateway.server.uvicorn_options(settings)`` serves it as
    ``specroute serve`` does, its address aside)."""
    port = stack.free_port()
    options = {"log_level": "warning", **options, "host": "127.0.0.1", "port": port}
    config = uvicorn.Config(fast_path(create_app(settings)), **options)  # as `specroute serve` runs it
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # uvicorn offers no event for it
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"{'https' if 'ssl_certfile' in options else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
