"""Tool calls through the gateway, on real vLLM's tool-call path (``--enable-auto-tool-choice``).

Agents send tools, get ``tool_calls`` back, and send the tool's result in the next turn: every step must
come back as it does from vLLM directly, on either pool (the call's id aside, which vLLM draws at
random), streamed or not. A named ``tool_choice`` makes vLLM constrain the output to the function's
schema, which it does on the speculative server too.
"""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from .client import post, stream, strip_volatile
from .servers import MODEL_NAME, VllmServer

pytestmark = pytest.mark.real_vllm

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"unit": {"enum": ["celsius", "fahrenheit"]}},
                "required": ["unit"],
                "additionalProperties": False,
            },
        },
    }
]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL: dict[str, Any] = {
    "model": MODEL_NAME,
    "messages": ASK,
    "tools": TOOLS,
    "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
    "max_tokens": 16,
    "temperature": 0,
}


@pytest.fixture(scope="module")
def pools(baseline: VllmServer, speculative: VllmServer) -> dict[str, str]:
    return {"baseline": baseline.url, "speculative": speculative.url}


def _pinned(pool: str) -> dict[str, str]:
    return {"x-specroute-pool": pool}


@pytest.mark.parametrize("pool", ["baseline", "speculative"])
def test_a_forced_tool_call_comes_back_as_vllm_gives_it(
    gateway: str, pools: dict[str, str], pool: str
) -> None:
    direct = post(pools[pool], "/v1/chat/completions", CALL)
    via = post(gateway, "/v1/chat/completions", CALL, _pinned(pool))
    assert direct.status_code == via.status_code == 200, (direct.text, via.text)
    assert via.headers["x-specroute-pool"] == pool
    message = via.json()["choices"][0]["message"]
    assert [c["function"]["name"] for c in message["tool_calls"]] == ["get_weather"]
    assert strip_volatile(via.json()) == strip_volatile(direct.json())


def _calls(events: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The tool calls a stream's deltas add up to (by index: the name once, the arguments in pieces)."""
    calls: dict[int, dict[str, str]] = {}
    for ev in events:
        for choice in ev.get("choices") or []:
            for delta in (choice.get("delta") or {}).get("tool_calls") or []:
                call = calls.setdefault(delta["index"], {"name": "", "arguments": ""})
                fn = delta.get("function") or {}
                call["name"] += fn.get("name") or ""
                call["arguments"] += fn.get("arguments") or ""
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("pool", ["baseline", "speculative"])
def test_a_streamed_tool_call_adds_up_to_the_same_call(
    gateway: str, pools: dict[str, str], pool: str
) -> None:
    whole = post(pools[pool], "/v1/chat/completions", CALL).json()["choices"][0]["message"]["tool_calls"]
    direct = stream(pools[pool], "/v1/chat/completions", CALL)
    via = stream(gateway, "/v1/chat/completions", CALL, _pinned(pool))
    assert via.status == 200 and via.done, via.body
    assert _calls(via.events) == _calls(direct.events)
    assert _calls(via.events) == [
        {"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in whole
    ]
    assert via.events[-1]["choices"][0]["finish_reason"] == direct.events[-1]["choices"][0]["finish_reason"]


def test_an_agent_turn_with_the_tools_result_through_the_sdk(gateway: str, pools: dict[str, str]) -> None:
    """The SDK's own objects: the call parsed, then the next turn carrying the assistant's call and the
    tool's answer (a message with no content, and a ``tool`` message) routed and answered."""
    sdk = openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)
    first = sdk.chat.completions.create(**CALL)  # type: ignore[call-overload]
    calls = first.choices[0].message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    follow_up = {
        "model": MODEL_NAME,
        "messages": [
            *ASK,
            {"role": "assistant", "content": None, "tool_calls": [c.model_dump() for c in calls]},
            {"role": "tool", "tool_call_id": calls[0].id, "content": json.dumps({"temperature": 21})},
        ],
        "tools": TOOLS,
        "tool_choice": "none",
        "max_tokens": 8,
        "temperature": 0,
    }
    raw = sdk.chat.completions.with_raw_response.create(**follow_up)  # type: ignore[call-overload]
    pool = raw.headers["x-specroute-pool"]
    answer = raw.parse()
    direct = post(pools[pool], "/v1/chat/completions", follow_up).json()
    assert answer.choices[0].message.tool_calls in (None, [])
    assert answer.choices[0].message.content == direct["choices"][0]["message"]["content"]
    assert answer.usage is not None and answer.usage.prompt_tokens == direct["usage"]["prompt_tokens"]
