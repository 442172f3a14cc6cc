"""Health checks: a failing endpoint is reported once, with its URL and the cause an operator can act on."""

from __future__ import annotations

import logging
import socket

import aiohttp
import httpx
import pytest
from httpx_aiohttp import AiohttpTransport

from gateway.config import HealthConfig
from gateway.upstream.health import check, check_all
from gateway.upstream.pool import Endpoint, Pool


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
    async with httpx.AsyncClient(transport=httpx.MockTransport(hang)) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            assert not await check(client, endpoint, HealthConfig(timeout_s=1.5))
    assert caplog.records[0].getMessage().endswith(": no answer within 1.5 s (health.timeout_s)")


async def test_a_check_that_fails_unforeseen_stops_neither_the_round_nor_the_others(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Start-up and the loop run every check in one round: one raising what no transport error covers
    is logged and leaves its endpoint as it was, and the others are still checked."""

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.host == "odd":
            raise RuntimeError("a bug beneath the client")
        return httpx.Response(200)

    odd = Endpoint(pool="baseline", name="odd-0", base_url="http://odd:8000")
    fine = Endpoint(pool="baseline", name="base-0", base_url="http://base-0:8000")
    fine.healthy = False
    pool = Pool(name="baseline", models=["m"], endpoints=[odd, fine])
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        with caplog.at_level(logging.WARNING, logger="specroute.health"):
            await check_all(client, [pool], HealthConfig())
    assert odd.healthy and fine.healthy
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert [r.getMessage() for r in errors] == ["health check of baseline/odd-0 failed"]
    assert errors[0].exc_info is not None and "a bug beneath the client" in str(errors[0].exc_info[1])
