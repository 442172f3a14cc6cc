"""Live estimates of alpha per prompt kind and class, from the classifier's prior and measurements.

Three layers, each cheap enough for the request path:

1. a prior that maps the classifier's ``p_structured`` to alpha, ``alpha0(p) = a + b·p``: an online
   weighted regression of measured alpha on p, anchored by two pseudo-observations (p = 0 → alpha of open
   prose, p = 1 → alpha of structured output) so that it starts from sensible values;
2. per (kind, class), an exponentially decayed mean of the measured alpha of its requests (one request
   weighs up to 1, less when it had few draft tokens), shrunk towards the prior with the weight of
   ``PRIOR_WEIGHT`` requests. Evidence halves every ``half_life_s``: an estimate that is no longer
   fed (because its kind is routed away) drifts back to the prior and gets re-measured;
3. a change detector (two-sided CUSUM on the residuals) per key: a sustained jump — a new draft
   model, a traffic shift, acceptance collapsing — replaces the old evidence by the run of new
   observations at once instead of waiting out the half-life;
4. the same detector across all keys: a new draft model moves every kind at once, so when the
   residuals of all requests together show a sustained shift *in at least two kinds*, every kind's
   evidence and the prior are rescaled by the ratio those kinds revealed — kinds that have not been
   measured since learn the change from the others instead of one by one. (A shift seen in one
   kind only is that kind's own business: a couple of misclassified prompts in a row used to be
   taken for a pool-wide shift, and rescaled every estimate down with nothing changed.)

Requests are the units of evidence, not tokens: prompts of one kind differ in alpha, and one long
request must not outvote many short ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

PRIOR_OPEN = 0.25  # alpha of open-ended prose (the reference deployment saw ≈ 0.27)
PRIOR_STRUCTURED = 0.8  # alpha of repetitive or templated output (≈ 0.8)
PRIOR_WEIGHT = 0.5  # the prior counts as this many requests: it decides only until measurements arrive
FULL_TRIALS = 32.0  # a request with this many draft draws counts as one whole observation
CUSUM_SLACK = 0.08  # residuals smaller than this are noise
CUSUM_LIMIT = 0.9  # accumulated excess that declares a change (≈ 2 observations 0.5 off)
SHIFT_KINDS = 2  # kinds whose requests must show a change before it is taken as pool-wide
SETTLED_OBSERVATIONS = 3  # a kind counts towards a pool-wide change only once measured this often


@dataclass(slots=True)
class PriorModel:
    """alpha0(p) = a + b·p by decayed weighted least squares, anchored at p = 0 and p = 1."""

    sw: float = 0.0
    sp: float = 0.0
    spp: float = 0.0
    sa: float = 0.0
    spa: float = 0.0
    a: float = PRIOR_OPEN
    b: float = PRIOR_STRUCTURED - PRIOR_OPEN
    scale: float = 1.0  # pool-wide factor from the global change detector; the fit sees alpha / scale

    def __call__(self, p: float) -> float:
        return min(0.99, max(0.0, self.scale * (self.a + self.b * p)))

    def decay(self, factor: float) -> None:
        self.sw *= factor
        self.sp *= factor
        self.spp *= factor
        self.sa *= factor
        self.spa *= factor

    def add(self, p: float, alpha: float, w: float) -> None:
        self.sw += w
        self.sp += w * p
        self.spp += w * p * p
        self.sa += w * alpha
        self.spa += w * p * alpha
        # the two anchors: one pseudo-request each at p = 0 and p = 1
        sw, sp, spp = self.sw + 2, self.sp + 1, self.spp + 1
        sa, spa = self.sa + PRIOR_OPEN + PRIOR_STRUCTURED, self.spa + PRIOR_STRUCTURED
        det = sw * spp - sp * sp
        if det > 1e-9:
            self.b = (sw * spa - sp * sa) / det
            self.a = (sa - self.b * sp) / sw


@dataclass(slots=True)
class KindEstimate:
    weight: float = 0.0  # decayed number of requests
    total: float = 0.0  # decayed Σ weight·alpha
    updated: float = 0.0
    observations: int = 0
    last_alpha: float | None = None
    last_p: float = 0.5
    changes: int = 0
    _up: float = 0.0
    _down: float = 0.0
    # the run since the CUSUM last sat at zero, as sums (a list of it grew without bound while the
    # residuals kept one side of the CUSUM above zero without reaching the limit)
    _run_w: float = 0.0
    _run_aw: float = 0.0

    def decay(self, now: float, half_life_s: float) -> None:
        if now > self.updated:
            f = 0.5 ** ((now - self.updated) / half_life_s)
            self.weight *= f
            self.total *= f
            self.updated = now

    def mean(self, prior: float) -> float:
        return (self.total + PRIOR_WEIGHT * prior) / (self.weight + PRIOR_WEIGHT)

    @property
    def settled(self) -> bool:
        """Measured a few times and predicting its own requests: its own change detector near rest.

        A kind still converging from a prior far from its measurements keeps its CUSUM high for a
        while; its residuals say how wrong the prior was for it, not that the pool changed.
        """
        return self.observations >= SETTLED_OBSERVATIONS and max(self._up, self._down) < CUSUM_LIMIT / 2

    def add(self, alpha: float, w: float, prior: float, p: float) -> None:
        current = self.mean(prior)
        r = alpha - current
        self._up = max(0.0, self._up + r - CUSUM_SLACK)
        self._down = max(0.0, self._down - r - CUSUM_SLACK)
        if self._up == 0.0 and self._down == 0.0:
            self._run_w = self._run_aw = 0.0
        else:
            self._run_w += w
            self._run_aw += alpha * w
        if max(self._up, self._down) > CUSUM_LIMIT:
            # a change: forget the old evidence, keep only the run that revealed it
            self.weight, self.total = self._run_w, self._run_aw
            self._up = self._down = self._run_w = self._run_aw = 0.0
            self.changes += 1
        else:
            self.weight += w
            self.total += w * alpha
        self.observations += 1
        self.last_alpha = alpha
        self.last_p = p


@dataclass(slots=True)
class ShiftDetector:
    """Two-sided CUSUM over every request's residual, for changes that hit all kinds together.

    A shift is declared only when the run that crossed the limit shows it in at least
    ``SHIFT_KINDS`` kinds, and the ratio applied is theirs. One prompt far from its kind's mean
    (a misclassified one, or only the spread inside a kind) crosses the limit on its own; taking
    that as pool-wide rescaled every kind by the ratio of a run picked for being extreme. And only
    kinds that were settled when they entered the run count (:attr:`KindEstimate.settled`): with a
    draft model unlike the prior, kinds measured for the first time far below it at start-up looked
    like every kind moving together, and every other kind was rescaled by their ratio.
    """

    changes: int = 0
    _up: float = 0.0
    _down: float = 0.0
    # the run since the CUSUM last sat at zero, per kind: Σ weight·residual, Σ w·measured, Σ w·expected,
    # and whether the kind was settled when it entered the run (1.0) or not (0.0)
    _run: dict[str, list[float]] = field(default_factory=dict)

    def add(self, kind: str, alpha: float, expected: float, w: float, settled: bool = True) -> float | None:
        """Record one residual; return the measured/expected ratio when a shift is declared."""
        r = (alpha - expected) * w
        self._up = max(0.0, self._up + r - CUSUM_SLACK * w)
        self._down = max(0.0, self._down - r - CUSUM_SLACK * w)
        if self._up == 0.0 and self._down == 0.0:
            self._run.clear()
            return None
        acc = self._run.setdefault(kind, [0.0, 0.0, 0.0, 1.0 if settled else 0.0])
        acc[0] += r
        acc[1] += alpha * w
        acc[2] += expected * w
        if max(self._up, self._down) <= CUSUM_LIMIT:
            return None
        sign = 1.0 if self._up > self._down else -1.0
        agreeing = [a for a in self._run.values() if a[3] and sign * a[0] > CUSUM_SLACK]
        self._up = self._down = 0.0
        self._run.clear()
        if len(agreeing) < SHIFT_KINDS:
            return None  # one kind's outliers: that kind's own detector deals with them
        measured = sum(a[1] for a in agreeing)
        expected_sum = sum(a[2] for a in agreeing)
        self.changes += 1
        return measured / expected_sum if expected_sum > 0 else None


class KindState(BaseModel):
    """One (kind, class)'s evidence, as kept across restarts (its change detector's run is not)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    kind: str
    cls: str
    weight: float = Field(ge=0)
    total: float = Field(ge=0)
    updated: float
    observations: int = Field(ge=0)
    last_alpha: float | None = Field(ge=0, le=1)
    last_p: float = Field(ge=0, le=1)
    changes: int = Field(ge=0)


class EstimatesState(BaseModel):
    """:class:`AlphaEstimates`' learning, as kept across restarts."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    prior: tuple[float, float, float, float, float, float, float, float]  # PriorModel's fields in order
    prior_at: float
    kinds: list[KindState]
    shifts: int = Field(ge=0)
    now: float  # the estimates' clock when they were saved


@dataclass
class AlphaEstimates:
    half_life_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    prior: PriorModel = field(default_factory=PriorModel)
    kinds: dict[tuple[str, str], KindEstimate] = field(default_factory=dict)
    shift: ShiftDetector = field(default_factory=ShiftDetector)
    _prior_at: float = 0.0

    def alpha(self, kind: str, cls: str, p_structured: float) -> float:
        """The alpha to expect for a request of this kind, class and classifier probability."""
        prior = self.prior(p_structured)
        est = self.kinds.get((kind, cls))
        if est is None:
            return prior
        est.decay(self.clock(), self.half_life_s)
        return est.mean(prior)

    def observe(self, kind: str, cls: str, p_structured: float, alpha: float, trials: float) -> float:
        """Record one request's measured alpha; returns the kind's new estimate."""
        now = self.clock()
        w = min(1.0, trials / FULL_TRIALS)
        if w <= 0:
            return self.alpha(kind, cls, p_structured)
        known = self.kinds.get((kind, cls))
        settled = known is not None and known.settled
        ratio = self.shift.add(kind, alpha, self.alpha(kind, cls, p_structured), w, settled)
        if ratio is not None:
            self._rescale(ratio)
        if now > self._prior_at:
            self.prior.decay(0.5 ** ((now - self._prior_at) / self.half_life_s))
            self._prior_at = now
        self.prior.add(p_structured, alpha / self.prior.scale, w)
        est = self.kinds.get((kind, cls))
        if est is None:
            est = self.kinds[(kind, cls)] = KindEstimate(updated=now)
        est.decay(now, self.half_life_s)
        prior = self.prior(p_structured)
        est.add(alpha, w, prior, p_structured)
        return est.mean(prior)

    def _rescale(self, ratio: float) -> None:
        """A pool-wide shift: move the prior and every kind's evidence by the ratio it revealed."""
        self.prior.scale = min(
            1.0 / max(self.prior.a + self.prior.b, 1e-6), max(0.05, self.prior.scale * ratio)
        )
        for est in self.kinds.values():
            if est.weight > 0:
                est.total = min(0.99 * est.weight, est.total * ratio)

    def state(self) -> EstimatesState:
        """What these estimates have learned (``gateway.routing.learned`` keeps it on disk)."""
        p = self.prior
        return EstimatesState(
            prior=(p.sw, p.sp, p.spp, p.sa, p.spa, p.a, p.b, p.scale),
            prior_at=self._prior_at,
            kinds=[
                KindState(
                    kind=kind,
                    cls=cls,
                    weight=e.weight,
                    total=e.total,
                    updated=e.updated,
                    observations=e.observations,
                    last_alpha=e.last_alpha,
                    last_p=e.last_p,
                    changes=e.changes,
                )
                for (kind, cls), e in self.kinds.items()
            ],
            shifts=self.shift.changes,
            now=self.clock(),
        )

    def restore(self, state: EstimatesState, down_s: float) -> None:
        """Take up a :meth:`state` saved ``down_s`` seconds ago: the evidence decays over that time."""
        moved = self.clock() - state.now - down_s
        self.prior = PriorModel(*state.prior)
        self._prior_at = state.prior_at + moved
        self.kinds = {
            (k.kind, k.cls): KindEstimate(
                weight=k.weight,
                total=k.total,
                updated=k.updated + moved,
                observations=k.observations,
                last_alpha=k.last_alpha,
                last_p=k.last_p,
                changes=k.changes,
            )
            for k in state.kinds
        }
        self.shift = ShiftDetector(changes=state.shifts)

    def snapshot(self) -> dict[str, Any]:
        now = self.clock()
        out: dict[str, Any] = {
            "prior": {
                "a": round(self.prior.a, 4),
                "b": round(self.prior.b, 4),
                "scale": round(self.prior.scale, 4),
            },
            "pool_shifts_detected": self.shift.changes,
            "half_life_s": self.half_life_s,
            "kinds": [],
        }
        for (kind, cls), est in sorted(self.kinds.items()):
            est.decay(now, self.half_life_s)
            out["kinds"].append(
                {
                    "kind": kind,
                    "class": cls,
                    "alpha": round(est.mean(self.prior(est.last_p)), 4),
                    "evidence": round(est.weight, 3),
                    "observations": est.observations,
                    "last_alpha": None if est.last_alpha is None else round(est.last_alpha, 4),
                    "changes_detected": est.changes,
                    "p_structured": round(est.last_p, 4),
                }
            )
        return out
