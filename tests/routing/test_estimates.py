"""Live alpha estimates: prior from the classifier, correction by measurements, decay, change detection."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from gateway.routing.estimates import FULL_TRIALS, PRIOR_OPEN, PRIOR_STRUCTURED, AlphaEstimates


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_prior_follows_the_classifier_probability():
    est = AlphaEstimates(60.0, Clock())
    assert est.alpha("code", "structured", 1.0) == pytest.approx(PRIOR_STRUCTURED)
    assert est.alpha("qa", "open-ended", 0.0) == pytest.approx(PRIOR_OPEN)
    assert PRIOR_OPEN < est.alpha("qa", "open-ended", 0.5) < PRIOR_STRUCTURED


def test_measurements_override_the_prior():
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    rng = random.Random(1)
    for _ in range(20):
        clock.t += 1
        est.observe("qa", "structured", 0.9, 0.3 + rng.uniform(-0.05, 0.05), FULL_TRIALS)
    assert est.alpha("qa", "structured", 0.9) == pytest.approx(0.3, abs=0.05)
    # another kind shares only the regression prior, which has moved towards what was measured
    assert est.alpha("code", "structured", 0.9) < PRIOR_STRUCTURED


def test_evidence_halves_every_half_life_and_returns_to_the_prior():
    clock = Clock()
    est = AlphaEstimates(10.0, clock)
    for _ in range(5):
        est.observe("qa", "open-ended", 0.0, 0.6, FULL_TRIALS)
    w0 = est.kinds[("qa", "open-ended")].weight
    clock.t += 10.0
    est.alpha("qa", "open-ended", 0.0)
    assert est.kinds[("qa", "open-ended")].weight == pytest.approx(w0 / 2)
    near = est.alpha("qa", "open-ended", 0.0)
    clock.t += 200.0
    far = est.alpha("qa", "open-ended", 0.0)
    assert far < near
    assert far == pytest.approx(est.prior(0.0), abs=0.01)


def test_short_requests_weigh_less():
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    est.observe("a", "structured", 1.0, 0.2, FULL_TRIALS / 8)
    est.observe("b", "structured", 1.0, 0.2, FULL_TRIALS)
    assert est.alpha("a", "structured", 1.0) > est.alpha("b", "structured", 1.0)


def test_a_sustained_change_is_detected_before_the_half_life():
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    for _ in range(60):  # a long, stable history at 0.85
        clock.t += 0.5
        est.observe("rep", "structured", 1.0, 0.85, FULL_TRIALS)
    n = 0
    while est.alpha("rep", "structured", 1.0) > 0.35:
        clock.t += 0.5
        est.observe("rep", "structured", 1.0, 0.25, FULL_TRIALS)
        n += 1
    assert n <= 6  # without detection, ~60 equal-weight observations would be needed
    assert est.kinds[("rep", "structured")].changes + est.shift.changes == 1


def test_a_pool_wide_shift_moves_kinds_not_measured_since():
    """A new draft model lowers every kind; kinds measured before the change learn it from the others."""
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    kinds = ["rep", "code", "data", "extract"]
    for i in range(80):
        clock.t += 0.25
        est.observe(kinds[i % 4], "structured", 0.95, 0.8, FULL_TRIALS)
    before = est.alpha("extract", "structured", 0.95)
    for _ in range(4):  # the draft gets worse; only "rep" and "code" are measured afterwards
        for kind in ("rep", "code"):
            clock.t += 0.25
            est.observe(kind, "structured", 0.95, 0.24, FULL_TRIALS)
    after = est.alpha("extract", "structured", 0.95)
    assert est.shift.changes == 1
    assert before == pytest.approx(0.8, abs=0.05)
    assert after < 0.45  # unmeasured since, yet it followed the pool-wide drop
    for _ in range(4):  # and back when the draft recovers
        for kind in ("rep", "code"):
            clock.t += 0.25
            est.observe(kind, "structured", 0.95, 0.8, FULL_TRIALS)
    assert est.alpha("extract", "structured", 0.95) > 0.6


def test_isolated_outliers_are_not_a_change():
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    rng = random.Random(2)
    for i in range(200):
        clock.t += 0.5
        alpha = 0.27 if i % 7 == 3 else 0.85 + rng.uniform(-0.03, 0.03)  # misclassified prompts now and then
        est.observe("rep", "structured", 1.0, alpha, FULL_TRIALS)
    assert est.kinds[("rep", "structured")].changes == 0
    assert est.shift.changes == 0
    assert est.alpha("rep", "structured", 1.0) == pytest.approx(0.85 - (0.85 - 0.27) / 7, abs=0.05)


def test_memory_stays_flat_when_residuals_alternate_around_the_estimate():
    """Requests alternately well above and below the estimate keep one side of each CUSUM off zero
    without a change: the state must not grow with the number of requests (it lives for the process)."""
    est = AlphaEstimates(half_life_s=1e9, clock=lambda: 0.0)

    def feed(n: int) -> None:
        for i in range(n):
            est.observe("qa", "open-ended", 0.5, 0.9 if i % 2 else 0.1, FULL_TRIALS)

    feed(1_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        feed(20_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 20_000, f"{grown} bytes more after 20,000 requests"


def _feed(est: AlphaEstimates, clock: Clock, kinds: list[str], alpha: float, n: int) -> None:
    for i in range(n):
        clock.t += 0.25
        est.observe(kinds[i % len(kinds)], "structured", 0.95, alpha, FULL_TRIALS)


def test_one_kinds_outliers_are_not_a_pool_wide_shift():
    """Two prompts in a row far below their kind's mean (a misclassified pair) crossed the pool-wide
    limit on their own, and every kind, measured or not, was rescaled by that pair's ratio: the
    estimates fell far below the prior with nothing changed in the pool."""
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    _feed(est, clock, ["rep", "code", "data", "extract"], 0.8, 80)
    _feed(est, clock, ["code"], 0.2, 2)
    assert est.shift.changes == 0
    assert est.alpha("extract", "structured", 0.95) == pytest.approx(0.8, abs=0.05)
    assert est.alpha("data", "structured", 0.95) == pytest.approx(0.8, abs=0.05)


def test_a_draft_unlike_the_prior_from_the_start_is_not_a_pool_wide_shift():
    """Kinds measured for the first time far below the prior (a draft weak on them) moved together
    only because every one of them was new: taken as a pool-wide change, it rescaled the prior and
    every other kind by their ratio (a fifth of the prior here)."""
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    _feed(est, clock, ["data", "count", "config"], 0.12, 12)
    assert est.shift.changes == 0
    assert est.prior.scale == 1.0
    assert est.alpha("data", "structured", 0.95) < 0.3  # the kinds themselves learned it


def test_a_change_after_start_up_is_still_pool_wide():
    """Once the kinds predict their own requests, the same drop in several of them is a change."""
    clock = Clock()
    est = AlphaEstimates(60.0, clock)
    _feed(est, clock, ["data", "count", "config"], 0.12, 30)  # learned, far below the prior
    _feed(est, clock, ["rep", "code"], 0.8, 20)
    _feed(est, clock, ["rep", "code"], 0.2, 6)
    assert est.shift.changes == 1
