"""``specroute bench learning --virtual``: the learning benchmark in virtual time, deterministic and fast.

The real benchmark runs emulators, gateways and clients in wall-clock time; on a busy machine its
figures move by a few per cent from one run to the next, which is the size of the differences it is
asked to resolve. This replays the same experiment, request for request, in virtual time:

* the same requests in the same seeded order (the ``mixed`` workload), the same Poisson arrivals;
* two engines that follow the emulator's model (:mod:`gateway.emulator.engine`): a FIFO queue, at
  most ``max_num_seqs`` running, a prefill step for the sequences just admitted, decode steps whose
  cost is the emulator's own ``Engine.decode_cost_ms``, and per verification step the leading
  successes of ``k`` Bernoulli draws at the prompt's alpha under the acceptance profile;
* the gateway's real routing policy (:class:`AdaptivePolicy`, any strategy) with its pools'
  in-flight counts and a scraper fed the engines' running and waiting counts every scrape interval,
  learning from every finished request as the gateway does (acceptance handed over as the server's
  per-request summary would give it). Its clocks read virtual time.

Left out: HTTP, the stream's chunking, and wall-clock jitter. Times are emulated seconds.
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from gateway.bench.learning import STRATEGIES, LearningOptions, emulated_alphas, oracle_pools, text_of
from gateway.bench.workloads import order, prepare, resolve
from gateway.config import RoutingConfig, Strategy
from gateway.emulator.config import EmulatorConfig, Mode
from gateway.emulator.engine import Engine
from gateway.emulator.metrics import EngineMetrics
from gateway.emulator.tokenizer import encode_prompt
from gateway.observability import Metrics
from gateway.routing.adaptive import AdaptivePolicy, PolicyState
from gateway.routing.classify import load_classifier
from gateway.routing.policy import Classifier, Decision, Outcome, RouteRequest
from gateway.types import PoolName
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import Reading, Scraper

K = 7
SCRAPE_S = 3.0  # the benchmark's scrape interval in emulated seconds


@dataclass(eq=False, slots=True)
class _Request:
    index: int
    body: dict[str, Any]
    alpha: float
    rng: random.Random
    arrival: float
    prompt_tokens: int
    decision: Decision | None = None
    pool: PoolName = "baseline"
    first: float | None = None
    tokens: int = 0
    steps: int = 0
    accepted: int = 0


@dataclass(eq=False)
class _Engine:
    """One emulated vLLM engine in virtual time: the emulator's costs, scheduling and draws."""

    name: PoolName
    costs: Engine
    max_tokens: int
    waiting: deque[_Request] = field(default_factory=deque)
    running: list[_Request] = field(default_factory=list)
    step: tuple[float, list[_Request], bool] | None = None  # (ends at, members, prefill?)

    @classmethod
    def build(cls, mode: Mode, opts: LearningOptions) -> _Engine:
        cfg = EmulatorConfig(
            mode=mode, draft_cost_ratio=opts.draft_cost_ratio, max_num_seqs=opts.max_num_seqs
        )
        engine = Engine(cfg, EngineMetrics(cfg.num_speculative_tokens, cfg.max_model_len, cfg.speculative))
        return cls(mode, engine, opts.max_tokens)

    def start(self, now: float) -> None:
        """Begin the next engine step, as the emulator's loop does, unless one is under way."""
        if self.step is not None or not (self.running or self.waiting):
            return
        cap = self.costs.cfg.max_num_seqs
        admitted: list[_Request] = []
        while self.waiting and len(self.running) + len(admitted) < cap:  # at most max_num_seqs running
            admitted.append(self.waiting.popleft())
        self.running.extend(admitted)
        if admitted:
            cost = self.costs.prefill_cost_ms(sum(r.prompt_tokens for r in admitted))
            self.step = (now + cost / 1000.0, admitted, True)
        else:
            self.step = (now + self.costs.decode_cost_ms(len(self.running)) / 1000.0, self.running, False)

    def finish_step(self, now: float) -> list[_Request]:
        """Apply the step that ends now; returns the requests it completed."""
        assert self.step is not None
        _, members, prefill = self.step
        self.step = None
        done = []
        speculative = self.costs.cfg.speculative
        for r in members:
            if prefill:
                r.first, r.tokens = now, 1
            else:
                want = 1
                if speculative:
                    acc = 0
                    while acc < K and r.rng.random() < r.alpha:
                        acc += 1
                    r.steps += 1
                    r.accepted += acc
                    want += acc
                r.tokens += min(want, self.max_tokens - r.tokens)
            if r.tokens >= self.max_tokens:
                done.append(r)
        if done:
            self.running = [r for r in self.running if r not in done]
        return done


def _policy(
    strategy: str, classifier: Classifier, routing: dict[str, Any], clock: Callable[[], float]
) -> AdaptivePolicy:
    pools: dict[PoolName, Pool] = {
        "speculative": Pool("speculative", ["m"], [Endpoint("speculative", "spec-0", "")], K, 0.05),
        "baseline": Pool("baseline", ["m"], [Endpoint("baseline", "base-0", "")]),
    }
    gw = Strategy("always-baseline" if strategy == "oracle" else strategy)
    # scraped readings are stamped with the real clock and never go stale within a run
    cfg = RoutingConfig(strategy=gw, **{**routing, "scrape_interval_s": 1e6})
    scraper = Scraper(None, pools, Metrics(), SCRAPE_S)  # type: ignore[arg-type]
    policy = AdaptivePolicy.build(gw, classifier, cfg, pools, scraper, None)
    policy.alpha_model.clock = clock
    policy.estimates.clock = clock
    return policy


def run_one(
    strategy: str,
    rate: float,
    opts: LearningOptions,
    classifier: Classifier,
    oracle: Sequence[str],
    alphas: Sequence[float],
    bodies: Sequence[dict[str, Any]],
    prompt_tokens: Sequence[int],
    learned: bytes | None = None,
    keep: Callable[[bytes], None] | None = None,
) -> list[dict[str, float | str | None]]:
    """One strategy at one load; one record per request, in arrival order.

    ``learned``: a state file's policy, as an earlier run left it (taken up at once, as at a restart with
    no time down); ``keep`` is handed this run's at its end, in the same form.
    """
    now = 0.0

    def clock() -> float:
        return now

    routing = {
        "seed": opts.seed,
        "half_life_s": 60.0,
        "acceptance_half_life_s": 600.0,
        **opts.routing,
    }
    policy = _policy(strategy, classifier, routing, clock)
    if learned is not None:
        policy.restore(PolicyState.model_validate_json(learned), 0.0)
    engines: dict[str, _Engine] = {m: _Engine.build(m, opts) for m in ("speculative", "baseline")}
    eps: dict[str, Endpoint] = {
        "speculative": policy.pools["speculative"].endpoints[0],
        "baseline": policy.pools["baseline"].endpoints[0],
    }
    arrivals = random.Random(opts.seed)
    requests = []
    t = 0.0
    for i in range(opts.requests):
        n = i % len(bodies)
        rng = random.Random(f"{opts.seed}-{i}")
        requests.append(_Request(i, bodies[n], alphas[n], rng, t, prompt_tokens[n]))
        t += arrivals.expovariate(rate)
    events: list[tuple[float, int, int, str]] = [(r.arrival, 1, r.index, "") for r in requests]
    events.append((0.0, 0, 0, "scrape"))
    heapq.heapify(events)
    finished = 0
    records: list[dict[str, float | str | None]] = [{} for _ in requests]
    while events and finished < len(requests):
        now, _, i, what = heapq.heappop(events)
        if what == "scrape":
            for name, eng in engines.items():
                reading = Reading(time.monotonic(), running=len(eng.running), waiting=len(eng.waiting))
                assert policy.scraper is not None
                policy.scraper.of(eps[name]).update(reading, K if name == "speculative" else None)
            heapq.heappush(events, (now + SCRAPE_S, 0, 0, "scrape"))
            continue
        if what:
            eng = engines[what]
            for r in eng.finish_step(now):
                finished += 1
                eps[r.pool].outstanding -= 1
                records[r.index] = _record(r, now)
                policy.observe(_outcome(r, now))
        else:
            r = requests[i]
            forced: PoolName | None = oracle[i % len(oracle)] if strategy == "oracle" else None  # type: ignore[assignment]
            r.decision = policy.decide(RouteRequest(r.body, "completions", forced))
            r.pool = r.decision.pool
            eps[r.pool].outstanding += 1
            eng = engines[r.pool]
            eng.waiting.append(r)
        if eng.step is None:
            eng.start(now)
            if eng.step is not None:
                heapq.heappush(events, (eng.step[0], 2, 0, eng.name))
    if keep is not None:
        keep(policy.state().model_dump_json().encode())
    return records


def _outcome(r: _Request, now: float) -> Outcome:
    assert r.decision is not None and r.first is not None
    spec = r.pool == "speculative"
    return Outcome(
        decision=r.decision,
        pool=r.pool,
        endpoint="spec-0" if spec else "base-0",
        status=200,
        ttft_s=r.first - r.arrival,
        e2e_s=now - r.arrival,
        completion_tokens=r.tokens,
        chunks=r.steps + 1,
        accepted_tokens=r.accepted if spec else None,
        draft_tokens=r.steps * K if spec else None,
        steps=r.steps if spec else None,
    )


def _record(r: _Request, now: float) -> dict[str, float | str | None]:
    assert r.first is not None and r.decision is not None
    return {
        "e2e": now - r.arrival,
        "tpot": (now - r.first) / (r.tokens - 1) if r.tokens > 1 else None,
        "pool": r.pool,
        "reason": r.decision.reason,
        "alpha_hat": r.decision.alpha,
        "sd": r.decision.alpha_sd,
        "speedup": r.decision.predicted_speedup,
    }


def summary(records: Sequence[dict[str, Any]], first_half: bool = False) -> dict[str, Any]:
    """The real benchmark's summary (second half, emulated ms) of one simulated run; or of its first half
    (what a restart changes)."""
    cut = len(records) // 2
    part = records[:cut] if first_half else records[cut:]
    half = [r for r in part if r.get("tpot") is not None]
    n = len(half)
    return {
        "ok": len(records),
        "errors": 0,
        "tpot_ms": 1000 * math.fsum(r["tpot"] for r in half) / n if n else None,
        "e2e_ms": 1000 * math.fsum(r["e2e"] for r in half) / n if n else None,
        "spec_share": sum(r["pool"] == "speculative" for r in half) / n if n else None,
        "explored": sum(r["reason"] == "explore" for r in half),
    }


def execute(opts: LearningOptions) -> dict[str, Any]:
    """Every strategy at every load, in virtual time; the same shape as :func:`learning.execute`."""
    unknown = set(opts.strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; known: {', '.join(STRATEGIES)}")
    workload = resolve(opts.workload, None)
    specs = order(
        prepare(workload, model=opts.model, max_tokens=opts.max_tokens, temperature=opts.temperature),
        opts.seed,
    )
    bodies = [orjson.loads(s.body) for s in specs]
    texts = [text_of(s) for s in specs]
    tokens = [len(encode_prompt(t)) for t in texts]
    alphas = emulated_alphas(texts, opts.profile, opts.temperature)
    oracle = oracle_pools(texts, opts.profile, opts.draft_cost_ratio, opts.temperature)
    if opts.switch_at is not None:
        # one entry per request (run_one reads entry i % len): the first profile's, then the next one's
        if opts.then_profile is None:
            raise ValueError("--switch-at needs --then-profile: the draft deployed from that request on")
        after = emulated_alphas(texts, opts.then_profile, opts.temperature)
        after_pools = oracle_pools(texts, opts.then_profile, opts.draft_cost_ratio, opts.temperature)
        n = len(specs)
        cut = range(opts.requests)
        alphas = [(alphas if i < opts.switch_at else after)[i % n] for i in cut]
        oracle = [(oracle if i < opts.switch_at else after_pools)[i % n] for i in cut]
        bodies = [bodies[i % n] for i in cut]
        tokens = [tokens[i % n] for i in cut]
    classifier = load_classifier()
    out: dict[str, Any] = {}
    for rate in opts.rates:
        row: dict[str, Any] = {}
        for s in opts.strategies:
            learned: list[bytes] = []
            if opts.restarted:  # the run before the restart: the same workload, other arrivals and draws
                before = dataclasses.replace(opts, seed=opts.seed + 1)
                run_one(s, rate, before, classifier, oracle, alphas, bodies, tokens, keep=learned.append)
            records = run_one(
                s, rate, opts, classifier, oracle, alphas, bodies, tokens, learned[0] if learned else None
            )
            row[s] = summary(records, first_half=opts.first_half)
        out[f"{rate:g}"] = row
    return {
        "config": {
            "profile": opts.profile,
            "requests": opts.requests,
            "max_tokens": opts.max_tokens,
            "time_scale": 0.0,
            "virtual": True,
            "draft_cost_ratio": opts.draft_cost_ratio,
            "max_num_seqs": opts.max_num_seqs,
            "seed": opts.seed,
            "routing": opts.routing,
            "tpot_below": opts.tpot_below,
            "restarted": opts.restarted,
            "first_half": opts.first_half,
            "workload": opts.workload,
            "temperature": opts.temperature,
            "switch_at": opts.switch_at,
            "then_profile": opts.then_profile,
        },
        "loads": out,
    }
