"""``POST /v1/responses`` through the gateway: routed like a chat, relayed as vLLM's events, checked."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.api.conftest import API_KEY, MODEL, InProcess, metric
from tests.api.test_fuzz import FUZZ, check, json_values

AUTH = {"authorization": f"Bearer {API_KEY}"}
STRUCTURED = "Repeat the following line exactly 20 times: hello world"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi."}], "max_tokens": 4}
RESPONSES = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4}


def test_responses_are_routed_like_chat_and_answered_in_the_responses_shape(echoing: InProcess) -> None:
    before = metric(echoing, "specroute_requests_total", route="responses")
    body = {"model": MODEL, "input": STRUCTURED, "instructions": "Be exact.", "max_output_tokens": 24}
    r = echoing.request("POST", "/v1/responses", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    messages = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": STRUCTURED}]
    chat = {"model": MODEL, "messages": messages, "max_tokens": 1}
    as_chat = echoing.request("POST", "/v1/chat/completions", json=chat, headers=AUTH)
    assert r.headers["x-specroute-class"] == as_chat.headers["x-specroute-class"]
    assert r.headers["x-specroute-reason"]
    out = r.json()
    assert out["object"] == "response"
    assert out["output"][0]["content"][0]["text"]
    assert out["usage"]["output_tokens"] == 24
    assert metric(echoing, "specroute_requests_total", route="responses") == before + 1


def test_streamed_responses_relay_the_named_events_unchanged(echoing: InProcess) -> None:
    body = {"model": MODEL, "input": [{"role": "user", "content": STRUCTURED}], "max_output_tokens": 16}
    before = metric(echoing, "specroute_time_to_first_token_seconds_count")
    with_stream = {**body, "stream": True}
    r = echoing.request("POST", "/v1/responses", json=with_stream, headers=AUTH)
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
        metric(echoing, "specroute_time_to_first_token_seconds_count") == before + 1
    )  # TTFT measured from the events


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": "nope", "input": "hi"}, 404, "model"),
        ({"model": MODEL}, 400, "input"),
        ({"model": MODEL, "input": 3}, 400, "input"),
        ({"model": MODEL, "input": "hi", "max_output_tokens": "many"}, 400, "max_output_tokens"),
        ({"model": MODEL, "input": "hi", "temperature": "warm"}, 400, "temperature"),
        ({"model": MODEL, "input": "hi", "stream": "maybe"}, 400, "stream"),
    ],
)
def test_responses_errors_name_the_field(
    echoing: InProcess, body: dict[str, Any], status: int, param: str
) -> None:
    r = echoing.request("POST", "/v1/responses", json=body, headers=AUTH)
    assert r.status_code == status
    assert r.json()["error"]["param"] == param


def test_responses_scalars_are_read_as_vllm_reads_them(echoing: InProcess) -> None:
    """vLLM's request model reads "0.5" as a number, "20" as an integer and "true" as a boolean, as the
    chat route does: such a request is served, and ``"stream": "true"`` is a stream."""
    body = {**RESPONSES, "temperature": "0.5", "top_p": True, "max_output_tokens": "6", "store": "false"}
    r = echoing.request("POST", "/v1/responses", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] == 6
    r = echoing.request("POST", "/v1/responses", json={**body, "stream": "true"}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "event: response.completed" in r.text or "event: response.incomplete" in r.text


def test_responses_bad_json_and_auth(echoing: InProcess) -> None:
    r = echoing.request("POST", "/v1/responses", content=b"{not json", headers=AUTH)
    assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
    assert echoing.request("POST", "/v1/responses", json={"model": MODEL, "input": "hi"}).status_code == 401


def test_response_format_json_schema_through_the_gateway(echoing: InProcess) -> None:
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
    r = echoing.request("POST", "/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text
    value = orjson.loads(r.json()["choices"][0]["message"]["content"])
    assert set(value) == {"city", "population", "tags"}
    assert (
        isinstance(value["city"], str) and isinstance(value["population"], int) and value["population"] >= 1
    )
    assert value["tags"] and set(value["tags"]) <= {"big", "old", "coastal"}
    assert r.json()["choices"][0]["finish_reason"] == "stop"


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


@settings(FUZZ, max_examples=120)
@given(path=st.sampled_from(["/v1/chat/completions", "/v1/responses"]), extra=structured)
def test_structured_output_requests_of_any_schema(
    echoing: InProcess, path: str, extra: dict[str, Any]
) -> None:
    body = {**(CHAT if path == "/v1/chat/completions" else RESPONSES), **extra}
    check(echoing.request("POST", path, content=orjson.dumps(body), headers=AUTH))


@settings(FUZZ, max_examples=120)
@given(
    extra=st.dictionaries(
        st.sampled_from(
            ["input", "instructions", "text", "tools", "stream", "max_output_tokens", "temperature"]
        )
        | st.text(max_size=8),
        json_values,
        max_size=4,
    )
)
def test_responses_fields_of_any_shape(echoing: InProcess, extra: dict[str, Any]) -> None:
    body = orjson.dumps({**RESPONSES, **extra})
    check(echoing.request("POST", "/v1/responses", content=body, headers=AUTH))


def test_a_responses_request_no_endpoint_answered_names_the_last_one_tried_in_the_access_log(capsys) -> None:
    """As on the completion routes: a 5xx from every try is logged with the endpoint that failed last."""
    with InProcess({"health": {"eject_after_failures": 100}}, emulator={"error_rate": 1.0}) as stack:
        for stream in (False, True):
            body = {"model": MODEL, "input": "Say hi.", "max_output_tokens": 4, "stream": stream}
            assert stack.request("POST", "/v1/responses", json=body).status_code == 502
        stack.flush_access_log()
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    logged = [(line["route"], line["status"], line["endpoint"]) for line in lines]
    assert [(r, s) for r, s, _ in logged] == [("responses", 502), ("responses", 502)]
    assert all(endpoint in ("spec-0", "base-0") for _, _, endpoint in logged), logged
