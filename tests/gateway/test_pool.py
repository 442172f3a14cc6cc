"""Balancing and passive ejection."""

from __future__ import annotations

import time
from collections import Counter

from gateway.config import HealthConfig
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import EndpointScrape, Reading


def _pool(*weights: float) -> Pool:
    eps = [Endpoint("baseline", f"e{i}", f"http://127.0.0.1:{9000 + i}", w) for i, w in enumerate(weights)]
    return Pool("baseline", ["m"], eps)


def test_least_outstanding_wins():
    pool = _pool(1, 1, 1)
    pool.endpoints[0].outstanding = 3
    pool.endpoints[1].outstanding = 1
    pool.endpoints[2].outstanding = 2
    assert pool.pick() is pool.endpoints[1]


def test_ties_rotate_and_weights_count():
    pool = _pool(1, 1)
    picked = {pool.pick().name for _ in range(4)}
    assert picked == {"e0", "e1"}
    heavy = _pool(1, 4)
    heavy.endpoints[0].outstanding = 1
    heavy.endpoints[1].outstanding = 3  # (3+1)/4 = 1 < (1+1)/1 = 2
    assert heavy.pick() is heavy.endpoints[1]


def test_light_traffic_spreads_in_proportion_to_the_weights():
    """Sequential requests (each done before the next): an endpoint of weight 3 beside two of 1 was the
    least loaded per unit of weight every time and took all of them; the weights are shares."""
    pool = _pool(3, 1, 1)
    assert Counter(pool.pick().name for _ in range(500)) == {"e0": 300, "e1": 100, "e2": 100}
    busy = _pool(1, 1)  # a busy endpoint keeps a quarter of its weight for a while: a fifth of the share
    busy.endpoints[0].busy_until, busy.endpoints[0].busy_weight = time.monotonic() + 60, 0.25
    assert Counter(busy.pick().name for _ in range(500)) == {"e0": 100, "e1": 400}


def test_the_endpoints_left_share_evenly_when_one_is_out():
    """A rotation over every endpoint gave an absent one's turn to the next in the list: with e1 of three
    down, e2 took two shares of sequential traffic and e0 one."""
    pool = _pool(1, 1, 1)
    pool.endpoints[1].healthy = False
    assert Counter(pool.pick().name for _ in range(90)) == {"e0": 45, "e2": 45}
    pool.endpoints[1].healthy, pool.endpoints[2].demoted = True, True
    picks = Counter(pool.pick().name for _ in range(100))
    assert picks["e2"] == 100 // pool.probe_every and abs(picks["e0"] - picks["e1"]) <= 1


def test_other_clients_requests_and_the_seats_count():
    """Requests the engine held beyond the gateway's own at the last scrape (other clients', other
    workers') count; an endpoint whose seats are all taken comes after every one with a free seat,
    however much larger the other's load (a small replica beside large ones)."""
    pool = _pool(1, 1, 1)
    big0, big1, small = pool.endpoints
    big0.outstanding, big0.others = 1, 8.0  # other clients fill it
    big1.outstanding = 3
    small.outstanding = 2
    assert pool.pick() is small
    small.seats = 2  # full: two of two seats taken
    big1.seats = big0.seats = 16
    assert pool.pick() is big1  # 3 of 16 seats, ahead of 9 and of a full one
    big0.others, big0.outstanding, big1.outstanding = 5.0, 10, 16
    assert pool.pick() is big0  # 16 of 16 on big1: the one with a seat (15 of 16), however loaded
    big0.outstanding = 11
    assert pool.pick() is small  # every one full: the fewest requests again
    big0.others, big0.seats = 0.0, None  # its scrapes failed: the gateway's own count alone
    big0.outstanding = 1
    assert pool.pick() is big0


def test_a_sole_gateway_balances_on_its_own_fresh_counts_not_on_a_scrape():
    """The engine's count at a scrape holds the gateway's own requests of then: only what is beyond them
    is others'. Counting the whole of it, an endpoint that held more at the scrape would be passed over
    for the whole interval after, however many of those requests had finished."""
    pool = _pool(1, 1)
    a, b = pool.endpoints
    a.outstanding, b.outstanding = 12, 8
    for ep in (a, b):  # the scrape saw the gateway's own requests, and one other client's on B
        EndpointScrape(ep).update(Reading(1.0, running=ep.outstanding + (ep is b)), None)
    assert (a.others, b.others) == (0.0, 1.0)
    a.outstanding = 5  # seven of A's finished since
    assert pool.pick() is a


def test_exclude_unhealthy_and_ejected():
    pool = _pool(1, 1, 1)
    pool.endpoints[0].healthy = False
    pool.endpoints[1].ejected_until = time.monotonic() + 60
    assert pool.pick() is pool.endpoints[2]
    assert pool.pick(exclude=[pool.endpoints[2]]) is None
    assert not _pool().has_available()


def test_ejection_after_consecutive_failures_with_backoff():
    health = HealthConfig(eject_after_failures=2, eject_base_s=1.0, eject_max_s=3.0)
    pool = _pool(1, 1)
    ep = pool.endpoints[0]
    assert not pool.record_failure(ep, health, time.monotonic())
    assert ep.available()
    assert pool.record_failure(ep, health, time.monotonic())
    assert not ep.available()
    first = ep.ejected_until - time.monotonic()
    ep.ejected_until = 0
    pool.record_failure(ep, health, time.monotonic())
    pool.record_failure(ep, health, time.monotonic())
    second = ep.ejected_until - time.monotonic()
    assert second > first  # exponential back-off
    for _ in range(10):
        ep.ejected_until = 0
        pool.record_failure(ep, health, time.monotonic())
        pool.record_failure(ep, health, time.monotonic())
    assert ep.ejected_until - time.monotonic() <= 3.0 + 0.01  # capped
    ep.record_success()
    assert ep.ejections == 0


def test_discovery_replacement_drains_departed_endpoints():
    pool = _pool(1, 1)
    kept, gone = pool.endpoints
    kept.outstanding = 2
    new = Endpoint("baseline", "e9", "http://127.0.0.1:9999")
    left = pool.set_endpoints([Endpoint("baseline", "x", kept.base_url), new])
    assert left == [gone] and gone.draining and not gone.available()
    assert pool.endpoints[0] is kept and pool.endpoints[0].outstanding == 2
    assert pool.endpoints[1] is new
