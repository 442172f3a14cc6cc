"""Decision headers name the pool whose answer the client got; non-streamed requests are measured by need."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import orjson
import pytest
from starlette.requests import Request

from gateway.api.errors import APIError
from gateway.api.routes import unless_disconnected
from gateway.types import CLIENT_SCOPE_KEY, ClientState
from tests.api.conftest import API_KEY, MODEL, InProcess, metric, read_body
from tests.conftest import FIXTURES

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
NOWHERE = {"endpoints": [{"name": "gone", "url": "http://127.0.0.1:9"}], "models": [MODEL]}


def test_a_503_when_no_pool_can_serve_names_no_pool() -> None:
    with InProcess({"pools": {"speculative": NOWHERE, "baseline": NOWHERE}}) as stack:
        for forced in (None, "baseline", "speculative"):
            headers = {"x-specroute-pool": forced} if forced else {}
            response = stack.request("POST", "/v1/chat/completions", json=CHAT, headers=headers)
            assert response.status_code == 503
            assert "x-specroute-pool" not in response.headers, forced
            # the decision is still explained, and the request can be found in the log
            assert response.headers["x-specroute-class"] in ("structured", "open-ended")
            assert response.headers["x-specroute-reason"]
            assert response.headers["x-request-id"]


def test_a_responses_request_no_pool_could_serve_names_no_pool() -> None:
    body = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4}
    with InProcess({"pools": {"speculative": NOWHERE, "baseline": NOWHERE}}) as stack:
        for stream in (False, True):
            response = stack.request("POST", "/v1/responses", json={**body, "stream": stream})
            assert response.status_code == 503
            assert "x-specroute-pool" not in response.headers
            rid = response.headers["x-request-id"]
            assert f"(request id {rid})" in response.json()["error"]["message"]
            assert response.headers["x-specroute-reason"]


def test_every_answer_carries_a_request_id_errors_and_the_model_list_too() -> None:
    with InProcess() as stack:
        for method, path in [
            ("GET", "/v1/models"),
            ("GET", f"/v1/models/{MODEL}"),
            ("GET", "/v1/models/nope"),  # 404
            ("GET", "/nothing/here"),  # the server's own 404
            ("POST", "/v1/completions"),  # no body: 400
            ("GET", "/v1/completions"),  # 405
            ("GET", "/health"),
            ("GET", "/ready"),
            ("GET", "/metrics"),
            ("GET", "/admin/routing"),
        ]:
            response = stack.request(method, path)
            assert response.headers["x-request-id"], (method, path)
            mine = stack.request(method, path, headers={"x-request-id": "req-42"})
            assert mine.headers["x-request-id"] == "req-42", (method, path)


_NESTED_BODY = '{"model": "%s", "prompt": "Say hi.", "max_tokens": 4, "stream": %s, "vllm_xargs": %s}'


def _nested(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


def test_a_body_nested_deeper_than_any_encoder_writes_is_forwarded_as_sent_whichever_the_pool() -> None:
    """orjson reads 1,024 levels and writes 254: a request the gateway rewrites (every stream, and a
    non-streamed one measured on the speculative pool) goes out by the standard library's encoder
    instead, and past what any encoder here writes as the client sent it, unmeasured: vLLM reads it
    (up to 1,024 levels), so the pool never decides whether it is served."""
    with InProcess({"logging": {"access_log": False}}) as stack:
        for depth in (300, 1000):
            for pool in ("speculative", "baseline"):
                for stream in ("true", "false"):
                    raw = (_NESTED_BODY % (MODEL, stream, _nested(depth))).encode()
                    r = stack.request(
                        "POST",
                        "/v1/completions",
                        content=raw,
                        headers={"content-type": "application/json", "x-specroute-pool": pool},
                    )
                    assert r.status_code == 200, (depth, pool, stream, r.text[:300])
                    assert r.headers["x-specroute-pool"] == pool
                    if stream == "true":
                        assert r.text.rstrip().endswith("data: [DONE]")
                    else:
                        assert r.json()["usage"]["completion_tokens"] == 4


# integers past 64 bits, which orjson reads as the nearest float: where vLLM reads them (a schema's
# ``const``, ``vllm_xargs``) they must arrive as the client wrote them, whichever route the body takes
WIDE = b"""{"model": "%s", "messages": [{"role": "user", "content": "The record, please."}], "max_tokens": 4,
 "stream": %s, "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {
  "type": "object", "properties": {"id": {"type": "integer", "const": 12345678901234567890123}}}}},
 "vllm_xargs": {"user_id": 98765432109876543210, "floor": -9223372036854775809}}"""


def test_integers_past_64_bits_go_upstream_exact_streamed_or_not_to_either_pool() -> None:
    """A stream's body is re-encoded (its ``stream_options``), and so is a non-streamed one measured on
    the speculative pool (measure_interval_s 0: every one); a non-streamed one to the baseline pool goes
    as sent. Each carries the same integers."""
    with InProcess({"routing": {"measure_interval_s": 0}, "logging": {"access_log": False}}) as stack:
        recorders = {}
        for pool, upstream in zip(("speculative", "baseline"), stack.upstreams, strict=True):
            recorders[pool] = recorder = Recorder(upstream.app, "/v1/chat/completions")
            upstream.app = recorder  # type: ignore[assignment]
        for pool in ("speculative", "baseline"):
            for stream in (b"false", b"true"):
                r = stack.request(
                    "POST",
                    "/v1/chat/completions",
                    content=WIDE % (MODEL.encode(), stream),
                    headers={"content-type": "application/json", "x-specroute-pool": pool},
                )
                assert r.status_code == 200, (pool, stream, r.text[:300])
                assert r.headers["x-specroute-pool"] == pool
                sent = json.loads(recorders[pool].bodies[-1])  # the standard library reads them exactly
                rewritten = pool == "speculative" or stream == b"true"
                assert ("stream_options" in sent) is rewritten, (pool, stream)  # the route it took
                assert sent["vllm_xargs"] == {"user_id": 98765432109876543210, "floor": -9223372036854775809}
                schema = sent["response_format"]["json_schema"]["schema"]
                assert schema["properties"]["id"]["const"] == 12345678901234567890123, (pool, stream)
                assert type(schema["properties"]["id"]["const"]) is int
        # an integer field past 64 bits is refused as before, whatever parsed it
        for field, value in (("seed", b"18446744073709551616"), ("max_tokens", b"-9999999999999999999")):
            body = b'{"model": "%s", "prompt": "x", "%s": %s}' % (MODEL.encode(), field.encode(), value)
            r = stack.request("POST", "/v1/completions", content=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text
            assert "at most a 64-bit integer" in r.json()["error"]["message"]
        # a number field takes any number: the upstream judges its value
        body = b'{"model": "%s", "prompt": "x", "max_tokens": 2, "presence_penalty": 100000000000000000000}'
        r = stack.request("POST", "/v1/completions", content=body % MODEL.encode())
        assert r.status_code == 200, r.text


class Busy:
    """Wraps an upstream: every ``POST /v1/*`` is answered 429 with ``body`` (and ``Retry-After`` when given),
    as vLLM behind a rate limiter or an overloaded router answers; the rest (health checks) passes."""

    def __init__(self, inner: Any, body: bytes, retry_after: bytes | None):
        self.inner = inner
        self.body = body
        self.retry_after = retry_after
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST" or not scope["path"].startswith("/v1/"):
            await self.inner(scope, receive, send)
            return
        self.calls += 1
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(self.body))]
        if self.retry_after is not None:
            headers.append((b"retry-after", self.retry_after))
        await send({"type": "http.response.start", "status": 429, "headers": headers})
        await send({"type": "http.response.body", "body": self.body})


def test_the_access_log_names_the_last_endpoint_tried_when_none_answered(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A request no endpoint answered (busy everywhere, a time-out, a 5xx from every try) is logged with
    the endpoint of its last try, not ``null``: where an operator looks first."""
    with InProcess() as stack:
        for upstream in stack.upstreams:
            upstream.app = Busy(upstream.app, RATE_LIMITED, None)  # type: ignore[assignment]
        capsys.readouterr()
        for i, stream in enumerate((False, True)):
            body = {**CHAT, "stream": stream}
            assert (
                stack.request(
                    "POST", "/v1/chat/completions", json=body, headers={"x-request-id": f"t-{i}"}
                ).status_code
                == 429
            )
        stack.flush_access_log()
        lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        names = {
            ep.name for pool in stack.app.state.gateway.upstreams.pools.values() for ep in pool.endpoints
        }
        logged = {line["request_id"]: line for line in lines}
        for rid in ("t-0", "t-1"):
            assert logged[rid]["status"] == 429 and logged[rid]["endpoint"] in names, logged[rid]


# vLLM's ErrorResponse, as it writes it (a key order and spacing the gateway would not write)
RATE_LIMITED = (
    b'{"error": {"message": "Too many requests for tenant acme: 40 of 40 in flight", '
    b'"type": "RateLimitError", "param": null, "code": 429}}'
)


def test_a_429_from_every_endpoint_reaches_the_client_with_the_upstreams_own_body() -> None:
    """429 means busy: each endpoint is tried (both pools) as before; when none takes the request the
    client reads vLLM's own error, status and Retry-After, with the gateway's request id."""
    with InProcess({"logging": {"access_log": False}}) as stack:
        busy = []
        for upstream in stack.upstreams:
            busy.append(Busy(upstream.app, RATE_LIMITED, b"7"))
            upstream.app = busy[-1]  # type: ignore[assignment]
        requests = [
            ("/v1/chat/completions", CHAT),
            ("/v1/chat/completions", {**CHAT, "stream": True}),
            ("/v1/completions", {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4}),
            ("/v1/completions", {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4, "stream": True}),
            ("/v1/responses", {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4}),
            ("/v1/embeddings", {"model": MODEL, "input": "Say hi."}),
        ]
        for i, (path, body) in enumerate(requests):
            calls = [b.calls for b in busy]
            r = stack.request("POST", path, json=body, headers={"x-request-id": f"rate-{i}"})
            assert r.status_code == 429, (path, body, r.text)
            assert r.content == RATE_LIMITED, (path, body)
            assert r.headers["content-type"] == "application/json"
            assert r.headers["retry-after"] == "7"
            assert r.headers["x-request-id"] == f"rate-{i}"
            assert "x-specroute-pool" not in r.headers  # no pool served it
            assert sum(b.calls for b in busy) - sum(calls) >= 2, path  # tried elsewhere before giving up
        # the completion routes fail over to the other pool: both were asked
        assert all(b.calls for b in busy)
        # a 429 whose body is no OpenAI error (a proxy's page) is told in the API's format, with the
        # gateway's own wait when the upstream named none
        for b in busy:
            b.body, b.retry_after = b"<html>429 Too Many Requests</html>", None
        r = stack.request("POST", "/v1/chat/completions", json=CHAT)
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"] == {
            "message": "the upstream returned HTTP 429",
            "type": "RateLimitError",
            "param": None,
            "code": 429,
        }


def test_an_empty_model_name_is_the_upstreams_default_as_vllm_reads_it() -> None:
    with InProcess({"logging": {"access_log": False}}) as stack:
        for path, body in (
            ("/v1/completions", {"model": "", "prompt": "Say hi.", "max_tokens": 4}),
            ("/v1/chat/completions", {**CHAT, "model": ""}),
            ("/v1/embeddings", {"model": "", "input": "hi"}),
            ("/tokenize", {"model": "", "prompt": "hi"}),
        ):
            r = stack.request("POST", path, json=body)
            assert r.status_code == 200, (path, r.text[:300])
        wrong = stack.request("POST", "/v1/completions", json={"model": "nope", "prompt": "hi"})
        assert wrong.status_code == 404 and wrong.json()["error"]["param"] == "model"
        # vLLM's own error, word for word (tests/fixtures: a real vLLM 0.32's answer)
        vllm = orjson.loads((FIXTURES / "error_unknown_model.txt").read_bytes().split(b"\n", 1)[0])
        assert wrong.json()["error"] == {
            **vllm["error"],
            "message": vllm["error"]["message"].replace("tiny-target", MODEL),
        }


def test_another_method_on_a_route_of_the_gateway_is_a_405_that_names_the_allowed_ones() -> None:
    with InProcess() as stack:
        for method, path, allowed in [
            ("GET", "/v1/completions", "POST"),
            ("PUT", "/v1/chat/completions", "POST"),
            ("HEAD", "/v1/responses", "POST"),
            ("DELETE", "/v1/embeddings", "POST"),
            ("POST", "/v1/models", "GET, HEAD"),
        ]:
            response = stack.request(method, path)
            assert response.status_code == 405, (method, path)
            assert response.headers["allow"] == allowed
            if method != "HEAD":
                assert response.json()["error"]["message"] == f"method {method} is not allowed on {path}"


def test_a_route_of_the_gateway_with_a_trailing_slash_is_redirected_to_it_method_and_body_kept() -> None:
    with InProcess() as stack:
        r = stack.request("POST", "/v1/chat/completions/?a=1", json=CHAT)
        assert r.status_code == 307 and r.headers["location"] == "/v1/chat/completions?a=1"
        assert r.headers["x-request-id"]
        followed = stack.request("POST", "/v1/chat/completions/", json=CHAT, follow_redirects=True)
        assert followed.status_code == 200 and followed.json()["choices"][0]["message"]["content"]
        assert followed.headers["x-specroute-pool"] in ("speculative", "baseline")
        # the model list's route too, which the route of one model's entry would otherwise read as model ""
        r = stack.request("GET", "/v1/models/?b=2")
        assert r.status_code == 307 and r.headers["location"] == "/v1/models?b=2"
        listed = stack.request("GET", "/v1/models/", follow_redirects=True)
        assert listed.status_code == 200 and listed.json()["data"][0]["id"] == MODEL


def test_a_served_response_names_its_pool() -> None:
    with InProcess() as stack:
        response = stack.request(
            "POST", "/v1/chat/completions", json=CHAT, headers={"x-specroute-pool": "baseline"}
        )
        assert response.status_code == 200
        assert response.headers["x-specroute-pool"] == "baseline"


class Recorder:
    """Wraps an upstream: keeps the body of every request to ``path`` it receives."""

    def __init__(self, inner: Any, path: str = "/v1/completions"):
        self.inner = inner
        self.path = path
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != self.path:
            await self.inner(scope, receive, send)
            return
        body = await read_body(receive)
        self.bodies.append(body)
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.inner(scope, replay, send)


def test_a_certain_recently_measured_request_goes_upstream_as_the_client_sent_it() -> None:
    # sd_share 1: never uncertain; a long interval: only the pool's first request is measured
    routing = {"strategy": "always-speculative", "measure_interval_s": 3600, "measure_sd_share": 1.0}
    with InProcess({"routing": routing, "auth": {"api_keys": [API_KEY]}}) as stack:
        spec = stack.upstreams[0]
        recorder = Recorder(spec.app)
        spec.app = recorder  # type: ignore[assignment]
        auth = {"authorization": f"Bearer {API_KEY}", "content-type": "application/json"}
        # the client's own spacing and key order: a passed-through request keeps its bytes
        raw = b'{ "prompt": "Return JSON: {\\"a\\": 1}",  "model": "%s", "max_tokens": 5 }' % MODEL.encode()
        measured = stack.request("POST", "/v1/completions", content=raw, headers=auth)
        passed = stack.request("POST", "/v1/completions", content=raw, headers=auth)
        for response in (measured, passed):
            assert response.status_code == 200, response.text
            assert response.headers["x-specroute-pool"] == "speculative"
            assert response.json()["object"] == "text_completion"
            assert response.json()["usage"]["completion_tokens"] == 5
        first, second = recorder.bodies
        assert orjson.loads(first)["stream"] is True  # streamed upstream, to be measured
        assert second == raw and "stream" not in orjson.loads(second)
        assert metric(stack, "specroute_nonstream_measurement_requests_total", outcome="interval") == 1
        assert metric(stack, "specroute_nonstream_measurement_requests_total", outcome="passed") == 1
        state = stack.request("GET", "/admin/routing", headers=auth).json()["measurement"]
        assert state["pools"]["speculative"] == {"uncertain": 0, "interval": 1, "passed": 1, "measured": 1}
        # a stream is measured anyway, and is no verdict's to count
        streamed = stack.request(
            "POST", "/v1/completions", json={**orjson.loads(raw), "stream": True}, headers=auth
        )
        assert streamed.status_code == 200 and "[DONE]" in streamed.text
        after = stack.request("GET", "/admin/routing", headers=auth).json()["measurement"]
        assert after["pools"] == state["pools"]  # (it may teach, which clears a pool's fruitless mark)


def test_a_speculative_request_that_cannot_be_measured_is_counted_as_such(capsys) -> None:
    """Tools, logprobs, several choices: sent as they came and not measured. They are counted and logged
    as ``unmeasurable``, so that measured and passed are not read as all non-streamed speculative traffic."""
    config = {"routing": {"strategy": "always-speculative"}, "auth": {"api_keys": [API_KEY]}}
    with InProcess(config) as stack:
        auth = {"authorization": f"Bearer {API_KEY}"}
        body = {"model": MODEL, "prompt": "Return JSON", "max_tokens": 4}
        for extra in ({"logprobs": 1}, {"prompt": ["Return JSON", "Return YAML"]}):
            r = stack.request("POST", "/v1/completions", json={**body, **extra}, headers=auth)
            assert r.status_code == 200 and r.headers["x-specroute-pool"] == "speculative", r.text
        name = "specroute_nonstream_measurement_requests_total"
        assert metric(stack, name, pool="speculative", outcome="unmeasurable") == 2
        stack.flush_access_log()
        lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
        measurements = [line["measurement"] for line in lines if line.get("route") == "completions"]
        assert measurements == ["unmeasurable", "unmeasurable"]


def test_one_token_answers_do_not_mark_a_pool_that_reports_acceptance_as_fruitless() -> None:
    """Streams and measured requests of one token show no step: the pool keeps measuring the requests it
    is uncertain about, and a longer answer is measured."""
    with InProcess({"routing": {"strategy": "always-speculative"}, "auth": {"api_keys": [API_KEY]}}) as stack:
        auth = {"authorization": f"Bearer {API_KEY}"}
        for i in range(4):
            body = {"model": MODEL, "prompt": f'Is {{"id": {i}}} valid JSON? yes or no', "max_tokens": 1}
            for streamed in (True, False):
                r = stack.request("POST", "/v1/completions", json={**body, "stream": streamed}, headers=auth)
                assert r.status_code == 200, r.text
        state = stack.request("GET", "/admin/routing", headers=auth).json()["measurement"]
        assert state["fruitless"] == []
        assert state["pools"]["speculative"]["uncertain"] >= 1


async def _abandoned_wait(scope_extra: dict[str, Any], lose: Any) -> tuple[int, bool]:
    """A request waiting on upstream work when its client goes away: the status it ends with, and
    whether the work was cancelled."""
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    request = Request({"type": "http", "headers": [], **scope_extra}, receive)
    cancelled = False

    async def upstream() -> None:
        nonlocal cancelled
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled = True
            raise

    waiting = asyncio.ensure_future(unless_disconnected(request, upstream()))
    await asyncio.sleep(0.01)
    lose(gone)
    try:
        await asyncio.wait_for(waiting, 5)
    except APIError as e:
        return e.status, cancelled
    return 200, cancelled


async def test_a_client_gone_mid_wait_ends_it_with_499_whichever_way_the_server_tells() -> None:
    """Told by the gateway's protocol (the scope's client state) or only by ``receive()`` (another
    ASGI server), the wait ends in a 499 and the upstream work is cancelled."""
    client = ClientState()
    assert await _abandoned_wait({CLIENT_SCOPE_KEY: client}, lambda gone: client.gone()) == (499, True)
    assert await _abandoned_wait({}, lambda gone: gone.set()) == (499, True)
    # a client already gone before the wait: no work is started
    assert await _abandoned_wait({CLIENT_SCOPE_KEY: client}, lambda gone: None) == (499, False)


def test_integer_fields_written_as_whole_decimals_are_the_integers_they_stand_for() -> None:
    # JSON has one number type: clients that compute a budget send 4.0, and vLLM reads it as 4
    with InProcess() as stack:
        for pool in ("baseline", "speculative"):  # the speculative pool's body is rebuilt to be measured
            for stream in (False, True):
                body = {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4.0, "n": 1.0, "seed": 7e0}
                response = stack.request(
                    "POST",
                    "/v1/completions",
                    json={**body, "stream": stream},
                    headers={"x-specroute-pool": pool},
                )
                assert response.status_code == 200, (pool, stream, response.text)
        answer = stack.request(
            "POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2.0}
        )
        assert answer.json()["usage"]["completion_tokens"] <= 2
        fraction = stack.request(
            "POST", "/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 2.5}
        )
        assert fraction.status_code == 400 and fraction.json()["error"]["param"] == "max_tokens"
        assert "must be an integer" in fraction.json()["error"]["message"]
        responses = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4.0}
        assert stack.request("POST", "/v1/responses", json=responses).status_code == 200


def test_a_completion_whose_prompt_comes_as_embeddings_alone_goes_upstream() -> None:
    # vLLM started with --enable-prompt-embeds takes `prompt_embeds` in the place of `prompt`
    with InProcess() as stack:
        for body in (
            {"model": MODEL, "prompt_embeds": "AAAA", "max_tokens": 2},
            {"model": MODEL, "prompt": None, "prompt_embeds": ["AAAA"], "max_tokens": 2},
        ):
            response = stack.request("POST", "/v1/completions", json=body)
            assert "required property" not in response.text, body
            assert response.headers.get("x-specroute-pool"), body  # an upstream's answer, whatever it says
        missing = stack.request("POST", "/v1/completions", json={"model": MODEL, "max_tokens": 2})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "prompt"


def test_what_routing_learned_is_taken_up_by_the_next_start(tmp_path: Path) -> None:
    """``routing.state_file``: written at shutdown, read at the next start, shown on /admin/routing."""
    path = tmp_path / "learned.json"
    overrides = {"routing": {"strategy": "always-speculative", "state_file": str(path)}}
    with InProcess(overrides) as stack:
        assert (
            stack.request("GET", "/admin/routing").json()["learned_state"]["at_start"].startswith("no file")
        )
        for i in range(6):
            body = {
                "model": MODEL,
                "prompt": f"Repeat the list 1 2 3 {i} twice.",
                "max_tokens": 24,
                "stream": True,
            }
            assert stack.request("POST", "/v1/completions", json=body).status_code == 200
        learned = stack.request("GET", "/admin/routing").json()["per_request_model"]["updates"]
        assert learned >= 1
    assert path.is_file()
    with InProcess(overrides) as stack:
        state = stack.request("GET", "/admin/routing").json()
        assert state["learned_state"]["at_start"].startswith(f"restored {learned} acceptance updates")
        assert state["per_request_model"]["updates"] == learned
        assert state["worker"] == {"pid": os.getpid(), "workers": 1}
    with InProcess({"logging": {"access_log": False}}) as stack:
        assert stack.request("GET", "/admin/routing").json()["learned_state"] is None


def test_a_photo_sent_inline_fits_the_default_body_limit() -> None:
    """vLLM sets no body limit, and images come inline, base64-encoded: a 4 MB photo is a 5.6 MB body."""
    photo = "data:image/jpeg;base64," + "A" * (4 * 1024 * 1024 * 4 // 3)
    content = [
        {"type": "text", "text": "What is in this picture?"},
        {"type": "image_url", "image_url": {"url": photo}},
    ]
    body = {**CHAT, "messages": [{"role": "user", "content": content}]}
    with InProcess() as stack:
        r = stack.request("POST", "/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text[:300]


def test_scalars_sent_as_strings_are_served_as_vllm_serves_them() -> None:
    """``"stream": "true"``, ``"max_tokens": "4"``, ``"temperature": "0.5"``: vLLM's request models read
    them (pydantic, lax mode), so the gateway serves them, and a stream of "true" is streamed."""
    with InProcess() as stack:
        for pool in ("baseline", "speculative"):
            headers = {"x-specroute-pool": pool}
            body = {"model": MODEL, "prompt": "Say hi.", "max_tokens": "4", "temperature": "0.5"}
            streamed = stack.request(
                "POST", "/v1/completions", json={**body, "stream": "true"}, headers=headers
            )
            assert streamed.status_code == 200, streamed.text
            assert streamed.headers["content-type"].startswith("text/event-stream")
            assert streamed.text.rstrip().endswith("data: [DONE]")
            chat = {**CHAT, "max_tokens": "4", "stream": "false"}
            whole = stack.request("POST", "/v1/chat/completions", json=chat, headers=headers)
            assert whole.status_code == 200, whole.text
            assert whole.json()["usage"]["completion_tokens"] == 4


def test_a_stream_of_several_sequences_goes_and_comes_back_as_vllm_streams_it() -> None:
    """Several interleaved sequences (a list of prompts, n > 1) show no steps and are not resumed: the
    request goes as sent, and the stream is vLLM's own, every choice's finishing chunk with the server's
    fingerprint (asked for usage on the client's behalf, vLLM moves them all onto the usage chunk)."""
    body = {"model": MODEL, "prompt": ["Say hi.", "Say bye."], "max_tokens": 3, "stream": True}
    raw = orjson.dumps(body)
    with InProcess() as stack:
        for pool in ("baseline", "speculative"):
            r = stack.request(
                "POST",
                "/v1/completions",
                content=raw,
                headers={"content-type": "application/json", "x-specroute-pool": pool},
            )
            assert r.status_code == 200, r.text
            chunks = [orjson.loads(e[6:]) for e in r.text.split("\n\n") if e.startswith("data: {")]
            finishing = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            assert sorted(c["choices"][0]["index"] for c in finishing) == [0, 1]
            assert all(c["system_fingerprint"].startswith("vllm-") for c in finishing), pool
            assert not any("usage" in c for c in chunks)
