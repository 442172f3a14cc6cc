"""Outlier ejection that cannot cause an outage.

The pool rules are checked on :class:`Pool` directly; what forwarding makes of them (busy answers,
panic mode, health checks ending an ejection) against scripted raw-socket upstreams on loopback.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest

from gateway.config import HealthConfig, load_settings
from gateway.errors import NoEndpoint, UpstreamStatus
from gateway.upstream import health
from gateway.upstream.forward import Upstreams
from gateway.upstream.pool import Endpoint, Pool
from tests.upstream.scripted import Answer, Script, Scripted, serving
from tests.upstream.wiring import upstreams_for

HEALTH = HealthConfig(eject_after_failures=2, eject_base_s=10.0, eject_max_s=60.0)


def _pool(n: int) -> Pool:
    eps = [Endpoint("baseline", f"e{i}", f"http://127.0.0.1:{9000 + i}") for i in range(n)]
    return Pool("baseline", ["m"], eps)


def _fail(pool: Pool, ep: Endpoint, times: int = 2, sent_at: float | None = None) -> bool:
    ejected = False
    for _ in range(times):
        ejected |= pool.record_failure(ep, HEALTH, time.monotonic() if sent_at is None else sent_at)
    return ejected


def test_failures_of_requests_in_flight_at_ejection_neither_re_eject_nor_extend_it():
    pool = _pool(2)
    ep = pool.endpoints[0]
    in_flight = time.monotonic()  # a hundred requests went out before the endpoint broke
    assert _fail(pool, ep, sent_at=in_flight)
    until = ep.ejected_until
    assert not _fail(pool, ep, times=100, sent_at=in_flight)
    assert (ep.ejections, ep.ejected_until) == (1, until)
    # even once the ejection is over, their failures describe the endpoint before it
    ep.ejected_until = time.monotonic()
    assert not _fail(pool, ep, times=100, sent_at=in_flight)
    assert ep.consecutive_failures == 0 and ep.available()
    # requests sent after it came back do count, with the back-off doubled
    assert _fail(pool, ep)
    assert ep.ejections == 2
    assert ep.ejected_until - time.monotonic() > 15


@pytest.mark.parametrize(
    ("size", "percent", "most"), [(4, 50, 2), (4, 100, 3), (2, 50, 1), (1, 100, 0), (5, 10, 0)]
)
def test_at_most_max_ejection_percent_of_a_pool_and_never_its_last_endpoint(size, percent, most):
    pool = _pool(size)
    health = HEALTH.model_copy(update={"max_ejection_percent": percent})
    for ep in pool.endpoints:
        for _ in range(health.eject_after_failures):
            pool.record_failure(ep, health, time.monotonic())
    assert pool.ejected() == most
    assert pool.has_available()


def test_unhealthy_endpoints_do_not_leave_the_last_healthy_one_to_ejection():
    pool = _pool(4)
    for ep in pool.endpoints[1:]:
        ep.healthy = False  # the health checks took them out
    assert not _fail(pool, pool.endpoints[0])
    assert pool.endpoints[0].available()


@asynccontextmanager
async def _upstreams(answers: list[Answer], **extra: Any) -> AsyncIterator[tuple[Upstreams, Script]]:
    script = Script(answers)
    async with serving(script, "base-a", "base-b") as servers:

        def pool(servers: list[Scripted]) -> dict[str, Any]:
            return {"endpoints": [{"name": s.name, "url": s.url} for s in servers], "models": ["m"]}

        overrides = {"pools": {"baseline": pool(servers), "speculative": pool(servers[:1])}, **extra}
        async with upstreams_for(load_settings(overrides=overrides)) as upstreams:
            yield upstreams, script


def _sample(upstreams: Upstreams, name: str, **labels: str) -> float:
    return upstreams.metrics.registry.get_sample_value(name, labels) or 0.0


async def _complete(upstreams: Upstreams) -> tuple[Endpoint, bytes]:
    sent, body = await upstreams.fetch("/v1/completions", b"{}", {}, "baseline", allow_failover=False)
    return sent.endpoint, body


async def test_a_busy_endpoint_is_passed_over_for_a_while_but_never_ejected():
    async with _upstreams(["busy", "busy", "busy", "ok"], health={"eject_after_failures": 1}) as (
        upstreams,
        script,
    ):
        pool = upstreams.pools["baseline"]
        # both endpoints say they are busy: the upstream's 503 is reported (its text goes to the log)
        with pytest.raises(UpstreamStatus) as e:
            await _complete(upstreams)
        assert e.value.status == 503 and "busy" not in e.value.message
        assert pool.ejected() == 0 and all(ep.consecutive_failures == 0 for ep in pool.endpoints)
        assert _sample(
            upstreams, "specroute_upstream_errors_total", pool="baseline", endpoint="base-a", kind="busy"
        )
        endpoint, _ = await _complete(upstreams)  # busy once more, then "ok" on the other endpoint
        assert script.log[-1][1] == "ok"
        assert (
            _sample(upstreams, "specroute_upstream_ejections_total", pool="baseline", endpoint=endpoint.name)
            == 0
        )


async def test_busy_lowers_the_effective_weight_so_the_other_endpoint_takes_the_traffic():
    async with _upstreams(["busy", "ok"]) as (upstreams, script):
        pool = upstreams.pools["baseline"]
        endpoint, _ = await _complete(upstreams)
        busy = next(ep for ep in pool.endpoints if ep.name == script.log[0][0])
        assert endpoint is not busy
        assert busy.available() and busy.busy_until > time.monotonic()
        # one request outstanding on the other endpoint still scores better than an idle busy one
        endpoint.outstanding = 1
        assert {pool.pick() for _ in range(4)} == {endpoint}


async def test_a_500_counts_toward_ejection():
    async with _upstreams(["error", "ok"], health={"eject_after_failures": 1}) as (upstreams, script):
        endpoint, _ = await _complete(upstreams)
        broken = next(ep for ep in upstreams.pools["baseline"].endpoints if ep.name == script.log[0][0])
        assert broken is not endpoint and broken.ejected()
        labels = {"pool": "baseline", "endpoint": broken.name}
        assert _sample(upstreams, "specroute_upstream_ejections_total", **labels) == 1


@pytest.mark.parametrize("queueing", [True, False])
async def test_a_first_byte_late_behind_vllms_own_queue_is_busy_not_a_fault(queueing):
    """An overloaded vLLM queues requests (``num_requests_waiting`` > 0) and sends a stream's first byte
    only once it runs it: a first-byte time-out then is its queue's wait. The endpoint gets less traffic
    for a while; ejecting it would pile its queue on the others, each in turn, and the pool would flap.
    Without a queue in sight the same time-out counts toward ejection, as before."""
    extra = {"health": {"eject_after_failures": 1}, "timeouts": {"first_byte_s": 0.2}}
    async with _upstreams(["stall_head", "ok"], **extra) as (upstreams, script):
        pool = upstreams.pools["baseline"]
        for ep in pool.endpoints:
            ep.queueing = queueing
        endpoint, _ = await _complete_streamed(upstreams)
        late = next(ep for ep in pool.endpoints if ep.name == script.log[0][0])
        assert endpoint is not late
        labels = {"pool": "baseline", "endpoint": late.name}
        assert _sample(upstreams, "specroute_upstream_errors_total", kind="timeout", **labels) == 1
        assert late.ejected() is not queueing
        assert (late.busy_until > time.monotonic()) is queueing


async def _complete_streamed(upstreams: Upstreams) -> tuple[Endpoint, bytes]:
    body = b'{"stream":true}'
    sent = await upstreams.send("/v1/completions", body, {}, "baseline", allow_failover=False)
    sent.response.close()
    return sent.endpoint, sent.first


async def test_with_every_endpoint_out_requests_are_sent_anyway_in_panic_mode():
    async with _upstreams(["ok"]) as (upstreams, _):
        for ep in upstreams.pools["baseline"].endpoints:
            ep.ejected_until = time.monotonic() + 60
        upstreams.pools["baseline"].endpoints[1].healthy = False
        _, body = await _complete(upstreams)
        assert b"Hello there" in body
        assert _sample(upstreams, "specroute_upstream_panic_requests_total", pool="baseline") == 1


async def test_panic_mode_off_answers_503_at_once():
    async with _upstreams(["ok"], retries={"panic": False}) as (upstreams, script):
        for ep in upstreams.pools["baseline"].endpoints:
            ep.ejected_until = time.monotonic() + 60
        with pytest.raises(NoEndpoint):
            await _complete(upstreams)
        assert script.log == []


async def test_a_passing_health_check_ends_an_ejection_and_a_failing_one_takes_the_endpoint_out():
    async with _upstreams(["ok"]) as (upstreams, _):
        up, down = upstreams.pools["baseline"].endpoints
        up.ejected_until = time.monotonic() + 60
        down.base_url = "http://127.0.0.1:9"  # nothing listens there
        pools = list(upstreams.pools.values())
        await health.check_all(upstreams.client, pools, upstreams.settings.health)
        assert up.available() and not up.ejected()
        assert not down.healthy and not down.available()
