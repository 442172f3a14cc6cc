"""The routing policy: strategies, load-driven reasons and the exploration share."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from gateway.config import RoutingConfig, Strategy
from gateway.observability import Metrics
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.policy import Decision, Outcome, RouteRequest
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import Reading, Scraper


@dataclass(frozen=True)
class Pred:
    p_structured: float
    label: str
    kind: str


class FixedClassifier:
    def predict(self, body):
        structured = "repeat" in body.get("prompt", "")
        return Pred(0.95 if structured else 0.05, "structured" if structured else "open-ended", "k")


def _policy(strategy=Strategy.ADAPTIVE, **routing) -> AdaptivePolicy:
    pools = {
        "speculative": Pool("speculative", ["m"], [Endpoint("speculative", "s0", "http://s0")], 7, 0.05),
        "baseline": Pool("baseline", ["m"], [Endpoint("baseline", "b0", "http://b0")]),
    }
    scraper = Scraper(None, pools, Metrics(), 1.0)  # type: ignore[arg-type]
    cfg = RoutingConfig(strategy=strategy, seed=7, **routing)
    return AdaptivePolicy.build(strategy, FixedClassifier(), cfg, pools, scraper, Metrics())


STRUCTURED = RouteRequest({"prompt": "repeat this"}, "completions")
OPEN = RouteRequest({"prompt": "tell me a story"}, "completions")


def test_adaptive_follows_predicted_gain():
    p = _policy(exploration_rate=0.0)
    d = p.decide(STRUCTURED)
    assert (d.pool, d.reason) == ("speculative", "predicted-gain") and d.predicted_speedup > 2
    d = p.decide(OPEN)
    assert (d.pool, d.reason) == ("baseline", "no-gain") and d.predicted_speedup < 1.1


def test_static_strategies_and_forced_pool():
    assert _policy(Strategy.ALWAYS_BASELINE).decide(STRUCTURED).pool == "baseline"
    assert _policy(Strategy.ALWAYS_SPECULATIVE).decide(OPEN).pool == "speculative"
    d = _policy(Strategy.CLASSIFIER).decide(STRUCTURED)
    assert (d.pool, d.reason) == ("speculative", "classifier-structured")
    forced = RouteRequest({"prompt": "repeat"}, "completions", forced_pool="baseline")
    assert _policy().decide(forced).reason == "forced"


def test_exploration_share_matches_the_rate():
    p = _policy(exploration_rate=0.2)
    n = 4000
    explored = sum(p.decide(OPEN).explore for _ in range(n))
    assert explored / n == pytest.approx(0.2, abs=3 * (0.2 * 0.8 / n) ** 0.5)
    assert p.counts["explore"] == explored
    again = _policy(exploration_rate=0.2)  # seeded: the same sequence
    assert sum(again.decide(OPEN).explore for _ in range(n)) == explored


def test_queued_speculative_pool_sends_to_baseline_until_it_drains():
    p = _policy(exploration_rate=0.5)
    ep = p.pools["speculative"].endpoints[0]
    state = p.scraper.of(ep)
    state.update(Reading(_now(), running=8, waiting=3), 7)
    assert p.decide(STRUCTURED).reason == "predicted-gain"  # a single sample may be a passing request
    state.update(Reading(_now(), running=8, waiting=3), 7)
    assert {p.decide(STRUCTURED).reason for _ in range(50)} == {"spec-queued"}
    assert state.capacity == 8
    state.update(Reading(_now(), running=2, waiting=0), 7)
    assert p.decide(STRUCTURED).reason == "predicted-gain"
    ep.outstanding = 8  # the gateway's own in-flight count reaches the capacity seen while queueing
    assert p.decide(STRUCTURED).reason == "spec-queued"


def test_large_batch_makes_speculation_a_loss():
    p = _policy(exploration_rate=0.0)
    p.model.knee = 16.0
    p.scraper.of(p.pools["speculative"].endpoints[0]).update(Reading(_now(), running=30, waiting=0), 7)
    d = p.decide(RouteRequest({"prompt": "repeat"}, "completions"))
    assert (d.pool, d.reason) == ("baseline", "spec-busy")


def test_stale_scrapes_are_ignored():
    p = _policy(exploration_rate=0.0, scrape_interval_s=1.0)
    p.scraper.of(p.pools["speculative"].endpoints[0]).update(Reading(_now() - 10, running=4, waiting=4), 7)
    assert p.decide(STRUCTURED).reason == "predicted-gain"


def test_observe_learns_alpha_per_kind():
    p = _policy(exploration_rate=0.0)
    d = p.decide(STRUCTURED)
    for _ in range(5):
        out = Outcome(
            d, "speculative", "s0", 200, 0.05, 1.0, 100, 30, accepted_tokens=6, draft_tokens=210, steps=30
        )
        p.observe(out)
    low = p.estimates.alpha("k", "structured", 0.95)
    assert low < 0.25
    assert p.decide(STRUCTURED).pool == "baseline"
    snap = p.snapshot()
    assert snap["estimates"]["kinds"][0]["observations"] == 5
    assert snap["decisions"]["predicted-gain"] == 1


def _now() -> float:
    import time

    return time.monotonic()


def test_decision_is_a_plain_record():
    d = _policy().decide(STRUCTURED)
    assert isinstance(d, Decision) and d.alpha is not None and d.batch == 1.0
