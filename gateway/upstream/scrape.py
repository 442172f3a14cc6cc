"""Reading each endpoint's own ``/metrics``: speculative-decoding counters, load gauges and step times.

Every ``routing.scrape_interval_s`` the gateway fetches every endpoint's Prometheus page and keeps
the last two readings. Acceptance over the interval comes from counter deltas (vLLM's definitions:
draft acceptance rate Δaccepted / Δdraft_tokens, mean acceptance length 1 + Δaccepted / Δdrafts,
per-position rates Δper_pos[i] / Δdrafts); load comes from the gauges. Counters and request gauges
are summed over the ``engine`` label (a data-parallel server's engines); KV-cache usage, a fraction
of each engine's own cache, is the fullest engine's. A counter that went down means the server
restarted: its current value is then the delta since the restart. Absent or all-zero counters
(Neuron's fused speculation keeps them at 0) simply give no interval acceptance: the per-request
measurements do not depend on them.

The inter-token latency histogram's sum and count (``vllm:inter_token_latency_seconds``, formerly
``vllm:time_per_output_token_seconds``: one sample per request per engine step) give the mean step time
over the interval, at about the batch the running gauge showed. On the baseline pool that is its time per
output token, timed by the server for every request it ran: what a gateway whose clients never stream
(only streams time a token) would otherwise never learn.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import PoolName
from gateway.observability import Metrics
from gateway.speculation import Measured
from gateway.upstream.health import causes, failure
from gateway.upstream.pool import Endpoint, Pool

log = logging.getLogger("specroute.scrape")

_DRAFTS = "vllm:spec_decode_num_drafts_total"
_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
_ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
_RUNNING = "vllm:num_requests_running"
_WAITING = "vllm:num_requests_waiting"
_KV = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
_STEP_FAMILIES = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")  # newest first
_STEP_SUMS = tuple(f + "_sum" for f in _STEP_FAMILIES)
_STEP_COUNTS = tuple(f + "_count" for f in _STEP_FAMILIES)
# one sample per engine step, prefill steps included: what tells an engine that steps from one that hangs
_ITERATIONS = "vllm:iteration_tokens_total_count"
STALE_SCRAPES = 3  # a page older than this many intervals says nothing of the endpoint now
MIN_STEPS = 20
"""Engine steps an interval must hold for its mean step time to count (fewer are one request's noise)."""
UNREAD_STEPS = 64
"""Step times kept for routing to take: a gateway with no requests for a while reads the latest ones."""
MAX_PAGE_BYTES = 8 * 1024 * 1024
"""The longest ``/metrics`` page read (vLLM's are ~60 KB): a longer one fails its scrape. Read whole, a
400 MB page takes the gateway to 2 GB and holds its event loop (its ``/health`` too) for seconds."""
# Only the lines of those families reach the parser: a vLLM page is ~50 KB, mostly histogram buckets,
# and parsing all of it held the event loop for ~5 ms per scrape; these ~20 lines take ~0.2 ms.
_FAMILIES = (
    "vllm:spec_decode_num_",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:gpu_cache_usage_perc",
)
# the histograms' sum and count only (their buckets are most of the page), read as untyped samples
_KEEP = _FAMILIES + tuple(f"# TYPE {name}" for name in _FAMILIES) + _STEP_SUMS + _STEP_COUNTS + (_ITERATIONS,)


def _wanted(text: str) -> str:
    """The sample and TYPE lines of the families ``parse`` reads, without counters' ``_created``."""
    return "\n".join(
        line
        for line in text.split("\n")
        if line.startswith(_KEEP) and not line.partition("{")[0].endswith("_created")
    )


class PageTooLarge(ValueError):
    """A ``/metrics`` page longer than :data:`MAX_PAGE_BYTES`: no vLLM's, and not read further."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One parsed ``/metrics`` page; ``None`` where the series is absent."""

    at: float
    drafts: float | None = None
    draft_tokens: float | None = None
    accepted: float | None = None
    per_pos: tuple[float, ...] = ()
    running: float | None = None
    waiting: float | None = None
    kv_usage: float | None = None
    step_seconds: float | None = None  # the inter-token latency histogram's sum ...
    steps: float | None = None  # ... and count
    iterations: float | None = None  # engine steps, prefill ones included (vllm:iteration_tokens_total)
    # a data-parallel server's engines (its running gauge's engine labels), and those of them that held
    # requests running: each engine steps its own requests only
    engines: int = 1
    busy: int = 1

    @property
    def bare(self) -> bool:
        """None of the series read from a vLLM page is on it: another server's page (a proxy's)."""
        series = (self.running, self.waiting, self.kv_usage, self.drafts, self.steps, self.iterations)
        return all(v is None for v in series)

    @property
    def batch(self) -> float | None:
        """The requests running per engine that holds any: the batch each engine step runs. The running
        gauge is the server's total, and a data-parallel server's engines step apart."""
        return None if self.running is None else self.running / max(self.busy, 1)


class StepTime(NamedTuple):
    """An interval's mean engine step time, at about ``batch`` running requests (per engine of a
    data-parallel server), over ``steps`` steps."""

    seconds: float
    batch: float
    steps: float


#: more speculative tokens per step than any deployment drafts (vLLM's own examples stop near 10)
MAX_POSITIONS = 64


def parse(text: str, at: float = 0.0) -> Reading:
    """Parse a vLLM metrics page (the ``_created`` samples beside counters are ignored).

    A series with a non-finite sample (NaN, ±Inf) on any engine is absent from the reading: such a
    value is no count of requests, steps or tokens, and a sum over engines that left it out would look
    like a counter going down (a restart) at the next page.
    """
    sums: dict[str, float] = {}
    peaks: dict[str, float] = {}
    pos: dict[int, float] = {}
    running: dict[str, float] = {}  # by engine
    broken: set[str] = set()
    for family in text_string_to_metric_families(_wanted(text)):
        for s in family.samples:
            name = s.name
            if name == _PER_POS:
                p = s.labels.get("position")
                # a position past any draft length is no vLLM's (a page claiming position 20,000,000
                # would have the reading hold that many zeros)
                if p is not None and p.isdigit() and int(p) < MAX_POSITIONS:
                    pos[int(p)] = pos.get(int(p), 0.0) + s.value
            elif name in _KV:
                # each engine of a data-parallel server has a cache of its own: the fullest one is
                # what refuses requests first (and a sum of fractions is none: 1.4 for two at 0.7)
                peaks[name] = max(peaks.get(name, s.value), s.value)
            elif (
                name in (_DRAFTS, _DRAFT_TOKENS, _ACCEPTED, _RUNNING, _WAITING)
                or name in _STEP_SUMS
                or name in _STEP_COUNTS
                or name == _ITERATIONS
            ):
                sums[name] = sums.get(name, 0.0) + s.value
                if name == _RUNNING:
                    engine = s.labels.get("engine", "")
                    running[engine] = running.get(engine, 0.0) + s.value
            else:
                continue
            if not math.isfinite(s.value):
                broken.add(name)
    for name in broken:
        sums.pop(name, None)
        peaks.pop(name, None)
    if _PER_POS in broken:
        pos.clear()
    kv = next((peaks[n] for n in _KV if n in peaks), None)
    # one histogram's sum and count, the newest name's where a server exports both
    named = next((i for i, n in enumerate(_STEP_COUNTS) if n in sums and _STEP_SUMS[i] in sums), None)
    per_pos = tuple(pos.get(i, 0.0) for i in range(max(pos) + 1)) if pos else ()
    return Reading(
        at,
        sums.get(_DRAFTS),
        sums.get(_DRAFT_TOKENS),
        sums.get(_ACCEPTED),
        per_pos,
        sums.get(_RUNNING),
        sums.get(_WAITING),
        kv,
        None if named is None else sums[_STEP_SUMS[named]],
        None if named is None else sums[_STEP_COUNTS[named]],
        sums.get(_ITERATIONS),
        max(1, len(running)),
        sum(1 for n in running.values() if n > 0),
    )


def step_time(prev: Reading | None, cur: Reading) -> StepTime | None:
    """The mean step time over ``prev`` → ``cur``; ``None`` without the histogram, across a restart, or
    with fewer than :data:`MIN_STEPS` steps in between."""
    if prev is None or prev.steps is None or prev.step_seconds is None:
        return None
    before, now = prev.batch, cur.batch
    if cur.steps is None or cur.step_seconds is None or now is None or before is None:
        return None
    steps, seconds = cur.steps - prev.steps, cur.step_seconds - prev.step_seconds
    if steps < MIN_STEPS or seconds <= 0:  # too few, or the server restarted (its counts went down)
        return None
    return StepTime(seconds / steps, (before + now) / 2, steps)


@dataclass(frozen=True, slots=True)
class Interval:
    """Acceptance between two readings."""

    drafts: float
    draft_tokens: float
    accepted: float
    per_position: tuple[float, ...]
    k: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.accepted / self.draft_tokens

    @property
    def mean_length(self) -> float:
        return 1.0 + self.accepted / self.drafts

    @property
    def alpha(self) -> float:
        return Measured(self.accepted, self.drafts, self.k, "counters").alpha


def restarted(prev: Reading | None, cur: Reading) -> bool:
    """A counter went down between two pages: the server restarted in between (a new process, maybe
    with other settings, such as another ``max_num_seqs``)."""
    if prev is None:
        return False
    pairs = (
        (prev.drafts, cur.drafts),
        (prev.draft_tokens, cur.draft_tokens),
        (prev.accepted, cur.accepted),
        (prev.steps, cur.steps),
        (prev.iterations, cur.iterations),
    )
    return any(p is not None and c is not None and c < p for p, c in pairs)


def _step_count(reading: Reading) -> float | None:
    """The engine's step count on a page: its iterations, else the inter-token histogram's count."""
    return reading.iterations if reading.iterations is not None else reading.steps


def interval(prev: Reading | None, cur: Reading, k: int | None = None) -> Interval | None:
    """Acceptance over ``prev`` → ``cur``; ``None`` without counters or without new drafts."""
    if cur.drafts is None or cur.draft_tokens is None or cur.accepted is None:
        return None
    p = prev if prev is not None and prev.drafts is not None else Reading(cur.at)
    reset = p.drafts is not None and (
        cur.drafts < p.drafts
        or (cur.draft_tokens < (p.draft_tokens or 0))
        or cur.accepted < (p.accepted or 0)
    )
    if reset:
        p = Reading(p.at)  # restarted: everything since the restart is the delta
    d_drafts = cur.drafts - (p.drafts or 0.0)
    d_tokens = cur.draft_tokens - (p.draft_tokens or 0.0)
    d_acc = cur.accepted - (p.accepted or 0.0)
    if d_drafts <= 0 or d_tokens <= 0:
        return None
    if cur.per_pos and (not reset and len(p.per_pos) in (0, len(cur.per_pos))):
        base = p.per_pos or (0.0,) * len(cur.per_pos)
        per_position = tuple(max(0.0, c - b) / d_drafts for c, b in zip(cur.per_pos, base, strict=True))
    else:
        per_position = tuple(c / d_drafts for c in cur.per_pos) if reset else ()
    # the counters' own positions first: a server redeployed with another k than configured drafts its own
    kk = len(cur.per_pos) or k or round(d_tokens / d_drafts)
    return Interval(d_drafts, d_tokens, d_acc, per_position, kk, cur.at - p.at)


@dataclass(eq=False)
class EndpointScrape:
    """What the last scrapes of one endpoint said."""

    endpoint: Endpoint
    reading: Reading | None = None
    previous: Reading | None = None
    last: Interval | None = None  # the latest interval that had drafts
    last_at: float | None = None  # monotonic time of the latest successful scrape
    watched_at: float = field(default_factory=time.monotonic)  # when its scrapes began
    step: StepTime | None = None  # the mean step time since the reading it was counted from, when new
    # the reading steps are counted from: kept until MIN_STEPS have gone by since, so that a sparse pool's
    # steps, split over scrapes, still add up to a step time
    step_base: Reading | None = None
    # step times counted and not yet taken by routing, which reads at its next decision: several scrape
    # rounds may pass between two decisions, and a sparse pool's one step time must not be lost in them
    unread: deque[StepTime] = field(default_factory=lambda: deque(maxlen=UNREAD_STEPS))
    capacity: int | None = None  # running requests seen while others waited: max_num_seqs
    # what routing reads while the last scrape is fresh, and once it is too old: made at each scrape
    # rather than at each of the requests in between
    loads: tuple[EndpointLoad, EndpointLoad] | None = None
    failures: int = 0
    error: str | None = None
    told_k: bool = False  # the log said its counters' k differs from the configured one
    told_drafting: bool = False  # the log said this baseline endpoint runs a draft model
    exported: set[str] = field(default_factory=set)  # its gauge series this process set (Scraper.export)
    told_bare: bool = False  # the log said its page has none of vLLM's series (until a page has them)
    # since when its engine has held requests running without taking a step (None: it steps, or is idle)
    still_since: float | None = None
    in_line: bool = False  # a queue: requests waited at two scrapes in a row (see ``queued``)
    restarts: int = 0  # how often its counters went down: its server restarted

    @property
    def k(self) -> int | None:
        if self.reading is not None and self.reading.per_pos:
            return len(self.reading.per_pos)
        return self.last.k if self.last else None

    def age(self, now: float | None = None) -> float | None:
        if self.last_at is None:
            return None
        return (time.monotonic() if now is None else now) - self.last_at

    def staleness(self, now: float) -> float:
        """Seconds since the latest successful scrape, or since scraping began while none has succeeded.

        What ``specroute_upstream_scrape_age_seconds`` reports: an endpoint whose ``/metrics`` never
        answered (a proxy in front that serves only ``/v1`` and ``/health``) is as stale as one whose
        scrapes stopped, and must reach the alert on that gauge rather than have no series at all.
        """
        return now - (self.watched_at if self.last_at is None else self.last_at)

    @property
    def queued(self) -> bool:
        """A queue: requests waited at two scrapes in a row, and it lasts until two in a row see none.

        One waiting count is not a queue: vLLM counts a request as waiting from its arrival to the
        engine's next step. Nor does one empty count end one: a full batch whose requests finished
        together leaves no line for the moment its clients take to send their next ones, and a
        request routed in that moment joins the line they form again (a wait of seconds).
        """
        return self.in_line

    def stalled(self, reading: Reading, hold_s: float = 0.0) -> float | None:
        """How long the engine has held requests without taking a step, as of ``reading`` (None while it
        steps or is idle, or when its page has no step count). Call before :meth:`update`.

        Held: running by its page, or waiting on it for their first byte by the gateway's own count. An
        engine that hung right after requests came in never reported them running (its API server's
        gauge stays where the engine's last report left it: 0), yet a request that has not had its
        first token is one that a working engine takes steps for. Once judged hung (and those requests
        sent elsewhere) it counts as held until its step count moves or ``hold_s`` have passed since it
        stopped stepping: an engine that came back with nothing to do takes no step either, and only
        requests sent to it again can tell.
        """
        before = self.reading
        count = _step_count(reading)
        last = (
            None
            if before is None
            else (before.iterations if reading.iterations is not None else before.steps)
        )
        ep = self.endpoint
        since = self.still_since
        held = (
            reading.running
            or ep.awaiting
            or (ep.stalled and since is not None and reading.at - since < hold_s)
        )
        if not held or count is None or last is None or count != last:
            self.still_since = None
            return None
        if self.still_since is None:
            self.still_since = before.at if before is not None else reading.at
        return reading.at - self.still_since

    def update(self, reading: Reading, k: int | None) -> None:
        """Take a new page in.

        Everything is worked out before anything is set: a page that made the working-out raise would
        otherwise leave the state half of the new page's and half of the old (its reading replaced, its
        scrape time and loads not), and nothing would say so but the growing scrape age.
        """
        iv = interval(self.reading, reading, k)
        base = self.step_base
        step = step_time(base, reading)
        # counted, or nothing to count from (first page, restart): the next step time counts from here
        rebase = step is not None or base is None or base.steps is None or (reading.steps or 0.0) < base.steps
        # a restart ends what was learned of the old process's engine: its seats and its line
        fresh = restarted(self.reading, reading)
        previous = None if fresh else self.reading
        capacity = None if fresh else self.capacity
        waited = bool(previous and previous.waiting)
        in_line = waited if bool(reading.waiting) == waited else (False if fresh else self.in_line)
        running = int(reading.running or 0)
        if in_line and running:
            # the most requests seen running while a queue lasted: the engine's seats (max_num_seqs)
            capacity = max(capacity or 0, running)
        elif capacity is not None and running > capacity:
            capacity = running
        # a queue behind an engine that steps: overload. One that stopped stepping (a hung engine whose
        # server still answers) is not excused its time-outs
        stepping = (
            previous is None
            or previous.steps is None
            or reading.steps is None
            or reading.steps > previous.steps
        )
        in_engine = (reading.running or 0.0) + (reading.waiting or 0.0)
        # requests waiting behind a batch that has all its seats taken wait for one to free: a line at
        # the first scrape that sees it (the two-scrape rule is for a batch with free seats, where a
        # request waits only for the engine's next step)
        full = bool(reading.waiting) and capacity is not None and running >= capacity
        engines = reading.engines
        loads = (
            EndpointLoad(in_engine, in_line or full, capacity, engines),
            EndpointLoad(None, False, capacity, engines),
        )
        ep = self.endpoint
        others = max(0.0, in_engine - ep.outstanding)
        # nothing below can raise
        if iv is not None:
            self.last = iv
        self.step = step
        if step is not None:
            self.unread.append(step)
        if rebase:
            self.step_base = reading
        self.previous, self.reading = previous, reading
        self.capacity, self.in_line, self.last_at, self.loads = capacity, in_line, reading.at, loads
        self.failures, self.error = 0, None
        ep.queueing = bool(reading.waiting) and stepping
        ep.others, ep.seats = others, capacity
        if fresh:
            self.restarts += 1
            log.info(
                "endpoint %s/%s restarted (counters on its /metrics went down): its seats and its line"
                " are learned afresh",
                ep.pool,
                ep.name,
            )

    def snapshot(self) -> dict[str, Any]:
        r, iv, ep = self.reading, self.last, self.endpoint
        now = time.monotonic()
        out: dict[str, Any] = {
            "pool": ep.pool,
            "endpoint": ep.name,
            # whether it is in rotation, and why not: which replica is out during an outage, without
            # reading the up and ejected gauges side by side
            "available": ep.available(now),
            "healthy": ep.healthy,
            "stalled": ep.stalled,
            "ejected_for_s": _round(max(0.0, ep.ejected_until - now)),
            "busy_for_s": _round(max(0.0, ep.busy_until - now)),
            "demoted": ep.demoted,
            "draining": ep.draining,
            "scrape_age_s": _round(self.age()),
            "scrape_error": self.error,
            "running": r.running if r else None,
            "waiting": r.waiting if r else None,
            "kv_cache_usage": _round(r.kv_usage) if r else None,
            "capacity": self.capacity,
            "inflight": self.endpoint.outstanding,
            "speculative_counters": bool(r and r.drafts is not None),
            "step_ms": None if self.step is None else _round(self.step.seconds * 1000),
        }
        if iv is not None:
            out["acceptance"] = {
                "draft_acceptance_rate": _round(iv.rate),
                "mean_acceptance_length": _round(iv.mean_length),
                "alpha": _round(iv.alpha),
                "per_position": [_round(x) for x in iv.per_position],
                "k": iv.k,
                "drafts": iv.drafts,
                "interval_s": _round(iv.seconds),
            }
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


class EndpointLoad(NamedTuple):
    """What an endpoint's scrapes say of its load: what routing reads (see :meth:`Scraper.load`).

    A named tuple: routing reads one per endpoint per decision.
    """

    in_engine: float | None  # running + waiting at the last scrape, None when that is too old
    # requests waited at two scrapes in a row, and two have not since seen none; or at the last one,
    # behind a batch at its capacity
    queued: bool
    capacity: int | None  # the most seen running while others waited (the engine's seats)
    # a data-parallel server's engines: the loads above are their totals, a step's batch is one engine's
    engines: int = 1


@dataclass
class Scraper:
    """Scrapes every endpoint of every pool; routing reads it through :meth:`load`, :meth:`drafts`
    and :meth:`snapshots`."""

    client: httpx.AsyncClient
    pools: Mapping[PoolName, Pool]
    metrics: Metrics
    interval_s: float
    timeout_s: float = 2.0
    # an engine that holds requests running and takes no step for this long is hung (None: not judged)
    stall_s: float | None = None
    by_endpoint: dict[int, EndpointScrape] = field(default_factory=dict)
    rounds: int = 0  # scrape rounds done: what routing reads once per round, it reads when this moves
    # each endpoint's scrape still under way, by id(endpoint): a slow one outlives its round
    pending: dict[int, asyncio.Task[None]] = field(default_factory=dict)

    def of(self, endpoint: Endpoint) -> EndpointScrape:
        state = self.by_endpoint.get(id(endpoint))
        if state is None or state.endpoint is not endpoint:
            state = self.by_endpoint[id(endpoint)] = EndpointScrape(endpoint)
        return state

    def load(self, endpoint: Endpoint, max_age_s: float, now: float | None = None) -> EndpointLoad | None:
        """The endpoint's load as last scraped; ``None`` before its first successful scrape."""
        state = self._state(endpoint)
        if state is None or state.loads is None or state.last_at is None:
            return None
        age = (time.monotonic() if now is None else now) - state.last_at
        return state.loads[0] if age <= max_age_s else state.loads[1]

    def drafts(self, endpoint: Endpoint) -> int | None:
        """How many tokens the endpoint drafts per step (k), as its counters' labels say."""
        state = self._state(endpoint)
        return state.k if state is not None else None

    def positions(self, endpoint: Endpoint) -> int | None:
        """How many draft positions the endpoint's last page counts (its k, by vLLM's own labels), or
        None where it has no per-position counters."""
        state = self._state(endpoint)
        if state is None or state.reading is None:
            return None
        return len(state.reading.per_pos) or None

    def engines(self, endpoint: Endpoint) -> int:
        """How many engines the endpoint's server runs (``--data-parallel-size``) by its last page; 1 before
        its first: the batch one engine steps is its share of the endpoint's requests."""
        state = self._state(endpoint)
        return state.reading.engines if state is not None and state.reading is not None else 1

    def restarts(self, endpoint: Endpoint) -> int:
        """How often the endpoint's server was seen to restart (its counters went down)."""
        state = self._state(endpoint)
        return state.restarts if state is not None else 0

    def drafting(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's last page had speculative decoding's counters (a draft model runs)."""
        state = self._state(endpoint)
        return state is not None and state.reading is not None and state.reading.drafts is not None

    def take_steps(self, endpoint: Endpoint) -> list[StepTime]:
        """The endpoint's step times counted since the last call, oldest first (each is taken once)."""
        state = self._state(endpoint)
        if state is None or not state.unread:
            return []
        steps = list(state.unread)
        state.unread.clear()
        return steps

    def times_steps(self, endpoint: Endpoint) -> bool:
        """Whether the endpoint's last page had the inter-token histogram (its steps can be timed)."""
        state = self._state(endpoint)
        return state is not None and state.reading is not None and state.reading.steps is not None

    def snapshots(self) -> list[dict[str, Any]]:
        """Every endpoint's scrape state, for ``/admin/routing``."""
        return [s.snapshot() for s in self.by_endpoint.values()]

    def _state(self, endpoint: Endpoint) -> EndpointScrape | None:
        state = self.by_endpoint.get(id(endpoint))
        return state if state is not None and state.endpoint is endpoint else None

    def endpoints(self) -> list[Endpoint]:
        return [e for p in self.pools.values() for e in p.endpoints]

    async def scrape_once(self) -> None:
        """One round: every endpoint's page, waiting one interval at most.

        A page that has not come by then (a black-holed endpoint, a server too busy to answer) is read
        when it comes, and its endpoint is not asked again meanwhile. Waiting for it held every other
        endpoint's reading back until its time-out (2 s): with an interval under 1 s their loads were
        older than routing's limit of three intervals for much of the time, and routing ignored them.
        """
        eps = self.endpoints()
        for ep in eps:
            if id(ep) not in self.pending:
                self.pending[id(ep)] = asyncio.create_task(self._scrape(ep), name=f"{ep.pool}/{ep.name}")
        if self.pending:
            await asyncio.wait(list(self.pending.values()), timeout=self.interval_s)
        # the endpoints now: discovery may have removed some while the round waited (and dropped their
        # gauges, which an export of their state would bring back, frozen, for the process's life)
        live = {id(e) for e in self.endpoints()}
        for key, task in list(self.pending.items()):
            if task.done():
                del self.pending[key]
                _log_unexpected(task)
            elif key not in live:  # an endpoint discovery removed
                task.cancel()
                del self.pending[key]
        for key in [k for k in self.by_endpoint if k not in live]:
            del self.by_endpoint[key]
        self.rounds += 1
        self.export()

    async def _scrape(self, ep: Endpoint) -> None:
        state = self.of(ep)
        try:
            reading = parse(await self._fetch(ep.base_url + "/metrics"), time.monotonic())
        except (httpx.HTTPError, ValueError, TimeoutError) as e:
            ep.queueing = False  # unknown: its time-outs count as faults again
            ep.others = 0.0  # unknown: the picker goes by the gateway's own requests alone
            if ep.stalled:  # unknown too: its health checks decide alone
                ep.stalled = False
                state.still_since = None
            if not state.failures:  # told when they start failing, not at every scrape
                log.warning(
                    "endpoint %s/%s: scraping its /metrics fails (%s): its load, acceptance and step times"
                    " are unknown until a scrape succeeds",
                    ep.pool,
                    ep.name,
                    _why(e, self.timeout_s),
                )
            state.failures += 1
            state.error = _kind(e)
            return
        if state.failures:
            log.info(
                "endpoint %s/%s: its /metrics is scraped again, after %d failed scrape(s)",
                ep.pool,
                ep.name,
                state.failures,
            )
        self._judge_stall(ep, state, reading)
        pool = self.pools.get(ep.pool)
        configured = pool.num_speculative_tokens if pool else None
        state.update(reading, configured)
        self._tell_bare(ep, state, reading)
        if ep.pool == "baseline" and reading.drafts is not None and not state.told_drafting:
            # a speculative server in the baseline pool (a pod of the wrong Deployment behind the
            # Service): its step is not baseline's, by which the draft's cost is measured
            state.told_drafting = True
            log.warning(
                "endpoint %s/%s has speculative decoding's counters in its /metrics: it runs a draft model,"
                " so its step times are left out of baseline's; list it in pools.speculative",
                ep.pool,
                ep.name,
            )
        drafted = len(reading.per_pos) if reading.per_pos else None
        if configured and drafted and drafted != configured and not state.told_k:
            # the counters' k is the one measurements read streams by (gateway.app.speculative_k)
            state.told_k = True
            log.warning(
                "endpoint %s/%s drafts %d tokens per step by its /metrics, but "
                "pools.speculative.num_speculative_tokens is %d: its acceptance is measured with %d, as"
                " its counters say; set it to the server's num_speculative_tokens, or leave it unset",
                ep.pool,
                ep.name,
                drafted,
                configured,
                drafted,
            )

    async def _fetch(self, url: str) -> str:
        """An endpoint's page, read as it comes and given up past :data:`MAX_PAGE_BYTES`.

        :attr:`timeout_s` bounds the whole of it: httpx's time-out bounds each read, so a page that
        trickles in a few bytes at a time never timed out, and its endpoint, its scrape still pending,
        was never asked again.
        """
        async with asyncio.timeout(self.timeout_s):
            async with self.client.stream("GET", url, timeout=self.timeout_s) as resp:
                resp.raise_for_status()
                return await _read_page(resp, MAX_PAGE_BYTES)

    def _tell_bare(self, ep: Endpoint, state: EndpointScrape, reading: Reading) -> None:
        """Say once that an endpoint's page, though it answers, has none of the vLLM series read from it.

        A proxy's page, or another server's: the endpoint's load, acceptance and step times are then
        unknown while its scrape age says it is read, and nothing else would tell an operator why.
        """
        bare = reading.bare
        if bare and not state.told_bare:
            log.warning(
                "endpoint %s/%s: its /metrics answers without vLLM's series (%s, %s, ...): its load,"
                " acceptance and step times are unknown; is that page its vLLM server's?",
                ep.pool,
                ep.name,
                _RUNNING,
                _WAITING,
            )
        state.told_bare = bare

    def _judge_stall(self, ep: Endpoint, state: EndpointScrape, reading: Reading) -> None:
        """Take an endpoint whose engine hangs out of rotation, and back once it steps again.

        A hung engine (a stuck collective, a wedged device) behind a server that still answers passes
        its health checks: ``/health`` and ``/metrics`` come from the API server, and the running gauge
        stays where it was. Its step count does not move: with requests running, no step for
        :attr:`stall_s` takes the endpoint out (its health checks fail while it lasts) and sends the
        requests waiting on it for a first byte elsewhere.
        """
        # judged hung, it stays out for one more stall_s with nothing left on it (its page cannot tell a
        # hung engine from one that came back idle), then its next requests tell
        before = state.reading
        stepped = before is None or _step_count(reading) != _step_count(before)
        still = state.stalled(reading, 2 * self.stall_s if self.stall_s is not None else 0.0)
        hung = self.stall_s is not None and still is not None and still >= self.stall_s
        if hung and not ep.stalled:
            ep.stalled = True
            moved = ep.unanswering()
            ep.healthy = False
            log.warning(
                "endpoint %s/%s is unhealthy: its engine took no step for %.0f s with %d request(s) running"
                " by its page; %d request(s) waiting for its answer sent elsewhere",
                ep.pool,
                ep.name,
                still,
                int(reading.running or 0),
                moved,
            )
        elif not hung and ep.stalled:
            ep.stalled = False  # its next health check brings it back
            if stepped:
                log.warning("endpoint %s/%s: its engine steps again", ep.pool, ep.name)
            else:
                log.warning(
                    "endpoint %s/%s: still no step, but nothing waits on it any more: back in rotation,"
                    " for its next requests to tell whether its engine runs",
                    ep.pool,
                    ep.name,
                )

    def export(self) -> None:
        """Refresh the scrape gauges (also called when ``/metrics`` is rendered, for the age)."""
        m = self.metrics
        now = time.monotonic()
        for state in self.by_endpoint.values():
            ep, r = state.endpoint, state.reading
            if ep.draining:  # discovery removed it: its gauges are gone (Metrics.forget), and stay so
                continue
            m.scrape_age.labels(ep.pool, ep.name).set(state.staleness(now))
            if r is None:
                continue
            if state.last_at is not None and now - state.last_at > STALE_SCRAPES * self.interval_s:
                # no page for a while (the server is down, or its /metrics fails): its last load and
                # acceptance would read as current beside its up gauge at 0, as routing no longer reads
                # them; dropped until a page comes
                r = Reading(r.at)
            self._export_reading(state, r)

    def _export_reading(self, state: EndpointScrape, r: Reading) -> None:
        """Set an endpoint's gauges from its last page, and drop those of the series it lacked: kept,
        their last values would read as the current ones (a proxy's page, a restart without a draft).

        Only series this process set are dropped: in multiprocess mode a drop writes NaN, which would
        give every baseline endpoint an acceptance series of its own.
        """
        m, ep = self.metrics, state.endpoint
        acceptance = state.last.rate if state.last is not None and r.drafts is not None else None
        for key, gauge, labels, value in (
            ("running", m.pool_load, (ep.pool, ep.name, "running"), r.running),
            ("waiting", m.pool_load, (ep.pool, ep.name, "waiting"), r.waiting),
            ("kv", m.kv_cache_usage, (ep.pool, ep.name), r.kv_usage),
            ("acceptance", m.endpoint_acceptance, (ep.pool, ep.name), acceptance),
        ):
            if value is not None:
                gauge.labels(*labels).set(value)
                state.exported.add(key)
            elif key in state.exported:
                m.drop(gauge, labels)
                state.exported.discard(key)

    async def run(self) -> None:
        try:
            while True:
                try:
                    await self.scrape_once()
                except Exception:  # never let one bad page stop the loop
                    log.exception("scrape round failed")
                await asyncio.sleep(self.interval_s)
        finally:  # the scrapes still under way end with the loop (at shutdown, before the client closes)
            for task in self.pending.values():
                task.cancel()
            await asyncio.gather(*self.pending.values(), return_exceptions=True)


async def _read_page(resp: httpx.Response, limit: int) -> str:
    """The page's text, read chunk by chunk so that one past ``limit`` is never held whole."""
    declared = resp.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise PageTooLarge(f"/metrics page of {declared} bytes, over {limit}")
    chunks: list[bytes] = []
    size = 0
    async for chunk in resp.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise PageTooLarge(f"/metrics page over {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks).decode(resp.encoding or "utf-8", errors="replace")


def _why(error: Exception, timeout_s: float) -> str:
    """What a failed scrape met, for the log: an HTTP status, the socket's own error where there is one
    (httpx's aiohttp transport reports a refused connection as a connect *time-out*, which sent an
    operator looking for a slow server that was not running), else the error and its message."""
    if isinstance(error, httpx.HTTPStatusError):
        return f"HTTP {error.response.status_code}"
    if isinstance(error, httpx.HTTPError) and (cause := _cause(error)) is not None:
        return failure(cause, timeout_s)
    text = str(error)[:200]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _kind(error: Exception) -> str:
    """A failed scrape's kind for ``/admin/routing``: the error's type, or the socket's where it differs."""
    cause = _cause(error) if isinstance(error, httpx.HTTPError) else None
    return type(cause).__name__ if cause is not None else type(error).__name__


def _cause(error: httpx.HTTPError) -> OSError | None:
    """The socket's own error behind an HTTP client's (a refused or reset connection, a name that does
    not resolve), or None."""
    for e in causes(error):
        if isinstance(e, (ConnectionRefusedError, ConnectionResetError, socket.gaierror)):
            return e
    return None


def _log_unexpected(task: asyncio.Task[None]) -> None:
    """Log what a finished scrape raised beyond the failures it records itself: one endpoint's bad page
    must not cost the others their round."""
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("scrape of %s failed", task.get_name(), exc_info=error)
