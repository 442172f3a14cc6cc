"""The latency shape of the reference deployment, time-scaled: speculation ~ 3x faster per token on
structured prompts, no gain on open-ended ones, same time to first token.

Client-side timings are loose (the test machine may be busy); the server's own TTFT histogram gives the
precise TTFT comparison."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import pytest

from tests.emulator.conftest import MODEL, OPEN_ENDED, STRUCTURED, TIME_SCALE, Emu, scrape

pytestmark = pytest.mark.timing  # measured speed: `make test-timing`

N = 64


def measure(emu: Emu, prompt: str) -> tuple[float, float]:
    """(TTFT, TPOT) in emulated seconds: TPOT = (e2e - TTFT) / (tokens - 1) with the server's count."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": N, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    t0 = time.perf_counter()
    ttft = None
    tokens = 0
    with emu.client.stream("POST", emu.url + "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line[6:])
            if event["choices"] and ttft is None:
                ttft = time.perf_counter() - t0
            if not event["choices"]:
                tokens = event["usage"]["completion_tokens"]
    e2e = time.perf_counter() - t0
    assert ttft is not None and tokens == N
    return ttft / TIME_SCALE, (e2e - ttft) / (tokens - 1) / TIME_SCALE


def profile(emu: Emu, prompt: str, reps: int = 3) -> tuple[float, float, float]:
    """Fastest client TTFT, median TPOT, and the server's mean TTFT (emulated seconds). A busy machine
    only ever adds delay, so the fastest TTFT is the least noisy."""
    before = scrape(emu.metrics_text())
    runs = [measure(emu, f"{prompt} ({i})") for i in range(reps)]
    after = scrape(emu.metrics_text())
    key = "vllm:time_to_first_token_seconds"
    n = after[key + "_count"] - before[key + "_count"]
    server_ttft = (after[key + "_sum"] - before[key + "_sum"]) / n
    return min(r[0] for r in runs), statistics.median(r[1] for r in runs), server_ttft / TIME_SCALE


def attempts(check: Callable[[], None], tries: int = 3) -> None:
    """Timing checks get a second chance: a loaded test machine can stall any single measurement."""
    for i in range(tries):
        try:
            check()
            return
        except AssertionError:
            if i == tries - 1:
                raise


def _same_ttft(s: tuple[float, float, float], b: tuple[float, float, float]) -> None:
    # prefill is not sped up by speculation: ~25 ms + 0.5 ms/token in both pools
    assert 0.025 <= b[2] <= 0.15, b[2]
    assert abs(s[2] - b[2]) <= 0.3 * b[2] + 0.005, (s[2], b[2])
    assert abs(s[0] - b[0]) <= 0.3 * b[0] + 0.01, (s[0], b[0])


def test_structured_prompt_speedup(spec: Emu, base: Emu) -> None:
    def check() -> None:
        s = profile(spec, STRUCTURED)
        b = profile(base, STRUCTURED)
        assert 0.042 <= b[1] <= 0.08, b[1]  # ~45 ms per token without speculation
        assert s[1] / b[1] <= 0.5, (s[1], b[1])  # ~15 ms with it (~3x)
        _same_ttft(s, b)

    attempts(check)


def test_open_ended_prompt_no_gain(spec: Emu, base: Emu) -> None:
    def check() -> None:
        s = profile(spec, OPEN_ENDED)
        b = profile(base, OPEN_ENDED)
        assert 0.75 <= s[1] / b[1] <= 1.33, (s[1], b[1])
        _same_ttft(s, b)

    attempts(check)
