"""Routes forwarded without classification: embeddings, (de)tokenising and any other ``/v1/*`` route."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.api.passthrough import _model
from gateway.app import create_app, fast_path
from gateway.config import load_settings
from gateway.stack import demo_config, free_port
from tests.api.conftest import API_KEY, MODEL, InProcess, metric
from tests.api.test_fuzz import FUZZ, check, json_values

AUTH = {"authorization": f"Bearer {API_KEY}"}


def test_embeddings_go_to_the_baseline_pool(echoing: InProcess) -> None:
    r = echoing.request("POST", "/v1/embeddings", json={"model": MODEL, "input": ["a", "b c"]}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers["x-specroute-pool"] == "baseline"
    assert "x-specroute-reason" not in r.headers  # not classified
    data = r.json()["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == len(data[1]["embedding"]) > 0
    assert metric(echoing, "specroute_requests_total", route="embeddings", status="200") >= 1


def test_tokenize_then_detokenize_round_trips(echoing: InProcess) -> None:
    text = "Speculative decoding, 42 times over!"
    tok = echoing.request("POST", "/tokenize", json={"model": MODEL, "prompt": text}, headers=AUTH)
    assert tok.status_code == 200 and tok.json()["count"] == len(tok.json()["tokens"])
    back = echoing.request(
        "POST", "/detokenize", json={"model": MODEL, "tokens": tok.json()["tokens"]}, headers=AUTH
    )
    assert back.status_code == 200 and back.json()["prompt"] == text


@pytest.mark.parametrize("path", ["/v1/embeddings", "/tokenize", "/detokenize"])
def test_unforwarded_errors(echoing: InProcess, path: str) -> None:
    unknown = echoing.request("POST", path, json={"model": "nope", "input": "x", "prompt": "x"}, headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    bad = echoing.request("POST", path, content=b"[1,", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
    assert echoing.request("POST", path, json={"model": MODEL}).status_code == 401


# -- any other /v1 route -------------------------------------------------------------------------


def test_other_v1_routes_pass_through_with_a_bounded_label(echoing: InProcess) -> None:
    body = {"model": MODEL, "text_1": "a", "text_2": "b"}
    r = echoing.request("POST", "/v1/score?x=1", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    echo = r.json()
    assert echo["method"] == "POST" and echo["path"] == "/v1/score" and echo["query"] == "x=1"
    assert orjson.loads(echo["body"]) == body
    form = (
        b'--XX\r\nContent-Disposition: form-data; name="model"\r\n\r\n'
        + MODEL.encode()
        + b'\r\n--XX\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
        + b"\r\nRIFF\r\n--XX--\r\n"
    )
    headers = {**AUTH, "content-type": "multipart/form-data; boundary=XX"}
    r = echoing.request("POST", "/v1/audio/transcriptions", content=form, headers=headers)
    assert r.status_code == 200 and r.json()["content_type"].startswith("multipart/form-data")
    unknown = form.replace(MODEL.encode(), b"nope")
    r = echoing.request("POST", "/v1/audio/transcriptions", content=unknown, headers=headers)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert metric(echoing, "specroute_requests_total", route="score") >= 1
    assert metric(echoing, "specroute_requests_total", route="audio") >= 1
    text = echoing.request("GET", "/metrics", headers=AUTH).text
    assert "transcriptions" not in text  # the raw path never becomes a label


@pytest.mark.parametrize(
    ("path", "label"),
    [("/score", "score"), ("/rerank", "rerank"), ("/v2/rerank", "rerank"), ("/classify", "classify"),
     ("/pooling", "pooling")],
)  # fmt: skip
def test_vllms_model_routes_outside_v1_pass_through(echoing: InProcess, path: str, label: str) -> None:
    """vLLM serves some only there (``/classify``, ``/pooling``): checked and labelled like ``/v1/score``."""
    body = {"model": MODEL, "query": "q", "documents": ["a", "b"]}
    r = echoing.request("POST", path, json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    echo = r.json()
    assert (echo["method"], echo["path"], orjson.loads(echo["body"])) == ("POST", path, body)
    assert r.headers["x-specroute-pool"] == "baseline" and "x-specroute-reason" not in r.headers
    assert metric(echoing, "specroute_requests_total", route=label, status="200") >= 1
    unknown = echoing.request("POST", path, json={**body, "model": "nope"}, headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    assert echoing.request("POST", path, json=body).status_code == 401
    version = echoing.request("GET", "/version", headers=AUTH)
    assert version.status_code == 200 and version.json()["path"] == "/version"
    assert echoing.request("POST", "/invocations", json=body, headers=AUTH).status_code == 404  # not ours


def test_passthrough_of_unknown_routes_and_methods(echoing: InProcess) -> None:
    r = echoing.request("GET", "/v1/no/such/route", headers=AUTH)
    assert r.status_code == 404  # the upstream has no such route: said in the API's error format
    assert r.json()["error"]["message"] == "no route GET /v1/no/such/route"
    assert echoing.request("GET", "/v1/no/such/route").status_code == 401
    assert echoing.request("GET", "/v1/completions", headers=AUTH).status_code == 405
    bad = echoing.request(
        "POST", "/v1/score", content=b"{", headers={**AUTH, "content-type": "application/json"}
    )
    assert bad.status_code == 400
    assert echoing.request("GET", "/nothing/here", headers=AUTH).status_code == 404


def test_a_path_with_dot_segments_is_refused_not_forwarded(echoing: InProcess) -> None:
    """Encoded, they reach the upstream as written, where a normalising proxy would leave ``/v1``."""
    for path in ("/v1/%2e%2e/sleep", "/v1/..%2Fsleep", "/v1/a/%2E/b", "/v1/%2e%2e"):
        r = echoing.request("POST", path, json={"model": MODEL}, headers=AUTH)
        assert r.status_code == 400, path
        assert "segment" in r.json()["error"]["message"] and r.headers["x-request-id"]
    # dots inside a segment are a name, not a step up: forwarded (the upstream has no such route)
    named = echoing.request("POST", "/v1/score.v2/..x", json={"model": MODEL}, headers=AUTH)
    assert named.status_code == 404 and named.json()["error"]["message"] == "no route POST /v1/score.v2/..x"


def test_the_model_of_a_multipart_form_is_read_from_its_part() -> None:
    def form(*headers: bytes) -> bytes:
        part = b'Content-Disposition: form-data; name="model"\r\n' + b"".join(h + b"\r\n" for h in headers)
        return b"--XX\r\n" + part + b"\r\n" + MODEL.encode() + b"\r\n--XX--\r\n"

    kind = "multipart/form-data; boundary=XX"
    assert _model(form(), kind) == MODEL
    assert _model(form(*[b"X-Extra: 1"] * 8), kind) == MODEL
    assert _model(form(*[b"X-Extra: 1"] * 9), kind) is None  # no part has that many header lines
    # a body of nothing but the name, line after line, is read in one pass (each occurrence looked at
    # a few lines ahead, not to the end of the body), and holds no model
    assert _model(b'name="model"\r\n' * 4_000, kind) is None


# -- upstream down -----------------------------------------------------------------------------


async def test_upstream_down_is_503_for_every_route() -> None:
    dead = [f"http://127.0.0.1:{free_port()}"]
    config = demo_config(dead, dead, free_port(), MODEL, extra={"logging": {"access_log": False}})
    settings = load_settings(overrides=config)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=fast_path(app))
        async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as client:
            calls = [
                ("/v1/responses", {"model": MODEL, "input": "hi"}),
                ("/v1/responses", {"model": MODEL, "input": "hi", "stream": True}),
                ("/v1/embeddings", {"model": MODEL, "input": "hi"}),
                ("/tokenize", {"model": MODEL, "prompt": "hi"}),
                ("/v1/score", {"model": MODEL}),
            ]
            for path, body in calls:
                r = await client.post(path, json=body)
                assert r.status_code in (502, 503), (path, r.text)
                error = r.json()["error"]
                assert "request id" in error["message"] and "127.0.0.1" not in error["message"]


VALID: dict[str, dict[str, Any]] = {
    "/v1/embeddings": {"model": MODEL, "input": "Say hi."},
    "/tokenize": {"model": MODEL, "prompt": "Say hi."},
    "/detokenize": {"model": MODEL, "tokens": [1]},
    "/v1/score": {"model": MODEL, "text_1": "a", "text_2": "b"},
}
FIELDS = st.sampled_from(
    ["model", "input", "dimensions", "encoding_format", "prompt", "messages", "tokens", "add_special_tokens"]
)


@settings(FUZZ, max_examples=120)
@given(
    path=st.sampled_from(sorted(VALID)),
    extra=st.dictionaries(FIELDS | st.text(max_size=8), json_values, max_size=4),
)
def test_fields_of_any_shape(echoing: InProcess, path: str, extra: dict[str, Any]) -> None:
    body = orjson.dumps({**VALID[path], **extra})
    err = check(echoing.request("POST", path, content=body, headers=AUTH))
    if "model" in extra and extra["model"] is not None and extra["model"] != MODEL:
        assert err is not None and err["param"] == "model"
