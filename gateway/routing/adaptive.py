"""The routing policy: classify, predict the speedup, pick the pool; learn from every outcome.

One policy serves every strategy, so estimates, the speedup model and ``/admin/routing`` stay live
whichever is selected; the strategy only changes the final choice:

- ``adaptive``: speculative when the predicted TPOT gain exceeds the margin at the pools'
  current batches; when the speculative pool queues (or baseline does) the marginal request goes
  to the other pool. A request predicted for baseline still goes to speculative (reason
  ``explore``) when a draw from the acceptance model's posterior predicts a gain (Thompson
  sampling: requests whose acceptance is uncertain get measured, well-known ones do not), or with
  probability ``routing.exploration_rate`` (a floor). Only requests predicted for baseline are
  explored: acceptance is measured on the speculative pool alone, so sending a request to
  baseline would teach nothing. The margin guards against a wrong prediction, so it shrinks with
  the prediction's uncertainty: ``margin · max(0.2, sd / prior sd)``.
  With ``routing.acceptance_model: per-kind`` the older behaviour holds: one decayed mean per
  (kind, class) and a fixed ``exploration_rate``;
- ``classifier``: speculative exactly when the classifier says "structured";
- ``always-speculative`` / ``always-baseline``: fixed pool.

Reasons (``x-specroute-reason``): ``predicted-gain``, ``no-gain``, ``spec-busy`` (a gain at an idle
pool, a loss at the current batch), ``spec-queued``, ``baseline-queued``, ``explore``, ``forced``,
``classifier-<label>``, ``always-<pool>``.

Load per endpoint is the larger of the gateway's own in-flight count (always fresh) and vLLM's
running + waiting from the last scrape (sees other clients); the pool's batch is that of its
least loaded endpoint, where the next request will go. An endpoint queues when vLLM reports
waiting requests or the in-flight count reaches the batch capacity seen while it queued before.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from gateway.config import PoolName, RoutingConfig, Strategy
from gateway.observability import Metrics
from gateway.routing.alpha_model import AlphaModel, AlphaPrediction, logit
from gateway.routing.estimates import AlphaEstimates
from gateway.routing.features import extract
from gateway.routing.outliers import OutlierDetector
from gateway.routing.policy import Classifier, Decision, Feedback, Outcome, RouteRequest
from gateway.routing.speedup import SpeedupModel
from gateway.speculation import Measured
from gateway.upstream.pool import Pool
from gateway.upstream.scrape import Scraper

STALE_SCRAPES = 3  # scraped gauges older than this many intervals are ignored
MARGIN_FLOOR = 0.2  # the share of the margin that stays however well a request's acceptance is known


@dataclass(frozen=True, slots=True)
class PoolLoad:
    batch: float  # requests running on the least loaded endpoint once this one joins
    queued: bool
    available: bool


@dataclass
class AdaptivePolicy:
    strategy: Strategy
    classifier: Classifier
    routing: RoutingConfig
    pools: dict[PoolName, Pool]
    scraper: Scraper | None = None
    metrics: Metrics | None = None
    model: SpeedupModel = field(default_factory=SpeedupModel)
    estimates: AlphaEstimates = field(default_factory=AlphaEstimates)
    alpha_model: AlphaModel = field(default_factory=AlphaModel)
    outliers: OutlierDetector | None = None
    counts: Counter[str] = field(default_factory=Counter)
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if self.outliers is None:
            self.outliers = OutlierDetector(self.pools["speculative"])

    @classmethod
    def build(
        cls,
        strategy: Strategy,
        classifier: Classifier,
        routing: RoutingConfig,
        pools: dict[PoolName, Pool],
        scraper: Scraper | None = None,
        metrics: Metrics | None = None,
    ) -> AdaptivePolicy:
        spec = pools["speculative"]
        model = SpeedupModel(
            k=spec.num_speculative_tokens or 7,
            c=spec.draft_cost_ratio if spec.draft_cost_ratio is not None else 0.05,
        )
        return cls(
            strategy,
            classifier,
            routing,
            pools,
            scraper,
            metrics,
            model,
            AlphaEstimates(routing.half_life_s),
            AlphaModel(routing.acceptance_half_life_s),
            rng=random.Random(routing.seed),
        )

    # -- deciding --------------------------------------------------------------------------------
    def decide(self, request: RouteRequest) -> Decision:
        t0 = perf_counter()
        pred = self.classifier.predict(request.body)
        if self.metrics is not None:
            self.metrics.classifier_latency.observe(perf_counter() - t0)
        label, p, kind = pred.label, pred.p_structured, pred.kind
        if request.forced_pool is not None:
            return self._count(Decision(request.forced_pool, label, "forced", p, kind))
        self._sync_k()
        per_request = self.routing.acceptance_model == "per-request"
        features = prediction = None
        sd_share = 1.0
        if per_request:
            features = extract(request.body, kind, p)
            prediction = self.alpha_model.predict(features, p)
            alpha = prediction.alpha
            sd_share = max(MARGIN_FLOOR, min(1.0, prediction.sd_share))
        else:
            alpha = self.estimates.alpha(kind, label, p)
        spec, base = self.load("speculative"), self.load("baseline")
        speedup = self.model.speedup(alpha, spec.batch, base.batch)
        gain = 1.0 + self.routing.margin * sd_share
        strategy = self.strategy
        pool: PoolName
        explore = False
        if strategy is Strategy.ALWAYS_SPECULATIVE:
            pool, reason = "speculative", strategy.value
        elif strategy is Strategy.ALWAYS_BASELINE:
            pool, reason = "baseline", strategy.value
        elif strategy is Strategy.CLASSIFIER:
            pool = "speculative" if label == "structured" else "baseline"
            reason = f"classifier-{label}"
        elif not spec.available or (spec.queued and not base.queued and base.available):
            pool, reason = "baseline", "spec-queued"
        elif not base.available or (base.queued and not spec.queued):
            pool, reason = "speculative", "baseline-queued"
        elif speedup > gain:
            pool, reason = "speculative", "predicted-gain"
        elif self._explore(prediction, spec.batch, base.batch, gain):
            pool, reason, explore = "speculative", "explore", True
        else:
            pool = "baseline"
            idle = self.model.speedup(alpha, 1.0, base.batch)
            reason = "spec-busy" if idle > gain else "no-gain"
        batch = spec.batch if pool == "speculative" else base.batch
        return self._count(
            Decision(
                pool=pool,
                prompt_class=label,
                reason=reason,
                p_structured=p,
                kind=kind,
                predicted_speedup=speedup,
                explore=explore,
                alpha=alpha,
                batch=batch,
                spec_batch=spec.batch,
                base_batch=base.batch,
                alpha_sd=prediction.sd if prediction is not None else None,
                features=features,
                prediction=prediction,
            )
        )

    def _explore(
        self, prediction: AlphaPrediction | None, spec_batch: float, base_batch: float, gain: float
    ) -> bool:
        """Thompson sampling on the predicted speedup, over the exploration-rate floor."""
        rate = self.routing.exploration_rate
        if rate and self.rng.random() < rate:
            return True
        if prediction is None:
            return False
        return self.model.speedup(prediction.sample(self.rng), spec_batch, base_batch) > gain

    def _count(self, decision: Decision) -> Decision:
        self.counts[decision.reason] += 1
        return decision

    def load(self, pool: PoolName) -> PoolLoad:
        now = time.monotonic()
        stale = STALE_SCRAPES * self.routing.scrape_interval_s
        best: tuple[bool, float] | None = None
        for ep in self.pools[pool].endpoints:
            if not ep.available(now):
                continue
            load, queued = float(ep.outstanding), False
            scraped = self.scraper.load(ep, stale, now) if self.scraper is not None else None
            cap = None
            if scraped is not None:
                if scraped.in_engine is not None:
                    load = max(load, scraped.in_engine)
                queued = scraped.queued
                cap = scraped.capacity
            if cap is not None:
                queued = queued or load >= cap
                load = min(load, cap - 1)
            key = (queued, load)
            if best is None or key < best:
                best = key
        if best is None:
            return PoolLoad(1.0, True, False)
        return PoolLoad(best[1] + 1.0, best[0], True)

    def _sync_k(self) -> None:
        """Take k from the speculative endpoints' counters when configuration does not give it."""
        if self.pools["speculative"].num_speculative_tokens or self.scraper is None:
            return
        for ep in self.pools["speculative"].endpoints:
            k = self.scraper.drafts(ep)
            if k:
                self.model.k = k
                return

    # -- learning --------------------------------------------------------------------------------
    def observe(self, outcome: Outcome) -> Feedback | None:
        if outcome.status >= 300:
            return None
        d = outcome.decision
        tpot = None
        tokens = outcome.completion_tokens
        if outcome.ttft_s is not None and tokens and tokens > 1:
            tpot = (outcome.e2e_s - outcome.ttft_s) / (tokens - 1)
        batch = self._lifetime_batch(outcome)
        if outcome.pool != "speculative":
            if tpot is not None and batch is not None:
                self.model.observe_baseline(tpot, batch)
            return None
        if outcome.accepted_tokens is None or not outcome.steps or not outcome.draft_tokens:
            return None
        k = round(outcome.draft_tokens / outcome.steps)
        m = Measured(outcome.accepted_tokens, outcome.steps, k, "stream")
        alpha = m.alpha
        trials = m.trials
        if self._judge_endpoint(outcome.endpoint, alpha, d.alpha):
            # a demoted endpoint's acceptance says nothing about the requests: only about it
            return Feedback(alpha, d.alpha, self._measured_speedup(d, alpha, k))
        est = self.estimates.observe(d.kind, d.prompt_class, d.p_structured, alpha, trials)
        if self.metrics is not None:
            self.metrics.alpha_estimate.labels(d.kind).set(est)
        predicted = d.alpha
        if d.features is not None:
            before = self.alpha_model.observe(d.features, d.p_structured, alpha, trials, d.prediction)
            if before is not None:
                predicted = before.alpha
        if self.metrics is not None and predicted is not None:
            self.metrics.acceptance_prediction_error.labels(d.prompt_class).observe(alpha - predicted)
        if tpot is not None and batch is not None and k == self.model.k:
            self.model.observe_speculative(tpot, batch, alpha)
        return Feedback(alpha, predicted, self._measured_speedup(d, alpha, k))

    def _measured_speedup(self, d: Decision, alpha: float, k: int) -> float | None:
        if d.spec_batch is None or d.base_batch is None or k != self.model.k:
            return None
        return self.model.speedup(alpha, d.spec_batch, d.base_batch)

    def _judge_endpoint(self, endpoint: str, alpha: float, predicted: float | None) -> bool:
        """Feed the outlier detector; True when the endpoint is (now) demoted."""
        assert self.outliers is not None
        if predicted is not None:
            changed = self.outliers.observe(endpoint, logit(alpha) - logit(predicted))
            if changed is not None and self.metrics is not None:
                self.metrics.endpoint_acceptance_outlier.labels(changed.pool, changed.name).set(
                    1.0 if changed.demoted else 0.0
                )
        return self.outliers.is_demoted(endpoint)

    def _lifetime_batch(self, outcome: Outcome) -> float | None:
        """Mean of the batch expected at the decision and the one left at the end."""
        d = outcome.decision
        if d.batch is None or outcome.pool != d.pool:
            return None
        end = next(
            (e.outstanding + 1 for e in self.pools[outcome.pool].endpoints if e.name == outcome.endpoint),
            None,
        )
        return d.batch if end is None else (d.batch + end) / 2

    # -- explaining --------------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        loads = {name: self.load(name) for name in self.pools}
        margin = self.routing.margin
        spec, base = loads["speculative"], loads["baseline"]
        return {
            "strategy": self.strategy.value,
            "margin": margin,
            "exploration_rate": self.routing.exploration_rate,
            "acceptance_model": self.routing.acceptance_model,
            "classifier": type(self.classifier).__module__ + "." + type(self.classifier).__name__,
            "estimates": self.estimates.snapshot(),
            "per_request_model": self.alpha_model.snapshot(),
            "endpoint_outliers": self.outliers.snapshot() if self.outliers is not None else [],
            "speedup_model": {
                **self.model.snapshot(),
                "breakeven_alpha_idle": round(self.model.breakeven_alpha(1.0, 1.0, 1.0 + margin), 4),
                "breakeven_alpha_now": round(
                    self.model.breakeven_alpha(spec.batch, base.batch, 1.0 + margin), 4
                ),
            },
            "pools": {
                name: {"batch": ld.batch, "queued": ld.queued, "available": ld.available}
                for name, ld in loads.items()
            },
            "endpoints": self.scraper.snapshots() if self.scraper else [],
            "decisions": dict(self.counts),
        }
