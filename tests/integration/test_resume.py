"""A stream whose endpoint is killed mid-answer goes on on the other pool, and the client gets the
very text of an unbroken run: one stream, one id, one role chunk, one finish, one ``[DONE]``."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gateway import stack

MODEL = "demo-model"
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
GREEDY = {"model": MODEL, "temperature": 0, "max_tokens": 80, "stream": True}
# the endpoint that gets killed: slow enough (a 45 ms step) that the kill lands mid-answer
SLOW = ["--served-model-name", MODEL, "--time-scale", "1.0"]
FAST = ["--served-model-name", MODEL, "--time-scale", "0.1"]
KILL_AFTER = 5  # data events the client has read when the serving endpoint is killed


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory):
    return tmp_path_factory.mktemp("resume")


@pytest.fixture(scope="module")
def baseline(workdir) -> Iterator[stack.Process]:
    proc = stack.start_emulator("baseline", extra=FAST, log_dir=workdir)
    with stack.running(proc):
        yield proc


@pytest.fixture
def victim(workdir) -> Iterator[stack.Process]:
    proc = stack.start_emulator("speculative", extra=SLOW, log_dir=workdir)
    with stack.running(proc):
        yield proc


@pytest.fixture
def gateway(victim: stack.Process, baseline: stack.Process, workdir) -> Iterator[stack.Process]:
    cfg = stack.demo_config([victim.url], [baseline.url], stack.free_port(), MODEL, "classifier")
    proc = stack.start_gateway(cfg, workdir, name=f"gateway-{victim.url.rsplit(':', 1)[1]}")
    with stack.running(proc):
        yield proc


def _stream(url: str, path: str, body: dict[str, Any], kill: stack.Process | None = None) -> list[bytes]:
    """The ``data:`` payloads of one streamed request to the speculative pool; with ``kill``,
    SIGKILL that endpoint once the client has read :data:`KILL_AFTER` of them."""
    events: list[bytes] = []
    headers = {"x-specroute-pool": "speculative"}
    with httpx.stream("POST", url + path, json=body, headers=headers, timeout=60) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line:
                continue
            assert line.startswith("data: "), line
            events.append(line[len("data: ") :].encode())
            if kill is not None and len(events) == KILL_AFTER:
                kill.stop(sig=9)
    return events


def _parsed(events: list[bytes], finish: str = "length") -> list[dict[str, Any]]:
    assert events.count(b"[DONE]") == 1 and events[-1] == b"[DONE]"
    chunks = [orjson.loads(e) for e in events[:-1]]
    assert not [c for c in chunks if "error" in c]
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    finishes = [ch["finish_reason"] for c in chunks for ch in c["choices"] if ch["finish_reason"]]
    assert finishes == [finish]
    return chunks


def _metric(url: str, outcome: str) -> float:
    text = httpx.get(url + "/metrics").text
    series = 'specroute_stream_resumptions_total{outcome="' + outcome + '",pool="speculative"}'
    m = re.search("^" + re.escape(series) + r" (\S+)$", text, re.M)
    return float(m.group(1)) if m else 0.0


def _access_line(gateway: stack.Process, request_id: str) -> dict[str, Any]:
    """The request's access-log line; the log is written by a thread, so it may lag the response."""
    deadline = time.monotonic() + 5
    while True:
        for line in gateway.log().splitlines():
            if request_id in line and line.startswith("{"):
                rec: dict[str, Any] = orjson.loads(line)
                return rec
        if time.monotonic() > deadline:
            raise AssertionError(f"no access-log line for {request_id}")
        time.sleep(0.05)


def test_completion_resumed_on_the_other_pool_equals_an_unbroken_run(
    gateway: stack.Process, victim: stack.Process
) -> None:
    body = {**GREEDY, "prompt": PROMPT}
    whole = _parsed(_stream(gateway.url, "/v1/completions", body))
    assert not victim.popen.poll()
    broken_events = _stream(gateway.url, "/v1/completions", body, kill=victim)
    assert victim.popen.poll() is not None, "the endpoint was killed"
    broken = _parsed(broken_events)
    text = "".join(ch["text"] for c in broken for ch in c["choices"])
    assert text == "".join(ch["text"] for c in whole for ch in c["choices"])
    assert len(text) > 100
    # the client did not ask for usage: none leaks from the continuation either
    assert not [c for c in broken if c.get("usage")]
    assert _metric(gateway.url, "resumed") == 1


def test_chat_resumed_on_the_other_pool_equals_an_unbroken_run(
    gateway: stack.Process, victim: stack.Process
) -> None:
    body = {
        **GREEDY,
        "messages": [{"role": "user", "content": PROMPT}],
        "stream_options": {"include_usage": True},
    }
    whole = _parsed(_stream(gateway.url, "/v1/chat/completions", body))
    broken = _parsed(_stream(gateway.url, "/v1/chat/completions", body, kill=victim))

    def content(chunks: list[dict[str, Any]]) -> str:
        return "".join(ch["delta"].get("content") or "" for c in chunks for ch in c["choices"])

    assert content(broken) == content(whole) and len(content(whole)) > 100
    roles = [ch["delta"]["role"] for c in broken for ch in c["choices"] if "role" in ch["delta"]]
    assert roles == ["assistant"]
    # one usage chunk, last, with the client's prompt and every token it was sent
    usage = [c["usage"] for c in broken if c.get("usage")]
    assert len(usage) == 1 and broken[-1]["usage"] == usage[0] and broken[-1]["choices"] == []
    assert usage[0] == whole[-1]["usage"]
    rid = broken[0]["id"]
    assert rid != whole[0]["id"]
    assert _metric(gateway.url, "resumed") == 1
    record = _access_line(gateway, '"resumed":1')
    assert record["endpoint"] == "spec-0" and record["resumed_on"] == ["base-0"]
    assert record["status"] == 200 and record["completion_tokens"] == 80


def test_a_resumed_completion_still_stops_at_the_stop_string(
    gateway: stack.Process, victim: stack.Process
) -> None:
    body = {**GREEDY, "prompt": PROMPT}
    chunks = _parsed(_stream(gateway.url, "/v1/completions", body))
    whole = "".join(ch["text"] for c in chunks for ch in c["choices"])
    # A character first written well after the kill point: only the continuation can meet it. One
    # character, because a longer stop string makes the server hold back text that might start it,
    # so the text sent may end inside a token (see gateway/upstream/resume.py).
    stop = next(ch for ch in sorted(set(whole)) if whole.index(ch) > len(whole) * 2 // 3)
    events = _stream(gateway.url, "/v1/completions", {**body, "stop": [stop]}, kill=victim)
    assert victim.popen.poll() is not None
    text = "".join(ch["text"] for c in _parsed(events, finish="stop") for ch in c["choices"])
    assert text == whole[: whole.index(stop)]
    assert _metric(gateway.url, "resumed") == 1
