"""The emulator's Responses, embeddings and (de)tokenising routes, and structured output, in process."""

from __future__ import annotations

import base64
import math
from array import array
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import openai
import orjson
import pytest
from pydantic import BaseModel

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.server import EmulatorApp

MODEL = "demo-model"


@pytest.fixture(params=[0.0, 0.01], ids=["inline", "timed"])
async def client(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    app = EmulatorApp(EmulatorConfig(time_scale=request.param, embedding_dim=32))
    app.engine.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as c:
            yield c
    finally:
        await app.engine.stop()


def _events(text: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in text.split("\n\n"):
        if not block:
            continue
        kind, data = block.split("\n")
        assert kind.startswith("event: ") and data.startswith("data: ")
        body = orjson.loads(data.removeprefix("data: "))
        assert body["type"] == kind.removeprefix("event: ")
        out.append((body["type"], body))
    return out


async def test_responses_plain(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "instructions": "Be brief.", "input": "Count to five.", "max_output_tokens": 12}
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "response" and out["id"].startswith("resp_")
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    message = out["output"][0]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["type"] == "output_text" and message["content"][0]["text"]
    usage = out["usage"]
    assert usage["output_tokens"] == 12 and usage["total_tokens"] == usage["input_tokens"] + 12


async def test_responses_stream_follows_vllms_event_sequence(client: httpx.AsyncClient) -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Write about the sea."}]}]
    body = {"model": MODEL, "input": items, "max_output_tokens": 20, "stream": True}
    r = await client.post("/v1/responses", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = _events(r.text)
    kinds = [k for k, _ in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
    deltas = "".join(e["delta"] for k, e in events if k == "response.output_text.delta")
    final = events[-1][1]["response"]
    assert deltas == final["output"][0]["content"][0]["text"] == events[-4][1]["text"]
    assert final["usage"]["output_tokens"] == 20


async def test_responses_errors(client: httpx.AsyncClient) -> None:
    missing = await client.post("/v1/responses", json={"model": MODEL})
    assert missing.status_code == 400 and "input" in missing.json()["error"]["message"]
    unknown = await client.post("/v1/responses", json={"model": "other", "input": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"


async def test_embeddings_are_deterministic_unit_vectors(client: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "input": ["the same text", "another text"]}
    a = (await client.post("/v1/embeddings", json=body)).json()
    b = (await client.post("/v1/embeddings", json=body)).json()
    assert a["object"] == "list" and a["usage"]["prompt_tokens"] > 0 and a["usage"]["completion_tokens"] == 0
    va, vb = a["data"][0]["embedding"], a["data"][1]["embedding"]
    assert va == b["data"][0]["embedding"] and va != vb
    assert len(va) == 32 and math.isclose(sum(x * x for x in va), 1.0, rel_tol=1e-9)
    b64 = (await client.post("/v1/embeddings", json={**body, "encoding_format": "base64"})).json()
    decoded = array("f", base64.b64decode(b64["data"][0]["embedding"])).tolist()
    assert decoded == pytest.approx(va, abs=1e-6)
    short = (await client.post("/v1/embeddings", json={**body, "dimensions": 8})).json()
    assert len(short["data"][0]["embedding"]) == 8
    too_wide = await client.post("/v1/embeddings", json={**body, "dimensions": 33})
    assert too_wide.status_code == 400 and too_wide.json()["error"]["param"] == "dimensions"


async def test_tokenize_detokenize_round_trip(client: httpx.AsyncClient) -> None:
    text = "Tokenisers split text, numbers like 12345 and symbols like {}!"
    tok = (await client.post("/tokenize", json={"model": MODEL, "prompt": text})).json()
    assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 1024 and tok["token_strs"] is None
    plain = (
        await client.post("/tokenize", json={"model": MODEL, "prompt": text, "add_special_tokens": False})
    ).json()
    assert plain["count"] == tok["count"] - 1  # without BOS
    back = (await client.post("/detokenize", json={"model": MODEL, "tokens": tok["tokens"]})).json()
    assert back == {"prompt": text}
    chat = {"model": MODEL, "messages": [{"role": "user", "content": text}]}
    chat_ids = (await client.post("/tokenize", json=chat)).json()
    assert chat_ids["count"] > plain["count"]  # the template's markers
    bad = await client.post("/detokenize", json={"model": MODEL, "tokens": [-1]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


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


async def test_response_format_json_schema_validates(client: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "Atlas", "schema": Atlas.model_json_schema()}}
    r = await client.post("/v1/chat/completions", json=_chat(response_format=fmt))
    choice = r.json()["choices"][0]
    atlas = Atlas.model_validate_json(choice["message"]["content"])
    assert atlas.cities and choice["finish_reason"] == "stop"


async def test_guided_json_structured_outputs_and_choice(client: httpx.AsyncClient) -> None:
    schema = City.model_json_schema()
    for extra in ({"guided_json": schema}, {"structured_outputs": {"json": orjson.dumps(schema).decode()}}):
        r = await client.post(
            "/v1/completions", json={"model": MODEL, "prompt": "A city:", "max_tokens": 200, **extra}
        )
        City.model_validate_json(r.json()["choices"][0]["text"])
    r = await client.post("/v1/chat/completions", json=_chat(structured_outputs={"choice": ["yes", "no"]}))
    assert r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    r = await client.post("/v1/chat/completions", json=_chat(response_format={"type": "json_object"}))
    assert isinstance(orjson.loads(r.json()["choices"][0]["message"]["content"]), dict)
    r = await client.post("/v1/chat/completions", json=_chat(response_format={"type": "xml"}))
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format"


async def test_streamed_structured_output_is_the_same_json(client: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "City", "schema": City.model_json_schema()}}
    body = _chat(response_format=fmt, temperature=0, seed=1)
    plain = (await client.post("/v1/chat/completions", json=body)).json()["choices"][0]["message"]["content"]
    r = await client.post("/v1/chat/completions", json={**body, "stream": True})
    text = "".join(
        orjson.loads(line[6:])["choices"][0]["delta"].get("content") or ""
        for line in r.text.splitlines()
        if line.startswith("data: {")
    )
    assert text == plain
    City.model_validate_json(text)


async def test_responses_text_format(client: httpx.AsyncClient) -> None:
    fmt = {"type": "json_schema", "name": "City", "schema": City.model_json_schema(), "strict": True}
    r = await client.post("/v1/responses", json={"model": MODEL, "input": "A city.", "text": {"format": fmt}})
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
