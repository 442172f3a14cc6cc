"""The application's lifespan: what start-up builds is left out of garbage collection while serving."""

from __future__ import annotations

import gc

from gateway.app import create_app
from gateway.config import load_settings

NOWHERE = "http://127.0.0.1:9"  # refused at once: start-up must not depend on reachable endpoints


def _settings():
    pools = {
        name: {"endpoints": [{"name": f"{name[:4]}-0", "url": NOWHERE}], "models": ["m"]}
        for name in ("speculative", "baseline")
    }
    return load_settings(overrides={"pools": pools})


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
