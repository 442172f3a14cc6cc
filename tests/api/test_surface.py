"""The routes beyond completions and chat: /v1/responses, embeddings, (de)tokenising, passthrough, CORS."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.app import create_app, fast_path
from gateway.config import load_settings
from gateway.stack import demo_config, free_port
from tests.api.conftest import API_KEY, MODEL, InProcess
from tests.api.test_fuzz import FUZZ, check, json_values

AUTH = {"authorization": f"Bearer {API_KEY}"}
STRUCTURED = "Repeat the following line exactly 20 times: hello world"


class Echo:
    """A stub upstream route beside the emulator's: ``/v1/score`` and ``/v1/audio/*`` echo the request."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.calls = 0

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == "/v1/score" or path.startswith("/v1/audio/")):
            await self.inner(scope, receive, send)
            return
        self.calls += 1
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = dict(scope["headers"])
        echo = {
            "method": scope["method"],
            "path": path,
            "query": scope["query_string"].decode(),
            "content_type": headers.get(b"content-type", b"").decode(),
            "body": body.decode(errors="replace"),
        }
        out = orjson.dumps(echo)
        response_headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(out))]
        await send({"type": "http.response.start", "status": 200, "headers": response_headers})
        await send({"type": "http.response.body", "body": out})


@pytest.fixture(scope="module")
def stack() -> Iterator[InProcess]:
    with InProcess({"auth": {"api_keys": [API_KEY]}, "logging": {"access_log": False}}) as s:
        for upstream in s.upstreams:
            upstream.app = Echo(upstream.app)  # type: ignore[assignment]
        yield s


def _metric(stack: InProcess, name: str, **labels: str) -> float:
    text = stack.request("GET", "/metrics", headers=AUTH).text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


# -- /v1/responses ----------------------------------------------------------------------------


def test_responses_are_routed_like_chat_and_answered_in_the_responses_shape(stack: InProcess) -> None:
    before = _metric(stack, "specroute_requests_total", route="responses")
    body = {"model": MODEL, "input": STRUCTURED, "instructions": "Be exact.", "max_output_tokens": 24}
    r = stack.request("POST", "/v1/responses", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": STRUCTURED}]
    chat = {"model": MODEL, "messages": messages, "max_tokens": 1}
    as_chat = stack.request("POST", "/v1/chat/completions", json=chat, headers=AUTH)
    assert r.headers["x-specroute-class"] == as_chat.headers["x-specroute-class"]
    assert r.headers["x-specroute-reason"]
    out = r.json()
    assert out["object"] == "response"
    assert out["output"][0]["content"][0]["text"]
    assert out["usage"]["output_tokens"] == 24
    assert _metric(stack, "specroute_requests_total", route="responses") == before + 1


def test_streamed_responses_relay_the_named_events_unchanged(stack: InProcess) -> None:
    body = {"model": MODEL, "input": [{"role": "user", "content": STRUCTURED}], "max_output_tokens": 16}
    before = _metric(stack, "specroute_time_to_first_token_seconds_count")
    with_stream = {**body, "stream": True}
    r = stack.request("POST", "/v1/responses", json=with_stream, headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e]
    kinds = [e.split("\n")[0].removeprefix("event: ") for e in events]
    assert kinds[0] == "response.created" and kinds[-1] in ("response.completed", "response.incomplete")
    assert "response.output_text.delta" in kinds
    assert "[DONE]" not in r.text  # no chat-style terminator added
    final = orjson.loads(events[-1].split("\n")[1].removeprefix("data: "))
    text = "".join(
        orjson.loads(e.split("\n")[1].removeprefix("data: "))["delta"]
        for e, k in zip(events, kinds, strict=True)
        if k == "response.output_text.delta"
    )
    assert text == final["response"]["output"][0]["content"][0]["text"]
    assert (
        _metric(stack, "specroute_time_to_first_token_seconds_count") == before + 1
    )  # TTFT measured from the events


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "nope", "input": "hi"}, 404, "model"),
        ({"model": MODEL}, 400, "input"),
        ({"model": MODEL, "input": 3}, 400, "input"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": "many"}, 400, "max_output_tokens"),
        ({"model": MODEL, "input": "hi", "temperature": True}, 400, "temperature"),
    ],
)
def test_responses_errors_name_the_field(
    stack: InProcess, body: dict[str, Any], status: int, param: str
) -> None:
    r = stack.request("POST", "/v1/responses", json=body, headers=AUTH)
    assert r.status_code == status
    assert r.json()["error"]["param"] == param


def test_responses_bad_json_and_auth(stack: InProcess) -> None:
    r = stack.request("POST", "/v1/responses", content=b"{not json", headers=AUTH)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert stack.request("POST", "/v1/responses", json={"model": MODEL, "input": "hi"}).status_code == 401


def test_response_format_json_schema_through_the_gateway(stack: InProcess) -> None:
    schema = {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "population": {"type": "integer", "minimum": 1},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["big", "old", "coastal"]}},
        },
        "required": ["city", "population", "tags"],
        "additionalProperties": False,
    }
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Describe Lisbon as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}},
    }
    r = stack.request("POST", "/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    value = orjson.loads(r.json()["choices"][0]["message"]["content"])
    assert set(value) == {"city", "population", "tags"}
    assert (
        isinstance(value["city"], str) and isinstance(value["population"], int) and value["population"] >= 1
    )
    assert value["tags"] and set(value["tags"]) <= {"big", "old", "coastal"}
    assert r.json()["choices"][0]["finish_reason"] == "stop"


# -- embeddings, tokenize, detokenize -----------------------------------------------------------


def test_embeddings_go_to_the_baseline_pool(stack: InProcess) -> None:
    r = stack.request("POST", "/v1/embeddings", json={"model": MODEL, "input": ["a", "b c"]}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers["x-specroute-pool"] == "baseline"
    assert "x-specroute-reason" not in r.headers  # not classified
    data = r.json()["data"]
    assert len(data) == 2 and len(data[0]["embedding"]) == len(data[1]["embedding"]) > 0
    assert _metric(stack, "specroute_requests_total", route="embeddings", status="200") >= 1


def test_tokenize_then_detokenize_round_trips(stack: InProcess) -> None:
    text = "Speculative decoding, 42 times over!"
    tok = stack.request("POST", "/tokenize", json={"model": MODEL, "prompt": text}, headers=AUTH)
    assert tok.status_code == 200 and tok.json()["count"] == len(tok.json()["tokens"])
    back = stack.request(
        "POST", "/detokenize", json={"model": MODEL, "tokens": tok.json()["tokens"]}, headers=AUTH
    )
    assert back.status_code == 200 and back.json()["prompt"] == text


@pytest.mark.parametrize("path", ["/v1/embeddings", "/tokenize", "/detokenize"])
def test_unforwarded_errors(stack: InProcess, path: str) -> None:
    unknown = stack.request("POST", path, json={"model": "nope", "input": "x", "prompt": "x"}, headers=AUTH)
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
    bad = stack.request("POST", path, content=b"[1,", headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"
    assert stack.request("POST", path, json={"model": MODEL}).status_code == 401


# -- any other /v1 route -------------------------------------------------------------------------


def test_other_v1_routes_pass_through_with_a_bounded_label(stack: InProcess) -> None:
    body = {"model": MODEL, "text_1": "a", "text_2": "b"}
    r = stack.request("POST", "/v1/score?x=1", json=body, headers=AUTH)
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
    r = stack.request("POST", "/v1/audio/transcriptions", content=form, headers=headers)
    assert r.status_code == 200 and r.json()["content_type"].startswith("multipart/form-data")
    unknown = form.replace(MODEL.encode(), b"nope")
    r = stack.request("POST", "/v1/audio/transcriptions", content=unknown, headers=headers)
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert _metric(stack, "specroute_requests_total", route="score") >= 1
    assert _metric(stack, "specroute_requests_total", route="audio") >= 1
    text = stack.request("GET", "/metrics", headers=AUTH).text
    assert "transcriptions" not in text  # the raw path never becomes a label


def test_passthrough_of_unknown_routes_and_methods(stack: InProcess) -> None:
    r = stack.request("GET", "/v1/no/such/route", headers=AUTH)
    assert r.status_code == 404  # the upstream has no such route: said in the API's error format
    assert r.json()["error"]["message"] == "no route GET /v1/no/such/route"
    assert stack.request("GET", "/v1/no/such/route").status_code == 401
    assert stack.request("GET", "/v1/completions", headers=AUTH).status_code == 405
    bad = stack.request(
        "POST", "/v1/score", content=b"{", headers={**AUTH, "content-type": "application/json"}
    )
    assert bad.status_code == 400
    assert stack.request("GET", "/nothing/here", headers=AUTH).status_code == 404


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


# -- CORS ----------------------------------------------------------------------------------------

PREFLIGHT = {
    "origin": "https://app.example",
    "access-control-request-method": "POST",
    "access-control-request-headers": "authorization, content-type",
}


def test_cors_is_off_by_default(stack: InProcess) -> None:
    r = stack.request("OPTIONS", "/v1/chat/completions", headers=PREFLIGHT)
    assert r.status_code == 405
    r = stack.request("GET", "/v1/models", headers={**AUTH, "origin": "https://app.example"})
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


# -- fuzzing the new surface -------------------------------------------------------------------

SURFACE_VALID: dict[str, dict[str, Any]] = {
    "/v1/responses": {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4},
    "/v1/embeddings": {"model": MODEL, "input": "Say hi."},
    "/tokenize": {"model": MODEL, "prompt": "Say hi."},
    "/detokenize": {"model": MODEL, "tokens": [1]},
    "/v1/chat/completions": {
        "model": MODEL,
        "messages": [{"role": "user", "content": "Hi."}],
        "max_tokens": 4,
    },
}
SURFACE_FIELDS = st.sampled_from(
    [
        "input",
        "instructions",
        "text",
        "tools",
        "stream",
        "max_output_tokens",
        "temperature",
        "dimensions",
        "encoding_format",
        "prompt",
        "messages",
        "tokens",
        "add_special_tokens",
        "response_format",
        "guided_json",
        "guided_choice",
        "structured_outputs",
    ]
)
schemas = st.recursive(
    st.fixed_dictionaries(
        {},
        optional={
            "type": st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null", 5]),
            "minItems": st.integers(-5, 10**9) | st.text(max_size=3),
            "minLength": st.integers(-5, 10**9),
            "maximum": st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False) | st.text(max_size=3),
            "enum": st.lists(json_values, max_size=3),
            "$ref": st.sampled_from(["#", "#/$defs/x", "#/nope", 3]),
        },
    ),
    lambda inner: st.fixed_dictionaries(
        {"type": st.just("object")},
        optional={"properties": st.dictionaries(st.text(max_size=5), inner, max_size=3), "items": inner},
    ),
    max_leaves=6,
)
structured = st.one_of(
    st.fixed_dictionaries(
        {
            "response_format": st.fixed_dictionaries(
                {"type": st.just("json_schema"), "json_schema": st.fixed_dictionaries({"schema": schemas})}
            )
        }
    ),
    st.fixed_dictionaries({"guided_json": schemas | json_values}),
    st.fixed_dictionaries(
        {
            "structured_outputs": st.dictionaries(
                st.sampled_from(["json", "choice", "json_object"]), json_values | schemas, max_size=2
            )
        }
    ),
)


SURFACE_FUZZ = settings(FUZZ, max_examples=300)


@SURFACE_FUZZ
@given(
    path=st.sampled_from(sorted(SURFACE_VALID)),
    extra=st.dictionaries(SURFACE_FIELDS | st.text(max_size=8), json_values, max_size=4),
)
def test_new_routes_with_fields_of_any_shape(stack: InProcess, path: str, extra: dict[str, Any]) -> None:
    check(stack.request("POST", path, content=orjson.dumps({**SURFACE_VALID[path], **extra}), headers=AUTH))


@SURFACE_FUZZ
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/responses"]), extra=structured)
def test_structured_output_requests_of_any_schema(stack: InProcess, path: str, extra: dict[str, Any]) -> None:
    check(stack.request("POST", path, content=orjson.dumps({**SURFACE_VALID[path], **extra}), headers=AUTH))
