"""The emulator against the real server it stands in for: same fields, metrics, errors and stream shape.

Files are numbered so that modules needing the same vLLM servers run together (fewer restarts).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import httpx
import pytest

from .client import (
    MAX_TOKENS,
    PROMPTS,
    TIMEOUT,
    USAGE_EVERY_CHUNK,
    chat,
    completion,
    metric_series,
    metric_value,
    post,
    shape,
    stream,
)
from .servers import MODEL_NAME, VllmServer

pytestmark = pytest.mark.real_vllm

MODES = ("baseline", "speculative")
# The series the gateway reads (REFERENCE §2); each one the real server exposes, the emulator must too.
GATEWAY_SERIES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
    "vllm:num_requests_running",
    "vllm:num_requests_waiting",
    "vllm:kv_cache_usage_perc",
    "vllm:prompt_tokens",
    "vllm:generation_tokens",
    "vllm:time_to_first_token_seconds",
    "vllm:inter_token_latency_seconds",
    "vllm:request_time_per_output_token_seconds",
    "vllm:e2e_request_latency_seconds",
    "vllm:request_success",
)


@pytest.fixture(scope="module")
def pairs(
    baseline: VllmServer, speculative: VllmServer, emulator_factory: Callable[[str], str]
) -> dict[str, tuple[str, str]]:
    """mode -> (real server URL, emulator URL)."""
    return {
        "baseline": (baseline.url, emulator_factory("baseline")),
        "speculative": (speculative.url, emulator_factory("speculative")),
    }


def chunk_shapes(events: list[dict[str, object]]) -> set[str]:
    return {json.dumps(shape(ev), sort_keys=True) for ev in events}


@pytest.mark.parametrize("mode", MODES)
def test_models_listing(pairs: dict[str, tuple[str, str]], mode: str) -> None:
    real, emu = (httpx.get(u + "/v1/models", timeout=TIMEOUT).json() for u in pairs[mode])
    assert [m["id"] for m in emu["data"]] == [m["id"] for m in real["data"]] == [MODEL_NAME]
    assert shape(emu) == shape(real)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_response_fields(pairs: dict[str, tuple[str, str]], mode: str, kind: str) -> None:
    path, body = (
        ("/v1/completions", completion(MODEL_NAME))
        if kind == "completion"
        else ("/v1/chat/completions", chat(MODEL_NAME))
    )
    real, emu = (post(u, path, body) for u in pairs[mode])
    assert real.status_code == emu.status_code == 200
    assert shape(emu.json()) == shape(real.json())
    assert emu.json()["usage"]["completion_tokens"] == real.json()["usage"]["completion_tokens"]
    assert emu.headers["content-type"] == real.headers["content-type"]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_stream_fields(pairs: dict[str, tuple[str, str]], mode: str, kind: str) -> None:
    if kind == "completion":
        path, body = "/v1/completions", completion(MODEL_NAME, **USAGE_EVERY_CHUNK)
    else:
        path, body = "/v1/chat/completions", chat(MODEL_NAME, **USAGE_EVERY_CHUNK)
    real, emu = (stream(u, path, body) for u in pairs[mode])
    assert real.status == emu.status == 200
    assert real.done and emu.done
    assert emu.headers["content-type"] == real.headers["content-type"]
    assert chunk_shapes(emu.events) == chunk_shapes(real.events)
    # Both end with a usage-only chunk whose count is the sum over the content chunks.
    for s in (real, emu):
        assert s.events[-1]["choices"] == []
        assert sum(s.tokens_per_chunk()) == s.events[-1]["usage"]["completion_tokens"]


def itl_count(url: str) -> float:
    """Engine steps so far: the inter-token-latency histogram has one sample per step, not per token."""
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    return metric_value(text, "vllm:inter_token_latency_seconds_count") or 0.0


@pytest.mark.parametrize("mode", MODES)
def test_tokens_per_chunk(pairs: dict[str, tuple[str, str]], mode: str) -> None:
    """One token per engine step without speculation, several with it; chunks follow steps (a busy server
    may merge steps into one chunk, so the step count comes from the latency histogram)."""
    body = completion(MODEL_NAME, PROMPTS[0], **USAGE_EVERY_CHUNK)
    for url in pairs[mode]:
        before = itl_count(url)
        counts = stream(url, "/v1/completions", body).tokens_per_chunk()
        steps = itl_count(url) - before
        tokens = sum(counts)
        assert tokens == MAX_TOKENS, url
        if mode == "baseline":
            assert steps == tokens - 1, url  # the first token comes from prefill
            assert 1 in counts, url
        else:
            assert 0 < steps < tokens - 1, url
            assert max(counts) > 1 and len(counts) < tokens, url


@pytest.mark.parametrize("mode", MODES)
def test_metric_series(pairs: dict[str, tuple[str, str]], mode: str) -> None:
    for url in pairs[mode]:  # histograms and counters are populated by at least one request
        assert post(url, "/v1/completions", completion(MODEL_NAME)).status_code == 200
    real, emu = (metric_series(httpx.get(u + "/metrics", timeout=TIMEOUT).text) for u in pairs[mode])
    for name in GATEWAY_SERIES:
        if name in real:
            assert name in emu, f"emulator lacks {name}"
            assert emu[name].type == real[name].type, name
            assert emu[name].labels == real[name].labels, name
    invented = {n: s.type for n, s in emu.items() if n not in real or real[n].type != s.type}
    assert not invented, f"emulator series unknown to (or typed differently from) vLLM: {invented}"
    has_spec = mode == "speculative"
    assert ("vllm:spec_decode_num_drafts" in real) is has_spec
    assert ("vllm:spec_decode_num_drafts" in emu) is has_spec


ERROR_CASES = {
    "unknown-model": ("/v1/completions", completion("no-such-model")),
    "max-tokens-too-large": ("/v1/completions", completion(MODEL_NAME, max_tokens=5000)),
    "chat-max-tokens-too-large": ("/v1/chat/completions", chat(MODEL_NAME, max_tokens=5000)),
    "stream-options-without-stream": (
        "/v1/completions",
        {**completion(MODEL_NAME), "stream_options": {"include_usage": True}},
    ),
    # refused by a server with speculative decoding (the pairs compared are speculative)
    "logit-bias": ("/v1/chat/completions", {**chat(MODEL_NAME), "logit_bias": {"5": 1.0}}),
    "min-p": ("/v1/completions", {**completion(MODEL_NAME), "min_p": 0.1, "temperature": 0.5, "seed": 1}),
}


@pytest.mark.parametrize("case", sorted(ERROR_CASES))
def test_error_bodies(pairs: dict[str, tuple[str, str]], case: str) -> None:
    path, body = ERROR_CASES[case]
    real, emu = (post(u, path, body) for u in pairs["speculative"])
    assert real.status_code >= 400
    assert emu.status_code == real.status_code
    assert emu.json() == real.json()


def test_error_bad_json(pairs: dict[str, tuple[str, str]]) -> None:
    responses = [
        httpx.post(
            u + "/v1/completions",
            content=b'{"model": "x", "prompt": ',
            timeout=TIMEOUT,
            headers={"content-type": "application/json"},
        )
        for u in pairs["baseline"]
    ]
    real, emu = (r.json()["error"] for r in responses)
    assert responses[1].status_code == responses[0].status_code == 400
    assert set(emu) == set(real)
    assert (emu["type"], emu["code"]) == (real["type"], real["code"])


def test_stream_error_before_first_byte(pairs: dict[str, tuple[str, str]]) -> None:
    """A streamed request that fails validation answers with a plain JSON error, not an SSE stream."""
    real, emu = (
        stream(u, "/v1/completions", completion(MODEL_NAME, max_tokens=5000)) for u in pairs["speculative"]
    )
    assert real.status == emu.status == 400
    assert json.loads(emu.body) == json.loads(real.body)
