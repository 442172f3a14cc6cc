"""Endpoints and pools: who is healthy, who is busy, and whom to try next.

Balancing is least-outstanding-requests weighted by the endpoint's weight, counting too the requests
its engine held at the last scrape that were not the gateway's own, and endpoints with a free seat
first. Health has two inputs: active checks (``healthy``) and passive ejection after consecutive
failures, with exponential back-off, so a crashing endpoint is skipped before the next health check
notices.

Ejection follows the outlier-detection rules that keep it from causing an outage itself:

* a failure only counts when the request was sent after the endpoint's last ejection ended, so the
  requests that were in flight when it was ejected do not eject it again (nor double its back-off);
* a passing active health check ends an ejection early, a failing one takes the endpoint out;
* at most ``health.max_ejection_percent`` of a pool is ejected at once, and never its last endpoint;
* when no endpoint of the candidate pools is usable, the caller picks among all of them anyway
  (panic mode, :meth:`Pool.pick` with ``panic=True``) rather than failing the request;
* an upstream that says it is busy (503, 429) is not broken: its weight drops for a while
  (:meth:`Endpoint.mark_busy`) and the request goes elsewhere.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.config import HealthConfig, PoolName
from gateway.upstream.deadline import Wait

#: added to the score of an endpoint whose seats are all taken: after every endpoint with a free one
#: (and before a demoted one, which scores 1e9 more)
FULL = 1e6
DEMOTED = 1e9  # added to a demoted endpoint's rank: after every other (taken away on a probe)


@dataclass(eq=False)
class Endpoint:
    pool: PoolName
    name: str
    base_url: str
    weight: float = 1.0
    healthy: bool = True
    outstanding: int = 0
    consecutive_failures: int = 0
    ejections: int = 0
    ejected_until: float = 0.0
    draining: bool = False
    busy_until: float = 0.0
    busy_weight: float = 1.0
    # set by routing when this endpoint's measured acceptance is far below its peers' (a bad draft
    # model on one replica): picked only when no peer is, or as one of the probes
    demoted: bool = False
    # its server had requests waiting in its own queue at its last scrape (vLLM's num_requests_waiting):
    # a first byte that does not come in time is then its queue's wait, overload rather than a fault
    queueing: bool = False
    # requests in its engine (running + waiting) at its last scrape beyond the gateway's own in flight
    # then: other clients', other workers' (0 while unknown); and its seats (max_num_seqs, learned from
    # its queues; None while unknown): the picker prefers an endpoint with a free seat to one where a
    # request would wait
    others: float = 0.0
    seats: int | None = None
    # its running credit in the smooth weighted rotation that breaks ties between equally loaded
    # endpoints (:meth:`Pool.pick`)
    credit: float = 0.0
    # its engine holds requests running and takes no step (see gateway.upstream.scrape): its health
    # checks fail while this lasts, whatever its /health says
    stalled: bool = False
    # the requests waiting for this endpoint's first response byte (see :meth:`unanswering`)
    awaiting: set[Wait] = field(default_factory=set, repr=False)
    # those that waited on it when it failed its first health check after passing: moved if the next
    # check fails too (see gateway.upstream.health)
    suspects: set[Wait] | None = field(default=None, repr=False)

    def unanswering(self, only: set[Wait] | None = None) -> int:
        """The endpoint stopped answering: the requests still waiting for its first byte (of ``only``,
        when given) stop waiting (each as if its time ran out) and go elsewhere; return how many did.

        Nothing of their answers has reached a client. A frozen server (a stopped process, a hung
        engine) accepts connections and answers nothing, and a non-streamed request, whose first byte
        comes only with its whole answer, would otherwise wait there up to ``timeouts.total_s``.
        """
        waits = list(self.awaiting if only is None else self.awaiting & only)
        self.awaiting.difference_update(waits)
        for wait in waits:
            wait.cut()
        return len(waits)

    def available(self, now: float | None = None) -> bool:
        if not self.healthy or self.draining:
            return False
        return not self.ejected(now)

    def ejected(self, now: float | None = None) -> bool:
        return self.ejected_until > (time.monotonic() if now is None else now)

    def effective_weight(self, now: float) -> float:
        """The configured weight, lowered while the endpoint recently said it was busy."""
        return self.weight * self.busy_weight if self.busy_until > now else self.weight

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.ejections = 0

    def counts(self, sent_at: float, now: float | None = None) -> bool:
        """Whether the outcome of a request sent at ``sent_at`` says anything about the endpoint now.

        Requests sent before the last ejection ended (or while it lasts: panic mode) were already
        accounted for by that ejection.
        """
        return not self.ejected(now) and sent_at >= self.ejected_until

    def mark_busy(self, health: HealthConfig) -> None:
        """The endpoint answered "busy" (overload): send it less for ``health.busy_s``, keep it in."""
        self.busy_until = time.monotonic() + health.busy_s
        self.busy_weight = health.busy_weight

    def eject(self, health: HealthConfig, now: float) -> None:
        backoff = min(health.eject_max_s, health.eject_base_s * (2**self.ejections))
        self.ejections += 1
        self.consecutive_failures = 0
        self.ejected_until = now + backoff

    def end_ejection(self) -> None:
        """A passing health check: back in rotation now; the back-off multiplier is kept."""
        now = time.monotonic()
        if self.ejected_until > now:
            self.ejected_until = now
        self.consecutive_failures = 0


@dataclass(eq=False)
class Pool:
    name: PoolName
    models: list[str]
    endpoints: list[Endpoint] = field(default_factory=list)
    num_speculative_tokens: int | None = None
    draft_cost_ratio: float | None = None
    probe_every: int = 20  # one pick in this many may go to a demoted endpoint
    _ticket: itertools.count[int] = field(default_factory=itertools.count, repr=False)

    def available(self) -> list[Endpoint]:
        now = time.monotonic()
        return [e for e in self.endpoints if e.available(now)]

    def has_available(self) -> bool:
        now = time.monotonic()
        return any(e.available(now) for e in self.endpoints)

    def ejected(self) -> int:
        now = time.monotonic()
        return sum(e.ejected(now) for e in self.endpoints)

    def pick(self, exclude: Iterable[Endpoint] = (), panic: bool = False) -> Endpoint | None:
        """The available endpoint with the fewest requests per unit of (effective) weight, among those
        with a free seat when any has one.

        An endpoint's requests are the gateway's own in flight (always fresh) and those of others (other
        clients, other workers) its engine held beyond them at the last scrape. Only the others' are
        taken from the scrape: a sole gateway balancing on a count as old as the scrape interval would
        send every request to the endpoint that looked lighter then, and swing at each scrape. One whose
        requests fill its seats (``max_num_seqs``, as learned from its queues) goes after every endpoint
        with a free seat: a request sent there waits for a seat while a peer would start it at once (a
        small replica beside large ones would otherwise take as many requests as they do and queue them).
        Endpoints of a pool whose every candidate is idle (no request of the gateway's or of others in
        its engine), and endpoints tied otherwise, take turns by a smooth weighted rotation among them
        alone: each gains its weight in credit, and the one with the most gives the sum back. So light
        traffic spreads in proportion to the weights (an endpoint of weight 3 beside two of 1 took every
        sequential request, being the least loaded per unit of weight each time), and evenly over the
        endpoints left when one is out (a rotation over all of them gave an absent endpoint's turn to
        the next in the list, which took two shares). With ``panic`` every endpoint not draining is a
        candidate, whether ejected or failing its health checks. A demoted endpoint is picked only when
        no other is available, or on a probe (one pick in ``probe_every``, which goes to a demoted
        endpoint when there is one).
        """
        skip = set(exclude)
        now = time.monotonic()
        probe = next(self._ticket) % self.probe_every == 0
        # the candidates of the best tier: a free seat before a full endpoint, a demoted one after every
        # other except on a probe, which it takes
        tier: list[tuple[Endpoint, float, float]] = []  # (endpoint, its load, its weight)
        best_tier = 0.0
        for ep in self.endpoints:
            if ep in skip or ep.draining or not (panic or ep.available(now)):
                continue
            load = ep.outstanding + ep.others
            rank = FULL if ep.seats is not None and load >= ep.seats else 0.0
            if ep.demoted:
                rank += -DEMOTED if probe else DEMOTED
            if not tier or rank < best_tier:
                tier, best_tier = [(ep, load, ep.effective_weight(now))], rank
            elif rank == best_tier:
                tier.append((ep, load, ep.effective_weight(now)))
        if len(tier) < 2:
            return tier[0][0] if tier else None
        if any(load for _, load, _ in tier):
            # the fewest requests per unit of weight, counting the one being placed
            least = min((load + 1) / weight for _, load, weight in tier)
            tier = [c for c in tier if (c[1] + 1) / c[2] == least]
            if len(tier) == 1:
                return tier[0][0]
        best, total = tier[0][0], 0.0
        for ep, _, weight in tier:
            ep.credit += weight
            total += weight
            if ep.credit > best.credit:
                best = ep
        best.credit -= total
        return best

    def record_failure(self, endpoint: Endpoint, health: HealthConfig, sent_at: float) -> bool:
        """Count a failed request sent at ``sent_at``; return True when this failure ejects the endpoint.

        Failures of requests that predate the endpoint's last ejection do not count, and an
        endpoint is not ejected when that would put more than ``health.max_ejection_percent`` of
        the pool, or its last usable endpoint, out.
        """
        now = time.monotonic()
        if not endpoint.counts(sent_at, now):
            return False
        endpoint.consecutive_failures += 1
        if endpoint.consecutive_failures < health.eject_after_failures:
            return False
        if not self._may_eject(endpoint, health, now):
            return False
        endpoint.eject(health, now)
        return True

    def _may_eject(self, endpoint: Endpoint, health: HealthConfig, now: float) -> bool:
        ejected = sum(e.ejected(now) for e in self.endpoints)
        if (ejected + 1) * 100 > health.max_ejection_percent * len(self.endpoints):
            return False
        return any(e is not endpoint and e.available(now) for e in self.endpoints)

    def set_endpoints(self, endpoints: list[Endpoint]) -> list[Endpoint]:
        """Replace the endpoint list (discovery); return the endpoints that left, now draining."""
        keep = {e.base_url for e in endpoints}
        current = {e.base_url: e for e in self.endpoints}
        merged = [current.get(e.base_url, e) for e in endpoints]
        gone = [e for e in self.endpoints if e.base_url not in keep]
        for e in gone:
            e.draining = True
        self.endpoints = merged
        return gone
