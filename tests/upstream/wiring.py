"""The gateway's forwarding parts wired as the app wires them; the whole app on uvicorn in the test's loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn

from gateway import stack
from gateway.app import build_pools, create_app, new_client, new_session
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
async def serving_gateway(settings: Settings) -> AsyncIterator[str]:
    """The app on uvicorn at a free loopback port, in this event loop; its URL; stopped on exit."""
    port = stack.free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    try:
        while not server.started:  # uvicorn offers no event for it
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
