"""CORS: off by default (a preflight is a 405), answered by the gateway when origins are configured."""

from __future__ import annotations

from tests.api.conftest import API_KEY, MODEL, InProcess

AUTH = {"authorization": f"Bearer {API_KEY}"}


PREFLIGHT = {
    "origin": "https://app.example",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
}


def test_cors_is_off_by_default(echoing: InProcess) -> None:
    r = echoing.request("OPTIONS", "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 405
    r = echoing.request("GET", "/v1/models", headers={**AUTH, "origin": "https://app.example"})
    assert "access-control-allow-origin" not in r.headers


def test_cors_when_configured_answers_preflights_and_marks_responses() -> None:
    cors = {"allow_origins": ["https://app.example"], "max_age_s": 120}
    with InProcess({"cors": cors, "logging": {"access_log": False}}) as s:
        r = s.request("OPTIONS", "/v1/chat/completions", headers=PREFLIGHT)
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert r.headers["access-control-max-age"] == "120"
        assert "POST" in r.headers["access-control-allow-methods"]
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        r = s.request("POST", "/v1/chat/completions", json=chat, headers={"origin": "https://app.example"})
        assert r.status_code == 200
        assert r.headers["access-control-allow-origin"] == "https://app.example"
        assert "x-specroute-pool" in r.headers["access-control-expose-headers"]
        other = s.request(
            "OPTIONS", "/v1/chat/completions", headers={**PREFLIGHT, "origin": "https://evil.example"}
        )
        assert other.status_code == 400 and "access-control-allow-origin" not in other.headers


def test_the_openai_sdks_own_headers_pass_a_preflight_and_retry_after_is_readable() -> None:
    # openai-node sends x-stainless-* headers with every call; it honours retry-after when it can read it
    sdk = (
        "authorization, content-type, x-stainless-lang, x-stainless-package-version, x-stainless-retry-count"
    )
    with InProcess(
        {"cors": {"allow_origins": ["https://app.example"]}, "logging": {"access_log": False}}
    ) as s:
        r = s.request(
            "OPTIONS", "/v1/chat/completions", headers={**PREFLIGHT, "access-control-request-headers": sdk}
        )
        assert r.status_code == 200, r.text
        allowed = {h.strip() for h in r.headers["access-control-allow-headers"].lower().split(",")}
        assert {h.strip() for h in sdk.split(",")} <= allowed
        r = s.request("GET", "/v1/models", headers={"origin": "https://app.example"})
        assert "retry-after" in r.headers["access-control-expose-headers"]
