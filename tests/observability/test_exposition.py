"""What a scrape of ``/metrics`` shows beside the request series: build, process and token series,
and never a ``_created`` sample; in one process and, per worker, in multiprocess mode."""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from gateway.observability import MULTIPROC_ENV, REVISION_ENV, Metrics, build_labels, render
from tests.api.conftest import MODEL, InProcess

PROCESS = (
    "process_cpu_seconds",
    "process_resident_memory_bytes",
    "process_open_fds",
    "process_start_time_seconds",
)


def families(body: bytes | str) -> dict[str, Metric]:
    text = body.decode() if isinstance(body, bytes) else body
    return {f.name: f for f in text_string_to_metric_families(text)}


@pytest.fixture(scope="module")
def scraped() -> Iterator[dict[str, Metric]]:
    """``/metrics`` of the in-process gateway after one streamed and one whole chat request."""
    with InProcess({"logging": {"access_log": False}}) as stack:
        chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6}
        assert stack.request("POST", "/v1/chat/completions", json=chat).status_code == 200
        streamed = {**chat, "stream": True}
        assert stack.request("POST", "/v1/chat/completions", json=streamed).status_code == 200
        response = stack.request("GET", "/metrics")
        assert response.status_code == 200
        yield families(response.text)


def test_no_created_series(scraped: dict[str, Metric]) -> None:
    names = {s.name for f in scraped.values() for s in f.samples}
    assert "specroute_requests_total" in names
    assert [n for n in names if n.endswith("_created")] == []


def test_build_info(scraped: dict[str, Metric]) -> None:
    (sample,) = scraped["specroute_build_info"].samples
    assert sample.value == 1
    assert sample.labels == build_labels()
    assert sample.labels["python"].count(".") == 2 and sample.labels["version"]


def test_build_revision_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REVISION_ENV, "0123abc")
    (sample,) = families(render(Metrics(CollectorRegistry()))[0])["specroute_build_info"].samples
    assert sample.labels["revision"] == "0123abc"
    monkeypatch.delenv(REVISION_ENV)
    assert build_labels()["revision"] == "unknown"


def test_process_series_of_this_process(scraped: dict[str, Metric]) -> None:
    for name in PROCESS:
        (sample,) = scraped[name].samples
        assert sample.value > 0, name
    assert "python_info" in scraped


def test_tokens_counted_per_pool_and_class(scraped: dict[str, Metric]) -> None:
    for name in ("specroute_prompt_tokens", "specroute_completion_tokens"):
        samples = [s for s in scraped[name].samples if s.name == name + "_total"]
        assert samples, name
        assert {"pool", "class"} == set(samples[0].labels)
        assert sum(s.value for s in samples) > 0, name
    completion = sum(s.value for s in scraped["specroute_completion_tokens"].samples)
    assert completion <= 2 * 6  # two requests of at most max_tokens each


def _worker(conn: object) -> None:
    Metrics()  # a gateway worker registers its build, which marks it live
    conn.send(os.getpid())  # type: ignore[attr-defined]
    conn.recv()  # type: ignore[attr-defined]  # stay alive until the parent has looked


def test_process_series_per_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Multiprocess mode: one ``process_*`` series per live worker, told apart by ``pid``."""
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_worker, args=(child,))
    proc.start()
    assert parent.poll(60), "worker did not start"
    pid = parent.recv()
    # This process imported prometheus_client before the variable was set, so it keeps its values in
    # memory: it answers the scrape but is not one of the workers.
    scraper = Metrics()
    try:
        got = families(render(scraper)[0])
        for name in PROCESS:
            pids = {s.labels["pid"] for s in got[name].samples}
            assert pids == {str(pid)}, name
        (info,) = got["specroute_build_info"].samples
        assert info.value == 1 and "pid" not in info.labels
        assert not [s for f in got.values() for s in f.samples if s.name.endswith("_created")]
    finally:
        parent.send("stop")
        proc.join(30)
    assert "process_cpu_seconds" not in families(render(scraper)[0])  # the worker is gone
