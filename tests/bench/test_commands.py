"""Smoke tests of the three commands, through the CLI (seconds each, no timing assertions)."""

from __future__ import annotations

import jsonschema
import orjson
from typer.testing import CliRunner

from gateway.bench import results
from gateway.cli import app

from .conftest import MODEL

runner = CliRunner()


def _invoke(*args: str):
    result = runner.invoke(app, ["bench", *args])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result


def test_run_through_gateway_writes_valid_results(bench_stack, tmp_path) -> None:
    out = tmp_path / "run"
    _invoke(
        "run",
        "--url",
        bench_stack["gateway"].url + "/v1",
        "--requests",
        "16",
        "--concurrency",
        "4",
        "--max-tokens",
        "16",
        "--warmup",
        "2",
        "--out",
        str(out),
        "--no-progress",
    )
    doc = orjson.loads((out / "results.json").read_bytes())
    jsonschema.validate(doc, results.schema())
    assert doc["config"]["model"] == MODEL  # discovered from /v1/models
    assert len(doc["requests"]) == 16 and doc["summary"]["overall"]["ok"] == 16
    assert set(doc["summary"]["by_pool"]) <= {"speculative", "baseline"}
    assert set(doc["summary"]["by_class"]) == {"structured", "open-ended"}
    assert doc["summary"]["overall"]["tpot_ms"]["count"] == 16
    summary = (out / "summary.md").read_text()
    assert "class structured" in summary and "## Routing" in summary
    assert {"latency_cdf.png", "tpot_over_time.png", "routing_mix.png"} <= {p.name for p in out.iterdir()}


def test_run_direct_open_loop_with_workload_file(bench_stack, tmp_path) -> None:
    wl = tmp_path / "w.jsonl"
    wl.write_text(
        '{"prompt": "1, 2, 3, 4,", "label": "numbers"}\n{"messages": [{"role": "user", "content": "hi"}]}\n'
    )
    out = tmp_path / "direct"
    _invoke(
        "run",
        "--url",
        bench_stack["baseline"].url,
        "--workload-file",
        str(wl),
        "--rate",
        "50",
        "--duration",
        "0.3",
        "--max-tokens",
        "8",
        "--no-stream",
        "--warmup",
        "0",
        "--model",
        MODEL,
        "--out",
        str(out),
        "--no-plots",
        "--no-progress",
    )
    doc = orjson.loads((out / "results.json").read_bytes())
    jsonschema.validate(doc, results.schema())
    assert set(doc["summary"]["by_pool"]) == {"direct"}
    assert {r["api"] for r in doc["requests"]} <= {"completions", "chat"}
    assert all(r["ttft_ms"] is None and r["completion_tokens"] == 8 for r in doc["requests"])
    assert not list(out.glob("*.png"))


def test_compare_smoke(tmp_path) -> None:
    out = tmp_path / "cmp"
    result = _invoke(
        "compare",
        "--strategy",
        "always-baseline",
        "--strategy",
        "classifier",
        "--requests",
        "6",
        "--warmup",
        "2",
        "--max-tokens",
        "12",
        "--time-scale",
        "0.02",
        "--out",
        str(out),
        "--no-progress",
    )
    doc = orjson.loads((out / "compare.json").read_bytes())
    assert list(doc["strategies"]) == ["always-baseline", "classifier"]
    base = doc["strategies"]["always-baseline"]
    assert base["routing"]["pool_by_class"] and all(
        set(pools) == {"baseline"} for pools in base["routing"]["pool_by_class"].values()
    )
    assert doc["strategies"]["classifier"]["summary"]["overall"]["ok"] == 6
    assert "### class structured" in (out / "compare.md").read_text()
    assert "always-baseline" in result.output


def test_compare_rejects_unknown_strategy(tmp_path) -> None:
    result = runner.invoke(app, ["bench", "compare", "--strategy", "fastest", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "unknown strategies" in result.output


def test_overhead_smoke(tmp_path) -> None:
    path = tmp_path / "overhead.json"
    result = _invoke(
        "overhead",
        "--duration",
        "1",
        "--rate",
        "50",
        "--warmup",
        "0.2",
        "--max-throughput",
        "--concurrency",
        "4",
        "--json",
        str(path),
        "--workdir",
        str(tmp_path / "w"),
    )
    doc = orjson.loads(path.read_bytes())
    assert set(doc["added_ms"]) == {"p50", "p90", "p99"}
    assert set(doc["added_ttft_ms"]) == {"p50", "p90", "p99"}
    ns = doc["non_streamed"]
    assert ns["direct"]["requests"] > 0 and ns["proxied"]["requests"] > 0
    assert abs(ns["direct"]["requests"] - ns["proxied"]["requests"]) <= 1
    assert ns["added_ms"]["p50"] == ns["proxied"]["ms"]["p50"] - ns["direct"]["ms"]["p50"]
    assert doc["max_throughput"]["requests"] > 0
    assert doc["gateway_rss_mb_start"] > 0 and doc["gateway_rss_mb_end"] > 0
    # memory is followed through the run: per phase, with the proxied requests served so far
    mems = [doc[name]["memory"] for name in ("non_streamed", "streamed", "max_throughput")]
    assert [m["proxied_requests_total"] for m in mems] == sorted(m["proxied_requests_total"] for m in mems)
    assert mems[-1]["proxied_requests_total"] >= ns["proxied"]["requests"] + doc["max_throughput"]["requests"]
    assert all(m["gateway_rss_mb"] > 0 and m["start_s"] < m["end_s"] for m in mems)
    times = [t for t, _ in doc["gateway_rss_mb_series"]]
    assert len(times) >= 3 and times == sorted(times)
    assert "added" in result.output and "proxied requests (max_throughput)" in result.output


def test_overhead_against_running_pair(bench_stack, tmp_path) -> None:
    result = _invoke(
        "overhead",
        "--gateway-url",
        bench_stack["gateway"].url,
        "--upstream-url",
        bench_stack["baseline"].url,
        "--gateway-pid",
        str(bench_stack["gateway"].popen.pid),
        "--duration",
        "0.5",
        "--rate",
        "20",
        "--warmup",
        "0",
        "--no-stream",
    )
    assert "non-streamed" in result.output and "streamed, TTFT" not in result.output


def test_learning_regime_options_in_virtual_time() -> None:
    """The regimes the learning benchmark can pose: a draft changed mid-run, a temperature, a workload
    whose answer format sets acceptance; each named in the report's first line."""
    out = _invoke(
        "learning", "--virtual", "--rate", "1", "--requests", "40", "--strategy", "always-baseline",
        "--strategy", "oracle", "--switch-at", "20", "--then-profile", "rules", "--temperature", "0.5",
        "--workload", "mixed-formats", "--acceptance-profile", "output-format",
    ).output  # fmt: skip
    assert "`output-format` (`rules` from request 20 on)" in out
    assert "`mixed-formats` workload" in out and "temperature 0.5" in out
    for args in (["--switch-at", "20"], ["--virtual", "--then-profile", "rules"]):
        result = runner.invoke(app, ["bench", "learning", *args])
        assert result.exit_code == 2, result.output
