"""Aggregation, TPOT from server token counts, and the results.json schema."""

from __future__ import annotations

import jsonschema
import numpy as np
import pytest

from gateway.bench import results
from gateway.bench.loadgen import Record


def _rec(i: int, label: str, pool: str, ttft: float, e2e: float, tokens: int, chunks: int, **kw) -> Record:
    return Record(
        i, label, "completions", True, i * 0.1, e2e, ttft, 200, None, tokens, 10, chunks, pool, **kw
    )


def test_tpot_uses_token_count_not_chunks() -> None:
    r = _rec(0, "structured", "speculative", ttft=0.1, e2e=1.1, tokens=101, chunks=25)
    assert r.tpot == pytest.approx(0.01)  # (1.1 - 0.1) / 100, whatever the chunking
    assert r.tokens_per_chunk == pytest.approx(101 / 25)
    assert _rec(1, "x", "p", 0.1, 0.2, tokens=1, chunks=1).tpot is None


@pytest.mark.parametrize("q", [0, 37, 50, 90, 99, 100])
def test_quantile_matches_numpy(q: float) -> None:
    xs = list(np.random.default_rng(q).exponential(size=101))
    assert results.quantile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def _records() -> list[Record]:
    recs = [
        _rec(
            0, "structured", "speculative", 0.05, 0.5, 50, 12, routed_class="structured", reason="classifier"
        ),
        _rec(1, "structured", "baseline", 0.06, 1.0, 50, 50, routed_class="open-ended", reason="classifier"),
        _rec(2, "open-ended", "baseline", 0.05, 1.2, 60, 60, routed_class="open-ended", reason="classifier"),
        _rec(3, "open-ended", "baseline", 0.05, 1.3, 60, 60, routed_class="open-ended", reason="adaptive"),
    ]
    failed = Record(4, "open-ended", "completions", True, 0.5, 0.01, None, 502, "HTTP 502: bad gateway")
    return [*recs, failed]


def test_summary_groups() -> None:
    s = results.summarise(_records(), elapsed=2.0)
    assert s["overall"]["requests"] == 5 and s["overall"]["errors"] == 1
    assert set(s["by_class"]) == {"structured", "open-ended"}
    assert set(s["by_pool"]) == {"speculative", "baseline", "direct"}
    assert s["by_class_pool"]["structured/speculative"]["ok"] == 1
    assert s["by_class"]["open-ended"]["output_tokens"] == 120
    assert s["by_class"]["structured"]["tpot_ms"]["max"] == pytest.approx((1.0 - 0.06) / 49 * 1000)
    assert s["overall"]["requests_per_s"] == pytest.approx(2.0)


def test_routing_counts_and_agreement() -> None:
    r = results.routing(_records())
    assert r["pool_by_class"]["structured"] == {"speculative": 1, "baseline": 1}
    assert r["class_agreement"] == pytest.approx(3 / 4)
    assert next(iter(r["reasons"])) == "classifier"


def _config() -> dict:
    load = {"concurrency": 2, "rate": None, "requests": 5, "duration": None, "seed": 0, "timeout": 60.0}
    return {
        "url": "http://x",
        "workload": "mixed",
        "api": "completions",
        "model": "m",
        "max_tokens": 8,
        "temperature": 0.0,
        "stream": True,
        "warmup": 0,
        "load": load,
    }


def test_built_results_validate() -> None:
    doc = results.build(_records(), 2.0, _config())
    jsonschema.validate(doc, results.schema())


def test_schema_rejects_wrong_version_and_missing_fields() -> None:
    doc = results.build(_records(), 2.0, _config())
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**doc, "schema_version": 2}, results.schema())
    broken = {**doc, "summary": {**doc["summary"], "overall": {"requests": 1}}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, results.schema())
