"""Active health checks: every endpoint's ``/health`` on an interval.

Passive ejection (in :mod:`gateway.upstream.pool`) reacts within a request; this loop brings an
endpoint back once it answers again and takes out one that stopped answering while idle. A passing
check also ends a passive ejection at once: a restarted endpoint is back in rotation within one
``health.interval_s`` of answering, not after whatever back-off its failures had built up.
"""

from __future__ import annotations

import asyncio
import logging

import httpx

from gateway.config import HealthConfig
from gateway.upstream.pool import Endpoint, Pool

log = logging.getLogger("specroute.health")


async def check(client: httpx.AsyncClient, endpoint: Endpoint, health: HealthConfig) -> bool:
    try:
        resp = await client.get(endpoint.base_url + health.path, timeout=health.timeout_s)
        ok = resp.status_code == 200
    except httpx.HTTPError:
        ok = False
    if ok != endpoint.healthy:
        log.warning("endpoint %s/%s is %s", endpoint.pool, endpoint.name, "healthy" if ok else "unhealthy")
    endpoint.healthy = ok
    if ok and endpoint.ejected():
        log.warning("endpoint %s/%s passed its health check: ejection ended", endpoint.pool, endpoint.name)
        endpoint.end_ejection()
    return ok


async def check_all(client: httpx.AsyncClient, pools: list[Pool], health: HealthConfig) -> None:
    await asyncio.gather(*(check(client, e, health) for p in pools for e in p.endpoints))


async def run(client: httpx.AsyncClient, pools: list[Pool], health: HealthConfig) -> None:
    """Check forever; cancelled at shutdown."""
    while True:
        await asyncio.sleep(health.interval_s)
        await check_all(client, pools, health)
