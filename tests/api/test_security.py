"""What a caller without a key can see and reach, and what reaches the upstreams and back."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import orjson
import pytest

from tests.api.conftest import API_KEY, MODEL, InProcess

AUTH = {"authorization": f"Bearer {API_KEY}"}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4}
WEIGHTS = "/mnt/models/llama-3-8b-instruct"


def test_metrics_and_admin_need_an_api_key_when_keys_are_set(gateway: InProcess) -> None:
    for path in ("/metrics", "/admin/routing", "/v1/models", f"/v1/models/{MODEL}"):
        assert gateway.request("GET", path).status_code == 401, path
        assert gateway.request("GET", path, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert gateway.request("GET", path, headers=AUTH).status_code == 200, path


def test_ready_shows_counts_to_anyone_and_names_to_a_key_holder(gateway: InProcess) -> None:
    anonymous = orjson.loads(gateway.request("GET", "/ready").content)
    assert anonymous["available_endpoints"] == {"speculative": 1, "baseline": 1}
    named = orjson.loads(gateway.request("GET", "/ready", headers=AUTH).content)
    assert named["available_endpoints"] == {"speculative": ["spec-0"], "baseline": ["base-0"]}


@pytest.fixture(scope="module")
def dedicated_keys() -> Iterator[InProcess]:
    auth = {"api_keys": [API_KEY], "admin_key": "admin-key", "metrics_key": "scrape-key"}
    with InProcess({"auth": auth}) as stack:
        yield stack


def test_dedicated_metrics_and_admin_keys(dedicated_keys: InProcess) -> None:
    def status(path: str, key: str) -> int:
        return dedicated_keys.request("GET", path, headers={"authorization": f"Bearer {key}"}).status_code

    assert status("/metrics", "scrape-key") == 200
    assert status("/metrics", API_KEY) == 200
    assert status("/metrics", "admin-key") == 401
    assert status("/admin/routing", "admin-key") == 200
    assert status("/admin/routing", API_KEY) == 401
    assert status("/admin/routing", "scrape-key") == 401


def test_metrics_can_be_opened_explicitly() -> None:
    with InProcess({"auth": {"api_keys": [API_KEY], "metrics_public": True}}) as stack:
        assert stack.request("GET", "/metrics").status_code == 200
        assert stack.request("GET", "/admin/routing").status_code == 401


def test_a_metrics_key_alone_protects_only_metrics() -> None:
    with InProcess({"auth": {"metrics_key": "scrape-key"}}) as stack:
        assert stack.request("GET", "/metrics").status_code == 401
        scrape = {"authorization": "Bearer scrape-key"}
        assert stack.request("GET", "/metrics", headers=scrape).status_code == 200
        assert stack.request("GET", "/admin/routing").status_code == 200  # no keys: open, as before
        assert stack.request("POST", "/v1/chat/completions", json=CHAT).status_code == 200


def test_ready_names_endpoints_to_the_admin_key_too(dedicated_keys: InProcess) -> None:
    admin = {"authorization": "Bearer admin-key"}
    body = orjson.loads(dedicated_keys.request("GET", "/ready", headers=admin).content)
    assert body["available_endpoints"] == {"speculative": ["spec-0"], "baseline": ["base-0"]}
    scrape = {"authorization": "Bearer scrape-key"}
    body = orjson.loads(dedicated_keys.request("GET", "/ready", headers=scrape).content)
    assert body["available_endpoints"] == {"speculative": 1, "baseline": 1}


def test_models_list_drops_the_upstreams_weight_path() -> None:
    with InProcess(emulator={"model": WEIGHTS}) as stack:
        response = stack.request("GET", "/v1/models")
        assert response.status_code == 200
        (entry,) = orjson.loads(response.content)["data"]
        assert WEIGHTS not in response.text
        assert entry["id"] == MODEL and entry["owned_by"] == "vllm" and entry["max_model_len"] == 512
        # vLLM's entry otherwise as it wrote it: permission, parent (a LoRA adapter's base model)
        assert set(entry) == {"id", "object", "created", "owned_by", "max_model_len", "parent", "permission"}
        assert entry["parent"] is None and entry["permission"][0]["object"] == "model_permission"


def test_one_model_is_retrieved_as_its_list_entry_and_an_unknown_one_is_a_404() -> None:
    with InProcess(emulator={"model": WEIGHTS}) as stack:
        (listed,) = orjson.loads(stack.request("GET", "/v1/models").content)["data"]
        response = stack.request("GET", f"/v1/models/{MODEL}")
        assert response.status_code == 200
        one = orjson.loads(response.content)
        # vLLM draws a new permission id and time at each answer
        fresh = {"created": one["created"], "permission": one["permission"]}
        assert one == {**listed, **fresh} and WEIGHTS not in response.text
        missing = stack.request("GET", "/v1/models/org/no-such-model")
        assert missing.status_code == 404
        err = missing.json()["error"]
        assert err["param"] == "model" and "org/no-such-model" in err["message"]


def test_an_upstream_5xx_reaches_the_client_as_status_and_request_id_only() -> None:
    with InProcess({"health": {"eject_after_failures": 100}}, emulator={"error_rate": 1.0}) as stack:
        response = stack.request("POST", "/v1/chat/completions", json=CHAT, headers={"x-request-id": "rid-1"})
        assert response.status_code == 502
        err = response.json()["error"]
        assert "injected fault" not in response.text and "Emulated" not in response.text
        assert "rid-1" in err["message"] and response.headers["x-request-id"] == "rid-1"
        for name in ("spec-0", "base-0", "127.0.0.1"):
            assert name not in err["message"]


def test_gateway_errors_name_no_endpoint_or_address() -> None:
    nowhere = {"endpoints": [{"name": "secret-name", "url": "http://127.0.0.1:9"}], "models": [MODEL]}
    with InProcess({"pools": {"speculative": nowhere, "baseline": nowhere}}) as stack:
        response = stack.request("POST", "/v1/chat/completions", json=CHAT)
        assert response.status_code == 503
        assert "secret-name" not in response.text and "127.0.0.1" not in response.text


def _upstream_auth(stack: InProcess, path: str) -> set[str | None]:
    return {auth for upstream in stack.upstreams for p, auth in upstream.seen if p == path}


def test_the_client_authorization_is_not_forwarded_unless_configured() -> None:
    client_auth = {"authorization": "Bearer client-secret"}
    with InProcess() as stack:
        assert (
            stack.request("POST", "/v1/chat/completions", json=CHAT, headers=client_auth).status_code == 200
        )
        assert _upstream_auth(stack, "/v1/chat/completions") == {None}
    with InProcess({"auth": {"forward_client_authorization": True}}) as stack:
        assert (
            stack.request("POST", "/v1/chat/completions", json=CHAT, headers=client_auth).status_code == 200
        )
        assert _upstream_auth(stack, "/v1/chat/completions") == {"Bearer client-secret"}
    # with gateway keys, the client's header holds the gateway's key: never forwarded
    with InProcess({"auth": {"api_keys": [API_KEY], "forward_client_authorization": True}}) as stack:
        assert stack.request("POST", "/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200
        assert _upstream_auth(stack, "/v1/chat/completions") == {None}


TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACE = {
    "traceparent": f"00-{TRACE_ID}-00f067aa0ba902b7-01",
    "tracestate": "vendor=opaque",
}


def test_the_callers_trace_context_reaches_the_engine_and_nothing_is_made_up(capsys) -> None:
    """vLLM with tracing on makes its spans children of the ``traceparent`` it gets: every route that
    forwards passes the caller's W3C trace context on, whichever pool serves it, and the access log
    names the trace."""
    requests = [
        ("/v1/completions", {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4}, "baseline"),
        ("/v1/completions", {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4}, "speculative"),
        ("/v1/chat/completions", {**CHAT, "stream": True}, "speculative"),
        ("/tokenize", {"model": MODEL, "prompt": "Say hi."}, None),
    ]
    with InProcess() as stack:
        for path, body, pool in requests:
            headers = {**TRACE, **({"x-specroute-pool": pool} if pool else {})}
            assert stack.request("POST", path, json=body, headers=headers).status_code == 200, path
            heads = [h for upstream in stack.upstreams for p, h in upstream.heads if p == path]
            assert heads and heads[-1][b"traceparent"] == TRACE["traceparent"].encode()
            assert heads[-1][b"tracestate"] == TRACE["tracestate"].encode()
        for upstream in stack.upstreams:
            upstream.heads.clear()
        assert stack.request("POST", "/v1/chat/completions", json=CHAT).status_code == 200
        sent = [h for upstream in stack.upstreams for p, h in upstream.heads if p == "/v1/chat/completions"]
        assert sent and not any(b"traceparent" in h or b"tracestate" in h for h in sent)
        stack.flush_access_log()
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert [(line["route"], line["trace_id"]) for line in lines] == [
        ("completions", TRACE_ID),
        ("completions", TRACE_ID),
        ("chat", TRACE_ID),
        ("tokenize", TRACE_ID),
        ("chat", None),
    ]


def test_a_body_request_id_names_the_request_unless_a_header_does() -> None:
    """vLLM names a request by its ``X-Request-Id`` header, else by the body's ``request_id`` (the response's
    ``id``, its log lines). The gateway sends an id upstream in that header; without the client's header it
    is the body's, as vLLM alone would have used, and the client reads it back in ``x-request-id``."""
    cases = [
        ("/v1/completions", {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4}, "baseline", "cmpl-"),
        ("/v1/completions", {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4}, "speculative", "cmpl-"),
        ("/v1/chat/completions", {**CHAT, "stream": True}, "speculative", "chatcmpl-"),
    ]
    with InProcess() as stack:
        for path, body, pool, prefix in cases:
            for header, expected in ((None, "trace-42"), ("req-7", "req-7"), ("bad\tid", "trace-42")):
                for upstream in stack.upstreams:
                    upstream.heads.clear()
                headers = {"x-specroute-pool": pool, **({"x-request-id": header} if header else {})}
                r = stack.request("POST", path, json={**body, "request_id": "trace-42"}, headers=headers)
                assert r.status_code == 200, (path, pool, r.text)
                assert r.headers["x-request-id"] == expected, (path, pool, header)
                heads = [h for upstream in stack.upstreams for p, h in upstream.heads if p == path]
                assert [h[b"x-request-id"] for h in heads] == [expected.encode()], (path, pool, header)
                if not body.get("stream"):
                    assert r.json()["id"] == prefix + expected, (path, pool, header)
        # an id that is no plausible id (a control character) is not adopted: a new one is made
        body = {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4, "request_id": "a\nb"}
        r = stack.request("POST", "/v1/completions", json=body)
        assert r.status_code == 200 and r.headers["x-request-id"] not in ("a\nb", "")


def test_an_upstream_key_from_the_environment_goes_to_every_upstream_call(monkeypatch) -> None:
    monkeypatch.setenv("SPECROUTE_TEST_UPSTREAM_KEY", "upstream-secret")
    overrides = {
        "pools": {"speculative": {"api_key_env": "SPECROUTE_TEST_UPSTREAM_KEY"}},
        "auth": {"forward_client_authorization": True},
    }
    with InProcess(overrides, upstream_key="upstream-secret") as stack:
        # the baseline pool has no key: its upstream refuses /v1/*, so send to the speculative one
        headers = {"x-specroute-pool": "speculative", "authorization": "Bearer client-secret"}
        body = {**CHAT, "stream": True}
        assert stack.request("POST", "/v1/chat/completions", json=body, headers=headers).status_code == 200
        speculative = stack.upstreams[0]
        paths = {p for p, auth in speculative.seen if auth == "Bearer upstream-secret"}
        assert {"/v1/chat/completions", "/health", "/metrics"} <= paths
        assert all(auth == "Bearer upstream-secret" for _, auth in speculative.seen)
        assert all(auth != "Bearer upstream-secret" for _, auth in stack.upstreams[1].seen)
        assert "upstream-secret" not in repr(stack.settings)


def test_an_upstream_key_from_a_file(tmp_path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-secret\n")
    pool = {"api_key_file": str(key_file)}
    with InProcess({"pools": {"speculative": pool, "baseline": pool}}, upstream_key="file-secret") as stack:
        assert stack.request("POST", "/v1/chat/completions", json=CHAT).status_code == 200
        response = stack.request("GET", "/v1/models")
        assert response.json()["data"][0]["owned_by"] == "vllm"  # the upstream's entry: its key was sent


def test_an_upstream_that_refuses_the_gateways_credentials_is_a_gateway_fault(caplog) -> None:
    """vLLM started with ``--api-key`` and no key configured for it: its 401 is the gateway's
    configuration to fix, not the caller's key. The other pool is tried; with none left the caller
    gets a 502 that says so (not vLLM's ``{"error": "Unauthorized"}`` as a 401 of its own), the
    endpoint is not ejected (its /health is open), and the log names the settings."""
    key_file_pool = {"speculative": {}, "baseline": {}}
    with InProcess({"pools": key_file_pool}, upstream_key="upstream-secret") as stack:
        for stream in (False, True):
            body = {**CHAT, "stream": stream}
            r = stack.request("POST", "/v1/chat/completions", json=body)
            assert r.status_code == 502, r.text
            assert "refused the gateway's credentials (HTTP 401)" in r.json()["error"]["message"]
        paths = [p for u in stack.upstreams for p, _ in u.seen if p == "/v1/chat/completions"]
        assert len(paths) == 4  # each pool once per request: nothing ran, so the other pool was tried
        metrics = stack.request("GET", "/metrics").text
        assert 'kind="unauthorized",pool="baseline"} 2.0' in metrics
        assert 'specroute_endpoint_ejected{endpoint="base-0",pool="baseline"} 0.0' in metrics
    warnings = [
        r.getMessage() for r in caplog.records if "refused the gateway's credentials" in r.getMessage()
    ]
    assert len(warnings) == 2 and all(
        "api_key_env or api_key_file" in w for w in warnings
    )  # one per endpoint


def test_a_refusal_of_the_callers_own_key_reaches_it_as_an_openai_error() -> None:
    """With the caller's Authorization forwarded, vLLM's 401 is the caller's: its status and text, in the
    shape OpenAI clients read (vLLM's own is ``{"error": "Unauthorized"}``)."""
    with InProcess({"auth": {"forward_client_authorization": True}}, upstream_key="right") as stack:
        headers = {"authorization": "Bearer wrong", "x-specroute-pool": "baseline"}
        r = stack.request("POST", "/v1/chat/completions", json=CHAT, headers=headers)
        assert r.status_code == 401
        assert r.json()["error"] == {
            "message": "Unauthorized",
            "type": "AuthenticationError",
            "param": None,
            "code": 401,
        }


def test_with_the_callers_key_forwarded_the_model_list_is_the_upstreams_to_refuse() -> None:
    """With ``forward_client_authorization`` the upstream judges the caller's key: a key vLLM refuses gets
    no model list either, as from vLLM itself; the right one gets vLLM's entries."""
    with InProcess({"auth": {"forward_client_authorization": True}}, upstream_key="right") as stack:
        for path in ("/v1/models", f"/v1/models/{MODEL}"):
            wrong = stack.request("GET", path, headers={"authorization": "Bearer wrong"})
            assert wrong.status_code == 401 and wrong.json()["error"]["message"] == "Unauthorized", path
            assert stack.request("GET", path).status_code == 401, path
            right = stack.request("GET", path, headers={"authorization": "Bearer right"})
            assert right.status_code == 200, path
        listed = stack.request("GET", "/v1/models", headers={"authorization": "Bearer right"}).json()
        assert listed["data"][0]["owned_by"] == "vllm"
    with InProcess(upstream_key="right") as stack:  # not forwarded: the gateway's list, as before
        assert (
            stack.request("GET", "/v1/models", headers={"authorization": "Bearer wrong"}).status_code == 200
        )


def test_a_missing_upstream_key_stops_start_up(monkeypatch) -> None:
    from gateway.app import create_app
    from gateway.config import ConfigError, load_settings
    from gateway.stack import demo_config

    monkeypatch.delenv("SPECROUTE_TEST_UNSET_KEY", raising=False)
    config = demo_config(["http://127.0.0.1:9"], ["http://127.0.0.1:9"], 8000)
    config["pools"]["baseline"]["endpoints"][0]["api_key_env"] = "SPECROUTE_TEST_UNSET_KEY"  # type: ignore[index]
    with pytest.raises(ConfigError, match=r"pools\.baseline\.endpoints\.0\.api_key_env"):
        create_app(load_settings(overrides=config))


def test_upstream_failures_map_to_statuses_in_one_place():
    """The API edge alone turns upstream failures into statuses; messages pass on as they are."""
    from gateway import errors
    from gateway.api.errors import from_upstream

    cases = [
        (errors.NoEndpoint("none"), 503),
        (errors.Unreachable("refused"), 503),
        (errors.UpstreamTimeout("silent"), 504),
        (errors.UpstreamBroken("cut"), 502),
        (errors.UpstreamStatus(429, "busy"), 429),
        (errors.UpstreamStatus(503, "busy"), 503),
        (errors.UpstreamStatus(500, "failed"), 502),
        (errors.UpstreamStatus(501, "failed"), 502),
    ]
    for error, status in cases:
        api = from_upstream(error)
        assert (api.status, api.message) == (status, error.message)


def test_a_model_entry_keeps_names_and_drops_paths() -> None:
    from gateway.api.routes import _public_model

    adapter = {"id": "sql-lora", "object": "model", "root": "/srv/loras/sql", "parent": "Qwen/Qwen3-32B"}
    assert _public_model(adapter) == {"id": "sql-lora", "object": "model", "parent": "Qwen/Qwen3-32B"}
    local = {"id": "m", "root": "Qwen/Qwen3-32B", "parent": "./weights", "permission": []}
    assert _public_model(local) == {"id": "m", "root": "Qwen/Qwen3-32B", "permission": []}


def test_an_unhandled_errors_log_line_shows_the_clients_path_escaped(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The path arrives percent-decoded: a %1B in it would drive the terminal that shows the log (and a
    %0A forge a line, where a route takes one)."""
    from gateway.api import routes

    async def broken(request: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(routes, "model", broken)
    # answered 500 and logged, then raised again by Starlette to the server (here, the test client)
    with (
        InProcess() as stack,
        caplog.at_level(logging.ERROR, logger="specroute"),
        pytest.raises(RuntimeError, match="a bug"),
    ):
        stack.request("GET", "/v1/models/m%1B]0;forged title%07%1B[31m")
    (record,) = [r for r in caplog.records if r.getMessage().startswith("unhandled error on")]
    message = record.getMessage()
    assert message.startswith("unhandled error on GET '/v1/models/m\\x1b]0;forged title\\x07\\x1b[31m'")
