"""Decision headers: ``x-specroute-pool`` names the pool whose answer the client got, and only then."""

from __future__ import annotations

from tests.api.conftest import MODEL, InProcess

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


def test_a_served_response_names_its_pool() -> None:
    with InProcess() as stack:
        response = stack.request(
            "POST", "/v1/chat/completions", json=CHAT, headers={"x-specroute-pool": "baseline"}
        )
        assert response.status_code == 200
        assert response.headers["x-specroute-pool"] == "baseline"
