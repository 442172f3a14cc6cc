"""The routing policy: strategies, load-driven reasons and the exploration share."""

from __future__ import annotations

import asyncio
import logging
import random
from dataclasses import dataclass

import httpx
import pytest
from prometheus_client import generate_latest

from gateway.config import RoutingConfig, Strategy
from gateway.observability import Metrics
from gateway.routing.adaptive import AdaptivePolicy
from gateway.routing.alpha_model import prior_alpha
from gateway.routing.policy import AFFINITY, Decision, Outcome, RouteRequest
from gateway.routing.speedup import STEP_WINDOW
from gateway.speculation import expected_length, from_token_steps
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import Reading, Scraper, parse
from tests.streams import cut_stream


@dataclass(frozen=True)
class Pred:
    p_structured: float
    label: str
    kind: str


class FixedClassifier:
    def predict(self, body):
        structured = "repeat" in body.get("prompt", "")
        return Pred(0.95 if structured else 0.05, "structured" if structured else "open-ended", "k")


def _policy(strategy=Strategy.ADAPTIVE, cost: float = 0.05, **routing) -> AdaptivePolicy:
    pools = {
        "speculative": Pool("speculative", ["m"], [Endpoint("speculative", "s0", "http://s0")], 7, cost),
        "baseline": Pool("baseline", ["m"], [Endpoint("baseline", "b0", "http://b0")]),
    }
    scraper = Scraper(None, pools, Metrics(), 1.0)  # type: ignore[arg-type]
    cfg = RoutingConfig(strategy=strategy, seed=7, **routing)
    return AdaptivePolicy.build(strategy, FixedClassifier(), cfg, pools, scraper, Metrics())


STRUCTURED = RouteRequest({"prompt": "repeat this"}, "completions")
OPEN = RouteRequest({"prompt": "tell me a story"}, "completions")


def test_adaptive_follows_predicted_gain():
    p = _policy(exploration_rate=0.0, acceptance_model="per-kind")
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
    """The per-kind model explores at the fixed rate (the per-request one adds Thompson sampling)."""
    p = _policy(exploration_rate=0.2, acceptance_model="per-kind")
    n = 4000
    explored = sum(p.decide(OPEN).explore for _ in range(n))
    assert explored / n == pytest.approx(0.2, abs=3 * (0.2 * 0.8 / n) ** 0.5)
    assert p.counts["explore"] == explored
    again = _policy(exploration_rate=0.2, acceptance_model="per-kind")  # seeded: the same sequence
    assert sum(again.decide(OPEN).explore for _ in range(n)) == explored


def test_baseline_is_timed_at_the_exploration_rate_while_its_timings_lag():
    """Requests predicted for speculative, streamed, go to baseline at the exploration rate while fewer
    baseline requests have timed its step than STEP_WINDOW and than a quarter of the speculative ones;
    non-streamed ones (which time nothing) never, and none once baseline has its share of timings."""
    p = _policy(exploration_rate=0.2)
    streamed = RouteRequest({"prompt": "repeat this", "stream": True}, "completions")
    assert all(p.decide(streamed).pool == "speculative" for _ in range(200))  # nothing timed either
    for _ in range(4 * STEP_WINDOW):
        p.model.observe_speculative(0.02, 1, 0.8)
    n = 2000
    timed = [p.decide(streamed) for _ in range(n)]
    to_base = [d for d in timed if d.pool == "baseline"]
    assert all((d.reason, d.explore) == ("explore", True) for d in to_base)
    assert len(to_base) / n == pytest.approx(0.2, abs=3 * (0.2 * 0.8 / n) ** 0.5)
    assert all(p.decide(STRUCTURED).pool == "speculative" for _ in range(200))
    for _ in range(STEP_WINDOW):
        p.model.observe_baseline(0.045, 1)
    assert all(p.decide(streamed).pool == "speculative" for _ in range(200))


def _finished(p: AdaptivePolicy, pool: str, decode_s: float, tokens: int, n: int = 1) -> None:
    """``n`` of the gateway's own requests finished on ``pool``, each decoding for ``decode_s``."""
    d = p.decide(RouteRequest({"prompt": "tell me a story"}, "completions", forced_pool=pool))
    for _ in range(n):
        p.observe(
            Outcome(d, pool, "s0" if pool == "speculative" else "b0", 200, 0.05, 0.05 + decode_s, tokens, 1)
        )


def test_queued_speculative_pool_sends_to_baseline_when_the_wait_outweighs_the_gain():
    """A short queue is worth waiting out for a 2.8x faster decode; a long one is not."""
    p = _policy(exploration_rate=0.0, acceptance_model="per-kind")
    ep = p.pools["speculative"].endpoints[0]
    state = p.scraper.of(ep)
    state.update(Reading(_now(), running=8, waiting=3), 7)
    assert p.decide(STRUCTURED).reason == "predicted-gain"  # a single sample may be a passing request
    state.update(Reading(_now(), running=8, waiting=60), 7)
    ep.outstanding = 68  # all of them the gateway's own
    assert state.capacity == 8 and p.load("speculative").ahead == 61
    # how fast seats free is unknown until one of the gateway's requests has finished there
    assert {p.decide(STRUCTURED).reason for _ in range(20)} == {"spec-queued"}
    _finished(p, "speculative", decode_s=1.0, tokens=64)  # a seat frees every 1/8 s
    assert p.decide(STRUCTURED).reason == "spec-queued"  # 61 ahead: 7.6 s, baseline decodes in 2.9
    ep.outstanding = 10
    state.update(Reading(_now(), running=8, waiting=2), 7)
    d = p.decide(STRUCTURED)
    assert (d.pool, d.reason) == ("speculative", "predicted-gain")  # 3 ahead: worth the wait
    ep.outstanding = 2  # the queue is other clients', whose requests' lengths are unknown
    state.update(Reading(_now(), running=8, waiting=2), 7)
    assert p.decide(STRUCTURED).reason == "spec-queued"
    state.update(Reading(_now(), running=2, waiting=0), 7)
    assert p.decide(STRUCTURED).reason == "predicted-gain"


@pytest.mark.parametrize("model", ["per-request", "per-kind"])
def test_the_exploration_floor_does_not_send_requests_into_a_speculative_queue(model):
    """Explored at the floor rate while the pool has no line; not once while it queues (the wait is
    the client's, for a measurement the next request after the line clears gives for free)."""
    p = _policy(exploration_rate=0.5, acceptance_model=model)
    state = p.scraper.of(p.pools["speculative"].endpoints[0])
    assert sum(p.decide(OPEN).reason == "explore" for _ in range(200)) >= 60
    for _ in range(2):
        state.update(Reading(_now(), running=16, waiting=8), 7)  # other clients' queue
    assert p.load("speculative").ahead > 0
    reasons = {p.decide(r).reason for r in (OPEN, STRUCTURED) for _ in range(200)}
    assert reasons == {"no-gain", "spec-queued"}
    for _ in range(2):
        state.update(Reading(_now(), running=4, waiting=0), 7)  # drained
    assert sum(p.decide(OPEN).reason == "explore" for _ in range(200)) >= 60


def _queued_baseline(p: AdaptivePolicy, waiting: int) -> None:
    """The speculative pool at a batch of 16 (twice the knee), baseline full with ``waiting`` in line,
    all of them the gateway's own requests."""
    spec_ep, base_ep = p.pools["speculative"].endpoints[0], p.pools["baseline"].endpoints[0]
    spec_ep.outstanding, base_ep.outstanding = 15, 32 + waiting
    p.scraper.of(spec_ep).update(Reading(_now(), running=15, waiting=0), 7)
    for _ in range(2):
        p.scraper.of(base_ep).update(Reading(_now(), running=32, waiting=waiting), None)


def test_queued_baseline_keeps_prose_off_a_busy_speculative_pool():
    """Prose at a large speculative batch decodes ~1.5x slower than on baseline: a short baseline queue
    is the faster way to finish (it used to be sent to speculative as soon as baseline queued)."""
    p = _policy(exploration_rate=0.0, acceptance_model="per-kind")
    _finished(p, "baseline", decode_s=64 * 0.045, tokens=64)
    _queued_baseline(p, waiting=3)
    d = p.decide(OPEN)
    assert d.pool == "baseline" and d.reason in ("no-gain", "spec-busy")
    assert p.decide(STRUCTURED).pool == "speculative"  # structured output still gains there
    _queued_baseline(p, waiting=400)  # ~12 residences of waiting: now the slow decode is faster
    d = p.decide(OPEN)
    assert (d.pool, d.reason) == ("speculative", "baseline-queued")


def test_a_batch_that_finished_since_the_scrape_leaves_the_wait_timed():
    """Baseline queued with the gateway's own requests at the last scrape; a batch of them has finished
    since (the page still shows the line until the next scrape). Those were never other clients'
    requests: the wait stays timed, and prose still finishes sooner on baseline than in a busy speculative
    pool. (Read as an untimed queue, every request went to the speculative pool until two scrapes had
    shown no line, piling up a batch there that decoded prose 2-3x slower.)"""
    p = _policy(exploration_rate=0.0, acceptance_model="per-kind")
    _finished(p, "baseline", decode_s=64 * 0.045, tokens=64)
    _queued_baseline(p, waiting=3)
    base_ep = p.pools["baseline"].endpoints[0]
    base_ep.outstanding = 12  # 23 of the 35 finished since the page
    assert p.load("baseline").own
    d = p.decide(OPEN)
    assert d.pool == "baseline" and d.reason in ("no-gain", "spec-busy")
    # other clients' requests (the page showed the line while the gateway had few in flight): untimed
    base_ep.outstanding = 4
    for _ in range(2):
        p.scraper.of(base_ep).update(Reading(_now(), running=32, waiting=3), None)
    assert not p.load("baseline").own
    assert p.decide(OPEN).reason == "baseline-queued"


def test_learned_residence_sets_the_wait():
    p = _policy(exploration_rate=0.0, acceptance_model="per-kind")
    _queued_baseline(p, waiting=8)
    assert p.decide(OPEN).reason == "baseline-queued"  # no baseline request timed yet: avoided
    _finished(p, "baseline", decode_s=64 * 0.045, tokens=64)
    assert p.decide(OPEN).pool == "baseline"  # 9 ahead of 32 seats: a quarter of a residence
    _finished(p, "baseline", decode_s=60.0, tokens=100, n=200)  # a seat frees every 2 s
    assert p.residence_s["baseline"] == pytest.approx(60.0, rel=1e-3)
    assert p.mean_tokens == pytest.approx(100, rel=1e-3)
    d = p.decide(OPEN)
    assert (d.pool, d.reason) == ("speculative", "baseline-queued")
    assert p.snapshot()["pools"]["baseline"]["ahead"] == 9


def test_large_batch_makes_speculation_a_loss():
    p = _policy(exploration_rate=0.0)
    p.model.knee = 16.0
    p.scraper.of(p.pools["speculative"].endpoints[0]).update(Reading(_now(), running=30, waiting=0), 7)
    d = p.decide(RouteRequest({"prompt": "repeat"}, "completions"))
    assert (d.pool, d.reason) == ("baseline", "spec-busy")


def test_a_data_parallel_speculative_server_is_priced_at_one_engines_batch():
    """Each engine of a server run with --data-parallel-size steps its own requests: two engines running 4
    each are two batches of 4 (a request joins one at 5), not one of 8 that the speedup model prices
    nearer its knee."""
    lines = [
        f'vllm:num_requests_{s}{{engine="{i}"}} {n}'
        for i in (0, 1)
        for s, n in (("running", 4), ("waiting", 0))
    ]
    p = _policy(exploration_rate=0.0)
    p.scraper.of(p.pools["speculative"].endpoints[0]).update(parse("\n".join(lines) + "\n", _now()), 7)
    assert p.load("speculative").batch == 5.0
    single = _policy(exploration_rate=0.0)
    single.scraper.of(single.pools["speculative"].endpoints[0]).update(
        Reading(_now(), running=4, waiting=0), 7
    )
    assert single.load("speculative").batch == 5.0
    d = p.decide(STRUCTURED)
    assert d.spec_batch == 5.0 and d.predicted_speedup == single.decide(STRUCTURED).predicted_speedup


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


def _spec_outcome(d: Decision, accepted: int, steps: int = 30) -> Outcome:
    return Outcome(
        d, "speculative", "s0", 200, 0.05, 1.0, accepted + steps, steps, accepted, steps * 7, steps
    )


def test_uncertain_requests_are_explored_and_measured_ones_not():
    """A prompt the prior calls a loss is explored while its acceptance is unknown (with a cheap draft
    what it may win outweighs what it may lose); once measured as a loss it is explored (almost) no
    more, with no fixed rate at all."""
    p = _policy(exploration_rate=0.0)
    n = 400
    early = sum(p.decide(OPEN).explore for _ in range(n)) / n
    assert early > 0.05
    d = p.decide(OPEN)
    for _ in range(30):
        p.observe(_spec_outcome(d, accepted=3))  # alpha ≈ 0.1: speculation is a loss
    late = sum(p.decide(OPEN).explore for _ in range(n)) / n
    assert late < early / 3


def test_a_useless_draft_timed_as_free_is_not_measured_again_and_again():
    """A draft that never agrees, its steps timed no dearer than the target's (a CPU server's noise puts
    the learned cost at 0): at any acceptance above 0 speculation gains a little by the model, always
    within the margin. Measuring the request cannot move a later one across the margin, so it is not
    made; each request was sent to be measured (the real-vLLM suite's useless draft: 107 of 120)."""
    p = _policy(cost=0.0, exploration_rate=0.0)
    d = p.decide(STRUCTURED)
    for _ in range(30):
        p.observe(_spec_outcome(d, accepted=0))
    after = [p.decide(STRUCTURED) for _ in range(200)]
    assert {(a.pool, a.reason) for a in after} == {("baseline", "no-gain")}
    assert all(1.0 <= a.predicted_speedup < 1.1 for a in after)  # a gain, inside the margin


def test_a_measured_loss_is_not_explored_when_the_draft_is_dear_even_by_the_floor():
    """With a draft costing 0.3 of a step, a prompt measured at alpha 0.1 runs at 0.4 of baseline's speed
    there. The floor guards against a model that is sure and wrong, so it asks what the request may win
    if its acceptance were as unknown as the prior's; at this cost that is nothing, and the floor that
    sent every such request to be measured again (a fifth of the short regimes' loss) sends none."""
    p = _policy(cost=0.3, exploration_rate=1.0)
    d = p.decide(OPEN)
    for _ in range(30):
        p.observe(_spec_outcome(d, accepted=3))
    assert sum(p.decide(OPEN).explore for _ in range(200)) == 0


def test_the_floor_keeps_measuring_what_the_prior_expects_to_gain_once_measured_as_a_loss():
    """A draft that turned bad on structured prompts (measured at 0.1) and may recover: the floor asks what
    the request may win by the prior's belief, which the measurements since do not move, so a fifth of
    them (the floor's rate) are still measured and a recovery is seen. Prose, which even the prior
    expects to lose at this cost, is not measured again (the floor's draws cost it nothing)."""
    p = _policy(cost=0.3, exploration_rate=0.2)
    d = p.decide(STRUCTURED)
    for _ in range(30):
        p.observe(_spec_outcome(d, accepted=3))
    assert p.decide(STRUCTURED).pool == "baseline"
    explored = sum(p.decide(STRUCTURED).explore for _ in range(400))
    assert 40 <= explored <= 120  # about the floor's 0.2 of 400
    d = p.decide(OPEN)
    for _ in range(30):
        p.observe(_spec_outcome(d, accepted=3))
    assert sum(p.decide(OPEN).explore for _ in range(400)) == 0


def test_the_floor_measures_a_replaced_draft_whose_old_one_was_useless_and_dear():
    """A useless draft (nothing accepted) whose steps cost 0.6 of a target step: by the prior, a
    structured prompt loses there on average (alpha about 0.77 gives 0.7x), and only its best case, an
    agreeing draft, gains. Were the draft replaced, only the floor's draws would see it, and what they
    find holds for every later request: they measure at the floor's rate wherever some acceptance the
    prior allows clears the margin (weighed over six later requests, none was measured again)."""
    p = _policy(cost=0.6, exploration_rate=0.2)
    d = p.decide(STRUCTURED)
    for _ in range(30):
        p.observe(_spec_outcome(d, accepted=0))
    prior = p.alpha_model.predict(d.features, d.p_structured)
    assert p.model.speedup(prior_alpha(d.p_structured), 1.0, 1.0) < 1.0 < p.model.speedup(0.99, 1.0, 1.0)
    assert prior.alpha < 0.1
    explored = sum(p.decide(STRUCTURED).explore for _ in range(400))
    assert 40 <= explored <= 120  # about the floor's 0.2 of 400


def test_the_floor_explores_outright_when_by_the_learned_cost_nothing_could_pay():
    """A draft learned as costly as a target step (a broken or busy server's timings, the old draft's):
    not even an acceptance of 1 pays by that cost, so no belief about acceptance asks for a measurement,
    yet the cost is only measured again on requests sent there. The floor then explores outright."""
    p = _policy(cost=1.0, exploration_rate=0.5)
    assert p.model.tpot_speculative(1.0, 1.0) >= p.model.tpot_baseline(1.0)
    explored = sum(p.decide(OPEN).explore for _ in range(200))
    assert 60 <= explored <= 140  # the floor's share, no more
    assert sum(_policy(cost=1.0, exploration_rate=0.0).decide(OPEN).explore for _ in range(200)) == 0


def test_exploration_weighs_what_a_measurement_wins_for_later_requests():
    """A prompt believed below break-even, but unsure: measuring it loses on this request and, where it
    turns out to gain, wins on the later requests like it. With no later request counted only its own
    expected gain decides; counted, the measurement is worth making."""

    def explored(horizon: float) -> int:
        p = _policy(cost=0.1, exploration_rate=0.0, exploration_horizon=horizon)
        return sum(p.decide(OPEN).explore for _ in range(100))

    assert explored(0.0) == 0
    assert explored(6.0) == 100


def test_a_prompt_the_prior_gets_wrong_is_learned_from_its_measurements():
    """The classifier calls it open-ended (prior alpha ≈ 0.27); the draft model accepts it well."""
    p = _policy(exploration_rate=0.0)
    assert p.decide(OPEN).reason in ("no-gain", "explore")
    d = p.decide(OPEN)
    for _ in range(10):
        fb = p.observe(_spec_outcome(d, accepted=150))  # mean length 6: alpha ≈ 0.9
    assert fb is not None and fb.alpha > 0.85
    assert fb.speedup == pytest.approx(p.model.speedup(fb.alpha, d.spec_batch, d.base_batch))
    assert fb.speedup > d.predicted_speedup  # measured beats the prediction made from the prior
    after = p.decide(OPEN)
    assert (after.pool, after.reason) == ("speculative", "predicted-gain")
    assert after.alpha > 0.7 and after.alpha_sd < d.alpha_sd
    snap = p.snapshot()["per_request_model"]
    assert snap["updates"] == 10 and snap["top_weights"]


def test_prediction_error_is_exported_per_class():
    p = _policy(exploration_rate=0.0)
    d = p.decide(STRUCTURED)
    p.observe(_spec_outcome(d, accepted=3))  # predicted ≈ 0.77, measured ≈ 0.09
    text = generate_latest(p.metrics.registry).decode()
    name = "specroute_acceptance_prediction_error_ratio_bucket"
    assert f'{name}{{class="structured",le="-0.5"}} 1.0' in text
    assert f'{name}{{class="structured",le="+Inf"}} 1.0' in text


def test_a_redeployed_speculative_pool_with_another_k_is_learned_from_its_new_steps():
    """Without k in configuration it comes from the pool's counters; when those show another k, the
    steps timed at the old one stop counting towards c."""
    pools = {
        "speculative": Pool("speculative", ["m"], [Endpoint("speculative", "s0", "http://s0")]),
        "baseline": Pool("baseline", ["m"], [Endpoint("baseline", "b0", "http://b0")]),
    }
    scraper = Scraper(None, pools, Metrics(), 1.0)  # type: ignore[arg-type]
    cfg = RoutingConfig(strategy=Strategy.ADAPTIVE, seed=7, exploration_rate=0.0)
    p = AdaptivePolicy.build(Strategy.ADAPTIVE, FixedClassifier(), cfg, pools, scraper, Metrics())
    spec = scraper.of(pools["speculative"].endpoints[0])
    spec.update(Reading(_now(), running=1, waiting=0, per_pos=(9.0,) * 5), None)
    scraper.rounds += 1  # the round's end (what scrape_once does after every endpoint's update)
    p.decide(STRUCTURED)
    assert p.model.k == 5
    for _ in range(3):
        p.model.observe_speculative(0.004, 1, 0.6)
    p.decide(STRUCTURED)
    assert len(p.model.spec_steps) == 3  # the same k: kept
    spec.update(Reading(_now(), running=1, waiting=0, per_pos=(9.0,) * 3), None)
    scraper.rounds += 1
    p.decide(STRUCTURED)
    assert p.model.k == 3 and not p.model.spec_steps


def test_baseline_step_time_is_learned_from_its_servers_histogram_when_no_client_streams():
    """A deployment unlike the prior: a 20 ms step and a dear draft (c = 0.6), non-streamed traffic only.

    Only streams time a token, so the step time (and with it the draft's cost, measured in steps) stayed
    at the configured 45 ms: the measured speculative steps looked cheap against it, and structured
    prompts went to a pool where they ran slower. The baseline servers' own inter-token histogram,
    scraped, times the step for every request they ran."""
    p = _policy(exploration_rate=0.0)
    k, alpha, step, c = 7, 0.6, 0.020, 0.6
    spec_tpot = step * (1 + k * c) / expected_length(alpha, k)
    assert spec_tpot > step  # speculation is the slower pool here
    for _ in range(5):  # measured speculative requests (assembled streams), each with its acceptance
        p.model.observe_speculative(spec_tpot, 1, alpha)
    assert p.decide(STRUCTURED).pool == "speculative"  # the prior's step makes the draft look cheap
    base = p.scraper.of(p.pools["baseline"].endpoints[0])
    steps = 0.0
    for _ in range(3):  # scrape rounds: 200 engine steps of 20 ms each in between, one request running
        steps += 200
        base.update(Reading(_now(), running=1, waiting=0, step_seconds=steps * step, steps=steps), None)
        p.scraper.rounds += 1
        p.decide(OPEN)
    assert p.model.step_s == pytest.approx(step)
    assert p.model.c == pytest.approx(c)
    assert p.decide(STRUCTURED).pool == "baseline"


def test_baseline_step_times_counted_between_two_decisions_are_all_learned():
    """Scrapes run on their own clock and routing reads them at its next decision. A sparse baseline
    pool's one step time was kept only until the next scrape round: with a decision every second and a
    scrape every 0.6 s, most of them were gone before a decision read them, and the configured step
    time (and a wrong draft cost with it) stayed for dozens of requests."""
    p = _policy(exploration_rate=0.0)
    base = p.scraper.of(p.pools["baseline"].endpoints[0])
    steps, step = 0.0, 0.009
    base.update(Reading(_now(), running=0, waiting=0, step_seconds=0.0, steps=steps), None)
    p.scraper.rounds += 1
    p.decide(OPEN)
    for _ in range(2):  # two requests timed, each followed by an idle scrape round, before one decision
        steps += 47
        base.update(Reading(_now(), running=1, waiting=0, step_seconds=steps * step, steps=steps), None)
        base.update(Reading(_now(), running=0, waiting=0, step_seconds=steps * step, steps=steps), None)
        p.scraper.rounds += 2
    p.decide(OPEN)
    assert p.model.base_observations == 2
    assert p.model.step_s == pytest.approx(step)
    p.decide(OPEN)
    assert p.model.base_observations == 2  # each is learned once


def test_short_streams_teach_the_acceptance_the_access_log_shows():
    """A stream's last step is cut short by max_tokens: read per position (accepted drafts over those
    plus the rejections seen) its acceptance stays right. The policy was handed accepted drafts and
    steps only, and read them by their mean length: answers of 6 tokens from a draft accepting 0.8
    taught about 0.6 while the access log said 0.8, and the model carried that to every request of
    the prompt, long ones included."""
    p = _policy(exploration_rate=0.0)
    rng = random.Random(4)
    taught = 0
    for _ in range(100):
        d = p.decide(STRUCTURED)
        m = from_token_steps(cut_stream(0.8, 7, 6, rng), 7)
        if m is None or m.rejected is None:
            continue
        out = Outcome(
            d, "speculative", "s0", 200, 0.05, 0.2, 6, 3,
            int(m.accepted), int(m.draft_tokens), int(m.steps), rejected_drafts=int(m.rejected),
        )  # fmt: skip
        fb = p.observe(out)
        assert fb is not None and fb.alpha == pytest.approx(m.alpha)
        taught += 1
    assert taught > 90
    assert p.decide(STRUCTURED).alpha > 0.72  # 0.75 here, and still rising; 0.62 read by mean length


def test_a_request_of_several_sequences_times_no_step():
    """n > 1: the sequences' tokens add up in the usage, so their sum over one sequence's time is no
    time per token (it made baseline's step look n times faster than it is)."""
    p = _policy(Strategy.ALWAYS_BASELINE)
    d = p.decide(OPEN)
    for _ in range(3):
        p.observe(Outcome(d, "baseline", "b0", 200, 0.05, 1.05, 4 * 50, 4 * 50, sequences=4))
    assert p.model.base_observations == 0 and p.residence_s == {}
    p.observe(Outcome(d, "baseline", "b0", 200, 0.05, 1.05, 51, 51))
    assert p.model.base_observations == 1 and p.model.step_s == pytest.approx(0.02)


def test_a_pool_with_no_endpoint_up_is_named_unavailable_not_queued():
    """With every endpoint of a pool down, the reason said it was queued: a dashboard of reasons then
    showed a load problem where there was an outage."""
    p = _policy(exploration_rate=0.0)
    p.pools["speculative"].endpoints[0].healthy = False
    assert (p.decide(STRUCTURED).pool, p.decide(STRUCTURED).reason) == ("baseline", "spec-unavailable")
    p.pools["speculative"].endpoints[0].healthy = True
    p.pools["baseline"].endpoints[0].healthy = False
    assert (p.decide(OPEN).pool, p.decide(OPEN).reason) == ("speculative", "baseline-unavailable")


def test_a_pool_left_with_only_a_demoted_endpoint_is_unavailable():
    """A replica demoted for its bad draft, its peers down: the picker's last resort sent every
    structured request there, slower than baseline, as the pool's model still predicted the peers' gain."""
    p = _policy(exploration_rate=0.0)
    bad, good = Endpoint("speculative", "s1", "http://s1", demoted=True), p.pools["speculative"].endpoints[0]
    p.pools["speculative"].endpoints.append(bad)
    assert (p.decide(STRUCTURED).pool, p.decide(STRUCTURED).reason) == ("speculative", "predicted-gain")
    good.healthy = False
    assert (p.decide(STRUCTURED).pool, p.decide(STRUCTURED).reason) == ("baseline", "spec-unavailable")
    bad.demoted = False  # readmitted (its server restarted)
    assert p.decide(STRUCTURED).pool == "speculative"


def test_prompts_whose_long_context_makes_speculation_lose_go_to_baseline_once_learned():
    """Every prompt new and structured (prior alpha 0.77); the ones with a long context accept 0.15,
    the short ones 0.75. The length weight, which every request shares, must keep learning: while it
    froze after a few dozen updates, every long prompt still went to the speculative pool after 200
    requests, each measured at 0.15 there."""
    p = _policy(exploration_rate=0.0)
    rng = random.Random(5)
    words = ["repeat", "the", "list", "of", "numbers", "copy", "this", "line"]
    words += ["data", "table", "and", "report"]
    sent: dict[bool, list[str]] = {True: [], False: []}  # requests 200-300: pool, or reason when speculative
    for i in range(300):
        long = i % 4 == 0
        text = "repeat " + " ".join(rng.choice(words) for _ in range(rng.randint(5, 12)))
        if long:
            text += "\n\n" + " ".join(rng.choice(words) for _ in range(250))  # about 1,300 characters
        d = p.decide(RouteRequest({"prompt": text}, "completions"))
        if d.pool == "speculative":  # acceptance is measured there alone: 30 steps of k = 7
            p.observe(_spec_outcome(d, accepted=5 if long else 78))
        if i >= 200:
            sent[long].append(d.reason if d.pool == "speculative" else d.pool)
    # long ones: predicted for baseline, a few still sent to speculative (explored, or predicted just
    # over break-even: measured no more, they stop where speculation stops paying, alpha about 0.26)
    assert len(sent[True]) - sent[True].count("baseline") <= 5, sent[True]
    assert sent[False].count("predicted-gain") >= 0.9 * len(sent[False]), sent[False]


def test_the_pools_load_is_that_of_its_endpoints_in_rotation():
    """A demoted endpoint gets probes only, so its small batch is not where the next request goes."""
    p = _policy()
    pool = p.pools["speculative"]
    pool.endpoints = [Endpoint("speculative", "s0", "http://s0"), Endpoint("speculative", "s1", "http://s1")]
    s0, s1 = pool.endpoints
    s0.outstanding, s1.outstanding = 12, 1
    assert p.load("speculative").batch == 2.0
    s1.demoted = True
    assert p.load("speculative").batch == 13.0
    s0.healthy = False  # only the demoted one is left: unavailable to routing, slower than baseline
    assert not p.load("speculative").available


def test_a_speculative_server_listed_as_baseline_does_not_time_baselines_step(caplog, vllm_fixture):
    """Its pages have speculative decoding's counters: its steps (a draft's and a verification's) and its
    requests' TPOT are not baseline's, by which the draft's cost is measured; the log says so once."""
    p = _policy(exploration_rate=0.0)
    b0 = p.pools["baseline"].endpoints[0]
    pages = iter(
        vllm_fixture(f"draftsame_metrics_{x}.txt").decode() for x in ("before", "under_load", "after_load")
    )
    scraper = p.scraper
    assert scraper is not None
    scraper.client = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda r: httpx.Response(200, text=next(pages)))
    )
    configured = p.model.step_s
    with caplog.at_level(logging.WARNING, "specroute.upstream.scrape"):
        for _ in range(3):
            asyncio.run(scraper._scrape(b0))
            scraper.rounds += 1
            p.decide(OPEN)
    assert scraper.drafting(b0) and p._drafting_baseline == {"b0"}
    assert p.model.base_observations == 0 and p.model.step_s == configured
    d = p.decide(RouteRequest({"prompt": "tell me a story"}, "completions", forced_pool="baseline"))
    p.observe(Outcome(d, "baseline", "b0", 200, 0.05, 0.05 + 63 * 0.03, 64, 1))
    assert p.model.base_observations == 0
    assert sum("runs a draft model" in r.getMessage() for r in caplog.records) == 1


def test_a_pool_forced_for_affinity_says_so_under_every_strategy():
    for strategy in Strategy:
        req = RouteRequest({"prompt": "repeat this"}, "completions", "baseline", forced_reason=AFFINITY)
        d = _policy(strategy).decide(req)
        assert (d.pool, d.reason, d.predicted_speedup) == ("baseline", "affinity", None)


def test_the_output_expected_is_the_limit_vllm_applies():
    """The wait behind a queue counts the request's output: its limit where lower than the running mean,
    read as vLLM's chat reads it (``max_completion_tokens or max_tokens``)."""
    p = _policy()
    p.mean_tokens = 100.0
    assert p._tokens({"max_completion_tokens": 7, "max_tokens": 12}) == 7.0
    assert p._tokens({"max_completion_tokens": None, "max_tokens": 12}) == 12.0
    assert p._tokens({"max_completion_tokens": 0, "max_tokens": 12}) == 12.0
    assert p._tokens({"max_tokens": 500}) == 100.0
