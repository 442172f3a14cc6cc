"""The pause before a retry: random within a ceiling that doubles per retry up to a cap."""

from __future__ import annotations

import random

import pytest

from gateway.config import load_settings
from gateway.errors import Unreachable
from gateway.upstream import forward
from gateway.upstream.backoff import retry_delay
from tests.upstream.wiring import upstreams_for


def test_delays_vary_and_stay_under_a_doubling_capped_ceiling() -> None:
    rng = random.Random(7)
    base, cap = 0.1, 1.0
    for retry in range(1, 12):
        ceiling = min(cap, base * 2 ** (retry - 1))
        delays = [retry_delay(retry, base, cap, rng.random) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in delays), retry
        assert len(set(delays)) == len(delays)  # jittered: no two requests wait alike
        assert max(delays) > 0.9 * ceiling and min(delays) < 0.1 * ceiling  # the whole window is used


def test_edges_of_the_window() -> None:
    assert retry_delay(3, 0.1, 1.0, lambda: 0.0) == 0.0
    assert retry_delay(3, 0.1, 1.0, lambda: 0.5) == pytest.approx(0.2)
    assert retry_delay(40, 0.1, 1.0, lambda: 0.5) == pytest.approx(0.5)  # capped
    assert retry_delay(10_000, 0.1, 1.0, lambda: 0.5) == pytest.approx(0.5)  # no overflow
    assert retry_delay(1, 0.0, 1.0, lambda: 0.5) == 0.0  # off
    assert retry_delay(0, 0.1, 1.0, lambda: 0.5) == 0.0  # the first try does not wait


async def test_forwarding_waits_a_drawn_pause_before_each_retry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Three unreachable endpoints, four tries allowed: three endpoints tried, two pauses drawn."""
    drawn: list[tuple[int, float]] = []

    def recording(retry: int, base_s: float, cap_s: float, uniform: object) -> float:
        delay = retry_delay(retry, base_s, cap_s, uniform)  # type: ignore[arg-type]
        drawn.append((retry, delay))
        return delay

    monkeypatch.setattr(forward, "retry_delay", recording)
    closed = [{"name": f"base-{i}", "url": f"http://127.0.0.{i + 1}:9"} for i in range(3)]
    other = {"endpoints": [{"name": "spec-0", "url": "http://127.0.0.1:9"}], "models": ["m"]}
    settings = load_settings(
        overrides={
            "pools": {"baseline": {"endpoints": closed, "models": ["m"]}, "speculative": other},
            "retries": {"attempts": 4, "backoff_s": 0.004, "backoff_max_s": 0.006, "panic": False},
        }
    )
    async with upstreams_for(settings) as upstreams:
        upstreams.jitter = random.Random(1).random
        with pytest.raises(Unreachable):
            await upstreams.send("/v1/completions", b"{}", {}, "baseline", allow_failover=False)
    assert [r for r, _ in drawn] == [1, 2]
    assert 0 <= drawn[0][1] <= 0.004 and 0 <= drawn[1][1] <= 0.006
    assert drawn[0][1] != drawn[1][1]
