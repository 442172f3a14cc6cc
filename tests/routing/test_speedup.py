"""The speedup model: the reference arithmetic, load effects, and what it learns online."""

from __future__ import annotations

import random

import pytest

from gateway.routing.speedup import C_MAX, STEP_WINDOW, WARM_UP, SpeedupModel
from gateway.speculation import expected_length


def test_reference_deployment_numbers():
    m = SpeedupModel(k=7, c=0.05, step_s=0.045, knee=64)
    assert m.tpot_baseline(1) == pytest.approx(0.045)
    assert m.tpot_speculative(0.8, 1) == pytest.approx(0.045 * 1.35 / expected_length(0.8, 7))
    assert m.tpot_speculative(0.8, 1) == pytest.approx(0.0146, abs=0.0005)  # about 15 ms/token
    assert m.speedup(0.27, 1, 1) == pytest.approx(1.0, abs=0.03)  # no gain for open-ended prose


def test_speedup_shrinks_past_the_knee():
    m = SpeedupModel(k=7, c=0.05, step_s=0.01, knee=32)
    small, large = m.speedup(0.8, 4, 4), m.speedup(0.8, 32, 32)
    assert small == pytest.approx(expected_length(0.8, 7) / 1.35)
    assert large < small / 3
    assert m.breakeven_alpha(32, 32) > m.breakeven_alpha(1, 1)
    assert m.speedup(m.breakeven_alpha(1, 1, 1.1), 1, 1) == pytest.approx(1.1, abs=1e-3)


def test_learns_step_time_c_and_knee():
    truth = SpeedupModel(k=7, c=0.12, step_s=0.009, knee=40)
    m = SpeedupModel(k=7, c=0.05, step_s=0.045, knee=64)
    rng = random.Random(5)
    for _ in range(WARM_UP * 10):
        b = rng.randint(1, 4)
        m.observe_baseline(truth.tpot_baseline(b) * rng.uniform(0.97, 1.03), b)
    assert m.step_s == pytest.approx(0.009, rel=0.05)
    for _ in range(200):
        b, alpha = rng.randint(1, 4), rng.uniform(0.2, 0.9)
        m.observe_speculative(truth.tpot_speculative(alpha, b) * rng.uniform(0.97, 1.03), b, alpha)
    assert m.c == pytest.approx(0.12, abs=0.02)
    for _ in range(300):
        b, alpha = rng.randint(10, 16), rng.uniform(0.2, 0.9)
        m.observe_speculative(truth.tpot_speculative(alpha, b), b, alpha)
    assert m.knee == pytest.approx(40, rel=0.1)


def test_c_waits_for_step_time():
    m = SpeedupModel(k=7, c=0.05, step_s=0.045)
    m.observe_speculative(0.003, 1, 0.8)  # far below the configured step: step_s not yet known
    assert m.c == 0.05


def test_c_is_learned_once_a_couple_of_baseline_requests_timed_the_step():
    """An adaptive gateway sends few requests to baseline while it believes speculation pays; c's error
    from the step time's is divided by k, so two timings are enough to start correcting a wrong c."""
    truth = SpeedupModel(k=7, c=0.15, step_s=0.009)
    m = SpeedupModel(k=7, c=0.05, step_s=0.045)
    for tpot in (0.0093, 0.0088):
        m.observe_speculative(truth.tpot_speculative(0.8, 1), 1, 0.8)  # before: nothing to measure c by
        assert m.c == 0.05
        m.observe_baseline(tpot, 1)
    m.observe_speculative(truth.tpot_speculative(0.8, 1), 1, 0.8)
    assert m.c == pytest.approx(0.15, abs=0.01)


def test_c_is_not_held_down_by_a_step_time_timed_badly_at_first():
    """The first baseline requests on a cold server (or a machine busy with the other pool) take 5x the
    step; later ones time it right. Ten requests later the step time and c are right: a running mean
    still put the step at 7.7 ms, and c, averaged from ratios taken against the step time of the moment,
    at 0.004 against a true 0.3 (a draft that accepted nothing looked free)."""
    truth = SpeedupModel(k=4, c=0.3, step_s=0.004)
    m = SpeedupModel(k=4, c=0.05, step_s=0.045)
    for tpot in (0.02, 0.02, 0.02):
        m.observe_baseline(tpot, 1)
        m.observe_speculative(truth.tpot_speculative(0.0, 1), 1, 0.0)
    for _ in range(10):
        m.observe_speculative(truth.tpot_speculative(0.0, 1), 1, 0.0)
        m.observe_speculative(truth.tpot_speculative(0.0, 1), 1, 0.0)
        m.observe_baseline(truth.tpot_baseline(1), 1)
    assert m.step_s == pytest.approx(0.004, rel=0.05)
    assert m.c == pytest.approx(0.3, abs=0.03)
    assert m.speedup(0.05, 1, 1) < 1.0


def test_the_step_time_follows_a_lasting_change_within_half_a_window():
    m = SpeedupModel(k=4, c=0.05, step_s=0.045)
    for _ in range(STEP_WINDOW):
        m.observe_baseline(0.004, 1)
    for _ in range(STEP_WINDOW // 2 + 1):
        m.observe_baseline(0.008, 1)
    assert m.step_s == pytest.approx(0.008)


def test_a_dear_draft_is_learned_as_dear_as_it_is():
    """A draft that costs 0.8 of a target step per token (measured on a shared CPU): c is learned as 0.8,
    and speculation is predicted to lose even at high acceptance, as it does."""
    truth = SpeedupModel(k=7, c=0.8, step_s=0.01)
    m = SpeedupModel(k=7, c=0.05, step_s=0.045)
    for _ in range(WARM_UP + 3):
        m.observe_baseline(truth.tpot_baseline(1), 1)
        m.observe_speculative(truth.tpot_speculative(0.9, 1), 1, 0.9)
    assert m.c == pytest.approx(0.8, abs=0.01)
    assert truth.speedup(0.9, 1, 1) < 1.0
    assert m.speedup(0.9, 1, 1) == pytest.approx(truth.speedup(0.9, 1, 1), rel=0.01)


def test_c_is_held_where_it_changes_no_decision():
    m = SpeedupModel(k=4, c=0.05, step_s=0.01)
    for _ in range(WARM_UP):
        m.observe_baseline(0.01, 1)
    m.observe_speculative(0.2, 1, 0.5)  # a step 20x the target's: a broken measurement, not a draft
    assert m.c == C_MAX
    assert m.speedup(1.0, 1, 1) <= 1.0


def test_steps_timed_at_another_k_leave_the_window_when_k_changes():
    """The speculative pool is redeployed with 3 draft tokens instead of 7: its steps are shorter. c is
    learned from the new steps alone at once; the old window's median would have put it at 0.23."""
    m = SpeedupModel(k=7, c=0.05, step_s=0.045)
    old, new = SpeedupModel(k=7, c=0.1, step_s=0.01), SpeedupModel(k=3, c=0.1, step_s=0.01)
    for _ in range(WARM_UP):
        m.observe_baseline(0.01, 1)
    for _ in range(STEP_WINDOW):
        m.observe_speculative(old.tpot_speculative(0.6, 1), 1, 0.6)
    assert m.c == pytest.approx(0.1, abs=0.005)
    m.use_k(7)  # the same k: nothing is dropped
    assert len(m.spec_steps) == STEP_WINDOW
    m.use_k(3)
    assert m.k == 3 and not m.spec_steps and m.c == pytest.approx(0.1, abs=0.005)
    m.observe_speculative(new.tpot_speculative(0.6, 1), 1, 0.6)
    assert m.c == pytest.approx(0.1, abs=0.005)
    assert m.speedup(0.6, 1, 1) == pytest.approx(new.speedup(0.6, 1, 1), rel=0.01)
