"""The official ``openai`` SDK against the gateway, with real vLLM behind it."""

from __future__ import annotations

import openai
import pytest

from .client import MAX_TOKENS, PROMPTS, chat, completion, post
from .servers import MODEL_NAME, VllmServer

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module")
def sdk(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def direct(baseline: VllmServer) -> str:
    """Greedy output is the same on either pool (same target, lossless speculation), so one will do."""
    return baseline.url


def test_models(sdk: openai.OpenAI) -> None:
    assert [m.id for m in sdk.models.list()] == [MODEL_NAME]
    assert sdk.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")


def test_completion(sdk: openai.OpenAI, direct: str) -> None:
    raw = sdk.completions.with_raw_response.create(
        model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=MAX_TOKENS, temperature=0
    )
    assert raw.headers["x-specroute-pool"] in ("baseline", "speculative")
    out = raw.parse()
    expected = post(direct, "/v1/completions", completion(MODEL_NAME, PROMPTS[0])).json()
    assert out.choices[0].text == expected["choices"][0]["text"]
    assert out.usage is not None and out.usage.completion_tokens == MAX_TOKENS


def test_chat(sdk: openai.OpenAI, direct: str) -> None:
    out = sdk.chat.completions.create(
        model=MODEL_NAME,
        messages=[{"role": "user", "content": PROMPTS[3]}],
        max_tokens=MAX_TOKENS,
        temperature=0,
    )
    expected = post(direct, "/v1/chat/completions", chat(MODEL_NAME, PROMPTS[3])).json()
    assert out.choices[0].message.content == expected["choices"][0]["message"]["content"]
    assert out.choices[0].finish_reason == "length"


def test_chat_stream_with_usage(sdk: openai.OpenAI, direct: str) -> None:
    chunks = list(
        sdk.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": PROMPTS[2]}],
            max_tokens=MAX_TOKENS,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected = post(direct, "/v1/chat/completions", chat(MODEL_NAME, PROMPTS[2])).json()
    assert text == expected["choices"][0]["message"]["content"]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == MAX_TOKENS


def test_completion_stream(sdk: openai.OpenAI, direct: str) -> None:
    chunks = list(
        sdk.completions.create(
            model=MODEL_NAME, prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, stream=True
        )
    )
    expected = post(direct, "/v1/completions", completion(MODEL_NAME, PROMPTS[1])).json()
    assert "".join(c.choices[0].text for c in chunks if c.choices) == expected["choices"][0]["text"]


def test_vllm_error_surfaces_as_sdk_error(sdk: openai.OpenAI, direct: str) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        sdk.completions.create(model=MODEL_NAME, prompt=PROMPTS[0], max_tokens=5000)
    expected = post(direct, "/v1/completions", completion(MODEL_NAME, max_tokens=5000)).json()["error"]
    assert err.value.status_code == 400
    assert err.value.body == expected
