"""``specroute bench overhead``: what the gateway itself adds to each request.

The same request stream goes straight to a zero-delay emulator (``direct``) and through a gateway in
front of it (``proxied``), interleaved in one run — randomised pairs, so the machine's drift (other
processes, frequency scaling, GC) hits both sides alike and cancels in the difference. The added
latency at each quantile is ``proxied - direct``. The gateway runs its normal path, classifier and
routing decision included; the upstream answers at once, so what remains is the gateway's own cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gateway import stack
from gateway.bench import loadgen
from gateway.bench.client import Client
from gateway.bench.loadgen import Load, Record, Target
from gateway.bench.results import QUANTILES, quantile
from gateway.bench.workloads import RequestSpec, builtin, order, prepare

DIRECT, PROXIED = "direct", "proxied"


@dataclass
class OverheadOptions:
    rate: float = 500.0
    duration: float = 10.0
    stream: bool = True  # also measure the streamed path (added TTFT)
    max_throughput: bool = False
    concurrency: int = 64
    max_tokens: int = 16
    model: str | None = None
    strategy: str = "classifier"
    gateway_url: str | None = None
    upstream_url: str | None = None
    gateway_pid: int | None = None
    pin: bool = False
    warmup_s: float = 1.0
    seed: int = 0
    progress: bool = False


@dataclass
class Usage:
    """CPU and memory of one process (and its children) across a phase."""

    proc: psutil.Process | None
    children: bool = True  # a server's workers count; the client's children (the servers) do not
    cpu_start: float = 0.0
    wall_start: float = 0.0

    def start(self) -> None:
        self.cpu_start, self.wall_start = self._cpu(), time.perf_counter()

    def cpu_seconds(self) -> float:
        return self._cpu() - self.cpu_start

    def cpu_percent(self) -> float | None:
        if self.proc is None:
            return None
        wall = time.perf_counter() - self.wall_start
        return 100.0 * (self._cpu() - self.cpu_start) / wall if wall > 0 else None

    def rss_mb(self) -> float | None:
        if self.proc is None:
            return None
        try:
            procs = [self.proc, *self.proc.children(recursive=True)]
            return float(sum(p.memory_info().rss for p in procs)) / 2**20
        except psutil.Error:
            return None

    def _cpu(self) -> float:
        if self.proc is None:
            return 0.0
        try:
            total = 0.0
            for p in [self.proc, *(self.proc.children(recursive=True) if self.children else [])]:
                t = p.cpu_times()
                total += t.user + t.system
            return total
        except psutil.Error:
            return 0.0


def _proc(pid: int | None) -> psutil.Process | None:
    try:
        return psutil.Process(pid) if pid else None
    except psutil.Error:
        return None


def _quantiles(values: Sequence[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {f"p{q}": quantile(values, q) * 1000 for q in QUANTILES}


def _diff(a: dict[str, float] | None, b: dict[str, float] | None) -> dict[str, float] | None:
    return {k: a[k] - b[k] for k in a} if a and b else None


def _pairs(direct: Target, proxied: Target, seed: int) -> loadgen.Picker:
    """Requests ``2k`` and ``2k+1`` form a pair in seeded random order: neither side always goes first."""
    rng = random.Random(seed)
    flips: list[bool] = []

    def pick(i: int) -> Target:
        k = i // 2
        while len(flips) <= k:
            flips.append(rng.random() < 0.5)
        first, second = (proxied, direct) if flips[k] else (direct, proxied)
        return first if i % 2 == 0 else second

    return pick


def _phase(records: Sequence[Record], field: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in (DIRECT, PROXIED):
        mine = [r for r in records if r.target == name]
        ok = [getattr(r, field) for r in mine if r.ok and getattr(r, field) is not None]
        errors = sorted({r.error or f"HTTP {r.status}" for r in mine if not r.ok})
        out[name] = {
            "requests": len(mine),
            "errors": len(mine) - len(ok),
            "ms": _quantiles(ok),
            "error_kinds": errors[:5],
        }
    out["added_ms"] = _diff(out[PROXIED]["ms"], out[DIRECT]["ms"])
    return out


async def _interleaved(
    direct: Target, proxied: Target, specs: Sequence[RequestSpec], opts: OverheadOptions, duration: float
) -> tuple[list[Record], float]:
    load = Load(rate=2 * opts.rate, duration=duration, seed=opts.seed, timeout=30.0)
    return await loadgen.generate(_pairs(direct, proxied, opts.seed), specs, load)


async def _sample_rss(usage: Usage, series: list[list[float]], t0: float, every_s: float = 1.0) -> None:
    """The gateway's RSS once a second: whether memory is flat shows over a run, not at its two ends."""
    while True:
        rss = usage.rss_mb()
        if rss is not None:
            series.append([round(time.perf_counter() - t0, 2), round(rss, 2)])
        await asyncio.sleep(every_s)


async def _measure(
    direct_url: str, gateway_url: str, model: str, opts: OverheadOptions, usage: dict[str, Usage]
) -> dict[str, Any]:
    workload = builtin("mixed")  # both classes: the classifier runs on every request, as in production
    plain = order(prepare(workload, model=model, max_tokens=opts.max_tokens, stream=False), opts.seed)
    streamed = order(prepare(workload, model=model, max_tokens=opts.max_tokens, stream=True), opts.seed)
    direct, proxied = Target(DIRECT, Client(direct_url)), Target(PROXIED, Client(gateway_url))
    me = Usage(psutil.Process(), children=False)
    out: dict[str, Any] = {}
    gw = usage["gateway"]
    series: list[list[float]] = []
    t0 = time.perf_counter()
    sampler = asyncio.ensure_future(_sample_rss(gw, series, t0))
    proxied_total = 0
    try:
        if opts.warmup_s:
            records, _ = await _interleaved(direct, proxied, plain, opts, opts.warmup_s)
            proxied_total += sum(1 for r in records if r.target == PROXIED)
        out["gateway_rss_mb_start"] = gw.rss_mb()
        phases = [("non_streamed", plain, "e2e")] + ([("streamed", streamed, "ttft")] if opts.stream else [])
        for name, specs, field in phases:
            for u in (*usage.values(), me):
                u.start()
            started = time.perf_counter() - t0
            records, elapsed = await _interleaved(direct, proxied, specs, opts, opts.duration)
            proxied_total += sum(1 for r in records if r.target == PROXIED)
            result = _phase(records, field)
            if field == "ttft":
                result["e2e"] = _phase(records, "e2e")
            result["elapsed_s"] = elapsed
            result["achieved_rate_per_target"] = len(records) / 2 / elapsed
            # an open loop that takes much longer than its duration was queueing: the numbers then
            # measure the backlog, not the gateway's per-request cost
            result["saturated"] = elapsed > 1.5 * opts.duration + 1.0
            served = sum(1 for r in records if r.target == PROXIED and r.ok)
            if gw.proc is not None and served:
                # CPU per proxied request: unlike latency, barely affected by other load on the machine
                result["gateway_cpu_ms_per_request"] = 1000 * gw.cpu_seconds() / served
            result["cpu_percent"] = {k: u.cpu_percent() for k, u in usage.items()} | {
                "client": me.cpu_percent()
            }
            result["memory"] = _memory(gw, started, time.perf_counter() - t0, proxied_total)
            out[name] = result
        if opts.max_throughput:
            for u in (*usage.values(), me):
                u.start()
            load = Load(concurrency=opts.concurrency, duration=opts.duration, seed=opts.seed, timeout=30.0)
            started = time.perf_counter() - t0
            records, elapsed = await loadgen.generate([proxied], plain, load)
            proxied_total += len(records)
            ok = [r.e2e for r in records if r.ok and r.e2e is not None]
            cpu = usage["gateway"].cpu_seconds()
            out["max_throughput"] = {
                "concurrency": opts.concurrency,
                "requests": len(records),
                "errors": len(records) - len(ok),
                "requests_per_s": len(ok) / elapsed,
                "latency_ms": _quantiles(ok),
                "gateway_cpu_ms_per_request": 1000 * cpu / len(ok) if ok and gw.proc else None,
                "cpu_percent": {k: u.cpu_percent() for k, u in usage.items()} | {"client": me.cpu_percent()},
                "memory": _memory(gw, started, time.perf_counter() - t0, proxied_total),
            }
        out["gateway_rss_mb_end"] = gw.rss_mb()
    finally:
        sampler.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await sampler
        await direct.client.aclose()
        await proxied.client.aclose()
    out["gateway_rss_mb_series"] = series
    return out


def _memory(gw: Usage, start_s: float, end_s: float, proxied_total: int) -> dict[str, Any]:
    """Where a phase left the gateway's memory, and after how many proxied requests in all."""
    return {
        "start_s": round(start_s, 2),
        "end_s": round(end_s, 2),
        "proxied_requests_total": proxied_total,
        "gateway_rss_mb": gw.rss_mb(),
    }


def _pin(pid: int | None, cpus: set[int]) -> None:
    if pid and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(pid, cpus)


def execute(opts: OverheadOptions, workdir: Path | None = None) -> dict[str, Any]:
    """Start (or use) an emulator and a gateway, measure, and return the report dictionary."""
    from gateway.bench.run import discover_model

    if (opts.gateway_url is None) != (opts.upstream_url is None):
        raise ValueError("give both --gateway-url and --upstream-url, or neither")
    procs: list[stack.Process] = []
    try:
        if opts.gateway_url and opts.upstream_url:
            gateway_url, direct_url = opts.gateway_url, opts.upstream_url
            model = opts.model or discover_model(direct_url, None)
            usage = {"gateway": Usage(_proc(opts.gateway_pid))}
        else:
            logs = workdir or Path(tempfile.mkdtemp(prefix="specroute-overhead-"))
            model = opts.model or "demo-model"
            emu = stack.start_emulator(
                "speculative", extra=["--served-model-name", model, "--time-scale", "0"], log_dir=logs
            )
            procs.append(emu)
            cfg = stack.demo_config([emu.url], [emu.url], stack.free_port(), model, opts.strategy)
            gw = stack.start_gateway(cfg, logs)
            procs.append(gw)
            gateway_url, direct_url = gw.url, emu.url
            usage = {"gateway": Usage(_proc(gw.popen.pid)), "emulator": Usage(_proc(emu.popen.pid))}
            if opts.pin and (os.cpu_count() or 1) >= 2:
                # the gateway gets a core of its own; the client shares the other with the emulator
                _pin(gw.popen.pid, {0})
                _pin(emu.popen.pid, {1})
                _pin(os.getpid(), {1})
        report: dict[str, Any] = loadgen.run_sync(_measure(direct_url, gateway_url, model, opts, usage))
    finally:
        for p in reversed(procs):
            p.stop()
    report["config"] = {
        "rate_per_target": opts.rate,
        "duration_s": opts.duration,
        "max_tokens": opts.max_tokens,
        "strategy": opts.strategy if not opts.gateway_url else None,
        "pinned": opts.pin,
        "cpus": os.cpu_count(),
        "seed": opts.seed,
    }
    ns = report["non_streamed"]
    report["added_ms"] = ns["added_ms"]
    if "streamed" in report:
        report["added_ttft_ms"] = report["streamed"]["added_ms"]
    return report


def _fmt(q: dict[str, float] | None) -> str:
    return "-" if not q else " / ".join(f"{q[k]:.3f}" for k in ("p50", "p90", "p99"))


def text(report: dict[str, Any]) -> str:
    """A human summary of :func:`execute`'s report."""
    c = report["config"]
    ns = report["non_streamed"]
    lines = [
        f"gateway overhead: {c['rate_per_target']:g} req/s to each of direct and proxied (interleaved pairs),"
        f" {c['duration_s']:g}s per phase, max_tokens {c['max_tokens']}, pinned={c['pinned']}",
        "",
        "non-streamed, latency ms p50 / p90 / p99:",
        f"  direct    {_fmt(ns[DIRECT]['ms'])}   {_count(ns[DIRECT])}",
        f"  proxied   {_fmt(ns[PROXIED]['ms'])}   {_count(ns[PROXIED])}",
        f"  added     {_fmt(ns['added_ms'])}",
        f"  achieved {ns['achieved_rate_per_target']:.0f} req/s per target; CPU % {_cpu(ns['cpu_percent'])}"
        f"{_per_req(ns)}",
    ]
    if "streamed" in report:
        st = report["streamed"]
        lines += [
            "streamed, TTFT ms p50 / p90 / p99:",
            f"  direct    {_fmt(st[DIRECT]['ms'])}   {_count(st[DIRECT])}",
            f"  proxied   {_fmt(st[PROXIED]['ms'])}   {_count(st[PROXIED])}",
            f"  added     {_fmt(st['added_ms'])}   (added e2e {_fmt(st['e2e']['added_ms'])})",
            f"  achieved {st['achieved_rate_per_target']:.0f} req/s per target;"
            f" CPU % {_cpu(st['cpu_percent'])}{_per_req(st)}",
        ]
    if "max_throughput" in report:
        mt = report["max_throughput"]
        lines += [
            f"max throughput through the gateway (closed loop x{mt['concurrency']}):"
            f" {mt['requests_per_s']:.0f} req/s,"
            f" {mt['errors']} errors of {mt['requests']}, latency p50/p90/p99 {_fmt(mt['latency_ms'])} ms;"
            f" CPU % {_cpu(mt['cpu_percent'])}{_per_req(mt)}",
        ]
    for name in ("non_streamed", "streamed"):
        if report.get(name, {}).get("saturated"):
            lines.append(
                f"WARNING: {name} phase saturated (requests queued): lower --rate for a latency figure"
            )
    lines += _memory_lines(report)
    return "\n".join(lines)


def _memory_lines(report: dict[str, Any]) -> list[str]:
    rss0 = report.get("gateway_rss_mb_start")
    if rss0 is None:
        return []
    steps = [
        f"{m['gateway_rss_mb']:.1f} after {m['proxied_requests_total']:,} proxied requests ({name})"
        for name in ("non_streamed", "streamed", "max_throughput")
        if (m := report.get(name, {}).get("memory")) and m["gateway_rss_mb"] is not None
    ]
    lines = [f"gateway RSS MB: {rss0:.1f} at start; " + "; ".join(steps)]
    last = next(
        (report[n]["memory"] for n in ("max_throughput", "streamed", "non_streamed") if n in report), None
    )
    series = report.get("gateway_rss_mb_series") or []
    if last is not None:
        mid = (last["start_s"] + last["end_s"]) / 2
        half = [mb for t, mb in series if mid <= t <= last["end_s"]]
        if len(half) >= 2:
            lines.append(
                f"  second half of the last phase: {half[0]:.1f} -> {half[-1]:.1f} MB"
                f" (min {min(half):.1f}, max {max(half):.1f}; sampled once a second)"
            )
    return lines


def _per_req(phase: dict[str, Any]) -> str:
    ms = phase.get("gateway_cpu_ms_per_request")
    return f"; gateway CPU {ms:.2f} ms per request" if ms is not None else ""


def _count(side: dict[str, Any]) -> str:
    kinds = f": {'; '.join(k[:80] for k in side['error_kinds'][:2])}" if side["errors"] else ""
    return f"({side['requests']} requests, {side['errors']} errors{kinds})"


def _cpu(cpu: dict[str, float | None]) -> str:
    return ", ".join(f"{k} {v:.0f}" for k, v in cpu.items() if v is not None)
