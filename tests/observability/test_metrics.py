"""Metric naming rules, and counts from several worker processes adding up in multiprocess mode."""

from __future__ import annotations

import math
import multiprocessing
import os
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability import MULTIPROC_ENV, GaugeChild, Metrics, render
from gateway.upstream.pool import Endpoint

#: every label a gateway series may carry: each takes a bounded set of values (the build's: one per build)
BOUNDED_LABELS = {"route", "pool", "class", "status", "strategy", "reason", "endpoint", "kind", "from_pool",
                  "to_pool", "state", "outcome", "version", "python", "revision"}  # fmt: skip
#: a base unit, or what is counted; ``_estimate`` is a probability (alpha-hat), dimensionless;
#: ``_up``, ``_ejected`` and ``_outlier`` are 0/1 states; ``_info`` is always 1 and says it in its labels
UNITS = ("_seconds", "_ratio", "_requests", "_tokens", "_decisions", "_errors", "_retries", "_failovers",
         "_resumptions", "_lines", "_up", "_estimate", "_ejections", "_ejected", "_outlier",
         "_info", "_endpoints", "_connections")  # fmt: skip


def _collectors(metrics: Metrics) -> list[object]:
    return [v for v in vars(metrics).values() if hasattr(v, "_name")]


def test_names_prefix_units_and_labels() -> None:
    metrics = Metrics(CollectorRegistry())
    for c in _collectors(metrics):
        name: str = c._name  # type: ignore[attr-defined]
        assert name.startswith("specroute_"), name
        assert name.endswith(UNITS), f"{name}: name should end in its unit"
        assert set(c._labelnames) <= BOUNDED_LABELS, name  # type: ignore[attr-defined]


def test_gauges_say_how_workers_combine() -> None:
    """``all`` (the default) would add a ``pid`` label per worker: unbounded across restarts."""
    for c in _collectors(Metrics(CollectorRegistry())):
        if isinstance(c, Gauge):
            assert c._multiprocess_mode.startswith("live"), c._name


def test_render_single_process() -> None:
    metrics = Metrics(CollectorRegistry())
    metrics.requests.labels("chat", "baseline", "open-ended", "200").inc(3)
    body, content_type = render(metrics)
    assert content_type.startswith("text/plain")
    samples = {s.name: s.value for f in text_string_to_metric_families(body.decode()) for s in f.samples}
    assert samples["specroute_requests_total"] == 3


def test_forget_removes_a_departed_endpoint() -> None:
    """Every gauge of an endpoint goes with it (an outlier flag left at 1 would keep its alert firing
    for a pod that no longer exists); its counters stay, as counters must."""
    metrics = Metrics(CollectorRegistry())
    gauges = [c for c in _collectors(metrics) if isinstance(c, Gauge) and "endpoint" in c._labelnames]
    assert len(gauges) >= 8
    for name in ("spec-0", "spec-1"):
        for gauge in gauges:
            values = {"pool": "speculative", "endpoint": name, "state": "running"}
            gauge.labels(*(values[label] for label in gauge._labelnames)).set(1)
    metrics.forget(Endpoint("speculative", "spec-1", "http://127.0.0.1:9", 1.0))
    left = {(name, labels) for (name, labels) in _parse(render(metrics)[0])}
    for gauge in gauges:
        endpoints = {dict(labels)["endpoint"] for name, labels in left if name == gauge._name}
        assert endpoints == {"spec-0"}, gauge._name


def _worker(n: int, up: float, conn: object) -> None:
    """One gateway worker: serves ``n`` requests, sees one in flight, reports endpoint health ``up``.

    It counts as the gateway does, through the cached children, which in multiprocess mode add through
    the shared files' values rather than to a float of their own."""
    m = Metrics()
    for _ in range(n):
        m.child(m.requests, "completions", "speculative", "structured", "200").inc()
        m.child(m.tpot, "speculative", "structured").observe(0.02)
    inflight = GaugeChild(m.inflight.labels("speculative", "spec-0"))
    inflight.inc(2)
    inflight.inc(-1)
    m.endpoint_up.labels("speculative", "spec-0").set(up)
    gone = Endpoint("speculative", f"spec-gone-{n}", "http://127.0.0.1:9", 1.0)
    m.kv_cache_usage.labels("speculative", gone.name).set(0.5)
    m.forget(gone)  # discovery dropped it
    conn.send(os.getpid())  # type: ignore[attr-defined]
    conn.recv()  # type: ignore[attr-defined]  # stay alive until the parent has looked


def _parse(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(body.decode())
        for s in f.samples
    }


def test_workers_add_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters import prometheus_client in mp mode
    links = []
    for n, up in ((3, 1.0), (4, 0.0)):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_worker, args=(n, up, child))
        proc.start()
        assert parent.poll(60), "worker did not start"
        links.append((proc, parent, parent.recv()))
    try:
        assert len({pid for _, _, pid in links}) == 2
        samples = _parse(render(Metrics())[0])
        key = (("class", "structured"), ("pool", "speculative"), ("route", "completions"), ("status", "200"))
        assert samples[("specroute_requests_total", key)] == 7
        hist = (("class", "structured"), ("pool", "speculative"))
        assert samples[("specroute_time_per_output_token_seconds_count", hist)] == 7
        ep = (("endpoint", "spec-0"), ("pool", "speculative"))
        assert samples[("specroute_inflight_requests", ep)] == 2  # livesum
        assert samples[("specroute_endpoint_up", ep)] == 0.0  # the most recent report wins
        gone = (("endpoint", "spec-gone-3"), ("pool", "speculative"))
        assert math.isnan(samples[("specroute_upstream_kv_cache_usage_ratio", gone)])
    finally:
        for proc, conn, _ in links:
            conn.send("stop")
            proc.join(30)
    # Dead workers: their requests still count, their in-flight gauges are gone.
    samples = _parse(render(Metrics())[0])
    assert samples[("specroute_requests_total", key)] == 7
    assert ("specroute_inflight_requests", ep) not in samples


def test_every_series_is_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "observability.md").read_text()
    for c in _collectors(Metrics(CollectorRegistry())):
        name = c._name + ("_total" if c._type == "counter" else "")  # type: ignore[attr-defined]
        assert f"`{name}`" in doc, name


def test_a_cached_child_counts_in_the_same_series_as_labels() -> None:
    metrics = Metrics()
    child = metrics.child(metrics.requests, "chat", "baseline", "open-ended", "200")
    assert metrics.child(metrics.requests, "chat", "baseline", "open-ended", "200") is child
    assert metrics.child(metrics.requests, "chat", "baseline", "open-ended", "500") is not child
    child.inc()
    metrics.requests.labels("chat", "baseline", "open-ended", "200").inc()
    labels = {"route": "chat", "pool": "baseline", "class": "open-ended", "status": "200"}
    assert metrics.registry.get_sample_value("specroute_requests_total", labels) == 2
    # the same label values on another metric are another series
    metrics.child(metrics.e2e, "baseline", "open-ended").observe(0.5)
    assert metrics.child(metrics.ttft, "baseline", "open-ended") is not metrics.child(
        metrics.e2e, "baseline", "open-ended"
    )


def test_a_series_hands_out_the_cached_children_and_adds_a_label_set_only_when_first_counted() -> None:
    metrics = Metrics()
    requests, e2e = metrics.counters(metrics.requests), metrics.histograms(metrics.e2e)

    def exported() -> list[tuple[str, dict[str, str]]]:
        return [
            (s.name, s.labels)
            for m in (metrics.requests, metrics.e2e)
            for c in m.collect()
            for s in c.samples
        ]

    assert exported() == []  # binding a metric adds no series
    # a status code is a label as prometheus_client writes it; the child is the one child() caches
    assert requests["chat", "baseline", "open-ended", 200] is metrics.child(
        metrics.requests, "chat", "baseline", "open-ended", "200"
    )
    requests["chat", "baseline", "open-ended", 200].inc()
    requests["chat", "baseline", "open-ended", 200].inc(2)
    e2e["baseline", "open-ended"].observe(0.5)
    labels = {"route": "chat", "pool": "baseline", "class": "open-ended", "status": "200"}
    assert metrics.registry.get_sample_value("specroute_requests_total", labels) == 3
    assert (
        metrics.registry.get_sample_value(
            "specroute_request_duration_seconds_count", {"pool": "baseline", "class": "open-ended"}
        )
        == 1
    )
    assert {name for name, _ in exported()} == {
        "specroute_requests_total",
        "specroute_request_duration_seconds_bucket",
        "specroute_request_duration_seconds_count",
        "specroute_request_duration_seconds_sum",
    }
    assert {tuple(sorted(ls.items())) for name, ls in exported() if name == "specroute_requests_total"} == {
        tuple(sorted(labels.items()))
    }


def test_a_cached_child_counts_exactly_as_prometheus_client_does() -> None:
    ours, theirs = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    amounts = [0.0, 0.004, 0.005, 0.0051, 0.3, 1, 299.9, 300, 300.1, math.inf, -0.5, math.nan]
    for amount in amounts:
        ours.child(ours.e2e, "baseline", "open-ended").observe(amount)
        theirs.e2e.labels("baseline", "open-ended").observe(amount)
        ours.child(ours.classifier_latency).observe(amount / 1000)
        theirs.classifier_latency.observe(amount / 1000)
    for tokens in (1, 16, 0, 2.5):
        ours.child(ours.completion_tokens, "baseline", "open-ended").inc(tokens)
        theirs.completion_tokens.labels("baseline", "open-ended").inc(tokens)
    ours.child(ours.requests, "chat", "baseline", "open-ended", "200").inc()
    theirs.requests.labels("chat", "baseline", "open-ended", "200").inc()
    gauge = GaugeChild(ours.inflight.labels("speculative", "spec-0"))
    for delta in (1, 1, -1, 3, -4, 1):
        gauge.inc(delta)
        theirs.inflight.labels("speculative", "spec-0").inc(delta)
    # in one process the children add to the values' floats themselves, not through their locks
    assert gauge._plain and ours.child(ours.e2e, "baseline", "open-ended")._plain  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="non-negative"):
        ours.child(ours.prompt_tokens, "baseline", "open-ended").inc(-1)
    with pytest.raises(ValueError, match="non-negative"):
        theirs.prompt_tokens.labels("baseline", "open-ended").inc(-1)

    def samples(m: Metrics) -> list[tuple[str, tuple[tuple[str, str], ...], float]]:
        return sorted(
            (s.name, tuple(sorted(s.labels.items())), s.value)
            for c in (
                m.e2e,
                m.classifier_latency,
                m.completion_tokens,
                m.requests,
                m.prompt_tokens,
                m.inflight,
            )
            for metric in c.collect()
            for s in metric.samples
            if not math.isnan(s.value)
        )

    assert samples(ours) == samples(theirs)
    nan_sums = [s for m in (ours, theirs) for metric in m.e2e.collect() for s in metric.samples]
    assert sum(math.isnan(s.value) for s in nan_sums) == 2  # each _sum took the NaN alike
