"""One speculative endpoint whose acceptance collapses while its peers' does not leaves the rotation.

A bad draft model deployed on one replica makes every request sent there slower than on baseline,
yet the pool's acceptance, averaged over all replicas, moves only by that replica's share. The
gateway measures each request's acceptance and knows the endpoint that served it, so it compares
endpoints on the same footing: each request's residual, its logit alpha as its measured draws move it
from the predicted one (:func:`residual`; the prediction accounts for the prompt, so endpoints that
happen to get harder prompts are not blamed, and a short answer of a few drafts moves it little),
averaged per endpoint with exponential weights.

An endpoint whose mean residual falls ``OUTLIER_LOGIT`` below the median of its peers' (with at
least ``MIN_OBSERVATIONS`` measurements each) is *demoted*: the pool's picker skips it while a
peer is available, except for a probe share (``Pool.pick``), so its acceptance keeps being measured
and its return is noticed once its residual comes back within half the threshold. The requests it
serves meanwhile do not teach the acceptance model (they would pull every prediction down).

A pool of one endpoint has no peers; the pool-wide change detector handles that case.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from gateway.routing.alpha_model import logit, posterior_mode
from gateway.upstream.pool import Endpoint, Pool

OUTLIER_LOGIT = 1.0  # below the peers' median by this much (logit alpha) is an outlier ...
RECOVER_LOGIT = 0.5  # ... and back within this much is recovered
RATE = 0.15  # weight of one request in an endpoint's running mean residual
MIN_OBSERVATIONS = 5  # measurements an endpoint needs before it is compared
# how far (variance, logit units) a request's own acceptance may stray from its prediction before its
# draws say so: wide, so that a request with many drafts counts nearly at its measured logit
RESIDUAL_VAR = 1.0


def residual(alpha: float, trials: float, predicted: float) -> float:
    """How far one measured request puts its endpoint from the prediction, in logit units.

    Not the logit of the measured proportion itself: a short answer shows a few drafts, all accepted or
    none, so that logit sits at the clip (±4.6), and a running mean of such jumps put identical endpoints
    1.0 below their peers' median often enough to demote them (answers of 3 to 8 tokens: a tenth of the
    time or more; 8 to 16 tokens: a few percent). Moved from the prediction by the binomial likelihood of
    its draws, a residual goes as far as they say: nearly to the measured logit for a long request, a
    little way for a few drafts.
    """
    mean = logit(predicted)
    return posterior_mode(alpha, trials, mean, RESIDUAL_VAR) - mean


@dataclass(slots=True)
class EndpointResidual:
    mean: float = 0.0
    n: int = 0

    def add(self, r: float) -> None:
        self.n += 1
        self.mean += max(RATE, 1.0 / self.n) * (r - self.mean)


@dataclass
class OutlierDetector:
    pool: Pool
    residuals: dict[str, EndpointResidual] = field(default_factory=dict)
    demotions: int = 0

    def observe(self, endpoint: str, residual: float) -> Endpoint | None:
        """Record one request's residual; returns the endpoint whose state changed, if any."""
        if not math.isfinite(residual):
            return None
        self.residuals.setdefault(endpoint, EndpointResidual()).add(residual)
        if len(self.residuals) > len(self.pool.endpoints):
            # discovery removed some: drop theirs, or pod churn would grow this for the process's life
            names = {e.name for e in self.pool.endpoints}
            self.residuals = {name: r for name, r in self.residuals.items() if name in names}
        return self._judge(endpoint)

    def forget(self, endpoint: str) -> Endpoint | None:
        """Start an endpoint's record afresh (its server restarted); returns it when that readmits it."""
        self.residuals.pop(endpoint, None)
        ep = self._endpoint(endpoint)
        if ep is not None and ep.demoted:
            ep.demoted = False
            return ep
        return None

    def is_demoted(self, endpoint: str) -> bool:
        ep = self._endpoint(endpoint)
        return ep is not None and ep.demoted

    def _endpoint(self, name: str) -> Endpoint | None:
        return next((e for e in self.pool.endpoints if e.name == name), None)

    def _judge(self, name: str) -> Endpoint | None:
        ep = self._endpoint(name)
        own = self.residuals[name]
        if ep is None or own.n < MIN_OBSERVATIONS:
            return None
        peers = sorted(
            r.mean
            for e in self.pool.endpoints
            if e.name != name and (r := self.residuals.get(e.name)) is not None and r.n >= MIN_OBSERVATIONS
        )
        if not peers:
            return None
        mid = len(peers) // 2
        median = peers[mid] if len(peers) % 2 else (peers[mid - 1] + peers[mid]) / 2
        gap = median - own.mean
        if not ep.demoted and gap > OUTLIER_LOGIT:
            ep.demoted = True
            self.demotions += 1
            return ep
        if ep.demoted and gap < RECOVER_LOGIT:
            ep.demoted = False
            return ep
        return None

    def snapshot(self) -> list[dict[str, Any]]:
        return [
            {
                "endpoint": e.name,
                "demoted": e.demoted,
                "mean_residual_logit": round(r.mean, 4) if (r := self.residuals.get(e.name)) else None,
                "observations": r.n if r else 0,
            }
            for e in self.pool.endpoints
        ]
