"""Structured output: answers valid against the request's JSON schema, parsed by the openai SDK."""

from __future__ import annotations

import random
from typing import Any, Literal

import httpx
import openai
import orjson
import pytest
from pydantic import BaseModel

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.server import EmulatorApp
from gateway.emulator.structured import Constraint

MODEL = "demo-model"


class City(BaseModel):
    name: str
    population: int
    kind: Literal["capital", "port", "town"]
    districts: list[str]
    mayor: str | None = None


class Atlas(BaseModel):
    cities: list[City]
    checked: bool


def _chat(**extra: Any) -> dict[str, Any]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "Describe some cities."}], **extra}


async def test_response_format_json_schema_validates(inproc: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "Atlas", "schema": Atlas.model_json_schema()}}
    r = await inproc.post("/v1/chat/completions", json=_chat(response_format=fmt))
    choice = r.json()["choices"][0]
    atlas = Atlas.model_validate_json(choice["message"]["content"])
    assert atlas.cities and choice["finish_reason"] == "stop"


async def test_guided_json_structured_outputs_and_choice(inproc: httpx.AsyncClient) -> None:
    schema = City.model_json_schema()
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": orjson.dumps(schema).decode()}}):
        r = await inproc.post(
            "/v1/completions", json={"model": MODEL, "prompt": "A city:", "max_tokens": 200, **extra}
        )
        City.model_validate_json(r.json()["choices"][0]["text"])
    r = await inproc.post("/v1/chat/completions", json=_chat(structured_outputs={"choice": ["yes", "no"]}))
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    r = await inproc.post("/v1/chat/completions", json=_chat(response_format={"type": "json_object"}))
    assert isinstance(orjson.loads(r.json()["choices"][0]["message"]["content"]), dict)
    r = await inproc.post("/v1/chat/completions", json=_chat(response_format={"type": "xml"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


async def test_streamed_structured_output_is_the_same_json(inproc: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "City", "schema": City.model_json_schema()}}
    body = _chat(response_format=fmt, temperature=0, seed=1)
    plain = (await inproc.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    r = await inproc.post("/v1/chat/completions", json={**body, "stream": True})
    text = "".join(
        orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in r.text.splitlines()
        if line.startswith("data: {")
    )
    assert text == plain
    City.model_validate_json(text)


async def test_responses_text_format(inproc: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "name": "City", "schema": City.model_json_schema(), "strict": True}
    r = await inproc.post("/v1/responses", json={"model": MODEL, "input": "A city.", "text": {"format": fmt}})
    City.model_validate_json(r.json()["output"][0]["content"][0]["text"])


async def test_openai_sdk_parses_structured_output_and_the_new_routes() -> None:
    app = EmulatorApp(EmulatorConfig(time_scale=0.0))
    transport = httpx.ASGITransport(app=app)
    http = httpx.AsyncClient(transport=transport, base_url="http://emulator/v1")
    sdk = openai.AsyncOpenAI(base_url="http://emulator/v1", api_key="unused", http_client=http)
    async with http:
        completion = await sdk.chat.completions.parse(
            model=MODEL, messages=[{"role": "user", "content": "Some cities."}], response_format=Atlas
        )
        parsed = completion.choices[0].message.parsed
        assert isinstance(parsed, Atlas) and parsed.cities
        response = await sdk.responses.create(model=MODEL, input="Hello there", max_output_tokens=8)
        assert response.output_text and response.usage is not None and response.usage.output_tokens == 8
        embedded = await sdk.embeddings.create(model=MODEL, input=["one", "two"])
        assert len(embedded.data) == 2 and len(embedded.data[0].embedding) == 384
        stream = await sdk.responses.create(
            model=MODEL, input="Hello there", max_output_tokens=8, stream=True
        )
        kinds = [event.type async for event in stream]
        assert kinds[0] == "response.created" and kinds[-1] == "response.incomplete"


ENDLESS = {
    "an array of itself": {"type": "array", "minItems": 3, "items": {"$ref": "#"}},
    "a billion items of itself": {"type": "array", "minItems": 10**9, "items": {"$ref": "#"}},
    "an object of two of itself": {"type": "object", "properties": {"a": {"$ref": "#"}, "b": {"$ref": "#"}}},
    "long strings, many": {
        "type": "array",
        "minItems": 10**9,
        "items": {"type": "string", "minLength": 10**9},
    },
}


@pytest.mark.parametrize("schema", ENDLESS.values(), ids=list(ENDLESS))
def test_a_schema_that_asks_for_endless_output_gets_a_bounded_answer(schema: dict[str, Any]) -> None:
    # ten to the power of the nesting depth would not fit in memory: the answer is cut short, as vLLM
    # cuts a guided answer at max_tokens
    text = Constraint(schema=schema).render(random.Random(0))
    value = orjson.loads(text)
    assert value and len(text) < 100_000


async def test_a_request_with_such_a_schema_is_answered(inproc: httpx.AsyncClient) -> None:
    fmt = {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": ENDLESS["a billion items of itself"]},
    }
    r = await inproc.post("/v1/chat/completions", json=_chat(response_format=fmt, max_tokens=64))
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
