"""The gateway in front of real emulator processes: routing, pass-through, failures, bad input."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from gateway import stack

MODEL = "demo-model"
SCALE = "0.2"  # baseline step 9 ms: fast, yet far above scheduling noise
STRUCTURED = "Repeat the following line exactly 40 times: the quick brown fox jumps over the lazy dog"
OPEN_ENDED = "Write a short story about a lighthouse keeper who finds a message in a bottle."


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("gateway-core")


@pytest.fixture(scope="module")
def pools(workdir) -> Iterator[dict[str, list[stack.Process]]]:
    extra = ["--served-model-name", MODEL, "--time-scale", SCALE, "--max-num-seqs", "16"]
    procs = {
        "speculative": [stack.start_emulator("speculative", extra=extra, log_dir=workdir) for _ in range(2)],
        "baseline": [stack.start_emulator("baseline", extra=extra, log_dir=workdir)],
    }
    with stack.running(*procs["speculative"], *procs["baseline"]):
        yield procs


def _config(pools, port: int, **extra) -> dict:
    return stack.demo_config(
        [p.url for p in pools["speculative"]],
        [p.url for p in pools["baseline"]],
        port,
        MODEL,
        "classifier",
        extra={"limits": {"max_body_bytes": 65536}, **extra},
    )


@pytest.fixture(scope="module")
def gateway(pools, workdir) -> Iterator[stack.Process]:
    proc = stack.start_gateway(_config(pools, stack.free_port()), workdir)
    with stack.running(proc):
        yield proc


def _complete(url: str, prompt: str, headers: dict | None = None, **body) -> httpx.Response:
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "temperature": 0, **body}
    return httpx.post(url + "/v1/completions", json=payload, headers=headers or {}, timeout=60)


def _stream(url: str, prompt: str, headers: dict | None = None, **body) -> tuple[httpx.Response, list[bytes]]:
    payload = {"model": MODEL, "prompt": prompt, "max_tokens": 64, "temperature": 0, "stream": True, **body}
    with httpx.stream("POST", url + "/v1/completions", json=payload, headers=headers or {}, timeout=60) as r:
        raw = r.read()
    return r, [e for e in raw.split(b"\n\n") if e]


def _tpot(url: str, prompt: str, headers: dict | None = None) -> tuple[float, float, str]:
    """TPOT from server token counts, and tokens per chunk."""
    payload = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 120,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    first = None
    chunks = 0
    usage = None
    with httpx.stream("POST", url + "/v1/completions", json=payload, headers=headers or {}, timeout=60) as r:
        pool = r.headers["x-specroute-pool"]
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            obj = orjson.loads(line[6:])
            if obj["choices"]:
                chunks += 1
                if first is None:
                    first = time.perf_counter()
            if obj.get("usage"):
                usage = obj["usage"]
    end = time.perf_counter()
    assert usage is not None and first is not None
    tokens = usage["completion_tokens"]
    return (end - first) / (tokens - 1), tokens / chunks, pool


def test_structured_goes_speculative_several_tokens_a_step(gateway):
    _, per_chunk, pool = _tpot(gateway.url, STRUCTURED)
    assert pool == "speculative"
    assert per_chunk >= 3
    _, base_per_chunk, forced = _tpot(gateway.url, STRUCTURED, {"x-specroute-pool": "baseline"})
    assert forced == "baseline"
    assert base_per_chunk == pytest.approx(1.0)


@pytest.mark.timing
def test_structured_is_faster_on_the_speculative_pool(gateway):
    tpot_spec, _, pool = _tpot(gateway.url, STRUCTURED)
    tpot_base, _, forced = _tpot(gateway.url, STRUCTURED, {"x-specroute-pool": "baseline"})
    assert (pool, forced) == ("speculative", "baseline")
    assert tpot_spec <= 0.5 * tpot_base


def test_open_ended_goes_baseline_with_decision_headers(gateway):
    r = _complete(gateway.url, OPEN_ENDED)
    assert r.status_code == 200
    assert r.headers["x-specroute-pool"] == "baseline"
    assert r.headers["x-specroute-class"] == "open-ended"
    assert r.headers["x-specroute-reason"]
    assert r.json()["choices"][0]["text"]


def test_unknown_fields_pass_through(gateway, pools):
    # vllm_xargs reaches the emulator: an acceptance of 0 makes speculation emit one token per step.
    r, events = _stream(
        gateway.url, STRUCTURED, return_token_ids=True, vllm_xargs={"emulated_acceptance": 0.0}, max_tokens=20
    )
    assert r.headers["x-specroute-pool"] == "speculative"
    chunks = [orjson.loads(e[6:]) for e in events if e != b"data: [DONE]"]
    assert all(len(c["choices"][0]["token_ids"]) == 1 for c in chunks)  # return_token_ids passed through


def _normalise(raw: bytes) -> bytes:
    raw = re.sub(rb'"id":"[^"]*"', b'"id":"X"', raw)
    return re.sub(rb'"created":\d+', b'"created":0', raw)


@pytest.mark.parametrize("pool_index", ["speculative", "baseline"])
@pytest.mark.parametrize(
    "options", [None, {"include_usage": True}, {"include_usage": True, "continuous_usage_stats": True}]
)
def test_streamed_bytes_equal_upstream(gateway, pools, pool_index, options):
    upstream = pools[pool_index][0]
    body = {"model": MODEL, "prompt": STRUCTURED, "max_tokens": 48, "temperature": 0, "stream": True}
    if options:
        body["stream_options"] = options
    direct = httpx.post(upstream.url + "/v1/completions", json=body, timeout=60).content
    via = httpx.post(
        gateway.url + "/v1/completions", json=body, headers={"x-specroute-pool": pool_index}, timeout=60
    )
    assert via.headers["x-specroute-pool"] == pool_index
    assert via.headers["content-type"].startswith("text/event-stream")
    assert _normalise(via.content) == _normalise(direct)
    assert via.content.endswith(b"data: [DONE]\n\n")


def test_chat_non_streamed_equals_upstream(gateway, pools):
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": OPEN_ENDED}],
        "max_tokens": 24,
        "temperature": 0,
    }
    direct = httpx.post(pools["baseline"][0].url + "/v1/chat/completions", json=body, timeout=60)
    via = httpx.post(gateway.url + "/v1/chat/completions", json=body, timeout=60)
    assert via.status_code == direct.status_code == 200
    assert _normalise(via.content) == _normalise(direct.content)


def test_models_health_ready(gateway):
    models = httpx.get(gateway.url + "/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(gateway.url + "/health").status_code == 200
    ready = httpx.get(gateway.url + "/ready")
    assert ready.status_code == 200 and ready.json()["ready"] is True
    metrics = httpx.get(gateway.url + "/metrics").text
    assert "specroute_requests_total" in metrics


@pytest.mark.parametrize(
    ("method", "path", "content", "status", "param"),
    [
        ("POST", "/v1/completions", b"{not json", 400, None),
        ("POST", "/v1/completions", b'{"model": "demo-model"}', 400, "prompt"),
        ("POST", "/v1/chat/completions", b'{"model": "demo-model", "messages": []}', 400, "messages"),
        ("POST", "/v1/completions", b'{"model": "nope", "prompt": "x"}', 404, "model"),
        ("POST", "/v1/completions", b'{"prompt": "' + b"x" * 70000 + b'"}', 413, None),
        ("GET", "/v1/completions", b"", 405, None),
        ("DELETE", "/v1/chat/completions", b"", 405, None),
        ("POST", "/v1/nothing-here", b"{}", 404, None),
        ("POST", "/v1/completions", b"[1, 2]", 400, None),
    ],
)
def test_bad_input_is_openai_shaped(gateway, method, path, content, status, param):
    r = httpx.request(
        method, gateway.url + path, content=content, headers={"content-type": "application/json"}
    )
    assert r.status_code == status
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["code"] == status and err["message"]
    assert "Traceback" not in r.text


def test_upstream_4xx_passes_through_unchanged(gateway, pools):
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 5000}
    direct = httpx.post(pools["baseline"][0].url + "/v1/completions", json=body)
    via = httpx.post(gateway.url + "/v1/completions", json=body, headers={"x-specroute-pool": "baseline"})
    assert via.status_code == direct.status_code == 400
    assert via.content == direct.content


def test_forced_pool_header_validation(gateway):
    r = _complete(gateway.url, "hi", headers={"x-specroute-pool": "fastest"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-specroute-pool"


def test_api_keys_and_disabled_override(pools, workdir):
    port = stack.free_port()
    cfg = _config(
        pools,
        port,
        auth={"api_keys": ["secret-1"]},
        routing={"strategy": "classifier", "allow_pool_override": False},
    )
    proc = stack.start_gateway(cfg, workdir, name="gateway-auth")
    with stack.running(proc):
        assert _complete(proc.url, "hi").status_code == 401
        assert _complete(proc.url, "hi", {"authorization": "Bearer wrong"}).status_code == 401
        ok = _complete(proc.url, "hi", {"authorization": "Bearer secret-1"})
        assert ok.status_code == 200
        forced = _complete(
            proc.url, "hi", {"authorization": "Bearer secret-1", "x-specroute-pool": "baseline"}
        )
        assert forced.status_code == 403


def test_client_disconnect_cancels_upstream(gateway, pools):
    """Closing a stream early removes the request from the upstream engine."""
    upstreams = [p.url for p in pools["speculative"]]

    def running() -> float:
        total = 0.0
        for u in upstreams:
            for line in httpx.get(u + "/metrics").text.splitlines():
                if line.startswith("vllm:num_requests_running{"):
                    total += float(line.rsplit(" ", 1)[1])
        return total

    payload = {"model": MODEL, "prompt": STRUCTURED, "max_tokens": 900, "stream": True, "temperature": 0}
    with httpx.stream("POST", gateway.url + "/v1/completions", json=payload, timeout=30) as r:
        pieces = r.iter_bytes()
        assert next(pieces)
        assert running() >= 1
    deadline = time.monotonic() + 10
    while running() > 0 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert running() == 0


def test_endpoint_killed_during_traffic(workdir):
    """No request that had not started streaming fails when one endpoint dies."""
    extra = ["--served-model-name", MODEL, "--time-scale", "0.05"]
    spec = [stack.start_emulator("speculative", extra=extra, log_dir=workdir) for _ in range(2)]
    base = [stack.start_emulator("baseline", extra=extra, log_dir=workdir)]
    with stack.running(*spec, *base):
        cfg = stack.demo_config(
            [p.url for p in spec], [p.url for p in base], stack.free_port(), MODEL, "classifier"
        )
        gw = stack.start_gateway(cfg, workdir, name="gateway-kill")
        with stack.running(gw):
            results: list[tuple[int, bool]] = []

            async def one(client: httpx.AsyncClient, i: int) -> None:
                body = {
                    "model": MODEL,
                    "prompt": STRUCTURED + f" #{i}",
                    "max_tokens": 16,
                    "stream": i % 2 == 0,
                }
                started = False
                try:
                    async with client.stream("POST", "/v1/completions", json=body) as r:
                        async for piece in r.aiter_bytes():
                            started = started or bool(piece)
                        results.append((r.status_code, started))
                except httpx.HTTPError:
                    results.append((0, started))

            async def traffic() -> None:
                async with httpx.AsyncClient(base_url=gw.url, timeout=30) as client:
                    for wave in range(12):
                        if wave == 4:
                            threading.Thread(target=spec[0].stop, kwargs={"timeout": 5}).start()
                        await asyncio.gather(*(one(client, wave * 8 + i) for i in range(8)))
                        await asyncio.sleep(0.05)

            asyncio.run(traffic())
            failed_before_streaming = [r for r in results if r[0] != 200 and not r[1]]
            assert len(results) == 96
            assert failed_before_streaming == []

            # The whole speculative pool down: served by the baseline pool.
            spec[1].stop()
            r = _complete(gw.url, STRUCTURED)
            assert r.status_code == 200
            assert r.headers["x-specroute-pool"] == "baseline"
            assert "failover" in r.headers["x-specroute-reason"]

            # All pools down: a prompt 503 in OpenAI shape.
            base[0].stop()
            r = _complete(gw.url, STRUCTURED)
            assert r.status_code == 503
            assert r.json()["error"]["code"] == 503
            deadline = time.monotonic() + 5  # the next health check marks the pools down
            while httpx.get(gw.url + "/ready").status_code != 503 and time.monotonic() < deadline:
                time.sleep(0.1)
            assert httpx.get(gw.url + "/ready").status_code == 503
