"""Predicting a request's time per output token on each pool, and learning the model online.

A decode step of the target model costs ``step_s`` while the tokens it verifies stay under a knee
(decode is memory-bound) and grows linearly past it::

    step(v) = step_s · max(1, v / knee)

Without speculation a batch of ``b`` verifies ``b`` tokens and each request gets one token per step.
With speculation it verifies ``b·(k + 1)`` tokens, pays ``k·c·step_s`` for the draft model, and each
request gets E(alpha, k) tokens per step (Leviathan et al.)::

    TPOT_base = step(b)                       TPOT_spec = (step(b·(k+1)) + k·c·step_s) / E(alpha, k)

At small batch this is the textbook speedup E / (1 + k·c); at large batch the verification cost
eats the gain, which is why the decision depends on the pool's current batch as well as on alpha.

Learned from what the gateway observes, starting from configuration: ``step_s``, the median
baseline TPOT below the knee; the cost of a speculative step (draft and verification), the median
speculative TPOT below the knee with each request's own measured acceptance multiplied back in;
``c`` from the two, ``(spec_step / step_s - 1) / k``, once ``WARM_UP`` baseline requests have timed
the step; ``knee`` (exponentially weighted) from either pool's TPOT above it.

Medians of the latest ``STEP_WINDOW`` requests, and c as a ratio of the two rather than a running
mean of per-request ratios: the first requests to a cold server, or those that met a moment of
contention, time a step several times too long. A running mean kept such a start for dozens of
requests, and each speculative request's ratio, taken against the step time of the moment, carried
it on into c: on a shared CPU, a step time timed 50 % high at first held c near 0 while speculation
ran at twice baseline's TPOT, and a draft that accepted nothing looked free. A median ignores a few
such requests and follows a lasting change within half a window.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from statistics import median
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.speculation import expected_length

LEARN_RATE = 0.05  # weight of one observation in the running estimate of the knee
STEP_WINDOW = 25  # the step costs are medians of this many latest requests
# baseline observations before step_s is trusted to learn c and the knee from. A couple are enough: c's
# error is about the step time's relative error times (1 + k·c) / k (10 % off in step_s is 0.02 to 0.03
# in c at k = 7), while waiting for many keeps a wrong configured c, and every decision made with it, for
# as long as an adaptive gateway that believes speculation pays takes to send that many to baseline
WARM_UP = 2
KNEE_SIGNAL = 1.25  # a step this much dearer than step_s is taken as being past the knee
# c as learned is held to [0, C_MAX]. At c = 1 a draft step costs a target step and speculation can no longer
# pay (E(alpha, k) <= k + 1 = 1 + k·c): a larger c changes no decision, and a smaller bound would
# under-state a dear draft (a bound of 0.5 at k = 7 put a measured 6x step at 4.5x, and promised a 1.3x
# gain at alpha 0.9 that was a 5 % loss)
C_MAX = 1.0


class SpeedupState(BaseModel):
    """A :class:`SpeedupModel`'s learning, as kept across restarts."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    k: int = Field(ge=1)
    c: float = Field(ge=0, le=C_MAX)
    step_s: float = Field(gt=0)
    knee: float = Field(gt=0)
    base_observations: int = Field(ge=0)
    spec_observations: int = Field(ge=0)
    base_steps: list[Annotated[float, Field(gt=0)]] = Field(max_length=STEP_WINDOW)
    spec_steps: list[Annotated[float, Field(gt=0)]] = Field(max_length=STEP_WINDOW)


@dataclass
class SpeedupModel:
    k: int = 7
    c: float = 0.05
    step_s: float = 0.045
    knee: float = 64.0
    base_observations: int = 0
    spec_observations: int = 0
    base_steps: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))
    spec_steps: deque[float] = field(default_factory=lambda: deque(maxlen=STEP_WINDOW))

    @property
    def spec_step_s(self) -> float | None:
        """Cost of one speculative step below the knee (None before any was timed)."""
        return median(self.spec_steps) if self.spec_steps else None

    def use_k(self, k: int) -> None:
        """The speculative pool's number of draft tokens, as its counters now show it. The speculative
        steps timed at another k cost another number of draft steps: they leave the window, so c is
        learned again from steps of this k (c itself, a per-draft-token cost, stays until then)."""
        if k != self.k:
            self.k = k
            self.spec_steps.clear()

    def step(self, verified: float) -> float:
        return self.step_s * max(1.0, verified / self.knee)

    def tpot_baseline(self, batch: float) -> float:
        return self.step(batch)

    def tpot_speculative(self, alpha: float, batch: float) -> float:
        k = self.k
        return (self.step(batch * (k + 1)) + k * self.c * self.step_s) / expected_length(alpha, k)

    def speedup(self, alpha: float, spec_batch: float, base_batch: float) -> float:
        """Predicted TPOT on baseline over TPOT on speculative (> 1: speculation is faster)."""
        return self.tpot_baseline(base_batch) / self.tpot_speculative(alpha, spec_batch)

    def breakeven_alpha(self, spec_batch: float = 1.0, base_batch: float = 1.0, gain: float = 1.0) -> float:
        """The smallest alpha at which the predicted speedup reaches ``gain`` (1.0 when none does)."""
        lo, hi = 0.0, 1.0
        if self.speedup(hi, spec_batch, base_batch) < gain:
            return 1.0
        for _ in range(30):
            mid = (lo + hi) / 2
            if self.speedup(mid, spec_batch, base_batch) < gain:
                lo = mid
            else:
                hi = mid
        return hi

    # -- learning --------------------------------------------------------------------------------
    def observe_baseline(self, tpot_s: float, batch: float) -> None:
        """A baseline request's TPOT at (about) ``batch`` concurrent requests."""
        if tpot_s <= 0:
            return
        self.base_observations += 1
        if batch <= self.knee:
            self.base_steps.append(tpot_s)
            self.step_s = median(self.base_steps)
            self._update_c()
        elif tpot_s > KNEE_SIGNAL * self.step_s:
            self._learn_knee(batch, tpot_s / self.step_s)

    def observe_speculative(self, tpot_s: float, batch: float, alpha: float) -> None:
        """A speculative request's TPOT at ``batch``, with its own measured acceptance."""
        if tpot_s <= 0:
            return
        k = self.k
        step = tpot_s * expected_length(alpha, k)  # seconds per speculative step
        verified = batch * (k + 1)
        if verified <= self.knee:
            self.spec_observations += 1
            self.spec_steps.append(step)
            self._update_c()
        elif self.base_observations >= WARM_UP:
            cost = step / self.step_s - k * self.c  # the verification's share, in units of step_s
            if cost > KNEE_SIGNAL:
                self._learn_knee(verified, cost)

    def _update_c(self) -> None:
        """c from the two step costs, once ``WARM_UP`` baseline requests have timed the step."""
        spec_step = self.spec_step_s
        if spec_step is None or self.base_observations < WARM_UP:
            return  # c is measured in units of step_s: wait until step_s is known
        self.c = min(C_MAX, max(0.0, (spec_step / self.step_s - 1.0) / self.k))

    def _learn_knee(self, verified: float, cost: float) -> None:
        knee = min(1e6, max(float(self.k + 1), verified / cost))
        self.knee += LEARN_RATE * (knee - self.knee)

    def state(self) -> SpeedupState:
        """What this model has learned (``gateway.routing.learned`` keeps it on disk)."""
        return SpeedupState(
            k=self.k,
            c=self.c,
            step_s=self.step_s,
            knee=self.knee,
            base_observations=self.base_observations,
            spec_observations=self.spec_observations,
            base_steps=list(self.base_steps),
            spec_steps=list(self.spec_steps),
        )

    def restore(self, state: SpeedupState) -> None:
        """Take up a :meth:`state`. The step times are the deployment's: they stay as they were; a
        speculative pool now drafting another k drops its step times at its first scrape (:meth:`use_k`)."""
        self.k, self.c, self.step_s, self.knee = state.k, state.c, state.step_s, state.knee
        self.base_observations = state.base_observations
        self.spec_observations = state.spec_observations
        self.base_steps = deque(state.base_steps, maxlen=STEP_WINDOW)
        self.spec_steps = deque(state.spec_steps, maxlen=STEP_WINDOW)

    def snapshot(self) -> dict[str, Any]:
        spec_step = self.spec_step_s
        return {
            "k": self.k,
            "draft_cost_ratio": round(self.c, 4),
            "step_ms": round(self.step_s * 1000, 3),
            "speculative_step_ms": None if spec_step is None else round(spec_step * 1000, 3),
            "knee_tokens": round(self.knee, 1),
            "baseline_observations": self.base_observations,
            "speculative_observations": self.spec_observations,
            "ideal_speedup_at_alpha": {
                str(a): round(self.speedup(a, 1, 1), 3) for a in (0.3, 0.5, 0.7, 0.8, 0.9)
            },
        }
