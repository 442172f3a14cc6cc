"""The routing policy: classify, predict the speedup, pick the pool; learn from every outcome.

One policy serves every strategy, so estimates, the speedup model and ``/admin/routing`` stay live
whichever is selected; the strategy only changes the final choice:

- ``adaptive``: speculative when the predicted gain in the time to finish the request exceeds the
  margin: the wait for a seat on each pool plus its output tokens at that pool's TPOT at its current
  batch. Without queues this is the TPOT ratio; when a pool queues, the wait counts, so a request goes
  to the other pool only when its own slower decoding there costs less than the wait (a queued baseline
  pool no longer sends prose to a full speculative pool, where each step verifies k + 1 tokens per
  request to emit little more than one). A request predicted for baseline still goes to speculative
  (reason ``explore``) when measuring it is worth what it may lose there. Over the acceptance it may
  have (the model's belief, widened by how much larger its residuals run than its variance says and by
  its kind's heterogeneity for words never measured), it gains the mean relative TPOT gain ``u`` now,
  and its measurement lets ``routing.exploration_horizon`` later requests like it gain ``u`` where it
  clears the margin (the mean over the acceptances whose speedup exceeds ``1 + margin``, 0 for the
  others): it is explored when that future gain is positive and the sum is too. A measurement whose
  every outcome leaves the decision where it is has nothing to win, whatever ``u`` is (a useless draft
  timed as cheap as a target step: every acceptance predicts a gain within the margin, and each request
  was sent to be measured). Uncertain requests get measured, well-known ones do not, and a dear draft,
  whose losers lose more than its winners win, is explored less (Thompson sampling, which explored as
  often as a draw reached break-even, spent more on the losers' measurements at a draft costing 0.2 of a
  step than the winners' returned). With probability ``routing.exploration_rate`` (a floor, against a
  model that is sure and wrong: a draft that fell and recovered, or was replaced) a request is measured
  when some acceptance the prior's belief gives it clears the margin (what the draw finds holds for
  every later request like it, which only the floor measures again), and outright where by the learned
  draft cost no acceptance would pay. While a pool queues, a draw from the belief decides instead
  (Thompson sampling on the time to finish), and the floor explores outright. Acceptance is measured on
  the speculative pool alone, so sending a request predicted for speculative to baseline would teach
  nothing about acceptance; it does time baseline's step, by which the speedup model measures the
  draft's cost, so while fewer baseline requests have timed it than ``STEP_WINDOW`` and than a quarter
  of the speculative ones, a streamed request predicted for speculative goes to baseline at the
  exploration rate (reason ``explore`` too). The margin guards against a wrong prediction, so it shrinks
  with the prediction's uncertainty: ``margin · max(0.2, sd / prior sd)``. With
  ``routing.acceptance_model: per-kind`` the older behaviour holds: one decayed mean per (kind, class)
  and a fixed ``exploration_rate``;
- ``classifier``: speculative exactly when the classifier says "structured";
- ``always-speculative`` / ``always-baseline``: fixed pool.

Reasons (``x-specroute-reason``): ``predicted-gain``, ``no-gain``, ``spec-busy`` (a gain at an idle pool, a
loss at the current batch), ``spec-queued``, ``baseline-queued``, ``spec-unavailable`` /
``baseline-unavailable`` (no endpoint of that pool is up, or only demoted ones), ``explore``, ``forced``,
``affinity`` (the pool of the endpoint that holds the stored response a Responses request continues),
``classifier-<label>``, ``always-<pool>``, ``spec-unsupported`` (a request the speculative pool's vLLM
refuses: ``min_p`` > 0 when not greedy, or a ``logit_bias``; under every strategy, and never failed over to
that pool).

Load per endpoint is the larger of the gateway's own in-flight count (always fresh) and vLLM's
running + waiting from the last scrape (sees other clients); the pool's batch is that of its
least loaded endpoint, where the next request will go (one demoted for its acceptance, which gets
probes only, while another is up), per engine of a data-parallel server (each engine steps its own
share of the requests). An endpoint queues when vLLM reports
waiting requests or the in-flight count reaches the batch capacity seen while it queued before.

The wait for a seat on a full endpoint is ``ahead · residence / capacity`` (Little's law): the
requests that must finish before this one is admitted, each seat freeing once per mean residence
time of that pool's requests (time from first token to last, learned per pool from outcomes). A
request's output length is its ``max_tokens`` when it sets one below the running mean of
completion tokens, else that mean. Requests are counted ahead only while the scrapes show a queue
(waiting at two in a row, until two in a row see none, or at one behind a batch at its capacity);
a queue whose wait cannot be timed (mostly other clients' requests, or none of the gateway's own
finished on that pool yet) is avoided outright, as every queue was before waits were weighed.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from time import perf_counter
from typing import Annotated, Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from gateway.config import PoolName, RoutingConfig, Strategy
from gateway.observability import HistogramChild, Metrics
from gateway.routing.alpha_model import AlphaModel, AlphaPrediction, AlphaState
from gateway.routing.estimates import AlphaEstimates, EstimatesState
from gateway.routing.features import extract
from gateway.routing.outliers import OutlierDetector, residual
from gateway.routing.policy import Classifier, Decision, Feedback, Outcome, RouteRequest
from gateway.routing.speedup import STEP_WINDOW, SpeedupModel, SpeedupState
from gateway.speculation import Measured, alpha_from_length, refused_by_speculation
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import STALE_SCRAPES, Scraper

log = logging.getLogger("specroute.routing")

MARGIN_FLOOR = 0.2  # the share of the margin that stays however well a request's acceptance is known
RESIDENCE_RATE = 0.05  # weight of one request in a pool's running mean residence time
DEFAULT_TOKENS = 256.0  # output tokens expected before any request has finished
SPEC_REFUSED = "spec-unsupported"  # the reason of a request only the baseline pool can serve
TIMING_SHARE = 0.25  # baseline is timed on purpose while its timings are under this share of speculation's


class PoolLoad(NamedTuple):
    """A pool's load as a decision sees it (a named tuple: two are made per decision, at a third of
    the cost of a frozen dataclass)."""

    batch: float  # requests running on the least loaded endpoint once this one joins (per engine)
    queued: bool
    available: bool
    ahead: float = 0.0  # requests that must leave that endpoint before this one gets a seat
    seats: float | None = None  # its batch capacity, when a queue has revealed it
    own: bool = True  # the gateway's own requests are at least half of that endpoint's load


class PolicyState(BaseModel):
    """What an :class:`AdaptivePolicy` has learned, as kept across restarts (``gateway.routing.learned``).

    Load, in-flight counts, the outlier detector's view of each endpoint and the decision counters are
    the running process's, not learning: a restarted gateway reads them afresh.
    """

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    acceptance: AlphaState
    estimates: EstimatesState
    speedup: SpeedupState
    residence_s: dict[PoolName, Annotated[float, Field(ge=0)]]
    mean_tokens: float = Field(ge=0)
    finished: int = Field(ge=0)

    @property
    def evidence(self) -> int:
        """How many measurements it was learned from: a count that only grows while a gateway runs
        (with several workers, the worker that served more has the larger one)."""
        speedup = self.speedup
        return self.acceptance.updates + speedup.base_observations + speedup.spec_observations + self.finished


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
    # running means from outcomes: seconds from first to last token per pool, completion tokens
    residence_s: dict[PoolName, float] = field(default_factory=dict)
    mean_tokens: float = DEFAULT_TOKENS
    _finished: int = 0
    _scrape_round: int = 0  # the scraper's round last read
    _base_histogram: bool = False  # a baseline server's page has the inter-token histogram
    # baseline endpoints whose pages have speculative decoding's counters: their steps time no baseline
    _drafting_baseline: set[str] = field(default_factory=set)
    # per kind of prompt, the one speculative endpoint that served it so far, or None once two have: an
    # endpoint's residuals count only on kinds its peers served too (see _judge_endpoint)
    _kind_served: dict[str, str | None] = field(default_factory=dict)
    _restarts: dict[str, int] = field(default_factory=dict)  # per speculative endpoint, as last read
    # what every decision reads, read once from the (frozen) routing settings: each attribute of a
    # pydantic model goes through its __getattr__ hook, some 500 instructions
    _per_request: bool = field(init=False)
    _margin: float = field(init=False)
    _horizon: float = field(init=False)
    _stale_s: float = field(init=False)
    _classifier_latency: HistogramChild | None = field(init=False)  # its one series, looked up once

    def __post_init__(self) -> None:
        self._per_request = self.routing.acceptance_model == "per-request"
        self._margin = self.routing.margin
        self._horizon = self.routing.exploration_horizon
        self._stale_s = STALE_SCRAPES * self.routing.scrape_interval_s
        metrics = self.metrics
        self._classifier_latency = None if metrics is None else metrics.child(metrics.classifier_latency)
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
        if self._classifier_latency is not None:
            self._classifier_latency.observe(perf_counter() - t0)
        label, p, kind = pred.label, pred.p_structured, pred.kind
        if request.forced_pool is not None:
            return self._count(Decision(request.forced_pool, label, request.forced_reason, p, kind))
        if refused_by_speculation(request.body) is not None:
            # the speculative pool's vLLM would answer it with a 400, whatever the strategy
            return self._count(Decision("baseline", label, SPEC_REFUSED, p, kind, baseline_only=True))
        scraper = self.scraper
        if scraper is not None and scraper.rounds != self._scrape_round:
            self._after_scrape(scraper)
        per_request = self._per_request
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
        tpot_spec = self.model.tpot_speculative(alpha, spec.batch)
        tpot_base = self.model.tpot_baseline(base.batch)
        speedup = tpot_base / tpot_spec
        gain = 1.0 + self._margin * sd_share
        strategy = self.strategy
        pool: PoolName
        explore = False
        if strategy is Strategy.ALWAYS_SPECULATIVE:
            pool, reason = "speculative", strategy._value_  # no Enum.value descriptor call
        elif strategy is Strategy.ALWAYS_BASELINE:
            pool, reason = "baseline", strategy._value_
        elif strategy is Strategy.CLASSIFIER:
            pool = "speculative" if label == "structured" else "baseline"
            reason = f"classifier-{label}"
        elif not spec.available:  # no endpoint of it is up: nothing to weigh
            pool, reason = "baseline", "spec-unavailable"
        elif not base.available:
            pool, reason = "speculative", "baseline-unavailable"
        else:
            queues = spec.ahead > 0 or base.ahead > 0
            tokens = self._tokens(request.body) if queues else 0.0
            finish = self._finish_gain(tpot_spec, tpot_base, spec, base, tokens) if queues else speedup
            if finish > gain:
                pool = "speculative"
                reason = "predicted-gain" if speedup > gain else "baseline-queued"
                if reason == "predicted-gain" and not base.ahead and self._time_baseline(request.body):
                    pool, reason, explore = "baseline", "explore", True
            elif self._explore(prediction, spec, base, tpot_base, tokens, gain):
                pool, reason, explore = "speculative", "explore", True
            else:
                pool = "baseline"
                if speedup > gain:
                    reason = "spec-queued"
                else:
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
        self,
        prediction: AlphaPrediction | None,
        spec: PoolLoad,
        base: PoolLoad,
        tpot_base: float,
        tokens: float,
        gain: float,
    ) -> bool:
        """Send a request predicted for baseline to speculative, to be measured?

        Without queues, :meth:`_worth_measuring` decides, over the posterior; on the exploration-rate
        floor's draws, whether any acceptance by the prior's belief clears the margin (outright where by
        the learned draft cost no acceptance at all would pay: then the cost is what is in question).
        While a pool queues, Thompson sampling on the time to finish does, over the floor. The floor does
        not draw while the speculative pool has a line: a request sent there to be measured would wait its
        turn behind it (seconds, for a full batch of long answers), a cost the client pays for a
        measurement the next request after the line clears gives for free. The draw from the posterior
        weighs that wait like any decision does.
        """
        rate = self.routing.exploration_rate
        floor = bool(rate) and spec.ahead <= 0 and self.rng.random() < rate
        if prediction is None:
            return floor
        widen = self.alpha_model.spread
        if spec.ahead <= 0 and base.ahead <= 0:
            if floor and self.model.tpot_speculative(1.0, spec.batch) >= tpot_base:
                # by the learned draft cost not even a draft that is always right pays: the verdict
                # rests on the cost, which only requests sent there measure again (a draft redeployed
                # cheaper, step times taken on a cold or busy server), so the floor explores outright
                return True
            if floor:
                # the floor's draw asks what if what was measured no longer held (a draft that
                # recovered, or was replaced): the prior's belief, which the measurements since do not
                # move. What it finds holds for every later request like it, which only the floor's
                # draws would measure again, so it is worth its cost wherever it can change a decision
                return self._clears_margin(prediction.prior_quantiles(widen), spec.batch, tpot_base, gain)
            return self._worth_measuring(prediction.quantiles(widen), spec.batch, tpot_base, gain)
        if floor:
            return True
        alpha = prediction.sample(self.rng, widen)
        tpot_spec = self.model.tpot_speculative(alpha, spec.batch)
        if spec.ahead > 0 or base.ahead > 0:
            return self._finish_gain(tpot_spec, tpot_base, spec, base, tokens) > gain
        return tpot_base / tpot_spec > gain

    def _worth_measuring(
        self, alphas: tuple[float, ...], spec_batch: float, tpot_base: float, gain: float
    ) -> bool:
        """Is measuring this request on speculative worth what it may lose there?

        ``alphas`` are equally likely values of its acceptance. Sent there, it gains the mean relative
        TPOT gain ``u`` over them (a loss where they lie under break-even); measured, its acceptance
        becomes known, and each of the ``exploration_horizon`` later requests like it goes to
        speculative where its speedup clears ``gain`` (the margin the decision asks of it) and gains
        ``u`` there: the mean over all of them of that ``u`` or 0. Thompson sampling weighed neither
        size: it measured a request as often as a draw reached break-even, and at a draft costing 0.2
        of a step a data format prompt at alpha 0.15 loses half its speed there while fiction at 0.65
        gains 13 %: the losers' measurements cost more than the winners', which were seldom drawn,
        returned. Where no value clears the margin the measurement cannot change where later requests
        go, and it is not made, even when ``u`` is positive throughout: a useless draft whose steps
        timed as cheap as the target's, at 9 % gain by every acceptance, had every request measured.
        """
        tpot = self.model.tpot_speculative
        clears = 1.0 - 1.0 / gain  # the relative TPOT gain of a speedup equal to ``gain``
        now = future = 0.0
        for a in alphas:
            u = 1.0 - tpot(a, spec_batch) / tpot_base
            now += u
            if u > clears:
                future += u
        return future > 0.0 and now + self._horizon * future > 0.0

    def _clears_margin(
        self, alphas: tuple[float, ...], spec_batch: float, tpot_base: float, gain: float
    ) -> bool:
        """Would any of ``alphas`` send a request like this one to speculative (a speedup over ``gain``)?"""
        tpot_spec = self.model.tpot_speculative(max(alphas), spec_batch)
        return tpot_base / tpot_spec > gain

    def _time_baseline(self, body: Mapping[str, Any]) -> bool:
        """Send a request predicted for speculative to baseline, to time baseline's step?

        The speedup model measures the draft's cost in units of baseline's step time, and only
        baseline requests time it. A gateway that believes speculation pays sends none there, so a
        step time timed wrong by the first few (a cold server is several times slower at first) would
        stay wrong for good: timed too slow, it makes speculation look free, and a draft that accepts
        nothing keeps all the traffic. So while fewer baseline timings than ``STEP_WINDOW``, and
        than a quarter of the speculative ones, have timed it, requests that will time a step go there
        at the exploration rate: streamed ones, and any once baseline's servers are seen to keep the
        inter-token histogram (their steps are timed at the next scrape). Traffic that sends baseline
        its share (prose) times it anyway and is never sent there for this.
        """
        rate = self.routing.exploration_rate
        model = self.model
        return (
            model.base_observations < min(STEP_WINDOW, TIMING_SHARE * model.spec_observations)
            and bool(rate)
            and (self._base_histogram or body.get("stream") is True)
            and self.rng.random() < rate
        )

    def _finish_gain(
        self, tpot_spec: float, tpot_base: float, spec: PoolLoad, base: PoolLoad, tokens: float
    ) -> float:
        """Predicted time to finish on baseline over that on speculative: the wait, then decoding.

        Called only when a pool queues; without a queue it would be the TPOT ratio, which is what
        the decision uses then (the output length cancels out).
        """
        wait_spec, wait_base = self._wait(spec, "speculative"), self._wait(base, "baseline")
        if math.isinf(wait_spec) and math.isinf(wait_base):
            return tpot_base / tpot_spec  # both queue for unknown times: decoding decides
        return (wait_base + tokens * tpot_base) / (wait_spec + tokens * tpot_spec)

    def _wait(self, load: PoolLoad, pool: PoolName) -> float:
        """Seconds until a seat frees for ``load.ahead`` requests ahead (Little's law).

        Infinite when the residence cannot be known: the gateway times only its own requests, so
        when other clients' requests fill most of a queued endpoint, or none of its own has finished
        there yet, the queue is avoided outright, as a queue always was before waits were weighed.
        """
        if load.ahead <= 0:
            return 0.0
        residence = self.residence_s.get(pool)
        if residence is None or not load.own or not load.seats:
            return math.inf
        return load.ahead * residence / load.seats

    def _tokens(self, body: Mapping[str, Any]) -> float:
        """Output tokens to expect: the running mean, or the request's own limit when lower."""
        # as vLLM's chat reads it: ``max_completion_tokens or max_tokens``
        limit = body.get("max_completion_tokens") or body.get("max_tokens")
        if isinstance(limit, int) and not isinstance(limit, bool) and 0 < limit < self.mean_tokens:
            return float(limit)
        return self.mean_tokens

    def _count(self, decision: Decision) -> Decision:
        self.counts[decision.reason] += 1
        return decision

    def load(self, pool: PoolName) -> PoolLoad:
        now = time.monotonic()
        stale = self._stale_s
        # a demoted endpoint gets probes only: the pool's load is that of the others while one is up
        best: tuple[bool, bool, float, float, float, bool, int] | None = None
        for ep in self.pools[pool].endpoints:
            if not ep.available(now):
                continue
            load, queued = float(ep.outstanding), False
            own = True
            scraped = self.scraper.load(ep, stale, now) if self.scraper is not None else None
            cap = None
            engines = 1
            if scraped is not None:
                engines = scraped.engines
                if scraped.in_engine is not None:
                    # split as at the scrape (others: what the engine held beyond the gateway's own then),
                    # not the live in-flight count against the page's: a batch that finished since the
                    # page would read as other clients' queue, whose wait cannot be timed
                    own = 2 * ep.others <= scraped.in_engine
                    load = max(load, scraped.in_engine)
                queued = scraped.queued
                cap = scraped.capacity
            ahead = 0.0
            if cap is not None:
                if queued:
                    # the in-flight count beyond the seats is the line; one at least (vLLM may hold
                    # requests back for KV cache below max_num_seqs). Only while the scrapes show a
                    # queue: a capacity learned from a passing wait at light load can be too small
                    ahead = max(1.0, load + 1.0 - cap)
                queued = queued or load >= cap
                load = min(load, cap - 1)
            key = (ep.demoted, queued, ahead, load, float(cap or 0), own, engines)
            if best is None or key < best:
                best = key
        if best is None or best[0]:
            # none up, or only demoted ones (a bad draft's replica whose peers are down): requests it
            # would get run slower there than on baseline, whatever the pool's model predicts
            return PoolLoad(1.0, True, False)
        _, queued, ahead, load, seats, own, engines = best
        # a data-parallel server's engines each step their own share of its requests
        return PoolLoad(load / engines + 1.0, queued, True, ahead, seats or None, own)

    def _after_scrape(self, scraper: Scraper) -> None:
        """Read a new scrape round: the speculative pool's k, and baseline's step times.

        Baseline's step time is its time per output token; streams time it per request, and the
        server's own histogram times it for every request, streamed or not, between two scrapes. Without
        it, a gateway whose clients never stream would keep the configured step time for good, and with
        it the draft's cost ``c``: a dear draft would look cheap, and speculation pay where it does not.
        """
        self._scrape_round = scraper.rounds
        self._sync_k()
        drafting: set[str] = set()
        for ep in self.pools["baseline"].endpoints:
            steps = scraper.take_steps(ep)
            if scraper.drafting(ep):  # a speculative server listed as baseline: not baseline's step
                drafting.add(ep.name)
                continue
            self._base_histogram = self._base_histogram or scraper.times_steps(ep)
            for step in steps:
                self.model.observe_baseline(step.seconds, step.batch)
        self._drafting_baseline = drafting
        if self.outliers is not None:
            for ep in self.pools["speculative"].endpoints:
                restarts = scraper.restarts(ep)
                if restarts != self._restarts.get(ep.name, 0):
                    # a restart is when a draft gets fixed (or replaced): what its old process showed no
                    # longer says anything of it (readmitted through probes alone, a fixed replica sat
                    # out some 230 requests)
                    self._restarts[ep.name] = restarts
                    readmitted = self.outliers.forget(ep.name)
                    self._outlier_changed(readmitted, "its server restarted, and it is judged afresh")

    def _sync_k(self) -> None:
        """Take k from the speculative endpoints' counters when configuration does not give it."""
        if self.pools["speculative"].num_speculative_tokens or self.scraper is None:
            return
        for ep in self.pools["speculative"].endpoints:
            k = self.scraper.drafts(ep)
            if k:
                self.model.use_k(k)
                return

    # -- learning --------------------------------------------------------------------------------
    def observe(self, outcome: Outcome) -> Feedback | None:
        if outcome.status >= 300:
            return None
        d = outcome.decision
        tpot = None
        tokens = outcome.completion_tokens
        if outcome.ttft_s is not None and tokens and tokens > 1 and outcome.sequences == 1:
            tpot = (outcome.e2e_s - outcome.ttft_s) / (tokens - 1)
            self._learn_residence(outcome.pool, outcome.e2e_s - outcome.ttft_s, tokens)
        # the batch is read only with a TPOT to learn from (non-streamed answers have none)
        batch = self._lifetime_batch(outcome) if tpot is not None else None
        if outcome.pool != "speculative":
            if tpot is not None and batch is not None and outcome.endpoint not in self._drafting_baseline:
                self.model.observe_baseline(tpot, batch)
            return None
        if outcome.accepted_tokens is None or not outcome.steps or not outcome.draft_tokens:
            return None
        k = round(outcome.draft_tokens / outcome.steps)
        m = Measured(outcome.accepted_tokens, outcome.steps, k, "stream", outcome.rejected_drafts)
        # what the access log shows: per position where a stream counted its rejections (its cut last
        # step read by its mean length made short outputs look like a weak draft)
        alpha = m.alpha
        trials = m.trials
        # what the model predicts now: the requests measured since the decision have moved it, and a
        # kind being learned (a weak draft on prose the prior expected more of) showed its whole error
        # on whichever endpoint served its first requests. The endpoint is judged against it, and the
        # model's update starts from it
        current = None if d.features is None else self.alpha_model.predict(d.features, d.p_structured)
        if self._judge_endpoint(
            outcome.endpoint, d.kind, alpha, trials, current.alpha if current else d.alpha
        ):
            # a demoted endpoint's acceptance says nothing about the requests: only about it
            return Feedback(alpha, d.alpha, self._measured_speedup(d, alpha, k))
        est = self.estimates.observe(d.kind, d.prompt_class, d.p_structured, alpha, trials)
        if self.metrics is not None:
            self.metrics.alpha_estimate.labels(d.kind).set(est)
        predicted = d.alpha
        if d.features is not None:
            before = self.alpha_model.observe(
                d.features, d.p_structured, alpha, trials, d.prediction, current
            )
            if before is not None:
                predicted = before.alpha
        if self.metrics is not None and predicted is not None:
            self.metrics.acceptance_prediction_error.labels(d.prompt_class).observe(alpha - predicted)
        if tpot is not None and batch is not None and k == self.model.k:
            # a step's time is the request's TPOT times the tokens it got per step, cut last step
            # included: exactly its mean length, whatever alpha it measured
            self.model.observe_speculative(tpot, batch, alpha_from_length(m.mean_length, k))
        return Feedback(alpha, predicted, self._measured_speedup(d, alpha, k))

    def _learn_residence(self, pool: PoolName, decode_s: float, tokens: int) -> None:
        """Running means of a pool's time from first to last token, and of completion tokens."""
        self._finished += 1
        rate = max(RESIDENCE_RATE, 1.0 / self._finished)
        self.mean_tokens += rate * (tokens - self.mean_tokens)
        old = self.residence_s.get(pool)
        self.residence_s[pool] = decode_s if old is None else old + RESIDENCE_RATE * (decode_s - old)

    def _measured_speedup(self, d: Decision, alpha: float, k: int) -> float | None:
        if d.spec_batch is None or d.base_batch is None or k != self.model.k:
            return None
        return self.model.speedup(alpha, d.spec_batch, d.base_batch)

    def _judge_endpoint(
        self, endpoint: str, kind: str, alpha: float, trials: float, predicted: float | None
    ) -> bool:
        """Feed the outlier detector; True when the endpoint is (now) demoted.

        A residual counts only on a kind of prompt that another endpoint of the pool has served too:
        while one endpoint alone gets a kind (a client's sequence that lines up with the picker's
        rotation sent every prose request to one replica), what the model has yet to learn of that
        kind reads as that endpoint's fault, and a replica with its peers' draft was demoted.
        """
        assert self.outliers is not None
        served = self._kind_served
        first = served.get(kind, endpoint)
        if first is not None:
            served[kind] = first if first == endpoint else None
        if predicted is not None and served[kind] is None:
            self._outlier_changed(self.outliers.observe(endpoint, residual(alpha, trials, predicted)))
        return self.outliers.is_demoted(endpoint)

    def _outlier_changed(
        self, changed: Endpoint | None, why: str = "its acceptance is back near its peers'"
    ) -> None:
        """An endpoint demoted or readmitted: its gauge, and a line in the log (as every other change of
        an endpoint's state has: ejected, unhealthy, healthy, restarted)."""
        if changed is None:
            return
        if self.metrics is not None:
            self.metrics.endpoint_acceptance_outlier.labels(changed.pool, changed.name).set(
                1.0 if changed.demoted else 0.0
            )
        if changed.demoted:
            log.warning(
                "endpoint %s/%s demoted: its measured acceptance is far below its peers' on the same kinds"
                " of prompt (a bad draft?); it gets probes only until it comes back",
                changed.pool,
                changed.name,
            )
        else:
            log.warning("endpoint %s/%s readmitted: %s", changed.pool, changed.name, why)

    def _lifetime_batch(self, outcome: Outcome) -> float | None:
        """Mean of the batch expected at the decision and the one left at the end."""
        d = outcome.decision
        if d.batch is None or outcome.pool != d.pool:
            return None
        ep = next((e for e in self.pools[outcome.pool].endpoints if e.name == outcome.endpoint), None)
        if ep is None:
            return d.batch
        engines = self.scraper.engines(ep) if self.scraper is not None else 1
        return (d.batch + ep.outstanding / engines + 1) / 2

    # -- keeping across restarts ------------------------------------------------------------------
    def state(self) -> PolicyState:
        return PolicyState(
            acceptance=self.alpha_model.state(),
            estimates=self.estimates.state(),
            speedup=self.model.state(),
            residence_s=dict(self.residence_s),
            mean_tokens=self.mean_tokens,
            finished=self._finished,
        )

    def restore(self, state: PolicyState, down_s: float) -> None:
        """Take up a :meth:`state` saved ``down_s`` seconds ago (what was learned fades over that time as
        it would have in a running gateway that measured nothing)."""
        self.alpha_model.restore(state.acceptance, down_s)
        self.estimates.restore(state.estimates, down_s)
        self.model.restore(state.speedup)
        self.residence_s = dict(state.residence_s)
        self.mean_tokens = state.mean_tokens
        self._finished = state.finished

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
                name: {
                    "batch": ld.batch,
                    "queued": ld.queued,
                    "available": ld.available,
                    "ahead": ld.ahead,
                    "residence_s": _round(self.residence_s.get(name)),
                }
                for name, ld in loads.items()
            },
            "mean_completion_tokens": round(self.mean_tokens, 1),
            "endpoints": self.scraper.snapshots() if self.scraper else [],
            "decisions": dict(self.counts),
        }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)
