"""The gateway's forwarding parts wired as the app wires them, without the app around them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from gateway.app import build_pools, new_client, new_session
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
