"""Health checks: a failing endpoint is reported once, with its URL and the cause an operator can act on."""

from __future__ import annotations

import logging
import socket

import aiohttp
import httpx
import pytest
from httpx_aiohttp import AiohttpTransport

from gateway.config import HealthConfig
from gateway.upstream.health import check
from gateway.upstream.pool import Endpoint


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
