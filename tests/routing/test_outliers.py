"""A speculative endpoint whose acceptance collapses alone leaves the rotation, and comes back."""

from __future__ import annotations

import random
from collections import Counter

from prometheus_client import generate_latest

from gateway.routing.outliers import MIN_OBSERVATIONS, OutlierDetector
from gateway.routing.policy import Outcome, RouteRequest
from gateway.speculation import from_token_steps
from gateway.upstream.pool import Endpoint, Pool
from tests.streams import cut_stream

from .test_policy import FixedClassifier, Pred, _policy  # noqa: F401  (shared policy builder)


def _pool(n: int = 3) -> Pool:
    return Pool("speculative", ["m"], [Endpoint("speculative", f"s{i}", f"http://s{i}") for i in range(n)], 7)


def test_one_endpoint_far_below_its_peers_is_demoted_then_restored():
    pool = _pool()
    det = OutlierDetector(pool)
    rng = random.Random(1)
    for _ in range(MIN_OBSERVATIONS + 5):
        for ep in ("s0", "s1", "s2"):
            det.observe(ep, rng.gauss(0.0, 0.3))
    assert not any(e.demoted for e in pool.endpoints)
    changed = None
    for _ in range(10):  # s2 gets a bad draft model: alpha 0.8 -> 0.2 is about -2.8 in logit
        changed = det.observe("s2", rng.gauss(-2.8, 0.3)) or changed
    assert changed is pool.endpoints[2] and pool.endpoints[2].demoted
    assert det.demotions == 1
    for _ in range(20):
        det.observe("s2", rng.gauss(0.0, 0.3))
    assert not pool.endpoints[2].demoted


def test_a_pool_wide_drop_demotes_nobody():
    pool = _pool()
    det = OutlierDetector(pool)
    for _ in range(30):
        for ep in ("s0", "s1", "s2"):
            det.observe(ep, -2.5)
    assert not any(e.demoted for e in pool.endpoints)


def test_the_picker_skips_a_demoted_endpoint_but_probes_it():
    pool = _pool()
    pool.endpoints[1].demoted = True
    picks = Counter(pool.pick().name for _ in range(600))  # type: ignore[union-attr]
    assert picks["s1"] == 600 // pool.probe_every  # every probe, and nothing else
    assert picks["s0"] > 150 and picks["s2"] > 150
    only = Pool("speculative", ["m"], [Endpoint("speculative", "x", "http://x", demoted=True)])
    assert only.pick() is only.endpoints[0]  # no peer: still served


def test_policy_demotes_from_measured_requests_exports_it_and_stops_learning_from_it():
    p = _policy(exploration_rate=0.0)
    pool = p.pools["speculative"]
    pool.endpoints = [Endpoint("speculative", f"s{i}", f"http://s{i}") for i in range(3)]
    p.outliers.pool = pool  # type: ignore[union-attr]
    req = RouteRequest({"prompt": "repeat this"}, "completions")

    def outcome(endpoint: str, accepted: int) -> Outcome:
        d = p.decide(req)
        return Outcome(d, "speculative", endpoint, 200, 0.05, 1.0, 100, 30, accepted, 210, 30)

    for _ in range(8):
        for ep in ("s0", "s1"):
            p.observe(outcome(ep, 150))  # alpha ≈ 0.9
    updates = p.alpha_model.updates
    for _ in range(8):
        p.observe(outcome("s2", 5))  # alpha ≈ 0.15 on s2 alone
    assert pool.endpoints[2].demoted
    assert p.alpha_model.updates < updates + 8  # what s2 measured after its demotion was not learned
    before = p.alpha_model.updates
    for _ in range(4):
        p.observe(outcome("s2", 5))
    assert p.alpha_model.updates == before
    for _ in range(4):  # what s2 taught before its demotion is soon outweighed by its peers
        for ep in ("s0", "s1"):
            p.observe(outcome(ep, 150))
    assert p.decide(req).alpha > 0.7
    text = generate_latest(p.metrics.registry).decode()
    assert 'specroute_endpoint_acceptance_outlier{endpoint="s2",pool="speculative"} 1.0' in text
    snap = {o["endpoint"]: o for o in p.snapshot()["endpoint_outliers"]}
    assert snap["s2"]["demoted"] and not snap["s0"]["demoted"]


def test_identical_endpoints_answering_briefly_are_not_demoted_and_a_bad_one_still_is():
    """A short answer shows a few drafts, all accepted or none: the logit of that proportion sits at its
    clip, and a running mean of such jumps put one of three identical endpoints a whole logit below its
    peers for a good part of the run. Moved only as far as its draws say, a residual of a few drafts is
    small, and a draft that really fails on one endpoint still shows within a few requests."""
    p = _policy(exploration_rate=0.0)
    pool = p.pools["speculative"]
    pool.endpoints = [Endpoint("speculative", f"s{i}", f"http://s{i}") for i in range(3)]
    p.outliers.pool = pool  # type: ignore[union-attr]
    req = RouteRequest({"prompt": "repeat this"}, "completions")
    rng = random.Random(2)

    def serve(endpoint: str, alpha: float, max_tokens: int) -> None:
        m = from_token_steps(cut_stream(alpha, 7, max_tokens, rng), 7)
        if m is not None and m.rejected is not None:
            d = p.decide(req)
            p.observe(
                Outcome(
                    d, "speculative", endpoint, 200, 0.05, 0.2, max_tokens, 3,
                    int(m.accepted), int(m.draft_tokens), int(m.steps), rejected_drafts=int(m.rejected),
                )
            )  # fmt: skip

    demoted = 0
    for i in range(600):
        serve(f"s{i % 3}", 0.8, rng.choice([3, 4, 5, 6, 8]))
        demoted += sum(e.demoted for e in pool.endpoints)
    assert demoted == 0
    for _ in range(8):  # s2's draft fails: alpha 0.1 where its peers still measure 0.8
        for endpoint, alpha in (("s0", 0.8), ("s1", 0.8), ("s2", 0.1)):
            serve(endpoint, alpha, 32)
    assert pool.endpoints[2].demoted and not pool.endpoints[0].demoted and not pool.endpoints[1].demoted


def test_the_residuals_of_endpoints_discovery_removed_are_dropped():
    """Pods come and go under discovery, each with a new name: what the detector keeps stays bounded."""
    pool = _pool()
    det = OutlierDetector(pool)
    for generation in range(50):
        pool.endpoints = [Endpoint("speculative", f"s{generation}-{i}", f"http://s{i}") for i in range(3)]
        for ep in pool.endpoints:
            det.observe(ep.name, 0.1)
    assert set(det.residuals) == {"s49-0", "s49-1", "s49-2"}


class KindClassifier:
    """As FixedClassifier, with prose and repetition told apart by their kind too."""

    def predict(self, body):
        structured = "repeat" in body.get("prompt", "")
        return Pred(
            0.95 if structured else 0.05,
            *(("structured", "repetition") if structured else ("open-ended", "creative")),
        )


def _three(p):
    pool = p.pools["speculative"]
    pool.endpoints = [Endpoint("speculative", f"s{i}", f"http://s{i}") for i in range(3)]
    p.outliers.pool = pool  # type: ignore[union-attr]
    return pool


def test_a_kind_of_prompt_only_one_endpoint_served_is_not_held_against_it():
    """Every replica runs a draft weak on prose, which the prior expects more of; a client's sequence that
    lines up with the picker's rotation sends every prose request to s0, each a new one. What the model has
    yet to learn of prose read as s0's fault, and a replica with its peers' draft was demoted. Residuals
    count on kinds its peers served too; once they do, a replica that is worse than them still shows."""
    p = _policy(exploration_rate=0.0)
    p.classifier = KindClassifier()
    pool = _three(p)
    rng = random.Random(3)
    words = ["river", "castle", "dragon", "winter", "harbour", "violin", "desert", "comet", "garden"]
    structured = RouteRequest({"prompt": "repeat this"}, "completions")

    def serve(req: RouteRequest, endpoint: str, accepted: int) -> None:
        d = p.decide(req)
        p.observe(Outcome(d, "speculative", endpoint, 200, 0.05, 1.0, 100, 30, accepted, 210, 30))

    for i in range(12):
        prose = RouteRequest({"prompt": f"tell me a story about a {rng.choice(words)} {i}"}, "completions")
        serve(prose, "s0", 0)  # alpha 0 where the prior says about 0.27
        serve(structured, "s1", 150)
        serve(structured, "s2", 150)
    assert not any(e.demoted for e in pool.endpoints)
    for _ in range(10):  # s0 also serves what its peers serve, and is worse at it
        for endpoint, accepted in (("s0", 3), ("s1", 150), ("s2", 150)):
            serve(structured, endpoint, accepted)
    assert pool.endpoints[0].demoted and not pool.endpoints[1].demoted


def test_a_restarted_endpoint_is_judged_afresh(caplog):
    """A restart is when a bad draft gets fixed: the demoted endpoint is readmitted and its old residuals
    forgotten, where probes alone took some 230 requests to bring a fixed replica back."""
    p = _policy(exploration_rate=0.0)
    pool = _three(p)
    req = RouteRequest({"prompt": "repeat this"}, "completions")
    for _ in range(8):
        for endpoint, accepted in (("s0", 150), ("s1", 150), ("s2", 5)):
            d = p.decide(req)
            p.observe(Outcome(d, "speculative", endpoint, 200, 0.05, 1.0, 100, 30, accepted, 210, 30))
    assert pool.endpoints[2].demoted
    assert "endpoint speculative/s2 demoted" in caplog.text
    scraper = p.scraper
    scraper.of(pool.endpoints[2]).restarts += 1  # its counters went down at the last scrape
    scraper.rounds += 1
    p.decide(req)
    assert not pool.endpoints[2].demoted
    assert {o["endpoint"]: o["observations"] for o in p.snapshot()["endpoint_outliers"]}["s2"] == 0
    text = generate_latest(p.metrics.registry).decode()
    assert 'specroute_endpoint_acceptance_outlier{endpoint="s2",pool="speculative"} 0.0' in text
    assert "endpoint speculative/s2 readmitted: its server restarted" in caplog.text
