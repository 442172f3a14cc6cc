"""Pool membership from the DNS of a headless Service, so pools scale without a gateway restart.

A headless Service resolves to one A/AAAA record per ready Pod. Every ``discovery.interval_s`` the
name is resolved again and the pool's endpoint list replaced: an address that appears is
health-checked once before it joins (so a Pod that is listed but not yet listening takes no
traffic); one that disappears is drained — it takes no new requests, its in-flight requests finish
on the :class:`~gateway.upstream.pool.Endpoint` object they hold, and it is forgotten once idle.
A failed resolution keeps the last known list: a DNS hiccup must not empty a pool, and a Pod that
really went away is taken out by the health checks meanwhile.

A discovered endpoint is named ``<pool>-<h>``, ``h`` a hash of its ``<address>:<port>`` that Prometheus
computes too (``hashmod`` in the ``vllm`` scrape job), so the gateway's series and the vLLM server's own
carry the same ``endpoint`` label. The name depends on the address alone: every gateway replica, and a
restarted one, gives a Pod the same name, and a Pod that comes back at its address gets its old name
(and the per-endpoint state kept under it). A number counted per gateway could do neither, and
Prometheus could not reproduce it. Endpoint names reach metrics labels, ``/ready`` and the admin view;
addresses stay in the gateway's own log (the line saying which address joined).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import socket
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import httpx

from gateway.config import DiscoveryConfig, PoolConfig, PoolName, Settings
from gateway.upstream import health
from gateway.upstream.pool import Endpoint, Pool

log = logging.getLogger("specroute.discovery")

#: ``(hostname, port) -> [(address, port), ...]``; raises :class:`OSError` when the name cannot be resolved.
Resolver = Callable[[str, int], Awaitable[Sequence[tuple[str, int]]]]

#: called once for each departed endpoint when its last in-flight request has finished
OnRemoved = Callable[[Endpoint], None]

#: how soon to try again while a discovered pool has no endpoint at all (e.g. DNS not ready at start-up)
EMPTY_RETRY_S = 1.0

#: how often a name that still cannot be resolved, with the same error, is said again in the log
REPEAT_FAILURE_S = 60.0


@dataclass(slots=True)
class _Failing:
    """A pool whose name cannot be resolved: since when, the error last logged, and when."""

    since: float
    error: str
    said_at: float


#: the pools whose name cannot be resolved now; a pool's entry goes with the pool
_failing: weakref.WeakKeyDictionary[Pool, _Failing] = weakref.WeakKeyDictionary()


def _resolution_failed(pool: Pool, hostname: str, error: BaseException) -> None:
    """Log a failed resolution when it begins, when its error changes, and every ``REPEAT_FAILURE_S``.

    An empty pool retries every ``EMPTY_RETRY_S``: logged each time, a name that stays unresolvable
    (a Service not created yet, a typo) would write thousands of lines an hour.
    """
    now, text = time.monotonic(), str(error)
    last = _failing.get(pool)
    if last is not None and last.error == text and now - last.said_at < REPEAT_FAILURE_S:
        return
    _failing[pool] = _Failing(now if last is None else last.since, text, now)
    log.warning(
        "pool %s: cannot resolve %s (%s); keeping %d known endpoints%s",
        pool.name,
        hostname,
        text,
        len(pool.endpoints),
        "" if last is None else f" (failing for {now - last.since:.0f} s)",
    )


def _resolved(pool: Pool, hostname: str) -> None:
    """Say once that a name which could not be resolved resolves again."""
    if _failing.pop(pool, None) is not None:
        log.warning("pool %s: %s resolves again", pool.name, hostname)


async def resolve_dns(hostname: str, port: int) -> list[tuple[str, int]]:
    """Every A and AAAA record of ``hostname``, through the event loop's ``getaddrinfo``."""
    infos = await asyncio.get_running_loop().getaddrinfo(
        hostname, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
    )
    return sorted(
        {(str(info[4][0]), int(info[4][1])) for info in infos if info[0] in (socket.AF_INET, socket.AF_INET6)}
    )


#: ``modulus`` of the ``hashmod`` relabelling that makes the ``endpoint`` label of vLLM targets
#: (deploy/prometheus/prometheus.yml, the monitoring component's PodMonitor): the two must agree.
#: 2**32 keeps names short, and two of a hundred Pods share one about once in a million pools.
NAME_MODULUS = 2**32


def address_label(address: str, port: int) -> str:
    """``<ip>:<port>`` (``[<ipv6>]:<port>``), as Prometheus's Pod discovery writes ``__address__``."""
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}"


def discovered_name(pool: PoolName, address: str, port: int) -> str:
    """``<pool>-<h>``: ``h`` is what Prometheus's ``hashmod`` makes of the address.

    That is the last 8 bytes of the MD5 of ``__address__``, big-endian, modulo ``NAME_MODULUS``.
    """
    digest = hashlib.md5(address_label(address, port).encode(), usedforsecurity=False).digest()
    return f"{pool}-{int.from_bytes(digest[8:], 'big') % NAME_MODULUS}"


def endpoint_for(pool: PoolName, discovery: DiscoveryConfig, address: str, port: int, name: str) -> Endpoint:
    return Endpoint(pool, name, f"{discovery.scheme}://{address_label(address, port)}")


def static_endpoints(pool: PoolName, cfg: PoolConfig) -> list[Endpoint]:
    """The endpoints listed in the configuration; a pool with only ``discovery`` starts empty."""
    return [Endpoint(pool, e.name, e.base_url, e.weight) for e in cfg.endpoints]


def _unique_names(wanted: list[Endpoint], static: int, members: list[Endpoint]) -> None:
    """Rename a newcomer found by DNS (``wanted[static:]``) whose name another endpoint holds.

    Names key a pool's metrics and per-endpoint state, so they must be unique in it. A static endpoint
    already named like a discovered one, or two addresses with the same hash, make the newcomer take a
    suffix (only its series then miss their vLLM counterparts); an endpoint already in the pool keeps
    the name it has.
    """
    current = {e.base_url: e.name for e in members}
    found = wanted[static:]
    taken = {e.name for e in wanted[:static]} | {current[e.base_url] for e in found if e.base_url in current}
    for e in found:
        if e.base_url in current:
            e.name = current[e.base_url]
            continue
        name, n = e.name, 1
        while e.name in taken:
            e.name, n = f"{name}-{n}", n + 1
        taken.add(e.name)


async def refresh_pool(
    client: httpx.AsyncClient,
    pool: Pool,
    cfg: PoolConfig,
    settings: Settings,
    resolve: Resolver = resolve_dns,
) -> list[Endpoint]:
    """Resolve once and replace ``pool``'s endpoints; return those that left (now draining)."""
    if cfg.discovery is None:
        return []
    try:
        found = await resolve(cfg.discovery.hostname, cfg.discovery.port)
    except (OSError, UnicodeError) as err:
        _resolution_failed(pool, cfg.discovery.hostname, err)
        return []
    _resolved(pool, cfg.discovery.hostname)
    wanted = static_endpoints(pool.name, cfg)
    seen = {e.base_url for e in wanted}
    addresses: dict[str, str] = {}
    for address, port in found:
        ep = endpoint_for(pool.name, cfg.discovery, address, port, discovered_name(pool.name, address, port))
        if ep.base_url not in seen:
            seen.add(ep.base_url)
            wanted.append(ep)
            addresses[ep.base_url] = address_label(address, port)
    _unique_names(wanted, len(cfg.endpoints), pool.endpoints)
    known = {e.base_url for e in pool.endpoints}
    new = [e for e in wanted if e.base_url not in known]
    # Checked before the list changes: a new endpoint takes traffic only after it has answered once.
    await asyncio.gather(*(health.check(client, e, settings.health) for e in new))
    gone = pool.set_endpoints(wanted)
    for e in new:
        log.info(
            "pool %s: endpoint %s joined at %s (%s)",
            pool.name,
            e.name,
            addresses.get(e.base_url, e.base_url),
            "healthy" if e.healthy else "unhealthy",
        )
    for e in gone:
        log.info(
            "pool %s: endpoint %s left; draining %d in-flight requests", pool.name, e.name, e.outstanding
        )
    return gone


async def refresh(
    client: httpx.AsyncClient,
    pools: dict[PoolName, Pool],
    settings: Settings,
    resolve: Resolver = resolve_dns,
) -> list[Endpoint]:
    """One pass over every pool with ``discovery`` (at start-up, before serving); return those that left."""
    results = await asyncio.gather(
        *(refresh_pool(client, pools[name], cfg, settings, resolve) for name, cfg in settings.pools.items())
    )
    return [e for gone in results for e in gone]


async def run(
    client: httpx.AsyncClient,
    pools: dict[PoolName, Pool],
    settings: Settings,
    resolve: Resolver = resolve_dns,
    on_removed: OnRemoved | None = None,
) -> None:
    """Re-resolve every pool on its own interval, forever; cancelled at shutdown."""
    watched = [
        _watch(client, pools[name], cfg, cfg.discovery.interval_s, settings, resolve, on_removed)
        for name, cfg in settings.pools.items()
        if cfg.discovery is not None
    ]
    await asyncio.gather(*watched)


async def _watch(
    client: httpx.AsyncClient,
    pool: Pool,
    cfg: PoolConfig,
    interval_s: float,
    settings: Settings,
    resolve: Resolver,
    on_removed: OnRemoved | None,
) -> None:
    draining: list[Endpoint] = []
    while True:
        await asyncio.sleep(interval_s if pool.endpoints else min(interval_s, EMPTY_RETRY_S))
        try:
            draining += await refresh_pool(client, pool, cfg, settings, resolve)
        except Exception:  # a bug here must not stop discovery for good
            log.exception("pool %s: discovery failed", pool.name)
        idle = [e for e in draining if e.outstanding <= 0]
        draining = [e for e in draining if e.outstanding > 0]
        current = {e.name for e in pool.endpoints}
        for e in idle:
            log.info("pool %s: endpoint %s drained and removed", pool.name, e.name)
            if on_removed is not None and e.name not in current:  # not if the same address came back
                on_removed(e)
