"""The demo pools at 5 requests/s: the slots never fill and requests wait only for the next step.

Each pool alone takes Poisson arrivals of the capacity figure's request (256-token prompts, 128-token
answers) at 5/s, in process at full time scale; the running sequences are sampled throughout and the
engine's own queue-time histogram (vLLM's ``request_queue_time_seconds``) is read at the end. A
request always waits for the step under way to end (one decode step, 45-61 ms here); more than a few
steps would be queueing. Measured speed on a shared machine: marked ``timing``.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx
import pytest

from gateway.demo import POOL, WORKLOAD
from gateway.emulator.capacity import capacity
from gateway.emulator.config import EmulatorConfig
from gateway.emulator.server import EmulatorApp

pytestmark = pytest.mark.timing

RATE = 5.0
SECONDS = 8.0


async def _drive(mode: str, rate: float, sizes: dict[str, Any]) -> tuple[int, float, int]:
    """(most sequences ever running, mean queue time, requests answered) for ``SECONDS`` at ``rate``."""
    app = EmulatorApp(EmulatorConfig(mode=mode, **sizes))  # type: ignore[arg-type]
    app.engine.start()
    prompt = " ".join(["word"] * (WORKLOAD.prompt_tokens - 1))  # one token a word, plus BOS
    body = {"model": "demo-model", "prompt": prompt, "max_tokens": WORKLOAD.output_tokens, "temperature": 1.0}
    most_running = 0
    rng = random.Random(0)
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://e") as client:
            tasks = []
            loop = asyncio.get_running_loop()
            end = loop.time() + SECONDS
            while loop.time() < end:
                tasks.append(asyncio.create_task(client.post("/v1/completions", json=body, timeout=60)))
                pause = rng.expovariate(rate)
                while pause > 0:
                    step = min(pause, 0.05)
                    await asyncio.sleep(step)
                    pause -= step
                    most_running = max(most_running, app.metrics.running)
            while not all(t.done() for t in tasks):
                most_running = max(most_running, app.metrics.running)
                await asyncio.sleep(0.05)
            ok = sum(1 for t in tasks if t.result().status_code == 200)
    finally:
        await app.engine.stop()
    queue = app.metrics.h_queue
    return most_running, queue.sum / max(1, queue.count), ok


@pytest.mark.parametrize("mode", ["speculative", "baseline"])
async def test_a_demo_pool_at_five_requests_per_second_does_not_queue(mode: str) -> None:
    assert capacity(EmulatorConfig(mode=mode, **POOL), WORKLOAD) > RATE  # type: ignore[arg-type]
    most_running, mean_queue_s, ok = await _drive(mode, RATE, POOL)
    assert ok > 0
    assert most_running < POOL["max_num_seqs"]
    assert mean_queue_s < 0.25


async def test_the_emulators_default_sizes_queue_at_five_requests_per_second() -> None:
    most_running, mean_queue_s, _ = await _drive("baseline", RATE, {})
    assert most_running == EmulatorConfig().max_num_seqs and mean_queue_s > 1.0
