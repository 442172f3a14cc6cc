"""``specroute bench learning``: does routing learn a deployment's acceptance, at every load?

Two emulated pools serve a draft model given by an acceptance profile (``--acceptance-profile``,
e.g. ``skewed-draft``: strong on code and fiction, slower than no speculation on data formats,
copying and counting, a small gain on other prose). Every strategy gets a fresh gateway (nothing
learned carries over) and the same seeded stream of requests from the built-in ``mixed``
workload, at each load. The **oracle** knows each prompt's emulated alpha and the emulated costs
and names the pool per request: speculative exactly when ``E(alpha, k) > 1 + k·c``, the
small-batch break-even (it ignores load, so under load a strategy can beat it).

Figures are for the *second half* of each run (the first half is where learning happens), as mean
TPOT and mean end-to-end time (queueing included) in emulated milliseconds (wall time ÷ time
scale), and as the share of the oracle's TPOT gain over ``always-baseline``:
``(TPOT_base - TPOT) / (TPOT_base - TPOT_oracle)``. Loads are emulated requests per second (the
wall-clock rate is that ÷ the time scale).

Each load is judged on one figure of merit, against the *best fixed strategy* (the better of
``always-baseline`` and ``always-speculative`` on that figure): below ``tpot_below`` req/s nothing
queues, time to first token is the same on both pools, and TPOT is what a pool changes; from
there on requests queue (a fixed pool saturates first), and the time a request takes to finish is
what counts; TPOT then ignores the wait (a strategy that spreads requests over both pools runs
larger batches, so a worse TPOT, and finishes them far sooner).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from gateway import stack
from gateway.bench import loadgen
from gateway.bench.client import Client
from gateway.bench.loadgen import Load, Target
from gateway.bench.report import table
from gateway.bench.workloads import RequestSpec, order, prepare, resolve
from gateway.emulator.acceptance import base_profile, effective_alpha, load_profile
from gateway.speculation import expected_length

STRATEGIES = ("always-baseline", "always-speculative", "classifier", "adaptive", "oracle")
FIXED = ("always-baseline", "always-speculative")
K = 7


@dataclass
class LearningOptions:
    profile: str = "skewed-draft"
    rates: Sequence[float] = (1.0, 4.0, 20.0)
    requests: int = 400
    max_tokens: int = 64
    time_scale: float = 0.1
    draft_cost_ratio: float = 0.05
    max_num_seqs: int = 32
    strategies: Sequence[str] = STRATEGIES
    seed: int = 0
    model: str = "demo-model"
    routing: dict[str, Any] = field(default_factory=dict)  # extra routing settings for every gateway
    tpot_below: float = 2.0  # loads (req/s) judged on TPOT; from here on on e2e (see the module notes)
    # virtual time only: every gateway first serves the workload once with another seed, then restarts
    # from the state it saved (``routing.state_file``)
    restarted: bool = False
    first_half: bool = False  # virtual time only: judge each run's first half (what a restart changes)
    workload: str = "mixed"  # a built-in prompt set (``mixed-formats``: some structured tasks want verse)
    temperature: float = 0.0  # every request's sampling temperature (the emulator scales alpha by it)
    # virtual time only: from this request on, the draft is ``then_profile`` (a new draft model deployed)
    switch_at: int | None = None
    then_profile: str | None = None


def oracle_pools(texts: Sequence[str], profile: str, c: float, temperature: float = 0.0) -> list[str]:
    """The oracle's pool per prompt: speculative exactly when it gains at a batch of one."""
    alphas = emulated_alphas(texts, profile, temperature)
    return ["speculative" if expected_length(a, K) > 1 + K * c else "baseline" for a in alphas]


def emulated_alphas(texts: Sequence[str], profile: str, temperature: float = 0.0) -> list[float]:
    """Each prompt's acceptance as the emulator draws it under ``profile`` at ``temperature``."""
    prof = load_profile(profile)
    return [effective_alpha(base_profile(t, prof).alpha, temperature, 1.0) for t in texts]


def _run_one(
    url: str, specs: Sequence[RequestSpec], load: Load, oracle: Sequence[str] | None
) -> list[loadgen.Record]:
    async def go() -> list[loadgen.Record]:
        if oracle is None:
            client = Client(url)
            try:
                records, _ = await loadgen.generate([Target("", client)], specs, load)
            finally:
                await client.aclose()
            return records
        clients = {pool: Client(url, {"x-specroute-pool": pool}) for pool in ("speculative", "baseline")}
        targets = {pool: Target(pool, c) for pool, c in clients.items()}
        try:
            records, _ = await loadgen.generate(lambda i: targets[oracle[i % len(oracle)]], specs, load)
        finally:
            for c in clients.values():
                await c.aclose()
        return records

    out: list[loadgen.Record] = loadgen.run_sync(go())
    return out


def _summary(records: Sequence[loadgen.Record], scale: float) -> dict[str, Any]:
    half = [r for r in records[len(records) // 2 :] if r.ok and r.tpot is not None]
    tpots = [r.tpot for r in half if r.tpot is not None]
    e2es = [r.e2e for r in half if r.e2e is not None]
    return {
        "ok": sum(r.ok for r in records),
        "errors": sum(not r.ok for r in records),
        "tpot_ms": 1000 * sum(tpots) / len(tpots) / scale if tpots else None,
        "e2e_ms": 1000 * sum(e2es) / len(e2es) / scale if e2es else None,
        "spec_share": sum(r.pool == "speculative" for r in half) / len(half) if half else None,
        "explored": sum(r.reason == "explore" for r in half),
    }


def execute(opts: LearningOptions, log_dir: Path | None = None) -> dict[str, Any]:
    """Every strategy at every load; ``{"config", "loads": {rate: {strategy: summary}}}``."""
    unknown = set(opts.strategies) - set(STRATEGIES)
    if unknown:
        raise ValueError(f"unknown strategies {sorted(unknown)}; known: {', '.join(STRATEGIES)}")
    if opts.switch_at is not None:
        raise ValueError("a draft that changes mid-run (--switch-at) needs --virtual")
    load_profile(opts.profile)  # a bad profile fails here, not in the emulators
    workload = resolve(opts.workload, None)
    specs = order(
        prepare(workload, model=opts.model, max_tokens=opts.max_tokens, temperature=opts.temperature),
        opts.seed,
    )
    oracle = oracle_pools([text_of(s) for s in specs], opts.profile, opts.draft_cost_ratio, opts.temperature)
    logs = log_dir or Path(tempfile.mkdtemp(prefix="specroute-learning-"))
    extra = [
        "--served-model-name", opts.model, "--time-scale", f"{opts.time_scale:g}",
        "--draft-cost-ratio", f"{opts.draft_cost_ratio:g}", "--max-num-seqs", str(opts.max_num_seqs),
        "--acceptance-profile", opts.profile, "--seed", str(opts.seed),
    ]  # fmt: skip
    scale = opts.time_scale
    routing = {
        "seed": opts.seed,
        "scrape_interval_s": 3 * scale,
        "half_life_s": 60 * scale,
        "acceptance_half_life_s": 600 * scale,
        **opts.routing,
    }
    out: dict[str, Any] = {}
    spec = stack.start_emulator("speculative", extra=extra, log_dir=logs)
    with stack.running(spec):
        base = stack.start_emulator("baseline", extra=extra, log_dir=logs)
        with stack.running(base):
            for rate in opts.rates:
                load = Load(rate=rate / scale, requests=opts.requests, seed=opts.seed, timeout=120)
                row: dict[str, Any] = {}
                for strategy in opts.strategies:
                    gw_strategy = "always-baseline" if strategy == "oracle" else strategy
                    cfg = stack.demo_config(
                        [spec.url],
                        [base.url],
                        stack.free_port(),
                        opts.model,
                        gw_strategy,
                        extra={"routing": routing, "pools": {"speculative": {"draft_cost_ratio": 0.05}}},
                    )
                    gw = stack.start_gateway(cfg, logs, name=f"gateway-{strategy}-{rate:g}")
                    with stack.running(gw):
                        records = _run_one(gw.url, specs, load, oracle if strategy == "oracle" else None)
                    row[strategy] = _summary(records, scale)
                out[f"{rate:g}"] = row
    return {
        "config": {
            "profile": opts.profile,
            "requests": opts.requests,
            "max_tokens": opts.max_tokens,
            "time_scale": opts.time_scale,
            "draft_cost_ratio": opts.draft_cost_ratio,
            "max_num_seqs": opts.max_num_seqs,
            "seed": opts.seed,
            "routing": routing,
            "tpot_below": opts.tpot_below,
            "workload": opts.workload,
            "temperature": opts.temperature,
        },
        "loads": out,
    }


def text_of(spec: RequestSpec) -> str:
    """The prompt (or last user turn) that decides a request's emulated acceptance."""
    body = orjson.loads(spec.body)
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    messages = body.get("messages") or []
    return next((m["content"] for m in reversed(messages) if m.get("role") == "user"), "")


def oracle_share(row: dict[str, Any], strategy: str) -> float | None:
    """The share of the oracle's TPOT gain over always-baseline that ``strategy`` got."""
    try:
        base, oracle, got = (row[s]["tpot_ms"] for s in ("always-baseline", "oracle", strategy))
    except KeyError:
        return None
    if base is None or oracle is None or got is None or base - oracle <= 0:
        return None
    return float((base - got) / (base - oracle))


def merit(rate: float, tpot_below: float) -> str:
    """The figure a load is judged on: ``tpot_ms`` below ``tpot_below`` req/s, else ``e2e_ms``."""
    return "tpot_ms" if rate < tpot_below else "e2e_ms"


def versus_best_fixed(row: dict[str, Any], strategy: str, metric: str) -> float | None:
    """``strategy``'s ``metric`` over the better fixed strategy's (< 1: better than either pool)."""
    fixed = [row[s][metric] for s in FIXED if s in row and row[s].get(metric) is not None]
    got = row.get(strategy, {}).get(metric)
    if not fixed or got is None or min(fixed) <= 0:
        return None
    return float(got / min(fixed))


def _with_change(value: float | None, ref: float | None) -> list[str]:
    if value is None:
        return ["-", "-"]
    return [f"{value:.2f}", f"{(value - ref) / ref:+.1%}" if ref else "-"]


def _window(config: dict[str, Any]) -> str:
    half = "First half of each run" if config.get("first_half") else "Second half of each run"
    if config.get("restarted"):
        return (
            "Every gateway restarted from the state an earlier run of the workload (another seed) left in"
            f" its state file. {half}"
        )
    return half


def _switch(config: dict[str, Any]) -> str:
    at = config.get("switch_at")
    return "" if at is None else f" (`{config.get('then_profile')}` from request {at} on)"


def _temperature(config: dict[str, Any]) -> str:
    t = config.get("temperature") or 0.0
    return f", temperature {t:g}" if t else ""


def markdown(result: dict[str, Any]) -> str:
    c = result["config"]
    tpot_below = float(c.get("tpot_below", LearningOptions.tpot_below))
    lines = [
        "# specroute bench learning",
        "",
        f"Acceptance profile `{c['profile']}`{_switch(c)}, {c['requests']} requests per strategy and load"
        f" from the `{c.get('workload', 'mixed')}` workload, max_tokens {c['max_tokens']}"
        f"{_temperature(c)}, draft cost ratio {c['draft_cost_ratio']:g},"
        f" {'virtual time' if c.get('virtual') else 'time scale ' + format(c['time_scale'], 'g')},"
        f" seed {c['seed']}. {_window(c)}; TPOT and e2e"
        " (mean, queueing included) in emulated ms; 'of oracle': share of the oracle's TPOT gain over"
        " always-baseline (none where the oracle gains nothing). 'vs best fixed': the strategy's"
        " figure of merit over the better of always-baseline and always-speculative (< 1: better);"
        f" the merit is TPOT below {tpot_below:g} req/s (nothing queues) and e2e from there on.",
        "",
    ]
    header = [
        "load (req/s)", "strategy", "TPOT ms", "vs baseline", "of oracle", "e2e ms", "vs baseline",
        "vs best fixed", "→spec", "explored", "err",
    ]  # fmt: skip
    rows = []
    summary = []
    for rate, row in result["loads"].items():
        base = row.get("always-baseline", {})
        metric = merit(float(rate), tpot_below)
        for name, s in row.items():
            share = oracle_share(row, name)
            vs = versus_best_fixed(row, name, metric)
            rows.append(
                [
                    rate,
                    name,
                    *_with_change(s["tpot_ms"], base.get("tpot_ms")),
                    f"{share:.2f}" if share is not None else "-",
                    *_with_change(s.get("e2e_ms"), base.get("e2e_ms")),
                    f"{vs:.3f}" if vs is not None else "-",
                    f"{s['spec_share']:.0%}" if s["spec_share"] is not None else "-",
                    str(s["explored"]),
                    str(s["errors"]),
                ]
            )
        if "adaptive" in row:
            tpot, e2e = (versus_best_fixed(row, "adaptive", m) for m in ("tpot_ms", "e2e_ms"))
            summary.append(
                [
                    rate,
                    "TPOT" if metric == "tpot_ms" else "e2e",
                    f"{tpot:.3f}" if tpot is not None else "-",
                    f"{e2e:.3f}" if e2e is not None else "-",
                ]
            )
    text = "\n".join(lines) + table(header, rows) + "\n"
    if summary:
        text += "\nadaptive vs best fixed strategy (ratio, < 1: better):\n\n"
        text += table(["load (req/s)", "judged on", "TPOT", "e2e"], summary) + "\n"
    return text


def cost(requests: int = 5000, seed: int = 0) -> dict[str, float]:
    """Microseconds per request of the per-request acceptance model's three steps (pure Python).

    Bodies are the ``mixed`` workload's prompts as completions and as chat requests; the classifier's
    output is computed once beforehand (its own cost is measured by the classifier's benchmark).
    """
    import random
    import time

    from gateway.routing.alpha_model import AlphaModel
    from gateway.routing.classify import load_classifier
    from gateway.routing.features import extract

    clf = load_classifier()
    bodies: list[dict[str, Any]] = []
    for p in resolve("mixed", None).prompts:
        bodies.append({"prompt": p.text, "max_tokens": 128, "temperature": 0})
        bodies.append(
            {
                "messages": [
                    {"role": "system", "content": "You are a helpful assistant."},
                    {"role": "user", "content": p.text},
                ],
                "temperature": 0.7,
            }
        )
    preds = [clf.predict(b) for b in bodies]
    rng = random.Random(seed)
    model = AlphaModel(60.0)
    t_extract = t_predict = t_update = 0.0
    samples: list[float] = []
    clock = time.perf_counter
    for _ in range(requests):
        i = rng.randrange(len(bodies))
        body, pred = bodies[i], preds[i]
        t0 = clock()
        x = extract(body, pred.kind, pred.p_structured)
        t1 = clock()
        prediction = model.predict(x, pred.p_structured)
        t2 = clock()
        model.observe(x, pred.p_structured, rng.random(), 60.0, prediction)
        t3 = clock()
        t_extract += t1 - t0
        t_predict += t2 - t1
        t_update += t3 - t2
        samples.append(t3 - t0)
    samples.sort()
    us = 1e6 / requests
    return {
        "requests": float(requests),
        "extract_us": t_extract * us,
        "predict_us": t_predict * us,
        "update_us": t_update * us,
        "total_us": (t_extract + t_predict + t_update) * us,
        "total_p99_us": samples[int(0.99 * (len(samples) - 1))] * 1e6,
    }
