"""The emulator's ``/v1/responses``: vLLM's body and its sequence of named stream events."""

from __future__ import annotations

from typing import Any

import httpx
import orjson

MODEL = "demo-model"


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


async def test_responses_plain(inproc: httpx.AsyncClient) -> None:
    body = {"model": MODEL, "instructions": "Be brief.", "input": "Count to five.", "max_output_tokens": 12}
    r = await inproc.post("/v1/responses", json=body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["object"] == "response" and out["id"].startswith("resp_")
    assert out["status"] == "incomplete" and out["incomplete_details"] == {"reason": "max_output_tokens"}
    message = out["output"][0]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["content"][0]["type"] == "output_text" and message["content"][0]["text"]
    usage = out["usage"]
    assert usage["output_tokens"] == 12 and usage["total_tokens"] == usage["input_tokens"] + 12


async def test_responses_stream_follows_vllms_event_sequence(inproc: httpx.AsyncClient) -> None:
    items = [{"role": "user", "content": [{"type": "input_text", "text": "Write about the sea."}]}]
    body = {"model": MODEL, "input": items, "max_output_tokens": 20, "stream": True}
    r = await inproc.post("/v1/responses", json=body)
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


async def test_responses_errors(inproc: httpx.AsyncClient) -> None:
    missing = await inproc.post("/v1/responses", json={"model": MODEL})
    assert missing.status_code == 400 and "input" in missing.json()["error"]["message"]
    unknown = await inproc.post("/v1/responses", json={"model": "other", "input": "hi"})
    assert unknown.status_code == 404 and unknown.json()["error"]["param"] == "model"
