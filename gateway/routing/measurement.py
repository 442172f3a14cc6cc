"""Measurement by need: which non-streamed speculative requests are streamed upstream to be measured.

A non-streamed answer says nothing about engine steps, so the gateway learns a request's acceptance
only by asking upstream for a stream and assembling it into one body, which costs the gateway more
CPU than passing one body on (the stream is read and parsed chunk by chunk). Streamed requests are
measured for free. For the others the measurement is bought only when it is worth it:

- the per-request acceptance model is uncertain about this request (the prediction's sd is more
  than ``routing.measure_sd_share`` of the prior's), or the request was sent to the speculative pool
  to explore: what it teaches is the reason it was routed there;
- otherwise, when more than ``routing.measure_interval_s`` has passed since that pool's last measured
  request (streams included). At low load every request is still measured; at high load the cost is
  capped at about one assembled request per interval, and the drift detector, the endpoint outlier
  detector and the per-request model keep getting data at that rate.

A measurement is worth its cost only if it can teach: an upstream that reports no per-request
acceptance (no usage per chunk, no ``metrics``: a server other than vLLM, or a test stub) leaves the
model as uncertain as before however often it is asked. So after a measured request of a pool came back
without an acceptance, that pool's requests are measured at the interval only, uncertain or not, until
a measured one shows an acceptance again; and each further measurement that teaches nothing doubles
that pool's interval, up to :data:`FRUITLESS_MAX_S`. A pool that never reports acceptance then costs one
assembled request per few seconds instead of one per interval (at 100 req/s with the default interval,
about a third of all requests), and one that starts reporting it (a server restarted with speculation
on) is noticed within :data:`FRUITLESS_MAX_S`, or at once by a client's stream.

The rest go upstream as the client sent them. ``routing.measure_interval_s: 0`` measures every
non-streamed speculative request, as before measurement by need.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from gateway.routing.policy import Decision
from gateway.types import PoolName

FRUITLESS_MAX_S = 5.0
"""The longest interval between measurements of a pool whose measurements teach nothing."""

MEASURABLE_TOKENS = 3
"""Output tokens an answer needs before its acceptance can be read: the prefill token, then at least two
more (one decode step whose rejection is seen, or a cut one with an accepted draft). A shorter answer
(``max_tokens`` 1 or 2, a stop at once) shows no step from any upstream, vLLM included."""

Verdict = Literal["uncertain", "interval", "passed"]
#: the verdicts that stream a request upstream and assemble its answer, to measure it
ASSEMBLED: frozenset[str] = frozenset(("uncertain", "interval"))
"""Why a non-streamed request was measured (``uncertain``, ``interval``) or not (``passed``)."""


@dataclass(slots=True, kw_only=True)
class MeasurementGate:
    """Decides, per non-streamed request, whether its acceptance is measured; counts the verdicts."""

    interval_s: float
    sd_share: float
    last: dict[PoolName, float] = field(default_factory=dict)  # monotonic time of the last measurement
    # pools whose last measurement taught nothing, and how many in a row did not
    fruitless: dict[PoolName, int] = field(default_factory=dict)
    counts: Counter[tuple[PoolName, Verdict]] = field(default_factory=Counter)

    def verdict(self, decision: Decision, pool: PoolName, now: float) -> Verdict:
        """Measure ``decision``'s request on ``pool`` (non-streamed) at ``now``, or pass it through.

        A measured verdict counts as that pool's latest measurement.
        """
        verdict: Verdict
        if pool not in self.fruitless and self._uncertain(decision):
            verdict = "uncertain"
        elif self.interval_s <= 0 or now - self.last.get(pool, -float("inf")) >= self._interval(pool):
            verdict = "interval"
        else:
            verdict = "passed"
        if verdict != "passed":
            self.last[pool] = now
        self.counts[pool, verdict] += 1
        return verdict

    def taught(self, pool: PoolName, learned: bool, completion_tokens: int | None = None) -> None:
        """A measured request to ``pool`` came back with an acceptance (``learned``) or without one.

        An answer of fewer than :data:`MEASURABLE_TOKENS` tokens says nothing either way: it was too
        short to show a step, whatever the upstream reports. Counted as fruitless, a client sending
        one-token answers (a classifier asking yes or no) made a vLLM pool look like one that reports no
        acceptance, and held back the measurement of the uncertain requests of everyone else.
        """
        if learned:
            self.fruitless.pop(pool, None)
        elif completion_tokens is None or completion_tokens >= MEASURABLE_TOKENS:
            self.fruitless[pool] = self.fruitless.get(pool, 0) + 1

    def _interval(self, pool: PoolName) -> float:
        """The pool's interval: the setting's, doubled for each fruitless measurement after the first."""
        streak = self.fruitless.get(pool, 0)
        if streak <= 1:
            return self.interval_s
        return min(max(FRUITLESS_MAX_S, self.interval_s), self.interval_s * 2.0 ** min(streak - 1, 30))

    def streamed(self, pool: PoolName, now: float) -> None:
        """A streamed request to ``pool`` is measured anyway: it refreshes the pool's interval."""
        self.last[pool] = now

    def _uncertain(self, decision: Decision) -> bool:
        if decision.explore:
            return True
        prediction = decision.prediction
        # sd_share is at most 1 (forgetting brings the variance back to the prior's, not beyond);
        # the clamp keeps rounding in the variance's sum from making ``sd_share: 1`` measure all
        return prediction is not None and min(1.0, prediction.sd_share) > self.sd_share

    def snapshot(self) -> dict[str, Any]:
        """Settings and counts per pool, for ``/admin/routing``."""
        pools: dict[str, dict[str, int]] = {}
        for (pool, verdict), n in sorted(self.counts.items()):
            pools.setdefault(pool, {"uncertain": 0, "interval": 0, "passed": 0})[verdict] = n
        for counts in pools.values():
            counts["measured"] = counts["uncertain"] + counts["interval"]
        return {
            "interval_s": self.interval_s,
            "sd_share": self.sd_share,
            "pools": pools,
            "fruitless": sorted(self.fruitless),
            "interval_by_pool_s": {pool: round(self._interval(pool), 4) for pool in sorted(self.fruitless)},
        }
