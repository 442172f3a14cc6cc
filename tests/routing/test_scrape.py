"""The scraper against real vLLM /metrics captures: expected rates come from the files' own numbers."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import time

import aiohttp
import httpx
import pytest
from httpx_aiohttp import AiohttpTransport
from prometheus_client import generate_latest

from gateway.app import speculative_k
from gateway.observability import Metrics
from gateway.upstream.pool import Endpoint, Pool
from gateway.upstream.scrape import (
    MAX_POSITIONS,
    MIN_STEPS,
    STALE_SCRAPES,
    UNREAD_STEPS,
    EndpointScrape,
    Reading,
    Scraper,
    interval,
    parse,
    step_time,
)

MODES = ["draftsame", "draftother", "ngram"]
_LINE = re.compile(r"^(vllm:[a-z_]+)\{([^}]*)\} (\S+)$", re.MULTILINE)


def _numbers(text: str) -> dict[str, float]:
    """The series the test needs, read line by line (independently of the scraper's parser)."""
    out: dict[str, float] = {}
    for name, labels, value in _LINE.findall(text):
        if name.endswith("_created"):
            continue
        pos = re.search(r'position="(\d+)"', labels)
        key = f"{name}[{pos.group(1)}]" if pos else name
        out[key] = out.get(key, 0.0) + float(value)
    return out


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("a", "b"), [("before", "under_load"), ("under_load", "after_load")])
def test_interval_rates_match_the_capture(vllm_fixture, mode, a, b):
    t0, t1 = (vllm_fixture(f"{mode}_metrics_{x}.txt").decode() for x in (a, b))
    n0, n1 = _numbers(t0), _numbers(t1)
    iv = interval(parse(t0, 10.0), parse(t1, 13.0))
    d = {k: n1[k] - n0.get(k, 0.0) for k in n1}
    drafts = d["vllm:spec_decode_num_drafts_total"]
    if drafts == 0:
        assert iv is None
        return
    assert iv is not None
    accepted = d["vllm:spec_decode_num_accepted_tokens_total"]
    assert iv.rate == pytest.approx(accepted / d["vllm:spec_decode_num_draft_tokens_total"])
    assert iv.mean_length == pytest.approx(1 + accepted / drafts)
    positions = sorted(int(k.split("[")[1][:-1]) for k in d if "[" in k)
    assert iv.k == len(positions)
    for i in positions:
        assert iv.per_position[i] == pytest.approx(
            d[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] / drafts
        )
    assert iv.seconds == pytest.approx(3.0)
    # configured with another k than the server drafts (redeployed): its own positions say its k, and
    # the interval's alpha follows them, as each request's measurement does
    other = interval(parse(t0, 10.0), parse(t1, 13.0), len(positions) + 3)
    assert other is not None and other.k == len(positions) and other.alpha == iv.alpha


@pytest.mark.parametrize("mode", MODES)
def test_load_gauges_and_created_samples_ignored(vllm_fixture, mode):
    text = vllm_fixture(f"{mode}_metrics_under_load.txt").decode()
    n = _numbers(text)
    r = parse(text)
    assert r.running == n["vllm:num_requests_running"]
    assert r.waiting == n["vllm:num_requests_waiting"]
    assert r.kv_usage == pytest.approx(n["vllm:kv_cache_usage_perc"])
    assert r.drafts == n["vllm:spec_decode_num_drafts_total"]  # not the _created timestamp


def test_both_cache_usage_names(vllm_fixture):
    text = vllm_fixture("draftsame_metrics_under_load.txt").decode()
    old = text.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert "kv_cache_usage_perc" not in old
    assert parse(old).kv_usage == pytest.approx(parse(text).kv_usage)
    assert parse(old).kv_usage > 0


def test_absent_counters_give_no_acceptance(vllm_fixture):
    a = parse(vllm_fixture("nospec_metrics.txt").decode())
    b = parse(vllm_fixture("nospec_metrics_under_load.txt").decode())
    assert b.drafts is None and b.per_pos == ()
    assert b.running is not None
    assert interval(a, b) is None


def test_all_zero_counters_give_no_acceptance(vllm_fixture):
    before = parse(vllm_fixture("draftsame_metrics_before.txt").decode())
    assert before.drafts == 0
    assert interval(before, before) is None


def test_counter_reset_uses_values_since_restart(vllm_fixture):
    after = parse(vllm_fixture("draftsame_metrics_after_load.txt").decode(), 1.0)
    under = parse(vllm_fixture("draftsame_metrics_under_load.txt").decode(), 2.0)
    iv = interval(after, under)  # counters went down: the server restarted in between
    assert iv is not None
    assert iv.drafts == under.drafts
    assert iv.rate == pytest.approx(under.accepted / under.draft_tokens)


def test_engines_are_summed(vllm_fixture):
    text = vllm_fixture("ngram_metrics_under_load.txt").decode()
    one = parse(text)
    lines = [ln for ln in text.splitlines() if ln.startswith("vllm:spec_decode") and 'engine="0"' in ln]
    two = parse(text + "\n".join(ln.replace('engine="0"', 'engine="1"') for ln in lines) + "\n")
    assert two.drafts == 2 * one.drafts
    assert two.per_pos == tuple(2 * x for x in one.per_pos)


def test_a_position_past_any_draft_length_is_left_out(vllm_fixture):
    """A page claiming position 20,000,000 would make the reading 20 million positions long."""
    text = vllm_fixture("ngram_metrics_under_load.txt").decode()
    one = parse(text)
    line = 'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",position="20000000"} 1.0\n'
    assert one.per_pos and parse(text + line).per_pos == one.per_pos
    assert len(parse(text + line.replace("20000000", str(MAX_POSITIONS - 1))).per_pos) == MAX_POSITIONS


def _scraper(handler) -> tuple[Scraper, list[Endpoint]]:
    eps = [Endpoint("speculative", "s0", "http://s0"), Endpoint("speculative", "s1", "http://s1")]
    pools = {"speculative": Pool("speculative", ["m"], eps), "baseline": Pool("baseline", ["m"], [])}
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return Scraper(client, pools, Metrics(), 1.0), eps


def test_unreachable_endpoint_is_survived(vllm_fixture):
    pages = iter([vllm_fixture(f"ngram_metrics_{x}.txt").decode() for x in ("before", "under_load")])

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "s1":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=next(pages))

    scraper, (s0, s1) = _scraper(handler)

    async def go() -> None:
        await scraper.scrape_once()
        await scraper.scrape_once()

    asyncio.run(go())
    ok, down = scraper.of(s0), scraper.of(s1)
    assert down.reading is None and down.failures == 2 and down.error == "ConnectError"
    assert ok.last is not None and ok.k == 4
    snap = ok.snapshot()
    assert snap["acceptance"]["draft_acceptance_rate"] == pytest.approx(ok.last.rate, abs=1e-4)
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for m in scraper.metrics.registry.collect()
        for s in m.samples
    }
    assert (
        samples[
            (
                "specroute_upstream_requests",
                (("endpoint", "s0"), ("pool", "speculative"), ("state", "running")),
            )
        ]
        == 8
    )
    assert ("specroute_endpoint_acceptance_ratio", (("endpoint", "s0"), ("pool", "speculative"))) in samples


def test_an_endpoint_never_scraped_is_as_stale_as_its_scrapes_are_old(vllm_fixture):
    """Its /metrics never answered: the age counts from the first try, so the stale-scrape alert sees it."""
    page = vllm_fixture("ngram_metrics_before.txt").decode()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404) if request.url.host == "s1" else httpx.Response(200, text=page)

    scraper, (s0, s1) = _scraper(handler)
    for state in (scraper.of(s0), scraper.of(s1)):
        state.watched_at -= 60  # scraped for a minute
    asyncio.run(scraper.scrape_once())
    ages = {
        s.labels["endpoint"]: s.value
        for m in scraper.metrics.registry.collect()
        for s in m.samples
        if s.name == "specroute_upstream_scrape_age_seconds"
    }
    assert ages["s0"] < 1
    assert ages["s1"] >= 60


def test_an_endpoint_that_does_not_answer_holds_back_no_other_endpoints_round(vllm_fixture):
    """A black-holed endpoint's scrape waited out its time-out (2 s) and held every other endpoint's
    reading back with it: with an interval under 1 s, their loads were older than routing takes for
    much of the time. Its page is now read when it comes, and it is not asked again meanwhile."""
    pages = iter([vllm_fixture(f"ngram_metrics_{x}.txt").decode() for x in ("before", "under_load") * 2])
    answer = asyncio.Event()
    asked: list[str] = []

    async def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "s1":
            await answer.wait()  # no time-out of its own: only the round's wait can end it
        return httpx.Response(200, text=next(pages))

    scraper, (s0, s1) = _scraper(handler)
    scraper.interval_s = 0.01

    async def go() -> None:
        for _ in range(2):
            await asyncio.wait_for(scraper.scrape_once(), 10)  # the guard of a hung test, not a timing
        assert scraper.rounds == 2 and scraper.of(s0).last is not None  # two of s0's pages: an interval
        assert scraper.of(s1).reading is None and asked.count("s1") == 1  # asked once, still waited for
        answer.set()
        await asyncio.wait_for(scraper.scrape_once(), 10)
        assert scraper.of(s1).reading is not None and not scraper.pending
        assert scraper.of(s0).failures == scraper.of(s1).failures == 0

    asyncio.run(go())


def test_capacity_is_learned_while_queueing():
    from gateway.upstream.scrape import EndpointScrape

    state = EndpointScrape(Endpoint("speculative", "s0", "http://s0"))
    state.update(Reading(1.0, running=3, waiting=0), None)
    assert state.capacity is None
    state.update(Reading(2.0, running=4, waiting=2), None)
    assert state.capacity is None and not state.queued  # one scrape: maybe a request between steps
    state.update(Reading(3.0, running=4, waiting=3), None)
    assert state.queued and state.capacity == 4
    state.update(Reading(4.0, running=2, waiting=0), None)
    assert state.queued and state.capacity == 4  # one empty scrape: maybe a batch that just finished
    state.update(Reading(5.0, running=4, waiting=2), None)
    assert state.queued  # the line its clients formed again
    state.update(Reading(6.0, running=2, waiting=0), None)
    state.update(Reading(7.0, running=1, waiting=0), None)
    assert not state.queued and state.capacity == 4  # two in a row: drained


def test_the_endpoint_is_told_its_server_queues_while_its_engine_steps():
    """What forwarding reads to tell a first byte late behind vLLM's queue from a fault."""
    from gateway.upstream.scrape import EndpointScrape

    endpoint = Endpoint("speculative", "s0", "http://s0")
    state = EndpointScrape(endpoint)
    state.update(Reading(1.0, running=4, waiting=3, steps=100.0, step_seconds=1.0), None)
    assert endpoint.queueing
    state.update(Reading(2.0, running=4, waiting=3, steps=180.0, step_seconds=2.0), None)
    assert endpoint.queueing
    # the engine took no step since: a hung engine behind a server that still answers, not a queue
    state.update(Reading(3.0, running=4, waiting=5, steps=180.0, step_seconds=2.0), None)
    assert not endpoint.queueing
    state.update(Reading(4.0, running=2, waiting=0, steps=260.0, step_seconds=3.0), None)
    assert not endpoint.queueing


def test_a_failed_scrape_leaves_no_queue_said():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    scraper, (s0, _) = _scraper(handler)
    s0.queueing, s0.others = True, 12.0
    asyncio.run(scraper.scrape_once())
    assert not s0.queueing and s0.others == 0.0  # the picker goes by the gateway's own count


def test_an_engine_that_holds_requests_and_takes_no_step_is_taken_out_until_it_steps_again(caplog):
    """A hung engine behind a server that still answers (real vLLM with its engine process stopped:
    ``/health`` 200, ``/metrics`` with the running gauge where it was) is found by its step count."""
    from gateway.config import HealthConfig
    from gateway.upstream.deadline import Deadlines
    from gateway.upstream.health import check

    page = {"running": 4, "steps": 100}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        text = (
            f'vllm:num_requests_running{{engine="0"}} {page["running"]}\n'
            f'vllm:iteration_tokens_total_count{{engine="0"}} {page["steps"]}\n'
        )
        return httpx.Response(200, text=text)

    scraper, (s0, _) = _scraper(handler)
    scraper.stall_s = 0.05
    health = HealthConfig()

    async def go() -> None:
        async def waiting() -> None:
            wait = Deadlines(60).wait()  # as forwarding waits for a first byte
            s0.awaiting.add(wait)
            with wait:
                await asyncio.sleep(30)

        task = asyncio.create_task(waiting())
        await asyncio.sleep(0)
        await scraper.scrape_once()
        assert not s0.stalled and s0.healthy
        await asyncio.sleep(0.06)
        await scraper.scrape_once()  # the same step count with requests running, for longer than stall_s
        assert s0.stalled and not s0.healthy and not s0.available()
        with pytest.raises(TimeoutError):  # the request waiting on it goes elsewhere
            await task
        assert not await check(scraper.client, s0, health)  # its /health answering 200 does not help
        page["steps"] = 130
        await scraper.scrape_once()
        assert not s0.stalled
        assert await check(scraper.client, s0, health) and s0.available()
        # idle: no request running, no step: nothing hangs
        page["running"] = 0
        for _ in range(2):
            await asyncio.sleep(0.06)
            await scraper.scrape_once()
            assert not s0.stalled

    with caplog.at_level("WARNING", logger="specroute.scrape"):
        asyncio.run(go())
    said = [
        r.getMessage() for r in caplog.records if r.name == "specroute.scrape" and "/s0" in r.getMessage()
    ]
    assert said[0].startswith("endpoint speculative/s0 is unhealthy: its engine took no step for 0 s with 4 ")
    assert said[0].endswith("1 request(s) waiting for its answer sent elsewhere")
    assert said[1:] == ["endpoint speculative/s0: its engine steps again"]


def test_an_engine_that_hung_before_reporting_its_new_requests_is_found_by_those_waiting_on_it(caplog):
    """vLLM's API server reports what the engine last told it: an engine stopped right after requests
    came in still says 0 running, and its step count stands still while the gateway's requests wait.
    Judged hung, it stays out while its count stands still, for one more stall_s with nothing left on
    it (an engine that came back idle takes no step either: then its next requests tell)."""
    from gateway.upstream.deadline import Deadlines

    scraper, (s0, _) = _scraper(lambda request: httpx.Response(503))
    scraper.stall_s = 10.0
    state = scraper.of(s0)

    def scrape(at: float, steps: float) -> None:  # what a scrape round does with the page read at ``at``
        reading = Reading(at, running=0, waiting=0, steps=steps, step_seconds=steps / 100)
        scraper._judge_stall(s0, state, reading)
        state.update(reading, None)

    async def waiting() -> None:  # a request waiting for its first byte, as forwarding waits
        wait = Deadlines(60).wait()
        s0.awaiting.add(wait)
        with wait:
            await asyncio.sleep(30)

    async def go() -> None:
        for at in (0.0, 20.0, 40.0):  # idle, nothing waiting on it: nothing hangs
            scrape(at, 100.0)
        assert not s0.stalled
        task = asyncio.create_task(waiting())
        await asyncio.sleep(0)
        scrape(45.0, 100.0)
        assert not s0.stalled  # 5 s without a step
        scrape(52.0, 100.0)
        assert s0.stalled and not s0.healthy and not s0.awaiting  # 12 s: out, the request moved
        with pytest.raises(TimeoutError):
            await task
        scrape(57.0, 100.0)
        assert s0.stalled  # nothing waits on it any more, but it took no step: still out
        scrape(58.0, 101.0)
        assert not s0.stalled  # it steps again: its next health check brings it back
        task = asyncio.create_task(waiting())
        await asyncio.sleep(0)
        scrape(70.0, 101.0)
        assert s0.stalled  # hung again (12 s): the request moved
        with pytest.raises(TimeoutError):
            await task
        scrape(75.0, 101.0)
        assert s0.stalled
        scrape(80.0, 101.0)
        assert not s0.stalled  # 22 s without a step and nothing on it: back, for the next requests to tell

    with caplog.at_level("WARNING", logger="specroute.scrape"):
        asyncio.run(go())
    said = [r.getMessage().split(": ", 1)[1] for r in caplog.records if r.name == "specroute.scrape"]
    assert [m.split(";")[0].split(",")[0] for m in said] == [
        "its engine took no step for 12 s with 0 request(s) running by its page",
        "its engine steps again",
        "its engine took no step for 12 s with 0 request(s) running by its page",
        "still no step",
    ]


def test_without_a_stall_limit_or_a_step_count_no_engine_is_judged():
    from gateway.upstream.scrape import EndpointScrape

    state = EndpointScrape(Endpoint("speculative", "s0", "http://s0"))
    assert state.stalled(Reading(1.0, running=4)) is None
    state.update(Reading(1.0, running=4), None)
    assert state.stalled(Reading(50.0, running=4)) is None  # no step count on the page
    state.update(Reading(50.0, running=4, iterations=10.0), None)
    assert state.stalled(Reading(60.0, running=4, iterations=10.0)) == 10.0


def test_a_request_waiting_for_the_next_step_is_not_a_queue():
    from gateway.upstream.scrape import EndpointScrape

    state = EndpointScrape(Endpoint("speculative", "s0", "http://s0"))
    for t in range(6):  # vLLM counts a request as waiting until the next step admits it
        state.update(Reading(float(t), running=2, waiting=1 if t % 2 else 0), None)
        assert not state.queued
    assert state.capacity is None


def test_routing_reads_load_and_drafts_through_the_scrapers_interface():
    scraper, (s0, s1) = _scraper(lambda request: httpx.Response(503))
    assert scraper.load(s0, max_age_s=5.0) is None and scraper.drafts(s0) is None  # never scraped
    state = scraper.of(s0)
    state.update(Reading(10.0, running=4, waiting=2, per_pos=(5.0, 4.0, 3.0)), None)
    state.update(Reading(11.0, running=4, waiting=3, per_pos=(6.0, 5.0, 4.0)), None)
    fresh = scraper.load(s0, max_age_s=5.0, now=12.0)
    assert fresh is not None and (fresh.in_engine, fresh.queued, fresh.capacity) == (7.0, True, 4)
    stale = scraper.load(s0, max_age_s=5.0, now=30.0)
    assert stale is not None and (stale.in_engine, stale.queued, stale.capacity) == (None, False, 4)
    assert scraper.drafts(s0) == 3 and scraper.drafts(s1) is None
    assert [snap["endpoint"] for snap in scraper.snapshots()] == ["s0"]


@pytest.mark.parametrize("mode", MODES)
def test_the_mean_step_time_is_the_inter_token_histograms_between_two_pages(vllm_fixture, mode):
    t0, t1 = (vllm_fixture(f"{mode}_metrics_{x}.txt").decode() for x in ("before", "under_load"))
    n0, n1 = _numbers(t0), _numbers(t1)
    family = "vllm:inter_token_latency_seconds"
    r0, r1 = parse(t0, 1.0), parse(t1, 2.0)
    assert (r1.steps, r1.step_seconds) == (n1[family + "_count"], n1[family + "_sum"])
    step = step_time(r0, r1)
    assert step is not None
    d_steps = n1[family + "_count"] - n0.get(family + "_count", 0.0)
    assert step.steps == d_steps
    assert step.seconds == pytest.approx((n1[family + "_sum"] - n0.get(family + "_sum", 0.0)) / d_steps)
    assert step.batch == (n0["vllm:num_requests_running"] + n1["vllm:num_requests_running"]) / 2


def test_a_step_time_needs_enough_steps_the_running_gauge_and_no_restart():
    def page(steps: float, running: float | None = 1.0, old_name: bool = False) -> Reading:
        name = "vllm:time_per_output_token_seconds" if old_name else "vllm:inter_token_latency_seconds"
        gauge = "" if running is None else f'vllm:num_requests_running{{engine="0"}} {running}\n'
        return parse(f'{gauge}{name}_sum{{engine="0"}} {steps * 0.01}\n{name}_count{{engine="0"}} {steps}\n')

    assert step_time(page(100), page(100 + MIN_STEPS)).seconds == pytest.approx(0.01)
    assert step_time(page(100, old_name=True), page(200, old_name=True)) is not None  # vLLM's older name
    assert step_time(page(100), page(99 + MIN_STEPS)) is None  # too few steps to say
    assert step_time(page(500), page(100)) is None  # restarted: its counts went down
    assert step_time(page(100, running=None), page(200, running=None)) is None
    assert step_time(None, page(200)) is None
    assert parse("vllm:num_requests_running 1\n").steps is None  # no histogram: no step time


def test_a_sparse_pools_steps_add_up_over_scrapes_to_a_step_time():
    # one short request now and then: its steps split over scrapes, none of which alone holds MIN_STEPS
    state = Scraper(None, {}, Metrics(), 1.0).of(Endpoint("baseline", "b0", "http://b0"))  # type: ignore[arg-type]
    half = MIN_STEPS // 2 + 1
    steps = []
    for n in (0, half, 2 * half, 2 * half, 2 * half + 1):
        state.update(Reading(float(n), running=1, step_seconds=n * 0.01, steps=float(n)), None)
        steps.append(state.step)
    assert steps[:2] == [None, None]
    assert steps[2] is not None and steps[2].steps == 2 * half and steps[2].seconds == pytest.approx(0.01)
    assert steps[3:] == [None, None]  # counted from the last step time on


def test_step_times_wait_to_be_taken_once_each():
    scraper = Scraper(None, {}, Metrics(), 1.0)  # type: ignore[arg-type]
    ep = Endpoint("baseline", "b0", "http://b0")
    assert scraper.take_steps(ep) == []  # never scraped
    state = scraper.of(ep)
    for n in (0, MIN_STEPS, MIN_STEPS, 3 * MIN_STEPS):
        state.update(Reading(float(n), running=1, step_seconds=n * 0.01, steps=float(n)), None)
    taken = scraper.take_steps(ep)
    assert [s.steps for s in taken] == [MIN_STEPS, 2 * MIN_STEPS]
    assert scraper.take_steps(ep) == []
    for n in range(4, 4 + UNREAD_STEPS + 10):  # a gateway that takes none keeps only the latest
        state.update(
            Reading(float(n), running=1, step_seconds=n * MIN_STEPS * 0.01, steps=n * MIN_STEPS), None
        )
    assert len(scraper.take_steps(ep)) == UNREAD_STEPS


def test_a_configured_k_the_counters_contradict_is_told_once(vllm_fixture, caplog):
    """Measurements read a stream by k: a configured one the server does not use would misread them all."""
    page = vllm_fixture("ngram_metrics_under_load.txt").decode()
    drafted = len(parse(page).per_pos)
    for configured, told in ((drafted + 2, 1), (drafted, 0), (None, 0)):
        ep = Endpoint("speculative", "s0", "http://s0")
        pools = {
            "speculative": Pool("speculative", ["m"], [ep], configured),
            "baseline": Pool("baseline", ["m"], []),
        }
        client = httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200, text=page)))
        scraper = Scraper(client, pools, Metrics(), 1.0)
        k = speculative_k(pools, scraper)  # what the observer reads each measured stream with
        assert k(ep) == configured  # nothing scraped yet
        caplog.clear()
        for _ in range(3):
            asyncio.run(scraper.scrape_once())
        warned = [r.getMessage() for r in caplog.records if "num_speculative_tokens is" in r.getMessage()]
        assert len(warned) == told, (configured, warned)
        if told:
            assert f"drafts {drafted} tokens per step" in warned[0]
            assert f"measured with {drafted}, as its counters say" in warned[0]
        # the server's own labels win over a configured k they contradict: read with a k too large, a
        # whole step reads as one that met a rejection, and acceptance is learned too low
        assert k(ep) == drafted


def test_requests_waiting_behind_a_full_batch_are_a_line_at_the_first_scrape():
    """The two-scrape rule is for a batch with free seats; behind one at its capacity a request waits for
    a seat to free, which routing must weigh from the first scrape that shows it."""
    scraper, (s0, _) = _scraper(lambda request: httpx.Response(503))
    state = scraper.of(s0)
    for t in (1.0, 2.0):
        state.update(Reading(t, running=16, waiting=6), None)
    for t in (3.0, 4.0):  # a batch that finished together: no line for a moment, then drained
        state.update(Reading(t, running=10, waiting=0), None)
    assert state.capacity == 16 and not state.queued
    state.update(Reading(5.0, running=12, waiting=1), None)  # seats free: waiting for the next step
    load = scraper.load(s0, max_age_s=5.0, now=5.5)
    assert load is not None and not load.queued
    state.update(Reading(6.0, running=12, waiting=0), None)
    state.update(Reading(7.0, running=16, waiting=6), None)
    load = scraper.load(s0, max_age_s=5.0, now=7.5)
    assert load is not None and load.queued and not state.queued


def test_a_restarted_server_is_learned_afresh():
    """Its seats and its line were the old process's: restarted with a smaller max_num_seqs, a capacity
    kept from before would count too few requests ahead and divide the wait by seats it no longer has."""
    from gateway.upstream.scrape import EndpointScrape

    state = EndpointScrape(Endpoint("speculative", "s0", "http://s0"))
    for t in (1.0, 2.0):
        state.update(Reading(t, running=8, waiting=4, steps=100.0 * t, step_seconds=t), None)
    assert state.capacity == 8 and state.queued
    state.update(Reading(3.0, running=2, waiting=3, steps=10.0, step_seconds=0.1), None)  # counters fell
    assert state.capacity is None and not state.queued  # one scrape of the new process: not yet a line
    state.update(Reading(4.0, running=2, waiting=3, steps=30.0, step_seconds=0.3), None)
    assert state.queued and state.capacity == 2
    assert (state.endpoint.others, state.endpoint.seats) == (5.0, 2)  # what the picker reads


def test_an_endpoint_discovery_removes_during_a_round_leaves_no_gauges(vllm_fixture):
    """Its gauges are dropped when it leaves (Metrics.forget); a scrape round that was under way then,
    or a /metrics render before the next round, must not bring them back, frozen, for good."""
    page = vllm_fixture("ngram_metrics_under_load.txt").decode()
    scraper: Scraper | None = None

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "s1" and scraper is not None:  # discovery removes s1 meanwhile
            pool = scraper.pools["speculative"]
            for gone in pool.set_endpoints([e for e in pool.endpoints if e.name != "s1"]):
                scraper.metrics.forget(gone)
        return httpx.Response(200, text=page)

    scraper, (_, s1) = _scraper(handler)
    asyncio.run(scraper.scrape_once())
    text = generate_latest(scraper.metrics.registry).decode()
    assert 'endpoint="s0"' in text and 'endpoint="s1"' not in text
    assert [s["endpoint"] for s in scraper.snapshots()] == ["s0"]
    # a removed endpoint still in the table (the next round prunes it) is not exported either
    scraper.by_endpoint[id(s1)] = EndpointScrape(s1, reading=Reading(1.0, running=3))
    scraper.export()
    assert 'endpoint="s1"' not in generate_latest(scraper.metrics.registry).decode()


def _set(text: str, series: str, value: str) -> str:
    """The page with every sample of ``series`` (its exact name) set to ``value``."""
    line = re.compile(rf"^({re.escape(series)}(?:\{{[^\n]*\}})?) \S+$", re.MULTILINE)
    return line.sub(rf"\g<1> {value}", text)


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
@pytest.mark.parametrize(
    ("series", "field"),
    [
        ("vllm:num_requests_running", "running"),
        ("vllm:num_requests_waiting", "waiting"),
        ("vllm:kv_cache_usage_perc", "kv_usage"),
        ("vllm:spec_decode_num_drafts_total", "drafts"),
        ("vllm:inter_token_latency_seconds_count", "steps"),
        ("vllm:iteration_tokens_total_count", "iterations"),
    ],
)
def test_a_non_finite_sample_makes_its_series_absent(vllm_fixture, series, field, value):
    text = vllm_fixture("draftsame_metrics_under_load.txt").decode()
    page = _set(text, series, value)
    assert page != text
    good, bad = parse(text), parse(page)
    assert getattr(good, field) is not None and getattr(bad, field) is None
    assert bad.accepted == good.accepted and (bad.running is None or bad.running == good.running)


def test_a_non_finite_per_position_counter_leaves_no_per_position_rates(vllm_fixture):
    text = vllm_fixture("ngram_metrics_under_load.txt").decode()
    assert parse(text).per_pos
    assert parse(_set(text, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "NaN")).per_pos == ()


def test_a_page_with_non_finite_load_gauges_is_taken_in_whole(vllm_fixture, caplog):
    """NaN running made every scrape raise half-way through its update (the reading replaced, the scrape
    time not: a fresh endpoint reported stale, with no scrape error); NaN waiting read as a queue."""
    text = vllm_fixture("draftsame_metrics_under_load.txt").decode()
    page = _set(_set(text, "vllm:num_requests_running", "NaN"), "vllm:num_requests_waiting", "NaN")
    scraper, (s0, _) = _scraper(lambda request: httpx.Response(200, text=page))
    for _ in range(2):
        asyncio.run(scraper.scrape_once())
    state = scraper.of(s0)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    assert state.last_at is not None and state.error is None and state.failures == 0
    assert state.loads is not None and state.previous is not None
    assert not state.queued and not s0.queueing
    snap = state.snapshot()
    assert (snap["running"], snap["waiting"]) == (None, None) and snap["kv_cache_usage"] is not None


def test_an_update_that_raises_leaves_the_state_as_it_was(monkeypatch):
    import gateway.upstream.scrape as scrape

    state = EndpointScrape(Endpoint("speculative", "s0", "http://s0"))
    first = Reading(1.0, running=2, waiting=1, steps=10.0, step_seconds=0.1)
    state.update(first, None)

    def kept() -> tuple[object, ...]:
        return (state.reading, state.previous, state.last_at, state.loads, state.in_line, state.step_base)

    before = kept()

    def broken(*args: object) -> None:
        raise RuntimeError("a page the update cannot take")

    monkeypatch.setattr(scrape, "EndpointLoad", broken)
    with pytest.raises(RuntimeError):
        state.update(Reading(2.0, running=3, waiting=2, steps=40.0, step_seconds=0.4), None)
    assert kept() == before
    assert not state.unread


def _data_parallel(text: str, second: str | None = None) -> str:
    """The page of a server run with ``--data-parallel-size 2``: every engine's series twice, the second
    engine's from ``second`` when given (else the same values)."""
    other = [ln for ln in (second or text).splitlines() if not ln.startswith("#") and 'engine="0"' in ln]
    return text + "\n".join(ln.replace('engine="0"', 'engine="1"') for ln in other) + "\n"


def test_a_data_parallel_servers_kv_cache_usage_is_its_fullest_engines(vllm_fixture):
    """Each engine's usage is a fraction of its own cache: summed, two engines at 0.7 made 1.4 of a
    gauge documented as 0-1."""
    text = vllm_fixture("draftsame_metrics_under_load.txt").decode()
    fuller = _set(text, "vllm:kv_cache_usage_perc", "0.7")
    assert parse(_data_parallel(fuller)).kv_usage == pytest.approx(0.7)
    emptier = _set(text, "vllm:kv_cache_usage_perc", "0.25")
    assert parse(_data_parallel(emptier, fuller)).kv_usage == pytest.approx(0.7)
    assert parse(_data_parallel(fuller, emptier)).kv_usage == pytest.approx(0.7)


def _engines(running: list[float], steps: float) -> Reading:
    """A page whose engines each run ``running[i]`` requests, with the inter-token histogram's sum and
    count (one engine's: only their sums over engines are read)."""
    lines = [f'vllm:num_requests_running{{engine="{i}"}} {n}' for i, n in enumerate(running)]
    family = "vllm:inter_token_latency_seconds"
    lines += [f'{family}_sum{{engine="0"}} {steps * 0.01}', f'{family}_count{{engine="0"}} {steps}']
    return parse("\n".join(lines) + "\n")


def test_a_data_parallel_servers_step_is_timed_at_one_engines_batch(vllm_fixture):
    """Each engine steps its own requests: two engines running 4 each step batches of 4, not 8."""
    text = vllm_fixture("draftsame_metrics_under_load.txt").decode()
    one, two = parse(text), parse(_data_parallel(text))
    assert one.running and (two.running, two.engines, two.batch) == (2 * one.running, 2, one.running)
    assert (one.engines, one.batch) == (1, one.running)
    for running, batch in (([4.0], 4.0), ([4.0, 4.0], 4.0), ([6.0, 0.0], 6.0), ([6.0, 2.0], 4.0)):
        step = step_time(_engines(running, 100), _engines(running, 100 + MIN_STEPS))
        assert step is not None and step.batch == batch, running
    idle = _engines([0.0, 0.0], 100)
    assert (idle.running, idle.batch) == (0.0, 0.0)


def test_routing_reads_a_data_parallel_servers_engines_beside_its_total_load():
    scraper, (s0, s1) = _scraper(lambda request: httpx.Response(503))
    scraper.of(s0).update(_engines([3.0, 5.0], 100), None)
    load = scraper.load(s0, max_age_s=5.0, now=1.0)
    assert load is not None and (load.in_engine, load.engines) == (8.0, 2)
    assert (scraper.engines(s0), scraper.engines(s1)) == (2, 1)


def _endpoint_gauges(scraper: Scraper, endpoint: str) -> dict[str, float]:
    """The scrape gauges of one endpoint, by series name (and state, for the request gauges)."""
    return {
        s.name + (f"[{s.labels['state']}]" if "state" in s.labels else ""): s.value
        for m in scraper.metrics.registry.collect()
        for s in m.samples
        if s.labels.get("endpoint") == endpoint
        and s.name.startswith(("specroute_upstream", "specroute_endpoint"))
    }


def test_a_page_without_vllms_series_leaves_no_gauge_at_its_old_value(vllm_fixture, caplog):
    """A page that answers 200 without vLLM's series (a proxy's) left the endpoint's gauges where the last
    vLLM page put them: a queue of 5 shown for good, beside a fresh scrape age."""
    pages = [vllm_fixture(f"ngram_metrics_{x}.txt").decode() for x in ("before", "under_load")]
    proxy = "# HELP up A proxy's own page.\n# TYPE up gauge\nup 1\n"
    page = iter([*pages, proxy, proxy, proxy, pages[1]])

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404) if request.url.host == "s1" else httpx.Response(200, text=next(page))

    scraper, _ = _scraper(handler)
    for _ in range(2):
        asyncio.run(scraper.scrape_once())
    shown = _endpoint_gauges(scraper, "s0")
    assert {"specroute_upstream_requests[waiting]", "specroute_upstream_kv_cache_usage_ratio"} <= set(shown)
    assert "specroute_endpoint_acceptance_ratio" in shown
    caplog.clear()
    for _ in range(3):
        asyncio.run(scraper.scrape_once())
    assert set(_endpoint_gauges(scraper, "s0")) == {"specroute_upstream_scrape_age_seconds"}
    told = [r for r in caplog.records if "without vLLM's series" in r.getMessage()]
    assert len(told) == 1 and told[0].levelname == "WARNING"
    asyncio.run(scraper.scrape_once())
    assert set(_endpoint_gauges(scraper, "s0")) == set(shown)


def test_a_page_past_the_size_limit_fails_its_scrape_unread(vllm_fixture, monkeypatch):
    """A 400 MB page, read whole, took the gateway to 2 GB and stalled its /health for seconds."""
    import gateway.upstream.scrape as scrape

    monkeypatch.setattr(scrape, "MAX_PAGE_BYTES", 256 * 1024)
    page = vllm_fixture("ngram_metrics_under_load.txt").decode()
    sent: dict[str, int] = {}

    async def endless(host: str):
        line = b'vllm:some_other_histogram_bucket{engine="0",le="1.0"} 1.0\n' * 1024
        for _ in range(1000):  # some 60 MB, were it read to its end
            sent[host] = sent.get(host, 0) + len(line)
            yield line

    def handler(request: httpx.Request) -> httpx.Response:
        host = request.url.host
        declared = {"content-length": str(10**9)} if host == "s1" else {}
        return httpx.Response(200, headers=declared, content=endless(host))

    scraper, (s0, s1) = _scraper(handler)
    asyncio.run(scraper.scrape_once())
    for ep in (s0, s1):
        state = scraper.of(ep)
        assert (state.error, state.failures, state.reading) == ("PageTooLarge", 1, None)
    assert sent.get("s1", 0) == 0  # its length said enough
    assert sent["s0"] < 2 * scrape.MAX_PAGE_BYTES
    fits = len(page.encode())
    assert fits < scrape.MAX_PAGE_BYTES
    scraper, (s0, _) = _scraper(lambda request: httpx.Response(200, text=page))
    asyncio.run(scraper.scrape_once())
    assert scraper.of(s0).reading is not None and scraper.of(s0).error is None


def test_a_page_that_trickles_in_fails_its_scrape_at_the_time_out():
    """httpx's time-out bounds each read: a page that came 4 bytes a second never failed, its scrape
    stayed pending and the endpoint was never asked again."""
    asked: list[str] = []

    async def trickle():
        while True:
            yield b"# x\n"
            await asyncio.sleep(0.005)

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        return httpx.Response(200, content=trickle())

    scraper, (s0, _) = _scraper(handler)
    scraper.interval_s, scraper.timeout_s = 0.01, 0.05

    async def go() -> None:
        for _ in range(100):  # each round waits one interval: up to 1 s in all, many time-outs
            await asyncio.wait_for(scraper.scrape_once(), 10)  # the guard of a hung test, not a timing
            if scraper.of(s0).failures >= 2:
                break
        for task in scraper.pending.values():
            task.cancel()

    asyncio.run(go())
    state = scraper.of(s0)
    assert state.failures >= 2 and state.error == "TimeoutError" and asked.count("s0") >= 2


def test_scrapes_that_start_failing_recover_or_see_a_restart_are_told_once_each(vllm_fixture, caplog):
    """An operator whose vLLM serves no /metrics (a 404) never heard of it; nor of a restart."""
    caplog.set_level(logging.INFO, logger="specroute.scrape")
    under, before = (vllm_fixture(f"ngram_metrics_{x}.txt").decode() for x in ("under_load", "before"))
    answers = iter(
        [
            httpx.Response(200, text=under),
            httpx.Response(404, text="Not Found"),
            httpx.Response(404, text="Not Found"),
            httpx.Response(500, text="Internal Server Error"),
            httpx.Response(200, text=under),
            httpx.Response(200, text=under),
            httpx.Response(200, text=before),  # its counters went down: a new process
            httpx.Response(200, text=before),
        ]
    )

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(503) if request.url.host == "s1" else next(answers)

    scraper, _ = _scraper(handler)
    for _ in range(8):
        asyncio.run(scraper.scrape_once())
    told = [(r.levelname, r.getMessage()) for r in caplog.records if "s0" in r.getMessage()]
    assert [level for level, _ in told] == ["WARNING", "INFO", "INFO"], told
    assert "fails (HTTP 404)" in told[0][1]
    assert "after 3 failed scrape(s)" in told[1][1]
    assert "restarted" in told[2][1]
    failing = [r.getMessage() for r in caplog.records if "s1" in r.getMessage()]
    assert len(failing) == 1 and "HTTP 503" in failing[0]


def test_a_refused_connection_is_told_as_refused_not_as_a_time_out(caplog):
    """httpx's aiohttp transport, the gateway's, reports a refused connection as a connect *time-out*:
    the scrape's log line and its error say what the socket met, as the health checks do."""

    async def scrape(ep: Endpoint) -> EndpointScrape:
        pools = {"speculative": Pool("speculative", ["m"], []), "baseline": Pool("baseline", ["m"], [ep])}
        async with aiohttp.ClientSession() as session:
            scraper = Scraper(
                httpx.AsyncClient(transport=AiohttpTransport(client=session)), pools, Metrics(), 1.0
            )
            await scraper.scrape_once()
            return scraper.of(ep)

    with socket.socket() as closed, caplog.at_level(logging.WARNING, logger="specroute.scrape"):
        closed.bind(("127.0.0.1", 0))  # bound, never listening: a connection to it is refused
        state = asyncio.run(scrape(Endpoint("baseline", "b0", f"http://127.0.0.1:{closed.getsockname()[1]}")))
    assert state.error == "ConnectionRefusedError"
    assert "connection refused (is the server running, on this port?)" in caplog.text
    assert "ConnectTimeout" not in caplog.text


def test_an_endpoint_whose_pages_stopped_coming_stops_exporting_its_last_load(vllm_fixture):
    """A speculative server killed under load: its last running count, KV usage and acceptance stayed on
    /metrics as current beside its up gauge at 0 (a pool's running panel summed a dead queue). Once its
    page is older than routing reads (three intervals), they are dropped; the next page brings them back."""
    page = vllm_fixture("ngram_metrics_under_load.txt").decode()
    down = False

    def handler(request: httpx.Request) -> httpx.Response:
        if down and request.url.host == "s1":
            raise httpx.ConnectError("refused")
        return httpx.Response(200, text=page)

    scraper, (_, s1) = _scraper(handler)
    asyncio.run(scraper.scrape_once())
    asyncio.run(scraper.scrape_once())

    def series(endpoint: str) -> set[str]:
        text = generate_latest(scraper.metrics.registry).decode()
        return {
            line.split("{")[0]
            for line in text.splitlines()
            if f'endpoint="{endpoint}"' in line and line.startswith("specroute_upstream_")
        }

    loads = {"specroute_upstream_requests", "specroute_upstream_kv_cache_usage_ratio"}
    assert loads <= series("s1")
    down = True
    asyncio.run(scraper.scrape_once())
    scraper.export()
    assert loads <= series("s1")  # one interval late: still what routing reads
    scraper.of(s1).last_at -= STALE_SCRAPES * scraper.interval_s + 0.1  # type: ignore[operator]
    scraper.export()
    assert not loads & series("s1") and loads <= series("s0")
    down = False
    asyncio.run(scraper.scrape_once())
    scraper.export()
    assert loads <= series("s1")


def test_the_endpoints_snapshot_says_whether_each_is_in_rotation_and_why_not():
    """During an outage /admin/routing named no endpoint as out: the up and ejected gauges had to be read
    side by side. Each endpoint says whether it is available, and what keeps it out."""
    scraper, (s0, s1) = _scraper(lambda request: httpx.Response(200, text=""))
    asyncio.run(scraper.scrape_once())
    s1.healthy, s0.demoted = False, True
    s0.busy_until = time.monotonic() + 5
    snaps = {s["endpoint"]: s for s in scraper.snapshots()}
    assert (snaps["s0"]["available"], snaps["s0"]["demoted"], snaps["s0"]["healthy"]) == (True, True, True)
    assert 4 < snaps["s0"]["busy_for_s"] <= 5 and snaps["s0"]["ejected_for_s"] == 0
    assert (snaps["s1"]["available"], snaps["s1"]["healthy"]) == (False, False)
    s1.healthy, s1.ejected_until = True, time.monotonic() + 30
    snap = {s["endpoint"]: s for s in scraper.snapshots()}["s1"]
    assert not snap["available"] and 29 < snap["ejected_for_s"] <= 30
