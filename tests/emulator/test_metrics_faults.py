"""``/metrics`` parses like vLLM's and its invariants hold; fault switches; zero-delay mode."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.emulator.conftest import FIXTURES, MODEL, OPEN_ENDED, STRUCTURED, Emu, scrape

SPEC_SERIES = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos",
)
LOAD_SERIES = {
    "vllm:num_requests_running": "gauge",
    "vllm:num_requests_waiting": "gauge",
    "vllm:kv_cache_usage_perc": "gauge",
    "vllm:prompt_tokens": "counter",
    "vllm:generation_tokens": "counter",
    "vllm:request_success": "counter",
    "vllm:time_to_first_token_seconds": "histogram",
    "vllm:inter_token_latency_seconds": "histogram",
    "vllm:request_time_per_output_token_seconds": "histogram",
    "vllm:e2e_request_latency_seconds": "histogram",
}


def families(text: str) -> dict[str, Any]:
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_metric_names_types_help_match_capture(spec: Emu, base: Emu) -> None:
    ref = families((FIXTURES / "draftsame_metrics_before.txt").read_text())
    got = families(spec.metrics_text())
    for name in (*SPEC_SERIES, *LOAD_SERIES):
        assert name in got, name
        assert got[name].type == ref[name].type, name
        assert got[name].documentation == ref[name].documentation, name
        ref_labels = {k for s in ref[name].samples for k in s.labels} - {"le"}
        got_labels = {k for s in got[name].samples for k in s.labels} - {"le"}
        assert got_labels == ref_labels, name
    for name in ("vllm:time_to_first_token_seconds", "vllm:inter_token_latency_seconds"):
        les = [s.labels["le"] for s in got[name].samples if s.name.endswith("_bucket")]
        ref_les = [s.labels["le"] for s in ref[name].samples if s.name.endswith("_bucket")]
        assert les == ref_les
    positions = [s.labels["position"] for s in got["vllm:spec_decode_num_accepted_tokens_per_pos"].samples
                 if s.name.endswith("_total")]  # fmt: skip
    assert positions == [str(i) for i in range(7)]
    base_fams = families(base.metrics_text())
    assert not any(name in base_fams for name in SPEC_SERIES)  # baseline: no speculation series
    assert set(LOAD_SERIES) <= set(base_fams)


def _traffic(emu: Emu) -> int:
    """Mixed streamed traffic, 4 at a time; returns the tokens the clients received."""
    bodies = []
    for i in range(8):
        prompt = (STRUCTURED if i % 2 else OPEN_ENDED) + f" #{i}"
        bodies.append(
            {
                "model": MODEL,
                "prompt": prompt,
                "max_tokens": 20 + 3 * i,
                "temperature": 0.3 * (i % 3),
                "return_token_ids": True,
            }
        )

    def one(body: dict[str, Any]) -> int:
        return sum(len(e["choices"][0]["token_ids"]) for e in emu.stream("/v1/completions", body))

    with ThreadPoolExecutor(4) as pool:
        return sum(pool.map(one, bodies))


def test_metrics_invariants_after_traffic(spec: Emu) -> None:
    before = scrape(spec.metrics_text())
    streamed = _traffic(spec)
    after = scrape(spec.metrics_text())

    def d(key: str) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    drafts = d("vllm:spec_decode_num_drafts_total")
    draft_tokens = d("vllm:spec_decode_num_draft_tokens_total")
    accepted = d("vllm:spec_decode_num_accepted_tokens_total")
    per_pos = [d(f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={i}}}") for i in range(7)]
    assert drafts > 0 and draft_tokens == 7 * drafts
    assert 0 < accepted <= draft_tokens
    assert sum(per_pos) == accepted
    assert per_pos == sorted(per_pos, reverse=True)  # acceptance stops at the first rejection
    assert d("vllm:generation_tokens_total") == streamed
    assert d("vllm:request_success_total{finished_reason=length}") == 8
    # one inter-token-latency sample per engine step (= per draft) of each request
    assert d("vllm:inter_token_latency_seconds_count") == drafts
    assert d("vllm:time_to_first_token_seconds_count") == 8
    assert d("vllm:e2e_request_latency_seconds_count") == 8
    assert after["vllm:num_requests_running"] == 0 and after["vllm:num_requests_waiting"] == 0
    # streamed tokens = first token + (1 + accepted) per step, minus what max_tokens cut off
    assert streamed <= 8 + drafts + accepted


def test_queueing_beyond_max_num_seqs(base: Emu) -> None:
    """8 slots (``--max-num-seqs 8``); 12 concurrent requests: some wait, FIFO, all finish."""
    seen_waiting = 0.0
    body = {"model": MODEL, "prompt": OPEN_ENDED, "max_tokens": 30, "temperature": 0}

    def one(_: int) -> int:
        return int(base.post("/v1/completions", body).json()["usage"]["completion_tokens"])

    with ThreadPoolExecutor(12) as pool:
        futs = [pool.submit(one, i) for i in range(12)]
        deadline = time.monotonic() + 10
        while not all(f.done() for f in futs) and time.monotonic() < deadline:
            c = base.state()["counters"]
            assert c["running"] <= 8
            seen_waiting = max(seen_waiting, c["waiting"])
            time.sleep(0.01)
        assert [f.result() for f in futs] == [30] * 12
    assert seen_waiting > 0


@pytest.mark.timing
def test_zero_delay_mode(zero: Emu) -> None:
    body = {
        "model": MODEL,
        "prompt": STRUCTURED,
        "max_tokens": 200,
        "temperature": 0,
        "return_token_ids": True,
    }
    before = scrape(zero.metrics_text())
    t0 = time.perf_counter()
    for _ in range(20):
        r = zero.post("/v1/completions", body)
        assert r.json()["usage"]["completion_tokens"] == 200
    assert time.perf_counter() - t0 < 2.0  # 20 x 200 tokens, no emulated delay
    events = zero.stream("/v1/completions", {**body, "stream_options": {"include_usage": True}})
    sizes = [len(e["choices"][0]["token_ids"]) for e in events[:-1]]
    assert sum(sizes) == 200 and max(sizes) > 1
    assert events[-1]["metrics"]["speculative_decoding"]["num_spec_steps"] == len(sizes) - 1
    after = scrape(zero.metrics_text())
    m = {k: v - before.get(k, 0.0) for k, v in after.items()}
    assert 0 < m["vllm:spec_decode_num_accepted_tokens_total"] <= m["vllm:spec_decode_num_draft_tokens_total"]
    per_pos = sum(
        v for k, v in m.items() if k.startswith("vllm:spec_decode_num_accepted_tokens_per_pos_total")
    )
    assert per_pos == m["vllm:spec_decode_num_accepted_tokens_total"]
    assert m["vllm:generation_tokens_total"] == 21 * 200
    assert m["vllm:inter_token_latency_seconds_count"] == m["vllm:spec_decode_num_drafts_total"]
    chat_body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10}
    chat = zero.stream("/v1/chat/completions", chat_body)
    assert chat[0]["choices"][0]["delta"]["role"] == "assistant"


# -- faults -----------------------------------------------------------------------------------------


@pytest.fixture
def clean(faulty: Emu) -> Any:
    yield faulty
    faulty.control(error_rate=0, hang_rate=0, reset_rate=0, slow_first_byte_ms=0, time_scale=0.05)


BODY = {"model": MODEL, "prompt": STRUCTURED, "max_tokens": 40, "temperature": 0}


def test_fault_error_rate(clean: Emu) -> None:
    clean.control(error_rate=1.0)
    r = clean.post("/v1/completions", BODY)
    assert r.status_code == 500
    err = r.json()["error"]
    assert list(err) == ["message", "type", "param", "code"] and err["code"] == 500
    clean.control(error_rate=0.0)
    assert clean.post("/v1/completions", BODY).status_code == 200
    assert clean.state()["counters"]["errors"] == 1


def test_fault_hang(clean: Emu) -> None:
    clean.control(hang_rate=1.0)
    with pytest.raises(httpx.ReadTimeout):
        clean.client.post(clean.url + "/v1/completions", json=BODY, timeout=0.3)
    clean.control(hang_rate=0.0)
    assert clean.post("/v1/completions", BODY).status_code == 200
    assert clean.state()["counters"]["hangs"] == 1


@pytest.mark.parametrize("time_scale", [0.05, 0.0])
def test_fault_reset(clean: Emu, time_scale: float) -> None:
    clean.control(reset_rate=1.0, time_scale=time_scale)
    with pytest.raises(httpx.RemoteProtocolError):
        clean.stream("/v1/completions", BODY)
    with pytest.raises(httpx.RemoteProtocolError):
        clean.client.post(clean.url + "/v1/completions", json=BODY)
    clean.control(reset_rate=0.0)
    assert clean.post("/v1/completions", BODY).status_code == 200
    assert clean.state()["counters"]["running"] == 0


@pytest.mark.timing
def test_fault_slow_first_byte(clean: Emu) -> None:
    clean.control(slow_first_byte_ms=300, time_scale=0)
    t0 = time.perf_counter()
    assert clean.post("/v1/completions", BODY).status_code == 200
    assert time.perf_counter() - t0 >= 0.3
    clean.control(slow_first_byte_ms=0)
    t0 = time.perf_counter()
    clean.post("/v1/completions", BODY)
    assert time.perf_counter() - t0 < 0.2
