"""A non-streamed request whose upstream body breaks is sent again: the client has seen nothing.

The gateway runs on uvicorn on loopback (:func:`tests.upstream.wiring.serving_gateway`) in front of
scripted raw-socket upstreams (:mod:`tests.upstream.scripted`); the client is the real ``openai`` SDK
with its own retries off, so every failure the gateway lets through is seen.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.config import Settings, load_settings
from tests.upstream.scripted import HUGE_BYTES, SLOW_S, Answer, Script, Scripted, serving
from tests.upstream.wiring import serving_gateway


def _settings(spec: list[Scripted], base: list[Scripted], **extra: Any) -> Settings:
    def pool(servers: list[Scripted]) -> dict[str, Any]:
        return {"endpoints": [{"name": s.name, "url": s.url} for s in servers], "models": ["m"]}

    overrides = {
        "pools": {"speculative": pool(spec), "baseline": pool(base)},
        "logging": {"access_log": False},
        "routing": {"strategy": "always-baseline"},
        "health": {"interval_s": 60},
        **extra,
    }
    return load_settings(overrides=overrides)


@asynccontextmanager
async def _setup(
    answers: list[Answer], **extra: Any
) -> AsyncIterator[tuple[openai.AsyncOpenAI, Script, str]]:
    """Two speculative and two baseline scripted endpoints sharing ``answers``, and a client."""
    script = Script(answers)
    async with serving(script, "spec-a", "spec-b", "base-a", "base-b") as servers:
        settings = _settings(servers[:2], servers[2:], **extra)
        async with (
            serving_gateway(settings) as url,
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30) as client,
        ):
            yield client, script, url


async def _text(client: openai.AsyncOpenAI, stream: bool) -> str:
    """A completion's text, streamed or whole."""
    if stream:
        chunks = await client.completions.create(model="m", prompt="hi", max_tokens=2, stream=True)
        return "".join([c.choices[0].text async for c in chunks if c.choices])
    answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
    return answer.choices[0].text


async def _streamed(http: httpx.AsyncClient) -> tuple[httpx.Response, list[bytes]]:
    """A streamed completion through the gateway: the response and its events."""
    body = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True}
    r = await http.post("/v1/completions", json=body)
    return r, [e for e in r.content.split(b"\n\n") if e]


async def _metric(url: str, name: str, **labels: str) -> float:
    async with httpx.AsyncClient() as http:
        text = (await http.get(url + "/metrics", timeout=10)).text
    return sum(
        s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


@pytest.mark.parametrize("broken", ["cut_body", "stall_body"])
async def test_a_non_streamed_body_that_breaks_is_sent_again_to_another_endpoint(broken):
    # a reset mid-body, or a silence longer than the gap budget, on whichever endpoint is tried first
    async with _setup([broken, "ok"], timeouts={"chunk_gap_s": 0.5}) as (client, script, url):
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert answer.choices[0].text == "Hello there"
        assert [a for _, a in script.log] == [broken, "ok"]
        first, second = (name for name, _ in script.log)
        assert first != second  # not the endpoint that broke
        assert await _metric(url, "specroute_upstream_retries_total") == 1


@pytest.mark.parametrize("broken", ["cut_stream", "early_end"])
async def test_an_assembled_stream_that_breaks_or_ends_early_is_sent_again(broken):
    # the speculative pool gets non-streamed requests as streams and assembles the body
    extra = {"routing": {"strategy": "always-speculative"}}
    async with _setup([broken, "ok"], **extra) as (client, script, _):
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert answer.choices[0].text == "Hello there"
        assert answer.choices[0].finish_reason == "length"
        assert [a for _, a in script.log] == [broken, "ok"]
        assert script.log[0][0] != script.log[1][0]
        assert all(name.startswith("spec") for name, _ in script.log)


async def test_an_answer_that_is_not_http_is_sent_elsewhere_then_reported_as_a_bad_gateway():
    async with _setup(["malformed", "ok"]) as (client, script, url):
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert answer.choices[0].text == "Hello there"
        assert await _metric(url, "specroute_upstream_errors_total", kind="protocol") == 1
        assert await _metric(url, "specroute_upstream_errors_total", kind="connect") == 0
    async with _setup(["malformed"], retries={"attempts": 2}) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502 and "not valid HTTP" in e.value.message
        assert len(script.log) == 2


@pytest.mark.parametrize(
    ("broken", "message"),
    [("empty", "was empty"), ("cut_after_head", "broke off before its body")],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_an_answer_without_a_body_is_sent_elsewhere_then_reported_as_a_bad_gateway(
    broken, message, stream
):
    """The endpoint was reached and answered: a protocol failure (502), not an unreachable one (503)."""
    async with _setup([broken, "ok"]) as (client, script, url):
        assert await _text(client, stream) == "Hello there"
        assert script.log[0][0] != script.log[1][0]
        assert await _metric(url, "specroute_upstream_errors_total", kind="protocol") == 1
        assert await _metric(url, "specroute_upstream_errors_total", kind="connect") == 0
    async with _setup([broken], retries={"attempts": 2}) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2, stream=stream)
        assert e.value.status_code == 502 and message in e.value.message
        assert len(script.log) == 2


async def test_resends_come_out_of_the_same_attempt_budget():
    async with _setup(["cut_body"], retries={"attempts": 2}) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502
        assert len(script.log) == 2  # two tries in all, not two per endpoint


@pytest.mark.parametrize("broken", ["cut_stream", "early_end"])
async def test_an_assembled_stream_is_resent_within_the_budget_and_then_reported(broken):
    extra = {"routing": {"strategy": "always-speculative"}, "retries": {"attempts": 3}}
    async with _setup([broken], **extra) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502
        assert len(script.log) == 3
        assert len({name for name, _ in script.log}) == 3  # two speculative, then the other pool
        # reported as any failure the gateway could not hide: the request id, no pool that served it
        headers = e.value.response.headers
        assert f"(request id {headers['x-request-id']})" in e.value.message
        assert "x-specroute-pool" not in headers
        assert headers["x-specroute-reason"] == "always-speculative"  # not "...,failover"


@pytest.mark.parametrize("strategy", ["always-speculative", "always-baseline"])
async def test_a_non_streamed_request_waits_as_long_however_it_is_measured(strategy):
    """Streamed upstream to be measured (the speculative pool) or passed as it came, a non-streamed
    request's first byte may take ``timeouts.total_s``; a streamed one's, ``timeouts.first_byte_s``."""
    extra = {"routing": {"strategy": strategy}, "timeouts": {"first_byte_s": SLOW_S / 3, "total_s": 30}}
    async with _setup(["slow_ok"], **extra) as (client, script, url):
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert answer.choices[0].text == "Hello there"
        assert len(script.log) == 1  # sent once: not cut at the first-byte limit and sent again
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2, stream=True)
        assert e.value.status_code == 504
        measured = await _metric(url, "specroute_nonstream_measurement_requests_total")
        passed = await _metric(url, "specroute_nonstream_measurement_requests_total", outcome="passed")
        # on the speculative pool it was streamed upstream and assembled; the baseline measures nothing
        assert (measured, passed) == ((1, 0) if strategy == "always-speculative" else (0, 0))


async def test_with_no_endpoint_left_to_resend_to_the_broken_body_is_reported_not_a_503():
    extra = {"retries": {"attempts": 3, "failover_to_other_pool": False}}
    async with _setup(["cut_body"], **extra) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502
        assert "broke the connection" in e.value.message
        assert len(script.log) == 2  # both baseline endpoints, and no third to try


async def test_an_error_event_in_an_assembled_stream_reaches_the_client_as_status_and_request_id_only():
    extra = {"routing": {"strategy": "always-speculative"}, "retries": {"attempts": 2}}
    async with _setup(["error_event"], **extra) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502  # an upstream's 500, told as a gateway tells one
        assert len(script.log) == 2  # a server error in the stream is sent again first
        assert "CUDA" not in e.value.message and "/srv" not in e.value.message
        assert "request id" in e.value.message
        assert "x-specroute-pool" not in e.value.response.headers


async def test_a_stream_that_opens_with_a_server_error_event_is_sent_again_and_counted():
    """vLLM answers 200 and then its error event when a request fails once its stream has begun: with
    nothing of it at the client yet, it goes to another endpoint as after an HTTP 500, and the failure
    counts against the endpoint (one that keeps failing so is ejected)."""
    async with _setup(["error_first", "ok"]) as (client, script, url):
        assert await _text(client, stream=True)
        assert len(script.log) == 2
        assert await _metric(url, "specroute_upstream_errors_total", kind="status_5xx") == 1
    extra = {"retries": {"attempts": 2}}
    async with _setup(["error_first", "error_first"], **extra) as (client, script, url):
        with pytest.raises(openai.APIStatusError) as e:
            await _text(client, stream=True)
        assert e.value.status_code == 502 and len(script.log) == 2  # as after two HTTP 500s
        assert "CUDA" not in e.value.message and "request id" in e.value.message


async def test_a_server_error_event_mid_stream_reaches_the_client_and_counts_against_the_endpoint():
    async with _setup(["error_event"]) as (_, script, url), httpx.AsyncClient(base_url=url) as http:
        r, events = await _streamed(http)
        assert r.status_code == 200 and len(script.log) == 1
        assert b'"error"' in events[-2] and b"CUDA" not in r.content and events[-1] == b"data: [DONE]"
        assert await _metric(url, "specroute_upstream_errors_total", kind="status_5xx") == 1
        # a stream the server failed is counted as one, not by the 200 its head said
        assert await _metric(url, "specroute_requests_total", status="502") == 1
        assert await _metric(url, "specroute_requests_total", status="200") == 0


async def test_a_stream_cut_after_its_done_event_reaches_the_client_whole():
    """[DONE] has gone out when the connection breaks before the body's end: nothing was lost."""
    async with _setup(["cut_after_done"]) as (_, script, url), httpx.AsyncClient(base_url=url) as http:
        r, events = await _streamed(http)
        assert r.status_code == 200 and len(script.log) == 1
        assert events[-1] == b"data: [DONE]" and events.count(b"data: [DONE]") == 1
        assert not any(b'"error"' in e for e in events)


@pytest.mark.parametrize("broken", ["cut_stream", "early_end"])
async def test_a_stream_broken_past_resumption_ends_with_an_error_event_and_done(broken):
    """Cut by a reset, or ended in good order before ``[DONE]``: the client is told, never handed a
    shorter answer that looks whole."""
    extra = {"retries": {"resume_streams": False}}
    async with _setup([broken], **extra) as (_, script, url), httpx.AsyncClient(base_url=url) as http:
        r, events = await _streamed(http)
        assert r.status_code == 200 and len(script.log) == 1  # bytes had gone out: not sent again
        assert events[0].startswith(b'data: {"id"')
        error = orjson.loads(events[-2][len(b"data: ") :])["error"]
        assert error["code"] == 502 and error["type"] == "BadGatewayError"
        assert events[-1] == b"data: [DONE]"


async def test_a_passed_through_post_whose_answer_broke_off_is_not_sent_again():
    """A POST the gateway does not know may have been acted on once its endpoint answered: it goes out
    once, and the break is reported."""
    async with _setup(["cut_after_head", "ok"]) as (_, script, url):
        async with httpx.AsyncClient() as http:
            r = await http.post(
                url + "/v1/score", json={"model": "m", "text_1": "a", "text_2": "b"}, timeout=10
            )
        assert r.status_code == 502 and "broke off" in r.json()["error"]["message"]
        assert [a for _, a in script.log] == ["cut_after_head"]


@pytest.mark.parametrize("stream", [False, True])
async def test_an_endpoint_without_the_model_is_passed_over_and_not_ejected(stream):
    """The configuration lists the model, so an endpoint that says it does not serve it (mid-rollout, a
    LoRA adapter not loaded there) is the endpoint's gap, not the client's mistake: sent elsewhere."""
    # one failure would eject an endpoint: the one without the model must not be
    extra = {
        "routing": {"strategy": "always-speculative"},
        "health": {"interval_s": 60, "eject_after_failures": 1},
    }
    async with _setup(["model_missing", "ok"], **extra) as (
        client,
        script,
        url,
    ):
        assert await _text(client, stream) == "Hello there"
        assert script.log[0][0] != script.log[1][0]
        assert await _metric(url, "specroute_upstream_errors_total", kind="model_missing") == 1
        assert await _metric(url, "specroute_upstream_ejections_total") == 0
        # the endpoint that lacked it still takes the next request
        await client.completions.create(model="m", prompt="hi", max_tokens=2)
        await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert {name for name, _ in script.log[2:]} == {"spec-a", "spec-b"}


@pytest.mark.parametrize("answer", ["model_missing", "busy", "error"])
async def test_the_last_try_goes_to_the_other_pool(answer):
    """Both pools serve the model: a pool whose endpoints lack it, are busy or fail had the client told so
    while the other pool stood idle, whenever the tries ran out on the first (its endpoints' count, or
    more). The last try goes to the other pool."""
    extra = {"routing": {"strategy": "always-speculative"}, "retries": {"attempts": 2}}
    async with _setup([answer, "ok"], **extra) as (client, script, _):
        answer_ = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert answer_.choices[0].text
        assert [name[:4] for name, _ in script.log] == ["spec", "base"]


async def test_when_no_endpoint_serves_the_model_the_client_gets_the_404():
    async with _setup(["model_missing"], retries={"attempts": 2}) as (client, script, _):
        with pytest.raises(openai.NotFoundError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.body["param"] == "model" and "does not exist" in e.value.message
        assert len(script.log) == 2


async def test_a_404_that_is_not_about_the_model_is_the_answer():
    """A passed-through route the upstream does not have: one try, and the client hears so."""
    async with _setup(["no_route", "ok"]) as (_, script, url):
        async with httpx.AsyncClient() as http:
            r = await http.post(
                url + "/v1/score", json={"model": "m", "text_1": "a", "text_2": "b"}, timeout=10
            )
        assert r.status_code == 404
        assert [a for _, a in script.log] == ["no_route"]
        # the model missing on one endpoint is retried even for a POST the gateway does not know:
        # the endpoint refused it before acting on it
    async with _setup(["model_missing", "ok"]) as (_, script, url):
        async with httpx.AsyncClient() as http:
            r = await http.post(
                url + "/v1/score", json={"model": "m", "text_1": "a", "text_2": "b"}, timeout=10
            )
        assert r.status_code == 200
        assert [a for _, a in script.log] == ["model_missing", "ok"]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_server_without_the_completions_route_is_an_openai_shaped_404(stream):
    """An embedding model's vLLM has no /v1/completions: its FastAPI 404 ({"detail": ...}) reached the
    client as it was, which the OpenAI SDKs report as a bare 'Error code: 404'."""
    async with _setup(["no_route", "ok"]) as (client, script, _):
        with pytest.raises(openai.NotFoundError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2, stream=stream)
        assert e.value.message == "Error code: 404 - no route POST /v1/completions"
        assert e.value.body == {
            "message": "no route POST /v1/completions",
            "type": "NotFoundError",
            "param": None,
            "code": 404,
        }
        assert [a for _, a in script.log] == ["no_route"]  # the answer, not tried again


async def test_an_endpoint_without_the_model_is_named_in_the_log_once_a_minute_not_per_request(caplog):
    with caplog.at_level(logging.WARNING, logger="specroute.upstream"):
        extra = {"routing": {"strategy": "always-speculative"}}
        async with _setup(["model_missing", "ok"] * 3, **extra) as (client, script, _):
            for _ in range(3):
                await client.completions.create(model="m", prompt="hi", max_tokens=2)
    lacking = {name for name, answer in script.log if answer == "model_missing"}
    told = [r.getMessage() for r in caplog.records if "does not serve the model" in r.getMessage()]
    assert len(told) == len(lacking) >= 1  # each endpoint once, whichever met the requests
    assert all("The model `m` does not exist" in m for m in told)


@pytest.mark.parametrize(
    ("answer", "status", "retry_after"),
    [("busy", 503, "1"), ("busy_for_7s", 503, "7"), ("error", 500, None)],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_told_busy_is_told_when_to_come_back(answer, status, retry_after, stream):
    """Every try met a busy endpoint: the client gets the upstream's own Retry-After, or a second; a
    broken endpoint is no reason to wait."""
    async with _setup([answer], retries={"attempts": 2}) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2, stream=stream)
        assert e.value.status_code == (502 if status == 500 else status)
        assert e.value.response.headers.get("retry-after") == retry_after
        assert len(script.log) == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_a_client_whose_every_endpoint_refused_is_told_when_to_come_back(stream):
    """Every endpoint refused the connection (the pools restarting, a whole deployment rolled at once):
    the 503 carries Retry-After as one for no endpoint at all does, so that the SDKs' retry waits a
    second rather than its own back-off."""

    def refusing() -> dict[str, str]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return {"name": f"e{s.getsockname()[1]}", "url": f"http://127.0.0.1:{s.getsockname()[1]}"}

    pools = {
        name: {"endpoints": [refusing(), refusing()], "models": ["m"]} for name in ("speculative", "baseline")
    }
    settings = load_settings(
        overrides={"pools": pools, "logging": {"access_log": False}, "health": {"interval_s": 60}}
    )
    async with (
        serving_gateway(settings) as url,
        openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30) as client,
    ):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2, stream=stream)
    assert e.value.status_code == 503
    assert e.value.response.headers.get("retry-after") == "1"


@pytest.mark.parametrize(
    ("answers", "status", "retry_after"),
    [
        (["busy_for_7s", "malformed"], 503, "7"),  # was: 502, the malformed answer's
        (["error", "model_missing"], 502, None),  # was: 404, as if no endpoint served the model
        (["malformed", "model_missing"], 502, None),
        (["busy", "error"], 502, None),  # two upstream answers: the later one
    ],
)
async def test_the_client_is_told_the_most_telling_of_its_tries_not_merely_the_last(
    answers, status, retry_after
):
    async with _setup(answers, retries={"attempts": 2, "backoff_s": 0}) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert [a for _, a in script.log] == answers
        assert e.value.status_code == status
        assert e.value.response.headers.get("retry-after") == retry_after


async def test_a_stream_that_ends_before_done_goes_on_elsewhere():
    async with _setup(["early_end", "ok"]) as (client, script, url):
        # the scripted upstream answers a continuation with the whole text again: what counts is that
        # the stream went on elsewhere after the first token, without an error
        assert (await _text(client, stream=True)).startswith("Hello")
        assert [a for _, a in script.log] == ["early_end", "ok"]
        assert script.log[0][0] != script.log[1][0]
        assert await _metric(url, "specroute_upstream_errors_total", kind="stream") == 1
        assert await _metric(url, "specroute_stream_resumptions_total", outcome="resumed") == 1


@pytest.mark.parametrize("stream", [False, True])
async def test_a_stream_cut_after_its_last_token_gives_the_client_its_whole_answer(stream):
    """What broke was the usage and ``[DONE]`` the gateway asked for itself: the client, which asked for
    neither, gets every token and the end it expects (non-streamed requests are assembled from it)."""
    extra = {"routing": {"strategy": "always-speculative"}}
    async with (
        _setup(["cut_after_finish", "ok"], **extra) as (_, script, url),
        httpx.AsyncClient(base_url=url) as http,
    ):
        body = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": stream}
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200
        if stream:
            events = [e for e in r.content.split(b"\n\n") if e]
            assert events[-1] == b"data: [DONE]" and not any(b'"error"' in e for e in events)
            text = [orjson.loads(e[len(b"data: ") :])["choices"][0] for e in events[:-1]]
            assert "".join(c["text"] for c in text) == "Hello there"
            assert text[-1]["finish_reason"] == "length"
            assert len(script.log) == 1  # whole: nothing to resume
        else:
            assert r.json()["choices"][0]["text"] == "Hello there"


async def test_a_stream_cut_after_the_usage_it_asked_for_ends_whole_with_done():
    """With ``include_usage`` the client's last chunk but ``[DONE]`` is the usage: a break after it lost
    nothing of the answer, and the client gets ``[DONE]``, not an error its SDK raises."""
    async with _setup(["cut_after_usage", "ok"]) as (_, script, url), httpx.AsyncClient(base_url=url) as http:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        r = await http.post("/v1/completions", json=body)
        events = [e for e in r.content.split(b"\n\n") if e]
        assert r.status_code == 200 and events[-1] == b"data: [DONE]", events
        assert not any(b'"error"' in e for e in events) and len(script.log) == 1
        assert orjson.loads(events[-2][len(b"data: ") :])["usage"]["completion_tokens"] == 2


async def test_a_break_in_a_stream_that_could_not_be_resumed_is_counted_refused():
    """A stream refused resumption up front (logprobs) that breaks: counted, as every break is."""
    async with _setup(["cut_stream", "ok"]) as (_, script, url), httpx.AsyncClient(base_url=url) as http:
        body = {"model": "m", "prompt": "hi", "max_tokens": 2, "stream": True, "logprobs": 1}
        r = await http.post("/v1/completions", json=body)
        assert r.status_code == 200 and b'"error"' in r.content and len(script.log) == 1
        assert await _metric(url, "specroute_stream_resumptions_total", outcome="refused") == 1


@pytest.mark.parametrize("broken", ["reset_until_close", "not_json", "cut_json"])
async def test_a_success_that_is_not_whole_json_is_sent_again_then_reported(broken):
    """A body delimited by the connection's end and reset midway, a proxy's page, half a body at the
    length announced for it: the client has seen nothing, so another endpoint answers; none left, a 502."""
    async with _setup([broken, "ok"]) as (client, script, url):
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert answer.choices[0].text == "Hello there"
        assert [a for _, a in script.log] == [broken, "ok"]
        kind = "stream" if broken == "reset_until_close" else "protocol"
        assert await _metric(url, "specroute_upstream_errors_total", kind=kind) == 1
    async with _setup([broken], retries={"attempts": 2}) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502 and len(script.log) == 2


@pytest.mark.parametrize("slow", ["stall_head", "drip"])
async def test_a_non_streamed_request_ends_within_its_total_time_whatever_the_tries(slow):
    """One hung endpoint after another, or a body a byte at a time (never silent for a whole gap), end
    at ``timeouts.total_s`` for the whole request, not per try."""
    extra = {"timeouts": {"total_s": 1.0, "chunk_gap_s": 0.5}, "retries": {"attempts": 3}}
    async with _setup([slow], **extra) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 504
        assert "within 1 s" in e.value.message
        assert len(script.log) == 1  # the request's time was spent on the first try


_SMALL = {"limits": {"max_response_bytes": HUGE_BYTES // 2}}


async def test_a_non_streamed_answer_over_the_limit_is_a_502_and_not_sent_again():
    # held whole in memory, it would grow as the upstream liked; the same request would get the same answer
    async with _setup(["huge", "ok"], **_SMALL) as (client, script, url):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502 and "larger than the gateway may hold" in e.value.message
        assert [a for _, a in script.log] == ["huge"]
        assert await _metric(url, "specroute_upstream_errors_total", kind="too_large") == 1
        # the endpoint is not at fault: the next request is served
        assert (await client.completions.create(model="m", prompt="hi", max_tokens=2)).choices[0].text
    async with _setup(["huge"]) as (client, _, _):  # under the default limit it is an answer like any
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert len(answer.choices[0].text) == HUGE_BYTES


@pytest.mark.parametrize("answer", ["huge", "long_stream"])
async def test_a_stream_to_assemble_over_the_limit_is_a_502_and_not_sent_again(answer):
    # "huge": one event that never ends; "long_stream": whole events, more of them than the limit
    extra = {"routing": {"strategy": "always-speculative"}, **_SMALL}
    async with _setup([answer, "ok"], **extra) as (client, script, url):
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 502 and "larger than the gateway may hold" in e.value.message
        assert [a for _, a in script.log] == [answer]
        assert await _metric(url, "specroute_upstream_errors_total", kind="too_large") == 1


async def test_a_streamed_event_that_never_ends_is_cut_at_the_limit_and_a_long_stream_is_not():
    async with _setup(["huge"], **_SMALL) as (client, _, _):
        with pytest.raises(openai.APIError, match="larger than the gateway may hold"):
            await _text(client, stream=True)
    async with _setup(["long_stream"], **_SMALL) as (client, _, _):  # relayed, never held whole
        assert len(await _text(client, stream=True)) > HUGE_BYTES // 2  # more than the limit


@pytest.mark.parametrize("stream", [False, True])
async def test_a_measured_or_streamed_request_is_not_tried_again_past_its_total_time(stream):
    # a non-streamed request streamed upstream to be measured waits total_s for its first byte, as one
    # passed as sent does; a stream's tries come out of the same total_s
    extra = {
        "routing": {"strategy": "always-speculative", "measure_interval_s": 0},
        "timeouts": {"total_s": 0.5, "first_byte_s": 0.5},
    }
    async with _setup(["stall_head", "ok"], **extra) as (client, script, _):
        with pytest.raises(openai.APIStatusError) as e:
            await _text(client, stream)
        assert e.value.status_code == 504
        assert len(script.log) == 1  # the request's time was spent on the first try
