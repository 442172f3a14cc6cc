"""The application's lifespan: what start-up builds is left out of garbage collection while serving."""

from __future__ import annotations

import asyncio
import gc
import time

from gateway.app import create_app
from gateway.config import load_settings

NOWHERE = "http://127.0.0.1:9"  # refused at once: start-up must not depend on reachable endpoints


def _settings(**overrides: object):
    pools = {
        name: {"endpoints": [{"name": f"{name[:4]}-0", "url": NOWHERE}], "models": ["m"]}
        for name in ("speculative", "baseline")
    }
    return load_settings(overrides={"pools": pools, **overrides})


async def test_start_up_objects_are_frozen_while_serving_and_released_at_shutdown() -> None:
    gc.unfreeze()
    app = create_app(_settings())
    async with app.router.lifespan_context(app):
        # modules, the app and the classifier: a full collection would walk every one of them
        assert gc.get_freeze_count() > 10_000
        young = [[]]  # a cycle made while serving is still collected
        young.append(young)
        del young
        assert gc.collect() >= 1
    assert gc.get_freeze_count() == 0


async def test_endpoint_gauges_follow_the_endpoints_without_a_scrape() -> None:
    """Each worker keeps its endpoint gauges current by itself: with several workers a scrape merges
    every worker's last values, and one that answered no scrape since an ejection ended would go on
    reporting the endpoint ejected (and the merged gauge with it)."""
    app = create_app(_settings(health={"interval_s": 0.05, "timeout_s": 0.05}))
    async with app.router.lifespan_context(app):
        gw = app.state.gateway
        endpoint = gw.upstreams.pools["speculative"].endpoints[0]
        labels = {"pool": "speculative", "endpoint": "spec-0"}
        # ejected by failed requests: the gauge says so at once
        endpoint.ejected_until = time.monotonic() + 0.2
        gw.metrics.ejected.labels("speculative", "spec-0").set(1.0)
        await asyncio.sleep(0.6)  # the ejection is over, several health rounds later; nobody scraped
        assert not endpoint.ejected()
        assert gw.metrics.registry.get_sample_value("specroute_endpoint_ejected", labels) == 0.0
        # and its health, which fails here (nothing listens): down, and its pool with it
        assert gw.metrics.registry.get_sample_value("specroute_endpoint_up", labels) == 0.0
        pool = {"pool": "speculative"}
        assert gw.metrics.registry.get_sample_value("specroute_pool_available_endpoints", pool) == 0.0


async def test_a_pool_without_any_endpoint_is_counted_as_one_with_none_available() -> None:
    """A discovery name that resolves to nothing leaves a pool without endpoints, and without any
    endpoint_up series: only the pool's own count can tell (the pool-down alert reads it)."""
    app = create_app(_settings(health={"interval_s": 0.05, "timeout_s": 0.05}))
    async with app.router.lifespan_context(app):
        gw = app.state.gateway
        gw.upstreams.pools["baseline"].endpoints.clear()
        await asyncio.sleep(0.2)  # health rounds export the gauges
        value = gw.metrics.registry.get_sample_value
        assert value("specroute_pool_available_endpoints", {"pool": "baseline"}) == 0.0
