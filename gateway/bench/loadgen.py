"""The load generator: closed loop (fixed concurrency) or open loop (seeded Poisson arrivals).

Per request it records TTFT (first chunk carrying output), end-to-end latency, the chunk count and the
server's own ``usage.completion_tokens``. TPOT is derived from those — never from chunk gaps, which
under speculative decoding measure engine steps, not tokens.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from gateway.bench.client import Client, HTTPError
from gateway.bench.workloads import RequestSpec
from gateway.upstream.sse import EventBuffer
from gateway.upstream.stream import has_output

DIRECT = "direct"


@dataclass
class Record:
    """One measured request; times in seconds, ``start`` relative to the start of the run."""

    index: int
    label: str
    api: str
    stream: bool
    start: float
    e2e: float | None = None
    ttft: float | None = None
    status: int = 0
    error: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    chunks: int = 0
    pool: str = DIRECT
    routed_class: str | None = None
    reason: str | None = None
    target: str = ""

    @property
    def ok(self) -> bool:
        return self.error is None and 200 <= self.status < 300

    @property
    def tpot(self) -> float | None:
        """(e2e - TTFT) / (output tokens - 1), with the server's token count."""
        if self.ttft is None or self.e2e is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.completion_tokens - 1)

    @property
    def tokens_per_chunk(self) -> float | None:
        if not self.completion_tokens or not self.chunks:
            return None
        return self.completion_tokens / self.chunks


@dataclass
class Target:
    """Where requests go: a client and the name records carry (``direct``/``proxied`` in ``overhead``)."""

    name: str
    client: Client


def _usage(rec: Record, usage: Any) -> None:
    if isinstance(usage, dict):
        if isinstance(usage.get("completion_tokens"), int):
            rec.completion_tokens = usage["completion_tokens"]
        if isinstance(usage.get("prompt_tokens"), int):
            rec.prompt_tokens = usage["prompt_tokens"]


async def send(target: Target, spec: RequestSpec, rec: Record, limit_s: float) -> Record:
    """Send one request and fill ``rec``; failures are recorded, never raised."""
    t0 = time.perf_counter()
    try:
        async with asyncio.timeout(limit_s):
            reply = await target.client.request(spec.path, spec.body)
            h = reply.headers
            rec.status = reply.status
            rec.pool = h.get("x-specroute-pool", DIRECT)
            rec.routed_class = h.get("x-specroute-class")
            rec.reason = h.get("x-specroute-reason")
            if reply.status >= 300:
                body = await reply.read()
                rec.error = f"HTTP {reply.status}: {body[:200].decode(errors='replace')}"
            elif spec.stream:
                await _read_stream(reply.chunks(), rec, t0)
            else:
                obj = orjson.loads(await reply.read())
                _usage(rec, obj.get("usage") if isinstance(obj, dict) else None)
                rec.chunks = 1
    except TimeoutError:
        rec.error = f"timeout after {limit_s:g}s"
    except (HTTPError, orjson.JSONDecodeError) as e:
        rec.error = str(e)[:300]
    rec.e2e = time.perf_counter() - t0
    return rec


async def _read_stream(chunks: Any, rec: Record, t0: float) -> None:
    sse = EventBuffer()
    async for raw in chunks:
        for event in sse.feed(raw)[0]:
            payload = sse.data(event)
            if payload is None or payload == b"[DONE]":
                continue
            obj = orjson.loads(payload)
            if not isinstance(obj, dict):
                continue
            if "error" in obj:
                rec.error = f"stream error: {str(obj['error'])[:200]}"
            choices = obj.get("choices")
            if choices and has_output(choices):
                rec.chunks += 1
                if rec.ttft is None:
                    rec.ttft = time.perf_counter() - t0
            if obj.get("usage"):
                _usage(rec, obj["usage"])


@dataclass
class Load:
    """How to send: ``concurrency`` (closed loop) or ``rate`` req/s (open loop); stop by count or time."""

    concurrency: int = 1
    rate: float | None = None
    requests: int | None = None
    duration: float | None = None
    seed: int = 0
    timeout: float = 600.0
    max_inflight: int = 10_000  # open loop: beyond this the run is overloaded; arrivals are dropped

    def describe(self) -> str:
        mode = f"open loop {self.rate:g} req/s" if self.rate else f"closed loop x{self.concurrency}"
        stop = f"{self.requests} requests" if self.requests else f"{self.duration:g}s"
        return f"{mode}, {stop}"


Picker = Callable[[int], Target]


async def generate(
    targets: Sequence[Target] | Picker,
    specs: Sequence[RequestSpec],
    load: Load,
    on_done: Callable[[Record], None] | None = None,
) -> tuple[list[Record], float]:
    """Run one phase; returns the records (in sending order) and the elapsed seconds.

    ``targets``: one target, or a function from request index to target (``overhead`` interleaves).
    """
    if load.requests is None and load.duration is None:
        raise ValueError("give a number of requests or a duration")
    pick: Picker = targets if callable(targets) else (lambda i, t=targets[0]: t)  # type: ignore[misc]
    records: list[Record] = []
    t_start = time.perf_counter()
    deadline = t_start + load.duration if load.duration else float("inf")
    limit = load.requests if load.requests is not None else 1 << 62

    def more(i: int) -> bool:
        return i < limit and time.perf_counter() < deadline

    async def one(i: int) -> None:
        spec = specs[i % len(specs)]
        target = pick(i)
        rec = Record(i, spec.label, spec.api, spec.stream, time.perf_counter() - t_start, target=target.name)
        records.append(rec)
        await send(target, spec, rec, load.timeout)
        if on_done is not None:
            on_done(rec)

    if load.rate:
        rng = random.Random(load.seed)
        tasks: set[asyncio.Task[None]] = set()
        i, next_at = 0, time.perf_counter()
        while more(i):
            delay = next_at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if len(tasks) < load.max_inflight:
                task = asyncio.create_task(one(i))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            i += 1
            next_at += rng.expovariate(load.rate)
        if tasks:
            await asyncio.gather(*tasks)
    else:
        counter = iter(range(1 << 62))

        async def worker() -> None:
            while more(i := next(counter)):
                await one(i)

        await asyncio.gather(*(worker() for _ in range(max(1, load.concurrency))))
    records.sort(key=lambda r: r.index)
    return records, time.perf_counter() - t_start


def new_loop() -> asyncio.AbstractEventLoop:
    """uvloop where installed (it is, with ``uvicorn[standard]``): a cheaper client per request."""
    try:
        import uvloop

        return uvloop.new_event_loop()
    except ImportError:  # pragma: no cover - uvloop ships with uvicorn[standard]
        return asyncio.new_event_loop()


def run_sync(coro: Any) -> Any:
    loop = new_loop()
    try:
        return loop.run_until_complete(coro)
    finally:
        loop.close()
