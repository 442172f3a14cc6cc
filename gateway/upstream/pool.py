"""Endpoints and pools: who is healthy, who is busy, and whom to try next.

Balancing is least-outstanding-requests weighted by the endpoint's weight. Health has two inputs:
active checks (``healthy``) and passive ejection after consecutive failures, with exponential
back-off, so a crashing endpoint is skipped before the next health check notices.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from gateway.config import HealthConfig, PoolName


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
    # set by routing when this endpoint's measured acceptance is far below its peers' (a bad draft
    # model on one replica): picked only when no peer is, or as one of the probes
    demoted: bool = False

    def available(self, now: float | None = None) -> bool:
        if not self.healthy or self.draining:
            return False
        return self.ejected_until <= (time.monotonic() if now is None else now)

    def record_success(self) -> None:
        self.consecutive_failures = 0
        self.ejections = 0

    def record_failure(self, health: HealthConfig) -> bool:
        """Count a failed request; return True when this failure ejects the endpoint."""
        self.consecutive_failures += 1
        if self.consecutive_failures < health.eject_after_failures:
            return False
        backoff = min(health.eject_max_s, health.eject_base_s * (2**self.ejections))
        self.ejections += 1
        self.consecutive_failures = 0
        self.ejected_until = time.monotonic() + backoff
        return True


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

    def pick(self, exclude: Iterable[Endpoint] = ()) -> Endpoint | None:
        """The available endpoint with the fewest outstanding requests per unit of weight.

        Ties rotate, so an idle pool still spreads requests over its endpoints. A demoted endpoint
        is picked only when no other is available, or on a probe (one pick in ``probe_every``, which goes
        to a demoted endpoint when there is one).
        """
        skip = set(exclude)
        now = time.monotonic()
        best: Endpoint | None = None
        best_score = 0.0
        n = len(self.endpoints)
        ticket = next(self._ticket)
        start = ticket % n if n else 0
        probe = ticket % self.probe_every == 0
        for i in range(n):
            ep = self.endpoints[(start + i) % n]
            if ep in skip or not ep.available(now):
                continue
            # a demoted endpoint scores after every other one, except on a probe, which it takes
            score = (ep.outstanding + 1) / ep.weight
            if ep.demoted:
                score += -1e9 if probe else 1e9
            if best is None or score < best_score:
                best, best_score = ep, score
        return best

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
