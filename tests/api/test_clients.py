"""What third-party clients (the OpenAI SDKs, LangChain, LiteLLM, ``vllm bench serve``) send and expect,
as plain HTTP against the gateway in-process."""

from __future__ import annotations

from typing import Any

import pytest

from tests.api.conftest import API_KEY, MODEL, InProcess

AUTH = {"authorization": f"Bearer {API_KEY}"}
COMPLETION = {"model": MODEL, "prompt": 'Return JSON: {"a": 1}', "max_tokens": 4}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": 'Return JSON: {"a": 1}'}], "max_tokens": 4}
RESPONSES = {"model": MODEL, "input": 'Return JSON: {"a": 1}', "max_output_tokens": 4}
NOWHERE = {"endpoints": [{"name": "gone", "url": "http://127.0.0.1:9"}], "models": [MODEL]}

# vLLM refuses min_p > 0 and a non-empty logit_bias on a server with speculative decoding (a 400)
REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("/v1/completions", {**COMPLETION, "logit_bias": {"5": -100}}),
    ("/v1/completions", {**COMPLETION, "min_p": 0.05, "stream": True}),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"7": 10}, "stream": True}),
    ("/v1/chat/completions", {**CHAT, "min_p": 0.1}),
    ("/v1/responses", {**RESPONSES, "min_p": 0.1}),
]


@pytest.fixture(scope="module")
def speculating() -> Any:
    with InProcess({"routing": {"strategy": "always-speculative"}, "auth": {"api_keys": [API_KEY]}}) as stack:
        yield stack


@pytest.mark.parametrize(("path", "body"), REFUSED)
def test_a_request_the_speculative_pool_refuses_is_served_by_the_baseline_pool(
    speculating: InProcess, path: str, body: dict[str, Any]
) -> None:
    """min_p or logit_bias (LangChain's and LiteLLM's ``logit_bias``, a sampler's ``min_p``) sent to the
    speculative pool got vLLM's 400, depending only on where the gateway routed the request."""
    response = speculating.request("POST", path, json=body, headers=AUTH)
    assert response.status_code == 200, response.text
    assert response.headers["x-specroute-pool"] == "baseline"
    assert response.headers["x-specroute-reason"] == "spec-unsupported"
    if body.get("stream"):
        assert response.text.rstrip().endswith("data: [DONE]")


def test_sampling_parameters_set_to_off_do_not_keep_a_request_from_the_speculative_pool(
    speculating: InProcess,
) -> None:
    for extra in (
        {"min_p": 0},
        {"min_p": 0.0, "logit_bias": {}},
        {"min_p": None, "logit_bias": None},
        {"min_p": 0.1, "temperature": 0},  # greedy: vLLM sets min_p to zero before it checks
    ):
        response = speculating.request("POST", "/v1/completions", json={**COMPLETION, **extra}, headers=AUTH)
        assert response.status_code == 200, response.text
        assert response.headers["x-specroute-pool"] == "speculative", extra


def test_a_request_forced_to_the_speculative_pool_gets_its_refusal(speculating: InProcess) -> None:
    headers = {**AUTH, "x-specroute-pool": "speculative"}
    response = speculating.request("POST", "/v1/completions", json=REFUSED[0][1], headers=headers)
    assert response.status_code == 400
    assert "speculative decoding" in response.json()["error"]["message"]


@pytest.mark.parametrize(("path", "body"), REFUSED[:4])
def test_a_request_only_the_baseline_pool_can_serve_is_not_failed_over_to_the_speculative_one(
    path: str, body: dict[str, Any]
) -> None:
    """With no baseline endpoint up, the answer is a 503 to retry, not the speculative pool's 400."""
    with InProcess({"pools": {"baseline": NOWHERE}}) as stack:
        response = stack.request("POST", path, json=body)
        assert response.status_code == 503, response.text
        assert response.headers["x-specroute-reason"] == "spec-unsupported"
        assert "x-specroute-pool" not in response.headers
        # any other request still fails over to the speculative pool
        plain = {k: v for k, v in body.items() if k not in ("min_p", "logit_bias")}
        served = stack.request("POST", path, json=plain)
        assert served.status_code == 200, served.text
        assert served.headers["x-specroute-pool"] == "speculative"


class WithoutRoutes:
    """An upstream as vLLM serving a generative model answers a pooling route: FastAPI's 404."""

    PATHS = ("/v1/embeddings", "/tokenize", "/detokenize")

    def __init__(self, inner: Any):
        self.inner = inner

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in self.PATHS:
            await self.inner(scope, receive, send)
            return
        body = b'{"detail":"Not Found"}'
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/embeddings", {"model": MODEL, "input": "hello"}),
        ("/tokenize", {"model": MODEL, "prompt": "hello"}),
        ("/detokenize", {"model": MODEL, "tokens": [1, 2]}),
    ],
)
def test_a_route_the_models_servers_lack_is_an_openai_shaped_404(
    speculating: InProcess, path: str, body: dict[str, Any]
) -> None:
    """``litellm.embedding`` / ``client.embeddings.create`` against a generative model: vLLM's FastAPI
    404 reached the client as ``{"detail": "Not Found"}``, which the SDKs report without a message."""
    inner = [u.app for u in speculating.upstreams]
    for upstream in speculating.upstreams:
        upstream.app = WithoutRoutes(upstream.app)  # type: ignore[assignment]
    try:
        response = speculating.request("POST", path, json=body, headers=AUTH)
    finally:
        for upstream, app in zip(speculating.upstreams, inner, strict=True):
            upstream.app = app
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["message"] == f"no route POST {path}"
    assert error["type"] == "NotFoundError" and error["code"] == 404
    assert response.headers["x-request-id"]
