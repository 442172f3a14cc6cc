"""The gateway reads real vLLM ``/metrics``: speculative counters and load gauges, as the server has them."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from . import admin
from .client import PROMPTS, TIMEOUT, completion, metric_value, post, spec_counters, wait_for
from .servers import MODEL_NAME, NUM_SPECULATIVE_TOKENS, VllmServer

pytestmark = pytest.mark.real_vllm

SCRAPE_INTERVAL_S = 0.5  # the gateway's scrape interval in this suite (conftest.py)
LONG_REQUESTS = 4  # concurrent loops of ~1,000-token requests: the engine stays busy meanwhile


@pytest.fixture(scope="module")
def routing(gateway: str) -> Iterator[str]:
    """The gateway URL, once it is known to publish scraped values (else the test waits for that piece)."""
    doc = wait_for(lambda: admin.fetch(gateway), lambda d: d is None or bool(d.get("endpoints")), timeout=10)
    if doc is None:
        pytest.skip("needs GET /admin/routing")
    try:
        admin.endpoint(doc, "speculative")
    except admin.AdminShapeError as e:
        pytest.skip(f"needs scraped /metrics values in /admin/routing: {e}")
    yield gateway


def scraped(gateway: str, pool: str) -> dict[str, Any]:
    doc = admin.fetch(gateway)
    assert doc is not None
    return admin.endpoint(doc, pool)


def per_position(url: str) -> list[float]:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    name = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
    return [metric_value(text, name, position=str(i)) or 0.0 for i in range(NUM_SPECULATIVE_TOKENS)]


def test_speculative_counters(routing: str, speculative: VllmServer) -> None:
    """Traffic sent straight to the server moves its counters; the gateway's interval ratios must be
    the ones those counters give (constant here: the same-weights draft accepts at a fixed rate)."""
    before, pos_before = spec_counters(speculative.url), per_position(speculative.url)
    for prompt in PROMPTS[:3]:
        assert post(speculative.url, "/v1/completions", completion(MODEL_NAME, prompt)).status_code == 200
    after, pos_after = spec_counters(speculative.url), per_position(speculative.url)
    assert before is not None and after is not None
    d = after - before
    assert d.drafts > 0

    got = wait_for(lambda: scraped(routing, "speculative"), lambda e: "acceptance" in e)
    assert got["speculative_counters"] is True
    acc = got["acceptance"]
    assert acc["k"] == NUM_SPECULATIVE_TOKENS
    assert acc["draft_acceptance_rate"] == pytest.approx(d.accepted_tokens / d.draft_tokens, abs=1e-4)
    assert acc["mean_acceptance_length"] == pytest.approx(1 + d.accepted_tokens / d.drafts, abs=1e-4)
    expected_pos = [(a - b) / d.drafts for a, b in zip(pos_after, pos_before, strict=True)]
    assert acc["per_position"] == pytest.approx(expected_pos, abs=1e-4)
    idle = wait_for(lambda: scraped(routing, "speculative"), lambda e: e["running"] == 0)
    assert idle["running"] == 0 and idle["waiting"] == 0
    kv = metric_value(
        httpx.get(speculative.url + "/metrics", timeout=TIMEOUT).text, "vllm:kv_cache_usage_perc"
    )
    assert kv is not None
    assert idle["kv_cache_usage"] == pytest.approx(kv, abs=1e-4)


def test_baseline_has_no_speculative_counters(routing: str, baseline: VllmServer) -> None:
    assert post(baseline.url, "/v1/completions", completion(MODEL_NAME)).status_code == 200
    got = wait_for(lambda: scraped(routing, "baseline"), lambda e: e["running"] == 0)
    assert got["running"] == 0
    assert got["speculative_counters"] is False
    assert "acceptance" not in got


class Stretch:
    """The longest run of consecutive true readings, in seconds."""

    def __init__(self) -> None:
        self.since: float | None = None
        self.longest_s = 0.0

    def add(self, value: bool) -> None:
        now = time.monotonic()
        if not value:
            self.since = None
            return
        if self.since is None:
            self.since = now
        self.longest_s = max(self.longest_s, now - self.since)


def test_running_gauge_follows_a_live_request(routing: str, baseline: VllmServer) -> None:
    """Long requests in flight show as running in the gateway's view, and none once they end."""
    stop = threading.Event()
    errors: list[BaseException] = []
    body = completion(MODEL_NAME, PROMPTS[3], max_tokens=1000, stream=True)

    def long_request() -> None:
        # On this tiny model 1,000 tokens take about a second, and vLLM refreshes its gauges only
        # now and then: keep the engine busy until the gauges have been seen.
        try:
            while not stop.is_set():
                with httpx.stream("POST", baseline.url + "/v1/completions", json=body, timeout=TIMEOUT) as r:
                    r.raise_for_status()
                    for _ in r.iter_lines():
                        if stop.is_set():
                            break  # closing the stream aborts the request upstream
        except BaseException as e:
            errors.append(e)

    workers = [threading.Thread(target=long_request, daemon=True) for _ in range(LONG_REQUESTS)]
    for w in workers:
        w.start()
    try:

        def direct_running() -> float:
            text = httpx.get(baseline.url + "/metrics", timeout=TIMEOUT).text
            return metric_value(text, "vllm:num_requests_running") or 0.0

        seen = wait_for(direct_running, lambda v: v >= 1, every=0.1)
        assert not errors, errors
        if seen < 1:
            # vLLM's CPU build refreshes these gauges rarely; with nothing to compare, say so.
            pytest.skip("vLLM's own num_requests_running never left 0 under load; nothing to compare")
        # vLLM may show a request running for a moment only; the gateway, scraping every 0.5 s, must see
        # what vLLM showed for longer than two of its scrapes, so the direct gauge is followed meanwhile
        held = Stretch()

        def gateway_view() -> dict:
            held.add(direct_running() >= 1)
            return scraped(routing, "baseline")

        busy = wait_for(gateway_view, lambda e: (e["running"] or 0) >= 1, every=0.1)
        if (busy["running"] or 0) < 1 and held.longest_s < 2 * SCRAPE_INTERVAL_S:
            pytest.skip(
                f"vLLM's num_requests_running left 0 for {held.longest_s:.2f} s at most; nothing to compare"
            )
        assert busy["running"] >= 1, f"vLLM showed running for {held.longest_s:.2f} s, the gateway never"
        assert busy["kv_cache_usage"] is not None and busy["kv_cache_usage"] > 0
    finally:
        stop.set()
        for w in workers:
            w.join(120)
    assert not errors
    idle = wait_for(lambda: scraped(routing, "baseline"), lambda e: e["running"] == 0)
    assert idle["running"] == 0
