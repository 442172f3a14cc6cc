"""Aggregate records into ``results.json`` (schema ``results.schema.json``, versioned by ``schema_version``).

Groups are the whole run, each prompt class (the workload's label), each pool (from the gateway's
``x-specroute-pool`` header, ``direct`` when absent) and each (class, pool) pair, because a mean over a
mixed workload hides exactly the difference speculation makes.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import orjson

from gateway.bench.loadgen import Record

SCHEMA_VERSION = 1
SCHEMA_PATH = Path(__file__).with_name("results.schema.json")
QUANTILES = (50, 90, 99)


def quantile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), on a sorted copy."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass
class Stats:
    count: int
    mean: float
    min: float
    max: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values: Iterable[float | None], scale: float = 1.0) -> Stats | None:
        xs = [v * scale for v in values if v is not None]
        if not xs:
            return None
        p50, p90, p99 = (quantile(xs, q) for q in QUANTILES)
        return cls(len(xs), sum(xs) / len(xs), min(xs), max(xs), p50, p90, p99)


def group(records: Sequence[Record], elapsed: float) -> dict[str, Any]:
    """The metrics of one group; latencies in milliseconds."""
    ok = [r for r in records if r.ok]
    tokens = sum(r.completion_tokens or 0 for r in ok)

    def stats(values: Iterable[float | None], scale: float = 1000.0) -> dict[str, float] | None:
        s = Stats.of(values, scale)
        return asdict(s) if s else None

    return {
        "requests": len(records),
        "ok": len(ok),
        "errors": len(records) - len(ok),
        "output_tokens": tokens,
        "requests_per_s": len(ok) / elapsed if elapsed > 0 else 0.0,
        "output_tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
        "ttft_ms": stats(r.ttft for r in ok),
        "tpot_ms": stats(r.tpot for r in ok),
        "e2e_ms": stats(r.e2e for r in ok),
        "tokens_per_chunk": stats((r.tokens_per_chunk for r in ok if r.stream), 1.0),
        "completion_tokens": stats((r.completion_tokens for r in ok), 1.0),
    }


def _by(records: Sequence[Record], key: Any) -> dict[str, list[Record]]:
    out: dict[str, list[Record]] = {}
    for r in records:
        out.setdefault(key(r), []).append(r)
    return dict(sorted(out.items()))


def summarise(records: Sequence[Record], elapsed: float) -> dict[str, Any]:
    return {
        "overall": group(records, elapsed),
        "by_class": {k: group(v, elapsed) for k, v in _by(records, lambda r: r.label).items()},
        "by_pool": {k: group(v, elapsed) for k, v in _by(records, lambda r: r.pool).items()},
        "by_class_pool": {
            k: group(v, elapsed) for k, v in _by(records, lambda r: f"{r.label}/{r.pool}").items()
        },
    }


def routing(records: Sequence[Record]) -> dict[str, Any]:
    """Where each class went, and how often the gateway's class agreed with the workload's label."""
    counts: dict[str, dict[str, int]] = {}
    agree = labelled = 0
    for r in records:
        counts.setdefault(r.label, {}).setdefault(r.pool, 0)
        counts[r.label][r.pool] += 1
        if r.routed_class is not None and r.label in ("structured", "open-ended"):
            labelled += 1
            agree += r.routed_class == r.label
    reasons: dict[str, int] = {}
    for r in records:
        if r.reason:
            reasons[r.reason] = reasons.get(r.reason, 0) + 1
    return {
        "pool_by_class": counts,
        "reasons": dict(sorted(reasons.items(), key=lambda kv: -kv[1])),
        "class_agreement": agree / labelled if labelled else None,
    }


def record_dict(r: Record) -> dict[str, Any]:
    return {
        "index": r.index,
        "label": r.label,
        "api": r.api,
        "stream": r.stream,
        "start_s": round(r.start, 6),
        "status": r.status,
        "error": r.error,
        "pool": r.pool,
        "routed_class": r.routed_class,
        "reason": r.reason,
        "ttft_ms": None if r.ttft is None else round(r.ttft * 1000, 4),
        "tpot_ms": None if r.tpot is None else round(r.tpot * 1000, 4),
        "e2e_ms": None if r.e2e is None else round(r.e2e * 1000, 4),
        "completion_tokens": r.completion_tokens,
        "prompt_tokens": r.prompt_tokens,
        "chunks": r.chunks,
    }


def build(
    records: Sequence[Record], elapsed: float, config: dict[str, Any], include_requests: bool = True
) -> dict[str, Any]:
    return {
        "schema_version": SCHEMA_VERSION,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "config": config,
        "duration_s": elapsed,
        "summary": summarise(records, elapsed),
        "routing": routing(records),
        "requests": [record_dict(r) for r in records] if include_requests else [],
    }


def write(results: dict[str, Any], path: Path) -> None:
    path.write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))


def schema() -> dict[str, Any]:
    loaded: dict[str, Any] = orjson.loads(SCHEMA_PATH.read_bytes())
    return loaded
