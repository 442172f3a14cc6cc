"""Adaptive routing against real emulator processes (seeded, time-scaled by SCALE).

One speculative and one baseline emulator serve every test; gateways differ in strategy settings.
Strategies are compared in the same run, request by request, on the same prompts.
"""

from __future__ import annotations

import re
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import orjson
import pytest

from gateway import stack
from gateway.emulator.acceptance import profile
from gateway.speculation import expected_length
from gateway.upstream.scrape import interval, parse

MODEL = "demo-model"
SCALE = 0.2  # 45 ms steps become 9 ms
C_TRUE = 0.15  # the emulated draft model's cost; the gateway is configured with 0.05 and learns
STRUCTURED = [
    "Repeat the following line exactly 30 times: the quick brown fox",
    "Continue the sequence: 2, 4, 6, 8, 10, 12",
    "Convert this record to JSON: name Alice, age 31, city Paris",
    "Write a Python function that returns the factorial of n.",
    "Count from 1 to 200 separated by commas.",
    "Output a YAML config with keys host, port and timeout.",
    "Copy this text verbatim three times: lorem ipsum dolor sit amet",
    "Write a SQL query selecting all users older than 30.",
    "Echo back the list: apple, banana, cherry, date, elderberry",
    "Generate a CSV with columns id,name,price for 20 products.",
    "Implement a binary search function in JavaScript.",
    "List the numbers 10 20 30 40 50 and continue the pattern.",
]
OPEN = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "What do you think is the meaning of life?",
    "Describe your ideal vacation in a few paragraphs.",
    "Tell me about the history of the Roman Empire.",
    "Why do people enjoy music so much?",
    "Imagine a world without electricity and describe a day in it.",
    "What makes a good friend?",
    "Share your thoughts on the future of cities.",
    "Write a poem about the ocean at night.",
    "I believe the meaning of life is",
    "Explain why the sky feels so vast at dusk.",
    "Tell me a tale of a dragon and a knight who become friends.",
]
MIXED = [p for pair in zip(STRUCTURED, OPEN, strict=True) for p in pair]


def _emulator_args(*extra: str) -> list[str]:
    return [
        "--served-model-name", MODEL, "--time-scale", str(SCALE), "--max-num-seqs", "16",
        "--draft-cost-ratio", str(C_TRUE), "--seed", "11", *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("adaptive")


@pytest.fixture(scope="module")
def pools(workdir) -> Iterator[dict[str, stack.Process]]:
    procs = {
        "speculative": stack.start_emulator("speculative", extra=_emulator_args(), log_dir=workdir),
        "baseline": stack.start_emulator("baseline", extra=_emulator_args(), log_dir=workdir),
        "zero": stack.start_emulator(
            "speculative", extra=_emulator_args("--spec-decode-counters", "zero"), log_dir=workdir
        ),
    }
    with stack.running(*procs.values()):
        yield procs


def _gateway(
    pools, workdir, name: str, strategy: str, spec: str = "speculative", c: float = 0.05, **routing
) -> stack.Process:
    cfg = stack.demo_config(
        [pools[spec].url],
        [pools["baseline"].url],
        stack.free_port(),
        MODEL,
        strategy,
        extra={
            # configuration scaled like the emulators: 3 s scrapes and a 60 s half-life in real time
            "routing": {"seed": 5, "scrape_interval_s": 3 * SCALE, "half_life_s": 60 * SCALE, **routing},
            "auth": {"admin_key": "admin-secret"},
            "pools": {"speculative": {"draft_cost_ratio": c}},
        },
    )
    return stack.start_gateway(cfg, workdir, name)


@pytest.fixture(scope="module")
def adaptive(pools, workdir) -> Iterator[stack.Process]:
    proc = _gateway(pools, workdir, "adaptive", "adaptive", exploration_rate=0.05)
    with stack.running(proc):
        yield proc


@pytest.fixture(scope="module")
def forced(pools, workdir) -> Iterator[stack.Process]:
    """A gateway whose requests name their pool: the oracle and the always-* strategies."""
    proc = _gateway(pools, workdir, "forced", "always-baseline")
    with stack.running(proc):
        yield proc


def _run(
    url: str,
    prompt: str,
    pool: str | None = None,
    max_tokens: int = 64,
    client: httpx.Client | None = None,
    **extra,
) -> dict:
    """One streamed request; TPOT from the server's token counts, as a client sees it (on ``client``'s
    connections when given, else on a connection of its own)."""
    payload = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    headers = {"x-specroute-pool": pool} if pool else {}
    t0 = time.perf_counter()
    first = usage = None
    with (client or httpx).stream(
        "POST", url + "/v1/completions", json=payload, headers=headers, timeout=60
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = orjson.loads(line[6:])
            if obj["choices"] and first is None:
                first = time.perf_counter()
            usage = obj.get("usage") or usage
    end = time.perf_counter()
    assert first is not None and usage is not None
    return {
        "t": t0,
        "tpot": (end - first) / (usage["completion_tokens"] - 1),
        "e2e": end - t0,
        "pool": r.headers["x-specroute-pool"],
        "reason": r.headers["x-specroute-reason"],
        "prompt": prompt,
    }


def _oracle_pool(prompt: str) -> str:
    """Knows each prompt's emulated alpha and the emulated costs: speculative exactly when faster."""
    return "speculative" if expected_length(profile(prompt).alpha, 7) > 1 + 7 * C_TRUE else "baseline"


def _admin(url: str) -> dict:
    r = httpx.get(url + "/admin/routing", headers={"authorization": "Bearer admin-secret"}, timeout=10)
    assert r.status_code == 200
    return r.json()


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


@pytest.mark.timing  # compares measured TPOTs: `make test-timing`
def test_adaptive_close_to_oracle_and_better_than_always(adaptive, forced):
    # warm-up: the speedup model learns the step time, and the acceptance model sees every prompt
    # once (on a cold start it explores the ones whose acceptance it cannot tell yet)
    for p in MIXED:
        _run(adaptive.url, p)

    def variants(prompt: str) -> dict[str, dict]:
        return {
            "adaptive": _run(adaptive.url, prompt),
            "oracle": _run(forced.url, prompt, _oracle_pool(prompt)),
            "always-speculative": _run(forced.url, prompt, "speculative"),
            "always-baseline": _run(forced.url, prompt, "baseline"),
        }

    with ThreadPoolExecutor(2) as pool:
        rows = list(pool.map(variants, MIXED))
    tpot = {name: _mean([r[name]["tpot"] for r in rows]) for name in rows[0]}
    print("mean TPOT ms:", {k: round(v * 1000, 2) for k, v in tpot.items()})
    print("adaptive decisions:", [(r["adaptive"]["pool"][:4], r["adaptive"]["reason"]) for r in rows])
    # the decisions: the oracle's pool for every prompt but what exploration sends elsewhere
    chosen = [
        (r["adaptive"]["pool"], r["adaptive"]["reason"], _oracle_pool(r["adaptive"]["prompt"])) for r in rows
    ]
    # but one: "Output a YAML config ..." is read as open-ended by the classifier (p_structured 0.44), so
    # its high acceptance is known only once exploration has measured it, which the run's two requests
    # of it may or may not do (its seeded draws change with any change to what else draws)
    missed = [r["adaptive"]["prompt"] for r, (pool, reason, oracle) in zip(rows, chosen, strict=True)
              if pool != oracle and reason != "explore"]  # fmt: skip
    print("decided against the oracle:", missed)
    assert len(missed) <= 1
    assert sum(reason == "explore" for _, reason, _ in chosen) <= len(chosen) // 8
    # the time they save: close to the oracle (one run's noise on a shared machine is a few %), ahead
    # of either fixed pool
    assert tpot["adaptive"] <= 1.08 * tpot["oracle"]
    assert tpot["adaptive"] < tpot["always-speculative"]
    assert tpot["adaptive"] < tpot["always-baseline"]

    state = _admin(adaptive.url)
    model = state["speedup_model"]
    print("learned:", model)
    assert model["step_ms"] < 45 * SCALE * 1.5  # learned from the configured 45 ms
    assert model["draft_cost_ratio"] > 0.05  # moved towards the emulated 0.15
    kinds = {(k["kind"], k["class"]): k["alpha"] for k in state["estimates"]["kinds"]}
    assert kinds[("repetition", "structured")] > 0.6
    assert httpx.get(adaptive.url + "/admin/routing", timeout=10).status_code == 401


def _control(url: str, **changes: float) -> None:
    assert httpx.post(url + "/emulator/control", json=changes, timeout=10).status_code == 200


@pytest.mark.timing  # compares measured TPOTs: `make test-timing`
def test_share_follows_acceptance_drift(pools, workdir):
    # configured with the true draft cost, so that only the acceptance has to be learned here
    gw = _gateway(pools, workdir, "drift", "adaptive", c=C_TRUE, exploration_rate=0.2)
    log: list[dict] = []
    stop = threading.Event()
    prompts = STRUCTURED * 2 + OPEN  # two thirds structured: the share moves visibly

    def worker(offset: int) -> None:
        i = offset
        while not stop.is_set():
            log.append(_run(gw.url, prompts[i % len(prompts)], max_tokens=48))
            i += 7

    def share(since: float, until: float, reason: str | None = None) -> float:
        sel = [r for r in log if since <= r["t"] < until and r["prompt"] in STRUCTURED]
        assert len(sel) >= 4, "too few requests in the window"
        if reason is not None:
            return sum(r["reason"] == reason for r in sel) / len(sel)
        return sum(r["pool"] == "speculative" for r in sel) / len(sel)

    window = 30 * SCALE  # 30 s of traffic, time-scaled
    with stack.running(gw), ThreadPoolExecutor(2) as ex:
        futures = [ex.submit(worker, j) for j in range(2)]
        try:
            time.sleep(6)
            t_drop = time.perf_counter()
            before = share(t_drop - 3, t_drop)
            _control(pools["speculative"].url, acceptance_scale=0.3)
            # the share after the drop is what exploration still sends (a 0.2 floor and Thompson draws):
            # 6 s of requests (about 15 structured ones), so that one window's draws do not decide it
            time.sleep(window + 6)
            after = share(t_drop + window, t_drop + window + 6)
            predicted_after = share(t_drop + window, t_drop + window + 6, "predicted-gain")
            t_restore = time.perf_counter()
            _control(pools["speculative"].url, acceptance_scale=1.0)
            back, t_back = 0.0, None
            while time.perf_counter() < t_restore + 40:
                time.sleep(1)
                now = time.perf_counter()
                recent = [r for r in log if r["t"] > max(t_restore, now - 3) and r["prompt"] in STRUCTURED]
                if len(recent) >= 4:
                    back = sum(r["pool"] == "speculative" for r in recent) / len(recent)
                    if back >= 0.7 * before:
                        t_back = now - t_restore
                        break
        finally:
            stop.set()
            _control(pools["speculative"].url, acceptance_scale=1.0)
            for f in futures:
                f.result()
    drop_at = next(
        (
            r["t"] - t_drop
            for r in log
            if r["t"] > t_drop and r["prompt"] in STRUCTURED and r["reason"] != "predicted-gain"
        ),
        None,
    )
    print(f"structured share: before {before:.2f}, {window:.0f}s after the drop {after:.2f}", end=" ")
    print(f"(predicted gain {predicted_after:.2f}), back {back:.2f}")
    print(f"first structured request routed away {drop_at:.2f}s after the drop; back after {t_back}s")
    assert before >= 0.7, [
        (round(r["t"] - t_drop, 2), r["reason"], r["prompt"][:20])
        for r in log
        if r["t"] < t_drop and r["pool"] == "baseline" and r["prompt"] in STRUCTURED
    ]
    assert after <= 0.6 * before
    assert predicted_after <= 0.3  # most of what still goes is exploration
    assert t_back is not None, f"share did not come back (last {back:.2f})"


def _background(url: str, n: int, stop: threading.Event) -> list[threading.Thread]:
    def loop() -> None:
        while not stop.is_set():
            body = {"model": MODEL, "prompt": OPEN[0], "max_tokens": 200, "temperature": 0}
            httpx.post(url + "/v1/completions", json=body, timeout=60)

    threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
    for t in threads:
        t.start()
    return threads


@pytest.mark.timing  # compares measured times: `make test-timing`
def test_overloaded_speculative_pool_no_worse_than_baseline(pools, adaptive, forced):
    stop = threading.Event()
    threads = _background(pools["speculative"].url, 22, stop)  # past max-num-seqs 16: a queue
    try:
        time.sleep(3 * 3 * SCALE + 1)  # a queue counts once it has outlasted a scrape interval
        rows = []
        for p in MIXED[:12]:
            rows.append((_run(adaptive.url, p), _run(forced.url, p, "baseline")))
    finally:
        stop.set()
        for t in threads:
            t.join()
    # under a queue the figure of merit is the time to finish (the wait for a seat included), not TPOT;
    # the median, since one request that joins the queue (an exploration, or a decision made between
    # two scrapes that both missed the queue) waits seconds and would swamp a mean of twelve
    adaptive_e2e = statistics.median([a["e2e"] for a, _ in rows])
    baseline_e2e = statistics.median([b["e2e"] for _, b in rows])
    reasons = [(a["pool"][:4], a["reason"], round(a["e2e"], 3), round(b["e2e"], 3)) for a, b in rows]
    print(
        f"overloaded: adaptive {adaptive_e2e * 1000:.1f} ms, always-baseline {baseline_e2e * 1000:.1f} ms",
        reasons,
    )
    assert adaptive_e2e <= 1.05 * baseline_e2e
    # prose never joins the queue but to be explored; most structured prompts, which would go there on
    # an idle pool, stay off it because it queues
    prose = [a for a, _ in rows if a["prompt"] in OPEN]
    assert all(a["pool"] == "baseline" or a["reason"] == "explore" for a in prose), reasons
    structured = [a["reason"] for a, _ in rows if a["prompt"] in STRUCTURED]
    assert sum(r in ("spec-queued", "spec-busy") for r in structured) >= len(structured) // 2, structured
    time.sleep(3 * 3 * SCALE + 0.5)  # drained: the next scrapes see no queue
    assert _run(adaptive.url, STRUCTURED[0])["pool"] == "speculative"


def _log_records(proc: stack.Process) -> dict[str, dict]:
    out = {}
    for line in proc.log().splitlines():
        if line.startswith("{") and '"request_id"' in line:
            rec = orjson.loads(line)
            out[rec["request_id"]] = rec
    return out


def _log_record(proc: stack.Process, rid: str) -> dict:
    """One request's access-log line; the log is written by a thread, so it may lag the response."""
    deadline = time.monotonic() + 5
    while (rec := _log_records(proc).get(rid)) is None:
        assert time.monotonic() < deadline, f"no access-log line for {rid}"
        time.sleep(0.05)
    return rec


def _counters(url: str):
    return parse(httpx.get(url + "/metrics", timeout=10).text)


@pytest.mark.parametrize("stream", [True, False])
def test_per_request_alpha_matches_counter_deltas(pools, forced, stream):
    spec = pools["speculative"].url
    cases = [(STRUCTURED[0], None), (OPEN[1], None), (STRUCTURED[3], None), (OPEN[4], 0.6), (OPEN[5], 0.9)]
    errors = []
    for i, (prompt, override) in enumerate(cases):
        rid = f"alpha-{int(stream)}-{i}"
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 300, "temperature": 0, "stream": stream}
        if override is not None:
            body["vllm_xargs"] = {"emulated_acceptance": override}
        before = _counters(spec)
        headers = {"x-specroute-pool": "speculative", "x-request-id": rid}
        r = httpx.post(forced.url + "/v1/completions", json=body, headers=headers, timeout=60)
        assert r.status_code == 200
        iv = interval(before, _counters(spec), 7)
        assert iv is not None
        rec = _log_record(forced, rid)
        assert rec["acceptance_source"] == "stream"
        errors.append((abs(rec["acceptance"] - iv.rate), abs(rec["alpha"] - iv.alpha)))
        assert rec["acceptance"] == pytest.approx(iv.rate, abs=0.02), (prompt, rec, iv)
        assert rec["alpha"] == pytest.approx(iv.alpha, abs=0.02), (prompt, rec, iv)
    print("per-request |error| (rate, alpha):", [(round(a, 4), round(b, 4)) for a, b in errors])


def test_zero_counters_still_measured_per_request(pools, workdir):
    gw = _gateway(pools, workdir, "zero", "adaptive", spec="zero", exploration_rate=0.0)
    with stack.running(gw):
        measured = []
        for i, prompt in enumerate([*STRUCTURED[:4], *OPEN[:2]]):
            rid = f"zero-{i}"
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 200, "temperature": 0, "stream": True}
            headers = {"x-specroute-pool": "speculative", "x-request-id": rid}
            with httpx.stream(
                "POST", gw.url + "/v1/completions", json=body, headers=headers, timeout=60
            ) as r:
                r.read()
            rec = _log_record(gw, rid)
            measured.append((rec["alpha"], profile(prompt).alpha))
        time.sleep(3 * SCALE + 0.3)
        state = _admin(gw.url)
    zero = _counters(pools["zero"].url)
    assert zero.drafts == 0  # the upstream's counters never moved
    ep = next(e for e in state["endpoints"] if e["pool"] == "speculative")
    assert ep["speculative_counters"] and "acceptance" not in ep
    print("zero counters, (measured, true) alpha:", measured)
    assert _mean([m for m, _ in measured]) == pytest.approx(_mean([t for _, t in measured]), abs=0.04)
    for m, t in measured:
        assert m == pytest.approx(t, abs=0.1)
    kinds = {k["kind"]: k for k in state["estimates"]["kinds"]}
    assert kinds["repetition"]["observations"] >= 1


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_assembled_body_equals_upstream_non_streamed(pools, forced, api):
    spec = pools["speculative"].url
    path = "/v1/completions" if api == "completions" else "/v1/chat/completions"
    for prompt, extra in [
        (STRUCTURED[2], {}),
        (OPEN[0], {"stop": ["e "]}),
        (STRUCTURED[4], {"max_tokens": 7}),
    ]:
        body: dict = {"model": MODEL, "max_tokens": 40, "temperature": 0, **extra}
        if api == "completions":
            body["prompt"] = prompt
        else:
            body["messages"] = [{"role": "user", "content": prompt}]
        via = httpx.post(
            forced.url + path, json=body, headers={"x-specroute-pool": "speculative"}, timeout=60
        )
        direct = httpx.post(spec + path, json=body, timeout=60)
        a, b = via.json(), direct.json()
        assert re.match(r"(chat)?cmpl-", a.pop("id")) and b.pop("id")
        a.pop("created"), b.pop("created")
        assert a == b
        assert list(a) == list(b)


@pytest.mark.timing  # compares measured TPOTs: `make test-timing`
def test_adaptive_learns_a_draft_model_unlike_the_prior(tmp_path):
    """The emulated draft model is strong where the classifier's prior expects a loss (fiction) and
    slower than no speculation where it expects its best (data formats, copying, counting).

    Fresh gateways, the same seeded requests at light load: on the second half of the run
    ``adaptive`` must beat both fixed pools and the ``classifier`` strategy, and get most of the
    oracle's gain. The margins are loose on purpose (a loaded machine stretches every TPOT); the
    figures themselves come from ``specroute bench learning`` (docs/benchmarking.md).
    """
    from gateway.bench import learning

    opts = learning.LearningOptions(profile="skewed-draft", rates=(1.0,), requests=240, time_scale=0.1)
    result = learning.execute(opts, tmp_path)
    print(learning.markdown(result))
    row = result["loads"]["1"]
    tpot = {name: s["tpot_ms"] for name, s in row.items()}
    assert all(s["errors"] == 0 for s in row.values())
    assert tpot["adaptive"] < 0.97 * tpot["classifier"]
    assert tpot["adaptive"] < 0.9 * tpot["always-baseline"]
    assert tpot["adaptive"] < tpot["always-speculative"]
    share = learning.oracle_share(row, "adaptive")
    assert share is not None and share > 0.7


def test_endpoint_with_collapsed_acceptance_leaves_the_rotation_and_returns(tmp_path):
    """Three speculative replicas; one gets a bad draft model (acceptance scaled by 0.2 through the emulator's
    control endpoint). The gateway measures it per request, demotes it (metric and /admin/routing say
    so), keeps probing it, and puts it back once its acceptance recovers."""
    args = ["--served-model-name", MODEL, "--time-scale", "0.01", "--max-num-seqs", "16", "--seed", "3"]
    specs = [stack.start_emulator("speculative", extra=args, log_dir=tmp_path) for _ in range(3)]
    base = stack.start_emulator("baseline", extra=args, log_dir=tmp_path)
    with stack.running(*specs, base):
        cfg = stack.demo_config(
            [s.url for s in specs],
            [base.url],
            stack.free_port(),
            MODEL,
            "adaptive",
            extra={"routing": {"seed": 1, "exploration_rate": 0.0}, "auth": {"admin_key": "admin-secret"}},
        )
        gw = stack.start_gateway(cfg, tmp_path, "outlier")
        with stack.running(gw), httpx.Client() as client:
            bad = specs[2].url
            _control(bad, acceptance_scale=0.2)

            def send(n: int) -> dict:
                for i in range(n):
                    _run(gw.url, STRUCTURED[i % len(STRUCTURED)], max_tokens=48, client=client)
                return {e["endpoint"]: e for e in _admin(gw.url)["endpoint_outliers"]}

            state = send(30)
            print("after the collapse:", state)
            names = sorted(state)
            assert state[names[2]]["demoted"] and not state[names[0]]["demoted"]
            gauge = [ln for ln in httpx.get(gw.url + "/metrics", timeout=10).text.splitlines()
                     if ln.startswith("specroute_endpoint_acceptance_outlier{")]  # fmt: skip
            assert any(names[2] in ln and ln.endswith(" 1.0") for ln in gauge), gauge
            served = _counters(bad).drafts
            send(40)
            assert _counters(bad).drafts > served  # still probed ...
            _control(bad, acceptance_scale=1.0)
            for _ in range(12):  # ... so that its recovery is seen
                state = send(20)
                if not state[names[2]]["demoted"]:
                    break
            print("after the recovery:", state)
            assert not state[names[2]]["demoted"]


@pytest.mark.timing  # reads step times the emulators take in real time: `make test-timing`
def test_non_streamed_traffic_learns_baselines_step_and_keeps_a_dear_draft_away(tmp_path):
    """Clients that never stream, and a draft that costs 0.8 of a target step: speculation is slower than
    baseline for every prompt. Only streams time a token, so the gateway kept the configured step time
    and draft cost (0.05) and sent every structured prompt to the speculative pool; the baseline servers'
    inter-token histogram, scraped, times the step for the requests they run."""
    args = ["--served-model-name", MODEL, "--time-scale", str(SCALE), "--max-num-seqs", "16", "--seed", "7"]
    spec = stack.start_emulator("speculative", extra=[*args, "--draft-cost-ratio", "0.8"], log_dir=tmp_path)
    base = stack.start_emulator("baseline", extra=args, log_dir=tmp_path)
    with stack.running(spec, base):
        cfg = stack.demo_config(
            [spec.url],
            [base.url],
            stack.free_port(),
            MODEL,
            "adaptive",
            extra={
                # baseline's step is timed by the requests sent there at the exploration rate: at the
                # default 0.02, 90 requests give two timings on average, and one in five runs had one
                "routing": {"seed": 3, "scrape_interval_s": 3 * SCALE, "exploration_rate": 0.1},
                "auth": {"admin_key": "admin-secret"},
            },
        )
        gw = stack.start_gateway(cfg, tmp_path, "nonstream")
        with stack.running(gw):
            pools = []
            for i in range(90):
                payload = {"model": MODEL, "prompt": STRUCTURED[i % len(STRUCTURED)], "max_tokens": 48}
                r = httpx.post(gw.url + "/v1/completions", json=payload, timeout=60)
                assert r.status_code == 200, r.text
                pools.append(r.headers["x-specroute-pool"])
            model = _admin(gw.url)["speedup_model"]
    print("speedup model:", model, "pools:", "".join(p[0] for p in pools))
    assert model["baseline_observations"] >= 2
    assert model["draft_cost_ratio"] > 0.5  # measured against the step the servers timed (true 0.8)
    assert pools[-30:].count("baseline") >= 27  # exploration aside, the slower pool is left
