"""Fuzzing the request surface: no body or header a client can send gets a 5xx or a bare error.

Bodies of arbitrary JSON shape, and valid bodies with one field replaced by a value of each JSON
type, go to the gateway in-process with real emulated upstreams behind it. Every answer must be a
success or an OpenAI-shaped 4xx; where the gateway rejects a field, ``param`` names that field.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.api.fields import FIELDS, lax, whole
from tests.api.conftest import API_KEY, MODEL, InProcess

AUTH = {"authorization": f"Bearer {API_KEY}"}
PATHS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
VALID: dict[str, dict[str, Any]] = {
    "chat": {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4},
    "completions": {"model": MODEL, "prompt": "Say hi.", "max_tokens": 4},
}
FUZZ = settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
tried: Counter[str] = Counter()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
#: one value of each JSON type, small and large
by_type = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=30),
    st.sampled_from(["0", "8", "-1", " 2 ", "0.5", "1e3", "true", "False", "yes", "off"]),  # lax scalars
    st.lists(json_values, max_size=3),
    st.dictionaries(st.text(max_size=10), json_values, max_size=3),
)
field_names = st.sampled_from(sorted({*FIELDS["chat"], *FIELDS["completions"]}))


def check(response: Any, field: str | None = None) -> dict[str, Any] | None:
    """The answer is a success or an OpenAI error with a 4xx; return the error object."""
    tried["all"] += 1
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code < 300:
        return None
    err = orjson.loads(response.content)["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str) and err["code"] == response.status_code
    assert "param" in err
    return err


@pytest.fixture(scope="module", autouse=True)
def report_count() -> Any:
    yield
    print(f"\nfuzzed requests: {dict(tried)}")


@FUZZ
@given(api=st.sampled_from(["chat", "completions"]), body=json_values)
def test_bodies_of_any_json_shape(gateway: InProcess, api: str, body: Any) -> None:
    check(gateway.request("POST", PATHS[api], content=orjson.dumps(body), headers=AUTH))
    tried["any shape"] += 1


@FUZZ
@given(
    api=st.sampled_from(["chat", "completions"]),
    extra=st.dictionaries(field_names | st.text(max_size=10), json_values, max_size=5),
)
def test_valid_bodies_with_fields_of_any_shape_added(gateway: InProcess, api: str, extra: Any) -> None:
    body = {**VALID[api], **extra}
    check(gateway.request("POST", PATHS[api], content=orjson.dumps(body), headers=AUTH))
    tried["fields added"] += 1


@FUZZ
@given(api=st.sampled_from(["chat", "completions"]), data=st.data())
def test_each_field_replaced_by_each_json_type(gateway: InProcess, api: str, data: Any) -> None:
    field = data.draw(st.sampled_from(sorted(FIELDS[api])))
    value = data.draw(by_type)
    body = {**VALID[api], field: value}
    response = gateway.request("POST", PATHS[api], content=orjson.dumps(body), headers=AUTH)
    err = check(response, field)
    tried["field replaced"] += 1
    allowed = FIELDS[api][field]
    # an integer written as a whole decimal is that integer (vLLM reads it so)
    # and a scalar written as another that vLLM's models read ("8", "0.5", "false", 1) is that scalar
    well_typed = (
        value is None
        or any(_is(value, t) for t in allowed)
        or ("integer" in allowed and whole(value) is not None)
        or (type(value) in (str, int, float, bool) and lax(value, allowed) is not None)
    )
    if not well_typed:
        assert response.status_code == 400 and err is not None
        assert err["param"] == field, err
    elif field == "model" and value not in (None, "", MODEL):  # "": the upstream's default model
        assert response.status_code == 404 and err is not None and err["param"] == "model"


def _is(value: Any, kind: str) -> bool:
    return {
        "string": isinstance(value, str),
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "boolean": isinstance(value, bool),
        "object": isinstance(value, dict),
        "array": isinstance(value, list),
    }[kind]


@FUZZ
@given(api=st.sampled_from(["chat", "completions"]), raw=st.binary(max_size=64))
def test_bodies_that_are_not_json(gateway: InProcess, api: str, raw: bytes) -> None:
    check(gateway.request("POST", PATHS[api], content=raw, headers=AUTH))
    tried["raw bytes"] += 1


header_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@FUZZ
@given(pool=header_text, authorization=header_text)
def test_headers_the_gateway_reads(gateway: InProcess, pool: str, authorization: str) -> None:
    headers = {"x-specroute-pool": pool, "authorization": authorization}
    response = gateway.request("POST", PATHS["chat"], content=orjson.dumps(VALID["chat"]), headers=headers)
    err = check(response)
    tried["headers"] += 1
    if authorization.strip() != f"Bearer {API_KEY}" and authorization.partition(" ")[2].strip() != API_KEY:
        assert response.status_code == 401 and err is not None
    elif pool.strip().lower() not in ("speculative", "baseline"):
        assert response.status_code == 400 and err is not None and err["param"] == "x-specroute-pool"
