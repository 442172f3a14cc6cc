"""Health checks: a failing endpoint is reported once, with its URL and the cause an operator can act on."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
import orjson
import pytest
from httpx_aiohttp import AiohttpTransport

from gateway.api.errors import from_upstream
from gateway.config import HealthConfig, load_settings
from gateway.errors import Unreachable
from gateway.upstream.deadline import Deadlines
from gateway.upstream.forward import Upstreams
from gateway.upstream.health import check, check_all
from gateway.upstream.pool import Endpoint, Pool
from tests.upstream.scripted import Script, serving
from tests.upstream.wiring import upstreams_for


def _refusing_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


async def test_a_refused_connection_is_named_as_such_with_the_url(caplog: pytest.LogCaptureFixture) -> None:
    """The gateway's transport (aiohttp under httpx) calls a refusal a connect time-out: the log must not."""
    endpoint = Endpoint(pool="speculative", name="spec-0", base_url=_refusing_url())
    async with aiohttp.ClientSession() as session:
        client = httpx.AsyncClient(transport=AiohttpTransport(client=session))
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            assert not await check(client, endpoint, HealthConfig())
            assert not await check(client, endpoint, HealthConfig())  # no second warning while still down
    (record,) = caplog.records
    message = record.getMessage()
    assert message.startswith(f"endpoint speculative/spec-0 is unhealthy: GET {endpoint.base_url}/health: ")
    assert "connection refused" in message and "within" not in message


async def test_a_server_that_hangs_up_without_answering_is_not_called_slow(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that reads the request and closes (an https upstream that wants a client certificate
    does so): the transport calls it a connect time-out, within milliseconds. The log says what it is,
    and the endpoint is not taken for a frozen one (whose waiting requests are moved)."""

    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    endpoint = Endpoint(pool="speculative", name="spec-0", base_url=url)
    async with server, aiohttp.ClientSession() as session:
        client = httpx.AsyncClient(transport=AiohttpTransport(client=session))
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            assert not await check(client, endpoint, HealthConfig())
        # a request sent there since, in panic mode: the checks answer (by hanging up), so it stays
        wait = Deadlines(60).wait()
        endpoint.awaiting.add(wait)
        assert not await check(client, endpoint, HealthConfig())
        assert not await check(client, endpoint, HealthConfig())
    (record,) = caplog.records
    assert "closed the connection without answering" in record.getMessage()
    assert "within" not in record.getMessage()
    assert not wait.expired and wait in endpoint.awaiting


async def test_a_failed_status_and_the_recovery_are_reported(caplog: pytest.LogCaptureFixture) -> None:
    status = {"code": 500}
    transport = httpx.MockTransport(lambda request: httpx.Response(status["code"]))
    endpoint = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    async with httpx.AsyncClient(transport=transport) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            assert not await check(client, endpoint, HealthConfig(path="/health"))
            status["code"] = 200
            assert await check(client, endpoint, HealthConfig(path="/health"))
    messages = [r.getMessage() for r in caplog.records]
    assert messages == [
        "endpoint baseline/base-0 is unhealthy: GET http://base-0:8000/health: answered 500",
        "endpoint baseline/base-0 is healthy",
    ]


async def test_silence_names_the_time_out_setting(caplog: pytest.LogCaptureFixture) -> None:
    def hang(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    endpoint = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    async with httpx.AsyncClient(transport=httpx.MockTransport(_timed_out)) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            assert not await check(client, endpoint, HealthConfig(timeout_s=1.5))
    assert caplog.records[0].getMessage().endswith(": no answer within 1.5 s (health.timeout_s)")


async def test_an_errors_text_from_the_upstream_reaches_the_log_escaped(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def garbled(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("illegal status line\nforged line \x1b[31m", request=request)

    endpoint = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    async with httpx.AsyncClient(transport=httpx.MockTransport(garbled)) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            assert not await check(client, endpoint, HealthConfig())
    (record,) = caplog.records
    assert record.getMessage().endswith(": illegal status line\\nforged line \\x1b[31m")


async def test_a_client_that_fails_unforeseen_fails_the_check_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """What no transport error covers (aiohttp's overflow on an infinite time-out, a header it refuses)
    repeats on every check: the endpoint is taken out like one that does not answer, said in one line
    when it turns unhealthy, not a traceback every interval; the round checks the others as usual."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "odd":
            raise OverflowError("timestamp too large\nto convert to C _PyTime_t")
        return httpx.Response(200)

    odd = Endpoint(pool="baseline", name="odd-0", base_url="http://odd:8000")
    fine = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    fine.healthy = False
    pool = Pool(name="baseline", models=["m"], endpoints=[odd, fine])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            await check_all(client, [pool], HealthConfig())
            await check_all(client, [pool], HealthConfig())
    assert not odd.healthy and fine.healthy
    assert [(r.levelno, r.getMessage(), r.exc_info) for r in caplog.records] == [
        (
            logging.WARNING,
            "endpoint baseline/odd-0 is unhealthy: GET http://odd:8000/health: the HTTP client failed:"
            " OverflowError: timestamp too large to convert to C _PyTime_t",
            None,
        ),
        (logging.WARNING, "endpoint baseline/base-0 is healthy", None),
    ]


async def test_a_check_that_fails_beyond_its_call_stops_neither_the_round_nor_the_others(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Start-up and the loop run every check in one round: one that raises after its call (a bug in
    the gateway's own bookkeeping) is logged and leaves its endpoint as it was, and the others are
    still checked."""
    odd = Endpoint(pool="baseline", name="odd-0", base_url="http://odd:8000")
    fine = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    fine.healthy = False
    odd.healthy = False
    odd.suspects = {object()}  # type: ignore[arg-type]

    def broken(suspects: object) -> int:
        raise RuntimeError("a bug in the bookkeeping")

    monkeypatch.setattr(odd, "unanswering", broken)
    transport = httpx.MockTransport(lambda request: httpx.Response(200 if request.url.host != "odd" else 503))
    pool = Pool(name="baseline", models=["m"], endpoints=[odd, fine])
    async with httpx.AsyncClient(transport=transport) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            await check_all(client, [pool], HealthConfig())
    assert not odd.healthy and fine.healthy
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["health check of baseline/odd-0 failed"]
    assert errors[0].exc_info is not None and "a bug in the bookkeeping" in str(errors[0].exc_info[1])


def _timed_out(request: httpx.Request) -> httpx.Response:
    """A health check that gets no answer in time (a frozen server, or a busy one)."""
    raise httpx.ReadTimeout("timed out", request=request)


async def test_a_request_waiting_on_an_endpoint_that_fails_its_health_check_is_sent_elsewhere() -> None:
    """A frozen server (a stopped process, a hung engine) accepts the connection and answers nothing. A
    non-streamed request sends its first byte only with its whole answer, so it would wait out
    ``timeouts.total_s`` there (600 s by default) while the health checks already know: the second
    failed check in a row sends what waited on it at the first to another endpoint at once."""
    script = Script(["stall_head", "ok"])
    async with serving(script, "base-a", "base-b") as servers:
        settings = load_settings(
            overrides={
                "pools": {
                    "speculative": {
                        "endpoints": [{"name": "spec-a", "url": servers[0].url}],
                        "models": ["m"],
                    },
                    "baseline": {
                        "endpoints": [{"name": s.name, "url": s.url} for s in servers],
                        "models": ["m"],
                    },
                },
                "logging": {"access_log": False},
            }
        )
        total_s = settings.timeouts.total_s
        async with upstreams_for(settings) as upstreams:
            body = b'{"model":"m","prompt":"hi","max_tokens":2}'
            headers = {"content-type": "application/json"}
            fetch = asyncio.create_task(
                upstreams.fetch("/v1/completions", body, headers, "baseline", False, total_s)
            )
            while not script.log:  # noqa: ASYNC110 - the scripted server sets no event
                await asyncio.sleep(0.01)
            frozen = next(e for e in upstreams.pools["baseline"].endpoints if e.name == script.log[0][0])
            assert frozen.awaiting

            async with httpx.AsyncClient(transport=httpx.MockTransport(_timed_out)) as client:
                assert not await check(client, frozen, HealthConfig())
                await asyncio.sleep(0.05)
                assert not fetch.done() and frozen.awaiting  # one slow check may be a busy server
                assert not await check(client, frozen, HealthConfig())
            # a hang guard only: the answer comes at once from the other endpoint
            sent, content = await asyncio.wait_for(fetch, 30)
    assert sent.endpoint is not frozen and sent.retries == 1
    assert orjson.loads(content)["choices"]
    assert [server for server, _ in script.log] == [frozen.name, sent.endpoint.name]
    assert not frozen.awaiting and not sent.endpoint.awaiting
    errors = upstreams.metrics.upstream_errors.labels("baseline", frozen.name, "unhealthy")
    assert errors._value.get() == 1


@contextlib.asynccontextmanager
async def _waiting(script: Script, *names: str) -> AsyncIterator[tuple[Upstreams, asyncio.Task[Any]]]:
    """Scripted servers ``names`` as both pools, and a non-streamed request to the baseline pool (no
    failover) that has reached one of them and waits there for its answer."""
    async with serving(script, *names) as servers:
        pool = {"endpoints": [{"name": s.name, "url": s.url} for s in servers], "models": ["m"]}
        overrides = {"pools": {"speculative": pool, "baseline": pool}, "logging": {"access_log": False}}
        async with upstreams_for(load_settings(overrides=overrides)) as upstreams:
            body = b'{"model":"m","prompt":"hi","max_tokens":2}'
            fetch = asyncio.create_task(upstreams.fetch("/v1/completions", body, {}, "baseline", False))
            while not script.log:  # noqa: ASYNC110 - the scripted server sets no event
                await asyncio.sleep(0.01)
            yield upstreams, fetch


async def test_with_no_other_endpoint_the_cut_request_is_told_to_come_back_not_that_it_timed_out() -> None:
    """Its wait was cut long before any time limit: a 503 with Retry-After, not a 504."""
    script = Script(["stall_head"])
    async with _waiting(script, "base-a") as (upstreams, fetch):
        frozen = upstreams.pools["baseline"].endpoints[0]
        async with httpx.AsyncClient(transport=httpx.MockTransport(_timed_out)) as client:
            assert not await check(client, frozen, HealthConfig())
            assert not await check(client, frozen, HealthConfig())
        with pytest.raises(Unreachable) as e:
            await asyncio.wait_for(fetch, 30)
    assert e.value.retry_after_s == 1 and "health checks" in e.value.message
    assert from_upstream(e.value).status == 503


async def test_one_slow_health_check_does_not_throw_away_the_work_waiting_there() -> None:
    """A busy API server may answer one /health late: the endpoint leaves the rotation, but the requests
    it is working on are not sent again elsewhere (their work would be lost and done twice) unless the
    next check fails too."""
    script = Script(["slow_ok"])
    async with _waiting(script, "base-a", "base-b") as (upstreams, fetch):
        busy = next(e for e in upstreams.pools["baseline"].endpoints if e.name == script.log[0][0])
        async with httpx.AsyncClient(transport=httpx.MockTransport(_timed_out)) as client:
            assert not await check(client, busy, HealthConfig())
        async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(200))) as client:
            assert await check(client, busy, HealthConfig())
        sent, content = await asyncio.wait_for(fetch, 30)
    assert sent.endpoint is busy and sent.retries == 0 and orjson.loads(content)["choices"]
    assert len(script.log) == 1 and busy.suspects is None


async def test_a_request_sent_to_an_endpoint_whose_checks_are_answered_with_a_failure_is_left_alone() -> None:
    """Panic mode sends a request to an endpoint that fails its checks when no other is usable; checks
    that are answered (a failing status: maybe a wrong health check, which panic mode is for) do not cut
    it (only the turn from healthy to unhealthy, or checks that get no answer, do)."""
    endpoint = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    endpoint.healthy = False
    wait = Deadlines(60).wait
    task_waits = []

    async def waiting() -> None:
        w = wait()
        task_waits.append(w)
        endpoint.awaiting.add(w)
        with w:
            await asyncio.sleep(0.2)

    task = asyncio.create_task(waiting())
    await asyncio.sleep(0)
    async with httpx.AsyncClient(transport=httpx.MockTransport(lambda r: httpx.Response(500))) as client:
        assert not await check(client, endpoint, HealthConfig())
        assert not await check(client, endpoint, HealthConfig())
    await task  # ended by itself, not cut
    assert not task_waits[0].expired


async def test_a_request_sent_in_panic_to_a_silent_endpoint_moves_at_the_second_silent_check_and_no_further():
    """Every endpoint frozen (accepting connections, answering nothing) and failing its checks: panic mode
    sends a request to one anyway. Had it been left to its time limit, a non-streamed request would wait
    ``timeouts.total_s`` (600 s by default); it moves at the second check after it was sent that gets no
    answer (not the first: a busy server may miss one), and the checks having proved right, it is not
    sent to another failing endpoint: the client is told to come back (a 503 with Retry-After)."""
    script = Script(["stall_head", "stall_head"])
    async with serving(script, "base-a", "base-b") as servers:
        pool = {"endpoints": [{"name": s.name, "url": s.url} for s in servers], "models": ["m"]}
        overrides = {"pools": {"speculative": pool, "baseline": pool}, "logging": {"access_log": False}}
        async with upstreams_for(load_settings(overrides=overrides)) as upstreams:
            for endpoint in upstreams.pools["baseline"].endpoints:
                endpoint.healthy = False
            body = b'{"model":"m","prompt":"hi","max_tokens":2}'
            fetch = asyncio.create_task(upstreams.fetch("/v1/completions", body, {}, "baseline", False))
            while not script.log:  # noqa: ASYNC110 - the scripted server sets no event
                await asyncio.sleep(0.01)
            frozen = next(e for e in upstreams.pools["baseline"].endpoints if e.name == script.log[0][0])
            async with httpx.AsyncClient(transport=httpx.MockTransport(_timed_out)) as client:
                assert not await check(client, frozen, HealthConfig())
                await asyncio.sleep(0.05)
                assert not fetch.done() and frozen.awaiting
                assert not await check(client, frozen, HealthConfig())
            with pytest.raises(Unreachable) as e:
                await asyncio.wait_for(fetch, 30)  # a hang guard only
    assert from_upstream(e.value).status == 503 and e.value.retry_after_s == 1
    assert len(script.log) == 1  # not sent on to the other frozen endpoint
    assert upstreams.metrics.panic.labels("baseline")._value.get() == 1
