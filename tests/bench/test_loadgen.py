"""The load generator against real emulator and gateway processes (no timing assertions)."""

from __future__ import annotations

import orjson
import pytest

from gateway.bench import loadgen, overhead
from gateway.bench.client import Client
from gateway.bench.loadgen import Load, Target
from gateway.bench.workloads import builtin, prepare

from .conftest import MODEL


def _run(url: str, load: Load, **prep) -> list[loadgen.Record]:
    specs = prepare(builtin("mixed"), **{"model": MODEL, "max_tokens": 12, **prep})

    async def main() -> list[loadgen.Record]:
        client = Client(url)
        try:
            records, _ = await loadgen.generate([Target("t", client)], specs, load)
        finally:
            await client.aclose()
        return records

    out: list[loadgen.Record] = loadgen.run_sync(main())
    return out


def test_closed_loop_streamed_counts_server_tokens(bench_stack) -> None:
    records = _run(bench_stack["speculative"].url, Load(concurrency=3, requests=9))
    assert [r.index for r in records] == list(range(9))
    for r in records:
        assert r.ok, r.error
        assert r.pool == "direct" and r.routed_class is None
        assert r.completion_tokens == 12 and r.ttft is not None and r.tpot is not None
        assert 1 <= r.chunks <= 12


def test_open_loop_non_streamed_chat_through_gateway(bench_stack) -> None:
    records = _run(bench_stack["gateway"].url, Load(rate=40, requests=10, seed=3), api="chat", stream=False)
    assert len(records) == 10
    assert all(r.ok for r in records), [r.error for r in records]
    assert {r.pool for r in records} <= {"speculative", "baseline"}
    assert all(r.routed_class in ("structured", "open-ended") for r in records)
    assert all(r.ttft is None and r.completion_tokens == 12 for r in records)


def test_errors_are_recorded_not_raised(bench_stack) -> None:
    records = _run(bench_stack["gateway"].url, Load(concurrency=1, requests=1), model="no-such-model")
    assert records[0].status >= 400 and records[0].error and not records[0].ok
    dead = _run("http://127.0.0.1:9", Load(concurrency=1, requests=2))
    assert all(r.status == 0 and r.error for r in dead)


@pytest.mark.parametrize("eol", [b"\n", b"\r\n", b"\r"], ids=["lf", "crlf", "cr"])
@pytest.mark.parametrize("sep", [b"data: ", b"data:"], ids=["space", "no-space"])
def test_sse_parsing_counts_chunks_with_output(eol: bytes, sep: bytes) -> None:
    rec = loadgen.Record(0, "x", "chat", True, 0.0)
    events = [
        {"choices": [{"delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"delta": {"content": "ab"}}]},
        {"choices": [{"delta": {"content": "cd"}}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}},
    ]
    raw = (
        b"".join(sep + orjson.dumps(e) + eol * 2 for e in events)
        + b": done"
        + eol
        + sep
        + b"[DONE]"
        + eol * 2
    )

    async def chunks():
        for i in range(0, len(raw), 7):  # events split across reads
            yield raw[i : i + 7]

    loadgen.run_sync(loadgen._read_stream(chunks(), rec, 0.0))
    assert rec.chunks == 2 and rec.completion_tokens == 5 and rec.prompt_tokens == 3 and rec.ttft is not None


def test_pairs_alternate_targets_in_seeded_order() -> None:
    a, b = Target("direct", None), Target("proxied", None)  # type: ignore[arg-type]
    picks = [overhead._pairs(a, b, 7)(i).name for i in range(40)]
    for k in range(20):
        assert sorted(picks[2 * k : 2 * k + 2]) == ["direct", "proxied"]
    assert len({tuple(picks[2 * k : 2 * k + 2]) for k in range(20)}) == 2  # both orders occur
    pick = overhead._pairs(a, b, 7)
    assert [pick(i).name for i in range(40)] == picks
