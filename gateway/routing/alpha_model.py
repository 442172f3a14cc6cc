"""Per-request acceptance: an online Bayesian regression on the logit of alpha over hashed features.

Why per request: prompts of one kind differ in acceptance (a "code" prompt that asks for an essay
about code), and a deployment's draft model may be strong where the classifier's prior expects it to
be weak (or the reverse). One mean per (kind, class) cannot tell those prompts apart; a regression
over the request's own words and fields can, and it shares what it learns across kinds.

The model::

    logit(alpha) = logit(prior(p_structured)) + shift + Σ_i x_i · w_i        w_i ~ N(mean_i, var_i)

``prior`` is the classifier's prior (alpha 0.25 for prose to 0.8 for structured output) and ``shift``
the pool-wide changes detected so far (0 at start), so with no
data the prediction is exactly the prior the gateway always had; every weight starts at mean 0 with
variance ``PRIOR_VAR``. A measured request updates the weights of its features by a Kalman step with
a diagonal covariance (recursive least squares, one multiply-add per feature). What it measured,
accepted drafts out of ``trials`` draws, enters as a Gaussian observation of its logit that gives the
binomial likelihood's posterior mode (:func:`binomial_observation`), with ``PROMPT_VAR`` added for
what no feature explains, so a short request moves the model less than a long one, and one that
accepted every draft (or none) counts for what the likelihood says.

The covariance is kept diagonal, read two ways. ``var``, what a prediction reads, is scaled for each
of the request's features by the factor the exact update applies to that request's own predictive
variance, ``noise / (var + noise)``: a prompt seen again is predicted as surely as a full Kalman
filter would, where the textbook diagonal update (each weight's own share) barely shrinks the many
small n-gram weights and leaves every repeated prompt looking unknown. That factor is the request's,
though. The fixed features nearly every request shares (``Features.fixed``: kind, p_structured,
temperature, context length, response_format, tools, script) took it from every request, so their
variance compounded away within a few dozen (the length weight's sd was 0.005 after 50 updates) and
later evidence no longer moved them: with long contexts accepting 0.15 and short prompts 0.75 (0.35
with tools), new long prompts were still predicted at 0.26 after 300 requests, and sent to the
speculative pool. A full filter keeps a shared weight about as uncertain as its own evidence says;
what makes a repeated prompt sure is how its shared weights and its word grams correlate, which a
diagonal cannot hold. So the shared features keep their own variance too (``own_var``, the textbook update's
``var_i -= (var_i · x_i)² / s``), and it sets how far a measurement moves them: the mean moves by the
Kalman step whose prior reads the shared features' own variances and the word grams' ``var``. The
word grams carry what a prompt's measurements made sure (four measurements of one prompt still take
its sd under 0.4 of the prior's), while the shared weights go on learning (the long prompts above are
now predicted at 0.17, the short ones at 0.71).

Forgetting is a random walk of the weights: each weight's variance grows back towards
``PRIOR_VAR`` with the configured half-life, lazily when it is next read; its mean stays where the
measurements put it (decaying means towards the prior biased every estimate towards the prior under
light traffic). Old evidence thus weighs less against new, and what is no longer measured becomes
uncertain again and gets explored again.

Pool-wide changes (a new draft model moves every request at once) are caught by a two-sided CUSUM
on the standardised residuals (residual / predictive standard deviation): the model knows how sure
it is, so a residual is large only relative to that. A change is declared only when the run that
revealed it shows it in at least two kinds of prompt that had been predicted within the noise before
it (their running mean standardised residual under ``CUSUM_SLACK``), or whose errors turned round (a
fall still being learned when the draft was fixed: each side of the detector keeps its own run), and
no kind measured in it says the opposite. A draft model strong on one kind and weak on another is
not a pool-wide change: the weights learn that; nor is a deployment unlike the prior from its first
requests, where kinds seen for the first time, or still being learned in the run's direction, are off
by how wrong the prior is for them and would drag every other kind with them. A change moves a common
offset, added to every prediction, by the agreeing kinds' mean residual at once instead of waiting for
measurements of every feature; each kind's weight then becomes as uncertain as the shift is far from
what that kind showed (a kind the run never measured: the shift's square), since the shift reaches it
by extrapolation and a new draft is seldom better or worse at everything alike. A change that one kind
shows but that cannot be shown pool-wide (the
only kind the traffic has measured, or others moved against it) makes the weights read by the requests
of its run as uncertain as the prior's: what was learned before it no longer holds, and the next
measurements relearn them in a few requests instead of by slivers against a confident past.

A change is declared only from kinds that had been measured ``SHIFT_MIN_RUN`` times before its run:
a kind's first residuals are how wrong the prior is for it, whatever its running mean says after one
or two of them (with a draft costing 0.3 of a step, code at 0.9 and data formats at 0.15, the first
structured requests read as a pool-wide fall of 2 logits, and code was never sent to be measured).

Within-kind heterogeneity. The weights predict a new prompt from the features it shares with those
measured: its kind, its length, its common words. A kind whose measured prompts differ among
themselves (the classifier's ``code`` holding code at 0.9 and YAML handlers at 0.15) says that a new
prompt of it may differ from them as much, whatever the shared weights' small variance says; one whose
prompts all measure alike says it will not. So each kind keeps the variance its measurements showed
beyond what the model expected, ``τ² ≈ mean((residual² - expected) · novelty) / mean(novelty²)``, where a
request's novelty is the share of its word-gram weight in slots no measurement ever updated; a
prediction carries ``novel_var = τ² · novelty`` (:attr:`AlphaPrediction.novel_var`). Only exploration
reads it: it widens the belief about prompts whose own words were never measured, not the prediction
or the margin of prompts that were.

Exploration reads the posterior: :meth:`AlphaModel.sample` draws a logit from N(mean, var + novel_var),
for Thompson sampling on the predicted speedup; :meth:`AlphaPrediction.quantiles` gives the points the
policy's value-of-measurement rule averages over.
"""

from __future__ import annotations

import math
import random
import time
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from gateway.routing.estimates import PRIOR_OPEN, PRIOR_STRUCTURED
from gateway.routing.features import SLOTS, Features, slot
from gateway.types import record


def _weighted_c() -> Callable[..., tuple[float, float, float] | None] | None:
    """The prediction's sums in C (``gateway/routing/_slots.c``), or None where the package was built
    without it."""
    try:
        from gateway.routing._slots import weighted
    except ImportError:
        return None
    return weighted


_WEIGHTED = _weighted_c()

#: every so many updates, the names of the request's slots are recorded again (see ``AlphaModel.names``)
NAME_RENEWAL = 32

PRIOR_VAR = 0.15  # prior variance of each weight (logit units squared)
PROMPT_VAR = 0.05  # variance of a request's logit alpha that its features cannot explain
ALPHA_CLIP = 0.01  # measured alpha is clipped to [CLIP, 1 - CLIP] before taking its logit
MIN_TRIALS = 4.0  # fewer draft draws than this say too little to learn from
CUSUM_SLACK = 1.0  # standardised residuals under this are noise
CUSUM_LIMIT = 6.0  # accumulated standardised excess that declares a pool-wide change
CALIBRATION_RATE = 0.02  # weight of one request in the running mean of squared residuals
Z_CLIP = 3.0  # standardised residuals are clipped here before the change detector sees them
SHIFT_MIN_RUN = 3  # a change needs at least this many requests in the run that revealed it
SHIFT_KIND_LOGIT = 0.5  # a kind's mean residual over the run beyond this says which way it moved
KIND_Z_RATE = 0.3  # weight of one request in its kind's running mean standardised residual
HET_RATE = 0.1  # weight of one measurement in its kind's heterogeneity estimate
ERROR_RATE = 0.05  # weight of one request in the running prediction-error summary
NEWTON_STEPS = 60  # at most, to find a measured request's posterior mode (a few suffice)
REFRESH_S = 0.01  # forgetting is applied to a weight once this share of a half-life has passed
MAX_SHIFT = 2 * math.log((1 - ALPHA_CLIP) / ALPHA_CLIP)  # the most a pool-wide change moves the logit
QUANTILES = 16  # equally likely points a belief is averaged over (:meth:`AlphaPrediction.quantiles`)
_Z = tuple(NormalDist().inv_cdf((i + 0.5) / QUANTILES) for i in range(QUANTILES))


def logit(p: float) -> float:
    p = min(1.0 - ALPHA_CLIP, max(ALPHA_CLIP, p))
    return math.log(p / (1.0 - p))


def binomial_observation(alpha: float, trials: float, mean: float, var: float) -> tuple[float, float]:
    """A measured request as a Gaussian observation of its logit, and that observation's variance.

    The request accepted ``alpha · trials`` of ``trials`` draft draws; before it, its logit was
    believed N(``mean``, ``var``). The binomial likelihood is combined with that belief at its mode
    (a Laplace approximation: Newton steps on a concave log-posterior), and the result is returned
    as the pseudo-observation that gives the same mode through the Kalman update the weights use.

    Why not the logit of the measured proportion with the delta method's variance: at 0 and 1 it is
    infinite, and clipped it says little (24 of 24 drafts accepted reads as logit 4.6 give or take
    2), so a request that accepted every draft barely moved a model that had learned none would be,
    and a draft fixed after a bad one was noticed late. The likelihood knows better: 24 of 24 is
    very unlikely at an alpha of 0.66, whatever the exact alpha near 1 is.
    """
    theta = posterior_mode(alpha, trials, mean, var)
    p = sigmoid(theta)
    noise = 1.0 / max(1e-12, trials * p * (1.0 - p))
    return mean + (theta - mean) * (var + noise) / var, noise


def posterior_mode(alpha: float, trials: float, mean: float, var: float) -> float:
    """The most likely logit of a request that accepted ``alpha · trials`` of ``trials`` draft draws, its
    logit believed N(``mean``, ``var``) before: the binomial likelihood moves it from the belief only as
    far as that many draws say."""
    n = trials
    hit = min(n, max(0.0, alpha * n))

    def slope(t: float) -> float:  # of the log-posterior: decreasing in t, so its root is the mode
        return hit - n * sigmoid(t) - (t - mean) / var

    # the mode lies between the belief and where the slope at the belief, held, would reach zero
    # (the likelihood's pull only weakens on the way); Newton steps that leave the bracket bisect
    lo, hi = sorted((mean, mean + var * slope(mean)))
    theta = mean
    for _ in range(NEWTON_STEPS):
        g = slope(theta)
        if g > 0:
            lo = theta
        else:
            hi = theta
        p = sigmoid(theta)
        nxt = theta + g / (n * p * (1.0 - p) + 1.0 / var)
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - theta) < 1e-7:
            return nxt
        theta = nxt
    return theta


def sigmoid(x: float) -> float:
    if x >= 0:
        return 1.0 / (1.0 + math.exp(-x))
    e = math.exp(x)
    return e / (1.0 + e)


def prior_alpha(p_structured: float) -> float:
    """The classifier's prior: alpha of prose at p = 0 to alpha of structured output at p = 1."""
    p = min(1.0, max(0.0, p_structured))
    return PRIOR_OPEN + (PRIOR_STRUCTURED - PRIOR_OPEN) * p


@record
class AlphaPrediction:
    alpha: float  # alpha at the posterior mean of the logit
    mean: float  # posterior mean of logit(alpha)
    var: float  # posterior variance of logit(alpha) (the weights' uncertainty, not a request's noise)
    offset: float  # logit of the prior the prediction started from
    prior_var: float  # the variance it had before any measurement: Σ x² · PRIOR_VAR
    # how far the prompt's own, never measured words may take it from its kind's measured prompts: the
    # kind's heterogeneity times the prompt's novelty (exploration reads it; the prediction does not)
    novel_var: float = 0.0

    @property
    def sd(self) -> float:
        return math.sqrt(self.var)

    @property
    def sd_share(self) -> float:
        """How much of the prior's uncertainty is left (1: nothing learned about this request)."""
        return math.sqrt(self.var / self.prior_var) if self.prior_var > 0 else 1.0

    def sample(self, rng: random.Random, widen: float = 1.0) -> float:
        """One draw of alpha from the posterior (Thompson sampling), its spread times ``widen``."""
        return sigmoid(rng.gauss(self.mean, widen * math.sqrt(self.var + self.novel_var)))

    def quantiles(self, widen: float = 1.0, var: float | None = None) -> tuple[float, ...]:
        """``QUANTILES`` equally likely values of alpha under the exploration belief, N(mean, var +
        novel_var) with its spread times ``widen`` (``var``, when given, in place of that variance)."""
        sd = widen * math.sqrt(self.var + self.novel_var if var is None else var)
        return tuple(sigmoid(self.mean + z * sd) for z in _Z)

    def prior_quantiles(self, widen: float = 1.0) -> tuple[float, ...]:
        """``QUANTILES`` equally likely values of alpha under the prior this prediction started from:
        what the request may have if everything measured since no longer held."""
        sd = widen * math.sqrt(self.prior_var)
        return tuple(sigmoid(self.offset + z * sd) for z in _Z)

    def upper(self, z: float) -> float:
        """alpha at ``z`` posterior standard deviations above the mean."""
        return sigmoid(self.mean + z * math.sqrt(self.var))


class AlphaState(BaseModel):
    """An :class:`AlphaModel`'s learning, as kept across restarts; a file that does not fit is refused."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    mean: list[float] = Field(min_length=SLOTS, max_length=SLOTS)
    var: list[Annotated[float, Field(gt=0)]] = Field(min_length=SLOTS, max_length=SLOTS)
    own_var: list[Annotated[float, Field(gt=0)]] = Field(min_length=SLOTS, max_length=SLOTS)
    stamp: list[float] = Field(min_length=SLOTS, max_length=SLOTS)
    names: dict[Annotated[int, Field(ge=0, lt=SLOTS)], str]
    updates: int = Field(ge=0)
    shifts: int = Field(ge=0)
    forgotten: int = Field(ge=0)
    error_mean: float
    error_abs: float = Field(ge=0)
    shift_offset: float
    kind_z: dict[str, float]
    z2: float = Field(gt=0)
    # saved since the model weighs novelty and heterogeneity; a file without them takes every learned
    # slot as measured, every kind in ``kind_z`` as settled and no heterogeneity
    seen: list[Annotated[int, Field(ge=0)]] | None = Field(default=None, min_length=SLOTS, max_length=SLOTS)
    kind_n: dict[str, Annotated[int, Field(ge=0)]] | None = None
    kind_het: dict[str, tuple[float, Annotated[float, Field(ge=0)]]] = Field(default_factory=dict)
    now: float  # the model's clock when it was saved: the stamps are read against it


@dataclass
class AlphaModel:
    half_life_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    mean: array[float] = field(default_factory=lambda: array("d", bytes(8 * SLOTS)))
    var: array[float] = field(default_factory=lambda: array("d", [PRIOR_VAR]) * SLOTS)
    # each weight's own variance, as the textbook diagonal update keeps it: how far a measurement moves
    # the fixed features' weights, which nearly every request shares (``var`` is what a request reads)
    own_var: array[float] = field(default_factory=lambda: array("d", [PRIOR_VAR]) * SLOTS)
    stamp: array[float] = field(default_factory=lambda: array("d", bytes(8 * SLOTS)))
    # a feature name per slot (≤ SLOTS), to explain the weights: recorded for a slot without one, and
    # renewed for every slot of each NAME_RENEWAL-th update (a slot shared by several names shows one
    # the recent traffic uses)
    names: dict[int, str] = field(default_factory=dict)
    updates: int = 0
    shifts: int = 0
    forgotten: int = 0  # changes not shown to be pool-wide, after which the requests' weights forgot
    error_mean: float = 0.0  # running mean of measured - predicted alpha
    error_abs: float = 0.0  # running mean of |measured - predicted alpha|
    _up: float = 0.0
    _down: float = 0.0
    shift_offset: float = 0.0  # logit moved by the pool-wide changes detected so far
    # per side of the detector, kind: [n, Σ residual, its running mean standardised residual before
    # the run (nan: never measured)] over the current run
    _run_up: dict[str, list[float]] = field(default_factory=dict)
    _run_down: dict[str, list[float]] = field(default_factory=dict)
    # per side, the weights the current run's requests read
    _slots_up: set[int] = field(default_factory=set)
    _slots_down: set[int] = field(default_factory=set)
    _kind_z: dict[str, float] = field(default_factory=dict)  # running mean standardised residual per kind
    _kind_n: dict[str, int] = field(default_factory=dict)  # measurements per kind
    # per kind: running means of (squared residual - its expected value) · novelty and of novelty², whose
    # ratio is the variance of the prompt-specific part of a logit that its measured prompts showed
    _het: dict[str, list[float]] = field(default_factory=dict)
    # measurements that updated each slot (never forgotten: a forgotten weight is uncertain, not new)
    _seen: array[int] = field(default_factory=lambda: array("l", bytes(array("l").itemsize * SLOTS)))
    _z2: float = 1.0  # running mean of the squared standardised residual (1 when the noise model fits)

    def _refresh(self, s: int, now: float) -> None:
        """Apply the forgetting since the slot was last touched: its uncertainty grows back."""
        dt = now - self.stamp[s]
        if dt > REFRESH_S * self.half_life_s:
            f = 0.5 ** (dt / self.half_life_s)
            self.var[s] = PRIOR_VAR - (PRIOR_VAR - self.var[s]) * f
            self.own_var[s] = PRIOR_VAR - (PRIOR_VAR - self.own_var[s]) * f
            self.stamp[s] = now

    def predict(self, x: Features, p_structured: float) -> AlphaPrediction:
        now = self.clock()
        offset = logit(prior_alpha(p_structured))
        m, v, x2 = offset + self.shift_offset, 0.0, 0.0
        mean, var, stamp = self.mean, self.var, self.stamp
        horizon = REFRESH_S * self.half_life_s
        if _WEIGHTED is not None:
            # the same sums in C; None when a slot's forgetting is due, which the loop below applies
            sums = _WEIGHTED(x.slots, x.values, mean, var, stamp, m, now, horizon)
            if sums is not None:
                m, v, x2 = sums
                return AlphaPrediction(sigmoid(m), m, v, offset, x2 * PRIOR_VAR, self._novel_var(x))
        for s, xi in zip(x.slots, x.values, strict=True):
            if now - stamp[s] > horizon:
                self._refresh(s, now)
            m += xi * mean[s]
            sq = xi * xi
            v += sq * var[s]
            x2 += sq
        return AlphaPrediction(sigmoid(m), m, v, offset, x2 * PRIOR_VAR, self._novel_var(x))

    def novelty(self, x: Features) -> float:
        """The share of the request's word-gram weight (Σ x²) in slots no measurement has updated: 1 for a
        prompt none of whose words were measured, 0 for one measured before (or without words)."""
        values, slots, seen = x.values, x.slots, self._seen
        total = new = 0.0
        for k in range(len(x.fixed), len(slots)):
            sq = values[k] * values[k]
            total += sq
            if not seen[slots[k]]:
                new += sq
        return new / total if total > 0.0 else 0.0

    def heterogeneity(self, kind: str) -> float:
        """The variance of a logit's prompt-specific part that the kind's measured prompts showed beyond
        what the model expected of them (0 until measurements of new prompts show any)."""
        het = self._het.get(kind)
        if het is None or het[1] <= 0.0:
            return 0.0
        return max(0.0, het[0] / het[1])

    def _novel_var(self, x: Features) -> float:
        tau2 = self.heterogeneity(x.kind)
        return tau2 * self.novelty(x) if tau2 > 0.0 else 0.0

    def observe(
        self,
        x: Features,
        p_structured: float,
        alpha: float,
        trials: float,
        pred: AlphaPrediction | None = None,
        current: AlphaPrediction | None = None,
    ) -> AlphaPrediction | None:
        """Learn from one measured request; returns what was predicted for it: ``pred``, the prediction
        its routing decision made, when given (what the access log and the error metrics report).
        ``current`` is ``predict(x, p_structured)`` as the weights are now, when the caller has it.

        The update itself starts from the weights as they are now, not from ``pred``: every request
        that finished since the decision has moved them, and with dozens in flight the same error,
        measured against the decision's stale prediction, was corrected once per request. The
        corrections overshot by that factor and grew each round (under 48 concurrent clients the
        predictions swung between 0 and 1 and stuck there, the pool-wide offset at 1e13 logits).
        """
        if trials < MIN_TRIALS:
            return None
        if current is None:
            current = self.predict(x, p_structured)
        decided = pred if pred is not None else current
        measured, noise = binomial_observation(alpha, trials, current.mean, current.var + PROMPT_VAR)
        noise += PROMPT_VAR
        s_total = current.var + noise
        resid = measured - current.mean
        # novelty before this request's update marks its slots as seen
        novelty = self.novelty(x)
        het = self._het.setdefault(x.kind, [0.0, 0.0])
        het[0] += HET_RATE * ((resid * resid - s_total) * novelty - het[0])
        het[1] += HET_RATE * (novelty * novelty - het[1])
        mean, var, own = self.mean, self.var, self.own_var
        slots, values = x.slots, x.values
        fixed = len(x.fixed)  # the first slots: the features (nearly) every request shares
        # the step is a Kalman step whose prior reads the shared weights' own variances (the word
        # grams' as the request reads them): the shared weights keep learning at the rate their own
        # evidence allows instead of at the request's, which a repeated prompt makes small at once
        own_part = read = 0.0
        for k in range(fixed):
            s, sq = slots[k], values[k] * values[k]
            own_part += sq * own[s]
            read += sq * var[s]
        s_step = max(s_total + own_part - read, noise + own_part)
        gain = resid / s_step
        shrink = noise / s_total  # the exact update's factor on this request's predictive variance
        for k in range(fixed):
            s, xi = slots[k], values[k]
            ov = own[s]
            mean[s] += ov * xi * gain
            own[s] = ov - (ov * xi) ** 2 / s_step  # the textbook diagonal update: each weight's own share
            var[s] *= shrink
        seen = self._seen
        for s, xi in zip(slots[fixed:], values[fixed:], strict=True):
            pv = var[s]
            mean[s] += pv * xi * gain
            var[s] = pv * shrink
            seen[s] += 1
        names = self.names
        # a request's names are built from its text on demand: only where a slot has none yet
        if self.updates % NAME_RENEWAL == 0 or not all(map(names.__contains__, x.slots)):
            names.update(zip(x.slots, x.names, strict=True))
        self.updates += 1
        err = alpha - decided.alpha
        self.error_mean += ERROR_RATE * (err - self.error_mean)
        self.error_abs += ERROR_RATE * (abs(err) - self.error_abs)
        self._detect(x, resid / math.sqrt(s_total), resid)
        return decided

    def _detect(self, x: Features, z: float, resid: float) -> None:
        kind = x.kind
        # clipped: the logit of a proportion from a few draws has heavy tails; a real change shows
        # in many requests anyway
        z = max(-Z_CLIP, min(Z_CLIP, z))
        # calibrated: when the noise model is off (prompts vary more than PROMPT_VAR says), the
        # residuals are larger than their stated spread all the time; that is not a change
        z /= math.sqrt(max(1.0, self._z2))
        self._z2 += CALIBRATION_RATE * (z * z * max(1.0, self._z2) - self._z2)
        self._up = max(0.0, self._up + z - CUSUM_SLACK)
        self._down = max(0.0, self._down - z - CUSUM_SLACK)
        before = self._kind_z.get(kind)
        self._kind_z[kind] = z if before is None else before + KIND_Z_RATE * (z - before)
        measured = self._kind_n.get(kind, 0)
        self._kind_n[kind] = measured + 1
        if measured < SHIFT_MIN_RUN:
            # a kind's first residuals are the prior's error for it, not a change: it counts as one
            # first measured in the run (``before`` nan below)
            before = None
        # each side of the detector keeps its own run: the errors of a fall that was still being
        # learned must not count against the rise that follows it (a draft fixed after a bad one)
        for run, slots, active in (
            (self._run_up, self._slots_up, self._up > 0.0),
            (self._run_down, self._slots_down, self._down > 0.0),
        ):
            if not active:
                run.clear()
                slots.clear()
                continue
            acc = run.setdefault(kind, [0.0, 0.0, math.nan if before is None else before])
            acc[0] += 1
            acc[1] += resid
            slots.update(x.slots)
        if max(self._up, self._down) <= CUSUM_LIMIT:
            return
        up = self._up > self._down
        sign, run = (1.0, self._run_up) if up else (-1.0, self._run_down)
        slots = self._slots_up if up else self._slots_down
        if sum(a[0] for a in run.values()) < SHIFT_MIN_RUN:
            return
        # a change is a kind that was predicted within the noise and no longer is, or one whose errors
        # turned round: still being learned one way (a draft that stopped agreeing), now wrong the
        # other way. A kind first measured in the run, or still being learned in the run's direction,
        # shows how wrong the prior is, not a change.
        means = {
            k: (a[0], a[1] / a[0], abs(a[2]) < CUSUM_SLACK or sign * a[2] <= -CUSUM_SLACK)
            for k, a in run.items()
        }
        agreeing = {k: m for k, (_, m, s) in means.items() if s and sign * m > SHIFT_KIND_LOGIT}
        agree = list(agreeing.values())
        against = [m for c, m, _ in means.values() if c >= 2 and sign * m < -SHIFT_KIND_LOGIT]
        if len(agree) >= 2 and not against:
            # every kind moved: shift every prediction by their mean residual at once, within the
            # logits a measurement can show (a residual's pseudo-observation can run far beyond them)
            before = self.shift_offset
            self.shift_offset += sum(agree) / len(agree)
            self.shift_offset = max(-MAX_SHIFT, min(MAX_SHIFT, self.shift_offset))
            self.shifts += 1
            self._unsure_of_kinds(agreeing, self.shift_offset - before)
        elif agree:
            # a change, but not shown to be pool-wide (one kind moved, or others moved against it):
            # what was learned about the requests that revealed it no longer holds, so their weights
            # become as uncertain as the prior's and the next measurements relearn them at once
            # instead of by slivers
            for s in slots:
                self.var[s] = self.own_var[s] = PRIOR_VAR
            self.forgotten += 1
        self._up = self._down = 0.0
        for side in (self._run_up, self._run_down, self._slots_up, self._slots_down):
            side.clear()

    def _unsure_of_kinds(self, moved: Mapping[str, float], shift: float) -> None:
        """After a pool-wide shift, each kind's weight is as unsure as the shift is far from what that
        kind showed.

        The shift is the mean of what the kinds that revealed it showed; every other kind gets it by
        extrapolation. A new draft is seldom worse (or better) at everything alike: one that fails at
        data formats may be far better at code and fiction, which, sent to baseline by the prior, the
        run never measured. Moved by the shift with the certainty they had before, such kinds were
        predicted to lose and never sent to be measured again (after a switch from the ``rules`` draft
        to ``skewed-draft``, fiction at 0.65 was read as 0.1 for good on two seeds of twelve). So a kind
        the run did not measure takes the shift's square as variance on its weight, one that did the
        square of its own distance from the shift: its next measurements set it, and until then
        exploration draws reach as far as the shift went.
        """
        var, own = self.var, self.own_var
        for kind in self._kind_z:
            off = moved.get(kind, 0.0) - shift
            s = slot("kind=" + kind)
            var[s] += off * off
            own[s] += off * off

    def state(self) -> AlphaState:
        """What this model has learned (``gateway.routing.learned`` keeps it on disk).

        The change detector's run in progress is left out: a restarted gateway starts a new run.
        """
        return AlphaState(
            mean=self.mean.tolist(),
            var=self.var.tolist(),
            own_var=self.own_var.tolist(),
            stamp=self.stamp.tolist(),
            names=dict(self.names),
            updates=self.updates,
            shifts=self.shifts,
            forgotten=self.forgotten,
            error_mean=self.error_mean,
            error_abs=self.error_abs,
            shift_offset=self.shift_offset,
            kind_z=dict(self._kind_z),
            z2=self._z2,
            seen=self._seen.tolist(),
            kind_n=dict(self._kind_n),
            kind_het={k: (h[0], h[1]) for k, h in self._het.items()},
            now=self.clock(),
        )

    def restore(self, state: AlphaState, down_s: float) -> None:
        """Take up a :meth:`state` saved ``down_s`` seconds before this process's clock began to count for
        it: the weights forget over that time as if the gateway had run without measuring."""
        moved = self.clock() - state.now - down_s
        self.mean = array("d", state.mean)
        self.var = array("d", state.var)
        self.own_var = array("d", state.own_var)
        self.stamp = array("d", (t + moved for t in state.stamp))
        self.names = dict(state.names)
        self.updates = state.updates
        self.shifts = state.shifts
        self.forgotten = state.forgotten
        self.error_mean = state.error_mean
        self.error_abs = state.error_abs
        self.shift_offset = state.shift_offset
        self._kind_z = dict(state.kind_z)
        self._z2 = state.z2
        if state.seen is not None:
            self._seen = array("l", state.seen)
        else:
            self._seen = array("l", (int(v < PRIOR_VAR) for v in state.var))
        self._kind_n = (
            dict(state.kind_n) if state.kind_n is not None else dict.fromkeys(state.kind_z, SHIFT_MIN_RUN)
        )
        self._het = {k: [a, b] for k, (a, b) in state.kind_het.items()}

    @property
    def spread(self) -> float:
        """How much wider the residuals run than the predictive variance says (1 when it fits).

        Exploration draws are widened by it: a prompt whose own features were never measured is
        predicted from the features it shares with others (``write a`` in a story and in a YAML
        file), and its posterior is then narrower than the errors such predictions make.
        """
        return math.sqrt(max(1.0, self._z2))

    def snapshot(self, top: int = 12) -> dict[str, Any]:
        now = self.clock()
        for s in self.names:
            self._refresh(s, now)
        ranked = sorted(self.names.items(), key=lambda kv: abs(self.mean[kv[0]]), reverse=True)[:top]
        return {
            "updates": self.updates,
            "pool_shifts_detected": self.shifts,
            "changes_forgotten": self.forgotten,
            "shift_offset_logit": round(self.shift_offset, 4),
            "features_seen": len(self.names),
            "hash_slots": SLOTS,
            "half_life_s": self.half_life_s,
            "recent_error": {"mean": round(self.error_mean, 4), "mean_abs": round(self.error_abs, 4)},
            "residual_spread": round(self.spread, 4),
            "kind_heterogeneity": {k: round(self.heterogeneity(k), 4) for k in sorted(self._het)},
            "top_weights": [
                {
                    "feature": name,
                    "weight": round(self.mean[s], 4),
                    # a shared feature's own sd; a word gram's as the requests read it
                    "sd": round(math.sqrt((self.var if name.startswith("w=") else self.own_var)[s]), 4),
                }
                for s, name in ranked
            ],
        }
