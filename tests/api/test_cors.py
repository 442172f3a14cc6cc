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
