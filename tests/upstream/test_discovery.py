"""DNS discovery against real servers on loopback addresses, with a resolver the test controls.

Each "Pod" is a small uvicorn server on its own address (127.0.0.2, 127.0.0.3, ...: Linux routes all of
127/8 to ``lo``); the resolver answers with whichever of them the test says are behind the Service.
Requests go through the gateway's real forwarding code, so "receives traffic" means it was picked.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from types import SimpleNamespace

import pytest
import uvicorn
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings, load_settings
from gateway.upstream import discovery
from gateway.upstream.forward import Upstreams
from gateway.upstream.pool import Endpoint, Pool
from tests.upstream.wiring import upstreams_for

HOSTNAME = "vllm-baseline.pools.svc.cluster.local"
BODY = b'{"model":"m","prompt":"hi","stream":true}'


class Pod:
    """An upstream that records every request; ``hold`` keeps a stream open until released."""

    def __init__(self, address: str):
        self.address = address
        self.port = 0
        self.seen: list[str] = []
        self.healthy = True
        self.hold = False
        self.release = asyncio.Event()
        self.server = _QuietServer(
            uvicorn.Config(
                self.app, host=address, port=0, lifespan="off", log_level="error", interface="asgi3"
            )
        )

    async def app(self, scope, receive, send) -> None:
        self.seen.append(scope["path"])
        if scope["path"] == "/health":
            status = 200 if self.healthy else 503
            await send({"type": "http.response.start", "status": status, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
        if self.hold:
            await self.release.wait()
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})

    @property
    def completions(self) -> int:
        return self.seen.count("/v1/completions")


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the test process keeps its own signal handlers


class FakeDNS:
    """The records of a headless Service: the Pods currently behind it, or a resolution failure."""

    def __init__(self) -> None:
        self.records: list[Pod] = []
        self.failing = False
        self.calls = 0

    async def __call__(self, hostname: str, port: int) -> Sequence[tuple[str, int]]:
        assert hostname == HOSTNAME
        self.calls += 1
        if self.failing:
            raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
        return [(p.address, p.port) for p in self.records]


@pytest.fixture
async def pods() -> AsyncIterator[list[Pod]]:
    started = [Pod(f"127.0.0.{i}") for i in (2, 3, 4)]
    tasks = [asyncio.create_task(p.server.serve()) for p in started]
    await _until(lambda: all(p.server.started for p in started))
    for p in started:
        p.port = p.server.servers[0].sockets[0].getsockname()[1]
    yield started
    for p in started:
        p.release.set()
        p.server.should_exit = True
    await asyncio.gather(*tasks)


def _settings(interval_s: float = 10.0) -> Settings:
    """Baseline found through DNS; speculative a static list, which discovery leaves alone."""
    found = {"discovery": {"hostname": HOSTNAME, "port": 8000, "interval_s": interval_s}, "models": ["m"]}
    static = {"endpoints": [{"name": "spec-0", "url": "http://127.0.0.1:9"}], "models": ["m"]}
    return load_settings(overrides={"pools": {"speculative": static, "baseline": found}})


@pytest.fixture
async def gateway() -> AsyncIterator[tuple[Upstreams, Settings]]:
    settings = _settings(interval_s=0.05)
    async with upstreams_for(settings) as upstreams:
        yield upstreams, settings


async def _send(upstreams: Upstreams) -> bytes:
    sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
    return b"".join([piece async for piece in upstreams.relay(sent, None, lambda s, failed: None)])


def _names(pool: Pool) -> list[str]:
    return [e.name for e in pool.endpoints]


async def test_a_discovery_only_pool_fills_at_refresh_and_a_new_endpoint_takes_traffic(pods, gateway):
    upstreams, settings = gateway
    a, b, _ = pods
    dns = FakeDNS()
    pool = upstreams.pools["baseline"]
    assert pool.endpoints == []

    dns.records = [a]
    await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    assert _names(pool) == [discovery.discovered_name("baseline", "127.0.0.2", a.port)]
    assert pool.endpoints[0].base_url == f"http://127.0.0.2:{a.port}"
    assert _names(upstreams.pools["speculative"]) == ["spec-0"]
    for _ in range(4):
        assert (await _send(upstreams)).endswith(b"data: [DONE]\n\n")
    assert (a.completions, b.completions) == (4, 0)

    dns.records = [a, b]
    await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    assert b.seen[0] == "/health", "a new endpoint must be health-checked before it takes traffic"
    for _ in range(4):
        await _send(upstreams)
    assert b.completions >= 2  # least-outstanding with rotating ties spreads an idle pool evenly


async def test_a_new_endpoint_failing_its_health_check_takes_no_traffic(pods, gateway):
    upstreams, settings = gateway
    a, b, _ = pods
    b.healthy = False
    dns = FakeDNS()
    dns.records = [a, b]
    await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    assert len(upstreams.pools["baseline"].endpoints) == 2
    for _ in range(4):
        await _send(upstreams)
    assert (a.completions, b.completions) == (4, 0)
    assert b.seen == ["/health"]


async def test_a_removed_endpoint_finishes_its_stream_and_gets_no_new_requests(pods, gateway):
    upstreams, settings = gateway
    a, b, c = pods
    dns = FakeDNS()
    dns.records = [a]
    await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    pool = upstreams.pools["baseline"]
    a.hold = True
    sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)
    leaving = sent.endpoint
    assert leaving.base_url == f"http://127.0.0.2:{a.port}"
    assert leaving.outstanding == 1

    dns.records = [b, c]
    gone = await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    assert gone == [leaving] and leaving.draining and not leaving.available()
    assert leaving not in pool.endpoints
    before = a.completions
    for _ in range(6):
        await _send(upstreams)
    assert a.completions == before
    assert b.completions + c.completions == 6

    a.release.set()
    rest = b"".join([piece async for piece in upstreams.relay(sent, None, lambda s, failed: None)])
    assert rest == b"data: {}\n\ndata: [DONE]\n\n"
    assert leaving.outstanding == 0
    # drained: what was kept of it goes (pods come and go under discovery: it must not pile up)
    assert leaving in upstreams._inflight and leaving in upstreams._targets
    upstreams.forget(leaving)
    assert leaving not in upstreams._inflight and leaving not in upstreams._targets
    gauges = {
        s.name
        for f in text_string_to_metric_families(generate_latest(upstreams.metrics.registry).decode())
        if f.type == "gauge"
        for s in f.samples
        if s.labels.get("endpoint") == leaving.name
    }
    assert gauges == set()  # counters stay, as counters must


async def test_resolution_failure_keeps_the_last_known_list(pods, gateway, caplog):
    upstreams, settings = gateway
    a, b, _ = pods
    dns = FakeDNS()
    dns.records = [a, b]
    await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    before = list(upstreams.pools["baseline"].endpoints)

    dns.failing = True
    with caplog.at_level(logging.WARNING, logger="specroute.discovery"):
        gone = await discovery.refresh(upstreams.client, upstreams.pools, settings, dns)
    assert gone == []
    assert upstreams.pools["baseline"].endpoints == before
    assert any(HOSTNAME in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    for _ in range(4):
        await _send(upstreams)
    assert a.completions + b.completions == 4


async def test_a_name_that_stays_unresolvable_is_logged_rarely_and_its_recovery_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty pool retries every second: a line each time would be 3,600 lines an hour."""
    settings = _settings()
    pool = Pool("baseline", ["m"])
    failure = [socket.gaierror(socket.EAI_NONAME, "Name or service not known")]

    async def dns(hostname: str, port: int) -> list[tuple[str, int]]:
        if failure:
            raise failure[0]
        return []

    clock = [1000.0]  # discovery's own clock only: the event loop keeps the real one
    monkeypatch.setattr(discovery, "time", SimpleNamespace(monotonic=lambda: clock[0]), raising=False)
    async with upstreams_for(settings) as upstreams:

        async def refresh_for(seconds: int) -> None:
            for _ in range(seconds):
                await discovery.refresh_pool(upstreams.client, pool, settings.pools.baseline, settings, dns)
                clock[0] += 1

        with caplog.at_level(logging.INFO, logger="specroute.discovery"):
            await refresh_for(150)  # said at once, then once a minute
            failure[0] = socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")
            await refresh_for(5)  # another error is said at once
            failure.clear()
            await refresh_for(5)
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        f"pool baseline: cannot resolve {HOSTNAME} ([Errno -2] Name or service not known); keeping 0 known"
        " endpoints",
        f"pool baseline: cannot resolve {HOSTNAME} ([Errno -2] Name or service not known); keeping 0 known"
        " endpoints (failing for 60 s)",
        f"pool baseline: cannot resolve {HOSTNAME} ([Errno -2] Name or service not known); keeping 0 known"
        " endpoints (failing for 120 s)",
        f"pool baseline: cannot resolve {HOSTNAME} ([Errno -3] Temporary failure in name resolution);"
        " keeping 0 known endpoints (failing for 150 s)",
        f"pool baseline: {HOSTNAME} resolves again",
    ]


async def test_run_follows_the_service_and_reports_drained_endpoints(pods, gateway):
    upstreams, settings = gateway
    a, b, _ = pods
    dns = FakeDNS()
    dns.records = [a]
    pool = upstreams.pools["baseline"]
    removed: list[Endpoint] = []
    task = asyncio.create_task(
        discovery.run(upstreams.client, upstreams.pools, settings, dns, removed.append)
    )
    try:
        await _until(lambda: len(pool.endpoints) == 1)
        a.hold = True
        sent = await upstreams.send("/v1/completions", BODY, {}, "baseline", allow_failover=False)

        dns.records = [b]  # the Pod behind ``a`` was replaced by ``b``
        await _until(lambda: [e.base_url for e in pool.endpoints] == [f"http://127.0.0.3:{b.port}"])
        calls = dns.calls
        await _until(lambda: dns.calls > calls + 4)  # several refreshes while the stream is in flight
        assert removed == []

        a.release.set()
        async for _ in upstreams.relay(sent, None, lambda s, failed: None):
            pass
        await _until(lambda: bool(removed))
        assert [e.name for e in removed] == [discovery.discovered_name("baseline", "127.0.0.2", a.port)]
        assert not task.done()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_default_resolver_uses_the_system_resolver():
    found = await discovery.resolve_dns("localhost", 8123)
    assert ("127.0.0.1", 8123) in found or ("::1", 8123) in found
    with pytest.raises(OSError):
        await discovery.resolve_dns("no-such-host.invalid", 8000)


def test_endpoint_urls_for_ipv6():
    cfg = _settings().pools.baseline.discovery
    assert cfg is not None
    ep = discovery.endpoint_for("baseline", cfg, "fd00::1", 8000, "baseline-0")
    assert (ep.name, ep.base_url) == ("baseline-0", "http://[fd00::1]:8000")


def test_discovered_names_are_prometheus_hashmod_of_the_address_and_carry_no_address():
    """``<pool>-<h>`` with h = hashmod(``__address__``, 2**32): what the vllm scrape job labels the Pod.

    The figures are Prometheus's own (``promtool check service-discovery`` on prometheus.yml's relabelling;
    tests/deploy/test_monitoring.py runs it): a number the gateway counted could not be reproduced there.
    """
    assert discovery.discovered_name("speculative", "10.1.2.3", 8000) == "speculative-2587973837"
    assert discovery.discovered_name("baseline", "fd00::5", 8000) == "baseline-2780864585"
    # the same address, the same name: in every gateway replica and after a restart, whatever came first
    assert discovery.discovered_name("baseline", "10.0.0.7", 8000) == discovery.discovered_name(
        "baseline", "10.0.0.7", 8000
    )
    assert "10.0.0.7" not in discovery.discovered_name("baseline", "10.0.0.7", 8000)


async def test_a_newcomer_named_like_a_static_endpoint_takes_a_suffix_and_members_keep_theirs():
    clash = discovery.discovered_name("baseline", "10.0.0.7", 8000)
    static = {"endpoints": [{"name": clash, "url": "http://10.0.0.9:8000"}], "models": ["m"]}
    found = {"discovery": {"hostname": HOSTNAME, "port": 8000}, "models": ["m"], **static}
    settings = load_settings(overrides={"pools": {"speculative": static, "baseline": found}})
    pool = Pool("baseline", ["m"], discovery.static_endpoints("baseline", settings.pools.baseline))

    async def dns(hostname: str, port: int) -> list[tuple[str, int]]:
        return [("10.0.0.7", 8000), ("10.0.0.8", 8000)]

    async with upstreams_for(settings) as upstreams:
        await discovery.refresh_pool(upstreams.client, pool, settings.pools.baseline, settings, dns)
        other = discovery.discovered_name("baseline", "10.0.0.8", 8000)
        assert _names(pool) == [clash, f"{clash}-1", other]
        renamed = pool.endpoints[1]
        await discovery.refresh_pool(upstreams.client, pool, settings.pools.baseline, settings, dns)
        assert pool.endpoints[1] is renamed and _names(pool) == [clash, f"{clash}-1", other]


async def _until(condition: Callable[[], bool], limit_s: float = 10.0) -> None:
    """Poll state that the servers and the discovery loop change; no event exists for it."""
    async with asyncio.timeout(limit_s):
        while not condition():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
