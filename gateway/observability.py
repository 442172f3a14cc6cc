"""Gateway metrics (Prometheus) and the logging set-up; the access log is :mod:`gateway.accesslog`.

Names carry the ``specroute_`` prefix and base units; labels are bounded (pool, class, endpoint
name, status, reason) — never prompt text or request ids.

With several worker processes each worker counts only what it served, so a scrape answered by one
worker would show a fraction of the traffic. ``gateway.server`` then points
``PROMETHEUS_MULTIPROC_DIR`` at a fresh directory before the workers start: every worker writes its
values to memory-mapped files there and a scrape merges them (counters and histograms add up, each
gauge follows its ``multiprocess_mode``).

Beside its own series the gateway exports ``specroute_build_info`` (what is running), prometheus_client's
``process_*`` series (CPU, memory, open file descriptors, start time) and ``python_info``. A process
series describes one process, so with several workers they are exported per live worker, labelled with
its ``pid`` (:class:`WorkerProcessCollector`): a scrape answered by any worker shows them all, and a
worker's CPU counter never jumps to another worker's value. No ``_created`` series are exported: they
double the sample count of every counter and histogram and no dashboard or rule reads them.
"""

from __future__ import annotations

import glob
import logging
import math
import os
import platform
import re
import sys
from bisect import bisect_left
from collections.abc import Callable, Iterable
from contextlib import suppress
from importlib.metadata import PackageNotFoundError, version
from typing import Any, Protocol, TypeVar, overload

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.samples import Sample
from prometheus_client.values import MutexValue

# Read when a scrape renders the samples; set once for the process, before any collector exists.
disable_created_metrics()  # type: ignore[no-untyped-call]


class Endpoint(Protocol):
    """What metrics need of an upstream endpoint: its pool and name (labels)."""

    @property
    def pool(self) -> str: ...
    @property
    def name(self) -> str: ...


MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: The source revision the image was built from (the Dockerfile's ``GIT_REVISION`` build argument).
REVISION_ENV = "SPECROUTE_GIT_REVISION"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.045, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1)


def multiprocess_dir() -> str | None:
    """The shared metrics directory when running with several workers, else ``None``."""
    return os.environ.get(MULTIPROC_ENV) or os.environ.get(MULTIPROC_ENV.lower()) or None


def build_labels() -> dict[str, str]:
    """``specroute_build_info``'s labels: package version, Python version, source revision."""
    try:
        package = version("specroute")
    except PackageNotFoundError:  # running from a source tree that was never installed
        package = "unknown"
    return {
        "version": package,
        "python": platform.python_version(),
        "revision": os.environ.get(REVISION_ENV) or "unknown",
    }


class CounterChild(Protocol):
    def inc(self, amount: float = 1) -> None: ...


class HistogramChild(Protocol):
    def observe(self, amount: float) -> None: ...


_C = TypeVar("_C", "CounterChild", "HistogramChild")


def _plain(value: object) -> bool:
    """Whether ``value`` is prometheus_client's single-process value: a float under a lock.

    The lock is there for threads that count at once. Every series counted through the children below
    is counted by the event loop's thread alone (a request's decision, forwarding and observation all
    run there; the access log's thread counts nothing), so they add to the float directly: ``with
    lock`` costs more than the addition, about 2,000 instructions each time, and a request is counted
    13 times or more. Scrapes still read the value under the lock; a float's store is atomic under the
    interpreter's lock, so a scrape sees the value before or after an addition, as with the lock.
    In multiprocess mode (``server.workers`` > 1) the values live in shared files, and their own
    ``inc`` is called.
    """
    return type(value) is MutexValue and isinstance(getattr(value, "_value", None), float)


class GaugeChild:
    """A gauge's series moved up and down by the event loop (``Gauge.inc`` without its checks and,
    in a single process, without its lock: :func:`_plain`). Not cached by :meth:`Metrics.child`:
    endpoint gauges are removed when discovery drops the endpoint, and whoever keeps one of these keeps
    it per endpoint object."""

    __slots__ = ("_plain", "_value")

    def __init__(self, series: Counter | Gauge) -> None:
        self._value = series._value  # the value object ``inc`` adds to (shared memory with workers)
        self._plain = _plain(self._value)

    def inc(self, amount: float = 1) -> None:
        if self._plain:
            self._value._value += amount
        else:
            self._value.inc(amount)


class _CounterChild(GaugeChild):
    """A counter's series: ``Counter.inc`` as prometheus_client does it for a child, minus its checks
    that never fail for one (that it is a child, that no exemplar is given), and its lock where the
    event loop is the only thread that counts (:func:`_plain`): a gauge that refuses to go down. The
    addition is repeated rather than delegated to :meth:`GaugeChild.inc`, one call less per count."""

    __slots__ = ()

    def inc(self, amount: float = 1) -> None:
        if amount < 0:
            raise ValueError("Counters can only be incremented by non-negative amounts.")
        if self._plain:
            self._value._value += amount
        else:
            self._value.inc(amount)


class _HistogramChild:
    """A histogram's series: ``Histogram.observe`` as prometheus_client does it, its bucket found by
    bisection over the upper bounds instead of a Python loop (the first bound at or above the amount;
    none for NaN, as there), without the lock in a single process (:func:`_plain`)."""

    __slots__ = ("_bounds", "_buckets", "_plain", "_sum")

    def __init__(self, series: Histogram) -> None:
        self._sum = series._sum
        self._buckets = series._buckets
        self._bounds = series._upper_bounds
        self._plain = _plain(self._sum) and all(_plain(b) for b in self._buckets)

    def observe(self, amount: float) -> None:
        bounds = self._bounds
        i = bisect_left(bounds, amount)
        if self._plain:
            self._sum._value += amount
            if i < len(bounds) and amount <= bounds[i]:
                self._buckets[i]._value += 1.0
            return
        self._sum.inc(amount)
        if i < len(bounds) and amount <= bounds[i]:
            self._buckets[i].inc(1)


class Series(dict[tuple[object, ...], _C]):
    """One metric's cached children by their label values, for a call site that counts every request.

    ``series[labels]`` is a dictionary lookup done in C; :meth:`Metrics.child` is a Python call that
    builds its key on every use (about 1,000 instructions, seven times a request). A label set seen
    for the first time gets its child from :meth:`Metrics.child`, its values turned into strings as
    prometheus_client turns them (a status code), so a series appears when first counted, as before.
    """

    __slots__ = ("_make",)
    _make: Callable[[tuple[str, ...]], _C]

    def __init__(self, make: Callable[[tuple[str, ...]], _C]) -> None:
        super().__init__()
        self._make = make

    def __missing__(self, labels: tuple[object, ...]) -> _C:
        child = self._make(tuple(map(str, labels)))
        self[labels] = child
        return child


class Metrics:
    """Every collector the gateway exports, registered in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        # ``registry`` is what a scrape renders. In multiprocess mode the collectors write to the shared
        # directory instead, and the registry holds the collector that merges every worker's files.
        self.registry = registry or CollectorRegistry()
        shared = multiprocess_dir()
        r = None if shared else self.registry
        if shared:
            WorkersCollector(self.registry, shared)
            WorkerProcessCollector(self.registry, shared)
        else:
            ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        build = build_labels()
        self.build_info = Gauge(
            "specroute_build_info",
            "Always 1; the labels say which gateway build runs (package version, Python, source revision).",
            list(build),
            multiprocess_mode="livemax",
            registry=r,
        )
        # In multiprocess mode this also leaves a live-gauge file per worker: how a scrape finds the
        # workers whose process series to export.
        self.build_info.labels(**build).set(1)
        self.requests = Counter(
            "specroute_requests",
            "Requests answered, by API route, serving pool, prompt class and HTTP status.",
            ["route", "pool", "class", "status"],
            registry=r,
        )
        self.ttft = Histogram(
            "specroute_time_to_first_token_seconds",
            "Time from request arrival to the first streamed token.",
            ["pool", "class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            "specroute_time_per_output_token_seconds",
            "Decode time per output token: (e2e - TTFT) / (completion tokens - 1), from token counts.",
            ["pool", "class"],
            buckets=TPOT_BUCKETS,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "specroute_prompt_tokens",
            "Prompt tokens of answered requests, from the upstream's usage, by serving pool and class.",
            ["pool", "class"],
            registry=r,
        )
        self.completion_tokens = Counter(
            "specroute_completion_tokens",
            "Completion tokens of answered requests, from the upstream's usage (the last stream chunk's "
            "for streams), by serving pool and class.",
            ["pool", "class"],
            registry=r,
        )
        self.e2e = Histogram(
            "specroute_request_duration_seconds",
            "End-to-end request latency as seen by the gateway.",
            ["pool", "class"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(
            "specroute_routing_decisions",
            "Routing decisions by strategy, chosen pool and reason.",
            ["strategy", "pool", "reason"],
            registry=r,
        )
        self.state_save_errors = Counter(
            "specroute_state_save_errors",
            "Failed writes of routing.state_file (what routing learned, kept across restarts).",
            registry=r,
        )
        self.upstream_errors = Counter(
            "specroute_upstream_errors",
            "Upstream failures by pool, endpoint and kind "
            "(connect, dropped_connection, timeout, unhealthy, status_5xx, busy, protocol, stream,"
            " model_missing, too_large, unauthorized).",
            ["pool", "endpoint", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "specroute_upstream_retries",
            "Tries of a request beyond its first (on another endpoint), by the pool of the endpoint tried.",
            ["pool"],
            registry=r,
        )
        self.ejections = Counter(
            "specroute_upstream_ejections",
            "Passive ejections of an endpoint after consecutive failures.",
            ["pool", "endpoint"],
            registry=r,
        )
        self.ejected = Gauge(
            "specroute_endpoint_ejected",
            "1 while the endpoint is ejected (passive outlier detection), else 0.",
            ["pool", "endpoint"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.panic = Counter(
            "specroute_upstream_panic_requests",
            "Requests sent to an ejected or unhealthy endpoint because no endpoint of the candidate "
            "pools was usable (panic mode).",
            ["pool"],
            registry=r,
        )
        self.stream_resumptions = Counter(
            "specroute_stream_resumptions",
            "Streams that broke after the client had part of them, by the broken endpoint's pool and "
            "outcome (resumed: went on elsewhere; refused: not continuable; failed: no endpoint took it).",
            ["pool", "outcome"],
            registry=r,
        )
        self.measurements = Counter(
            "specroute_nonstream_measurement_requests",
            "Non-streamed requests to a pool that measures acceptance, by pool and outcome (uncertain or"
            " interval: streamed upstream and assembled, to be measured; passed: forwarded as sent;"
            " unmeasurable: forwarded as sent, since it cannot be rebuilt from a stream).",
            ["pool", "outcome"],
            registry=r,
        )
        self.failovers = Counter(
            "specroute_failovers",
            "Requests served by the other pool than the one decided.",
            ["from_pool", "to_pool"],
            registry=r,
        )
        self.endpoint_up = Gauge(
            "specroute_endpoint_up",
            "1 when the endpoint is healthy and not ejected.",
            ["pool", "endpoint"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        # per pool, so that a pool with no endpoint at all (a discovery name that resolves to nothing)
        # shows as down: it has no endpoint_up series to be 0
        self.pool_available = Gauge(
            "specroute_pool_available_endpoints",
            "Endpoints of the pool that are healthy and not ejected (0 also when it has none).",
            ["pool"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.inflight = Gauge(
            "specroute_inflight_requests",
            "Requests in flight to each endpoint.",
            ["pool", "endpoint"],
            multiprocess_mode="livesum",
            registry=r,
        )
        # Speculation: what the gateway measures and predicts.
        self.request_acceptance = Histogram(
            "specroute_request_acceptance_ratio",
            "Per-request draft acceptance rate measured from the upstream stream (speculative pool).",
            ["class"],
            buckets=(0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 1.0),
            registry=r,
        )
        self.accepted_tokens = Counter(
            "specroute_accepted_tokens",
            "Draft tokens accepted, measured per request by the gateway.",
            ["class"],
            registry=r,
        )
        self.draft_tokens = Counter(
            "specroute_draft_tokens",
            "Draft tokens proposed, measured per request by the gateway.",
            ["class"],
            registry=r,
        )
        self.acceptance_prediction_error = Histogram(
            "specroute_acceptance_prediction_error_ratio",
            "Measured minus predicted per-token acceptance (alpha) of each measured request.",
            ["class"],
            buckets=(-0.5, -0.3, -0.2, -0.1, -0.05, 0.0, 0.05, 0.1, 0.2, 0.3, 0.5),
            registry=r,
        )
        self.endpoint_acceptance_outlier = Gauge(
            "specroute_endpoint_acceptance_outlier",
            "1 while the endpoint's measured acceptance is far below its peers' and it is out of the"
            " speculative rotation (probed only), else 0.",
            ["pool", "endpoint"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.alpha_estimate = Gauge(
            "specroute_alpha_estimate",
            "Live estimate of the per-token acceptance probability, by prompt kind.",
            ["kind"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.endpoint_acceptance = Gauge(
            "specroute_endpoint_acceptance_ratio",
            "Draft acceptance rate from the endpoint's own vLLM counters over the last scrape interval.",
            ["pool", "endpoint"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.predicted_speedup = Histogram(
            "specroute_predicted_speedup_ratio",
            "Predicted TPOT speedup of the speculative pool over baseline at decision time.",
            ["class"],
            buckets=(0.25, 0.5, 0.75, 0.9, 1.0, 1.1, 1.25, 1.5, 2, 2.5, 3, 4),
            registry=r,
        )
        self.open_connections = Gauge(
            "specroute_open_connections",
            "Client connections open to the gateway, idle ones included (server.max_connections bounds"
            " them per worker; beyond it requests are refused with a 503). Several workers: the sum.",
            multiprocess_mode="livesum",
            registry=r,
        )
        self.access_log_dropped = Counter(
            "specroute_access_log_dropped_lines",
            "Access-log lines dropped because stdout was not read and the queue before it (50,000 lines)"
            " was full.",
            registry=r,
        )
        self.exploration = Counter(
            "specroute_exploration_decisions",
            "Requests sent to the pool their prediction did not choose, to keep measuring: to speculative"
            " for a kind predicted for baseline, or to baseline to time its step.",
            ["kind"],
            registry=r,
        )
        self.classifier_latency = Histogram(
            "specroute_classifier_duration_seconds",
            "Time the prompt classifier takes per request.",
            buckets=(0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.001, 0.002, 0.005),
            registry=r,
        )
        self.scrape_age = Gauge(
            "specroute_upstream_scrape_age_seconds",
            "Seconds since the last successful scrape of the endpoint's /metrics (since its scrapes began,"
            " while none has succeeded).",
            ["pool", "endpoint"],
            multiprocess_mode="livemax",
            registry=r,
        )
        self.pool_load = Gauge(
            "specroute_upstream_requests",
            "vLLM's own request gauges per endpoint (state: running | waiting), from the last scrape.",
            ["pool", "endpoint", "state"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )
        self.kv_cache_usage = Gauge(
            "specroute_upstream_kv_cache_usage_ratio",
            "vLLM's KV-cache usage (0-1) per endpoint, its fullest engine's for a data-parallel server, from"
            " the last scrape.",
            ["pool", "endpoint"],
            multiprocess_mode="livemostrecent",
            registry=r,
        )

    @overload
    def child(self, metric: Counter, *labels: str) -> CounterChild: ...
    @overload
    def child(self, metric: Histogram, *labels: str) -> HistogramChild: ...
    def child(self, metric: Counter | Histogram, *labels: str) -> CounterChild | HistogramChild:
        """``metric.labels(*labels)`` (the metric itself when it has no labels), looked up once per label
        set, with an ``inc`` or ``observe`` that does only what counting needs.

        prometheus_client takes a lock and validates and joins the labels on every ``labels()`` call,
        and checks on every ``inc`` and ``observe`` what a child never fails (that it is one);
        the requests' counters and histograms are touched several times per request with a few label
        sets that repeat (bounded: pools, classes, statuses, reasons). Counters and histograms only:
        their series are never removed, unlike the endpoint gauges (:meth:`forget`).
        """
        key = (id(metric), labels)
        found = self._children.get(key)
        if found is None:
            series = metric.labels(*labels) if labels else metric
            found = _CounterChild(series) if isinstance(series, Counter) else _HistogramChild(series)
            self._children[key] = found
        return found

    def counters(self, metric: Counter) -> Series[CounterChild]:
        """``metric``'s children through :meth:`child`, cached by their label values (:class:`Series`)."""
        return Series(lambda labels: self.child(metric, *labels))

    def histograms(self, metric: Histogram) -> Series[HistogramChild]:
        """``metric``'s children through :meth:`child`, cached by their label values (:class:`Series`)."""
        return Series(lambda labels: self.child(metric, *labels))

    def forget(self, endpoint: Endpoint) -> None:
        """Drop the gauges of an endpoint that discovery removed, so its last values do not linger."""
        series: list[tuple[Gauge, tuple[str, ...]]] = [
            (gauge, (endpoint.pool, endpoint.name))
            for gauge in (
                self.endpoint_up,
                self.ejected,
                self.inflight,
                self.scrape_age,
                self.kv_cache_usage,
                self.endpoint_acceptance_outlier,
                self.endpoint_acceptance,
            )
        ]
        series += [(self.pool_load, (endpoint.pool, endpoint.name, s)) for s in ("running", "waiting")]
        for gauge, labels in series:
            self.drop(gauge, labels)

    def drop(self, gauge: Gauge, labels: tuple[str, ...]) -> None:
        """Remove one series of a gauge, for a value no longer known: kept, its last value would be
        reported as the current one for good.

        Multiprocess mode cannot remove a series from the workers' files: its value becomes NaN
        instead, which panels show as a gap and alert comparisons never match.
        """
        if multiprocess_dir():
            gauge.labels(*labels).set(math.nan)
            return
        with suppress(KeyError):
            gauge.remove(*labels)


def render(metrics: Metrics) -> tuple[bytes, str]:
    """The ``/metrics`` body and content type; merges all workers' values in multiprocess mode."""
    return generate_latest(metrics.registry), CONTENT_TYPE_LATEST


class WorkersCollector(MultiProcessCollector):
    """Merges every worker's files, first dropping the live gauges of workers that exited."""

    def __init__(self, registry: CollectorRegistry, path: str):
        super().__init__(registry, path)  # type: ignore[no-untyped-call]
        self.path = path

    def collect(self) -> Iterable[Metric]:
        prune_dead_workers(self.path)
        metrics: Iterable[Metric] = super().collect()  # type: ignore[no-untyped-call]
        return metrics


_LIVE_FILE = re.compile(r"gauge_live\w+_(\d+)\.db$")


def live_workers(path: str) -> list[int]:
    """Pids of the running workers that write to ``path`` (each leaves live-gauge files there)."""
    pids = {
        int(m.group(1))
        for f in glob.glob(os.path.join(path, "gauge_live*.db"))
        if (m := _LIVE_FILE.search(f))
    }
    return sorted(pid for pid in pids if _alive(pid))


class WorkerProcessCollector:
    """``process_*`` series of every live worker, each labelled with its ``pid`` (multiprocess mode).

    prometheus_client's :class:`ProcessCollector` reads ``/proc/<pid>`` of one process and has no
    multiprocess support: registered as it is, each scrape would report whichever worker answered, and
    ``process_cpu_seconds_total`` would jump between workers' values. This reads each live worker's
    ``/proc`` entry instead (workers share the host or container with the one answering).
    """

    def __init__(self, registry: CollectorRegistry, path: str, proc: str = "/proc"):
        self.path = path
        self.proc = proc
        self._workers: dict[int, ProcessCollector] = {}
        registry.register(self)

    def _worker(self, pid: int) -> ProcessCollector:
        found = self._workers.get(pid)
        if found is None:
            found = self._workers[pid] = ProcessCollector(pid=_constant(pid), proc=self.proc, registry=None)
        return found

    def collect(self) -> Iterable[Metric]:
        pids = live_workers(self.path)
        for gone in self._workers.keys() - set(pids):
            del self._workers[gone]
        families: dict[str, Metric] = {}
        for pid in pids:
            for family in self._worker(pid).collect():
                merged = families.get(family.name)
                if merged is None:
                    merged = families[family.name] = Metric(family.name, family.documentation, family.type)
                merged.samples += [
                    Sample(s.name, {**s.labels, "pid": str(pid)}, s.value, s.timestamp, s.exemplar)
                    for s in family.samples
                ]
        return list(families.values())


def _constant(pid: int) -> Callable[[], int]:
    return lambda: pid


def prune_dead_workers(path: str) -> None:
    """Drop the ``live*`` gauge files of workers that exited (crashed or restarted by uvicorn).

    Counters and histograms of a dead worker stay: what it served still counts.
    """
    pids = {
        int(m.group(1))
        for f in glob.glob(os.path.join(path, "gauge_live*.db"))
        if (m := _LIVE_FILE.search(f))
    }
    for pid in pids:
        if not _alive(pid):
            mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _RoutineShutdown(logging.Filter):
    """uvicorn logs the end of its shutdown grace period, when it cancels the requests still running, as
    an ERROR; for a gateway of long streams that is every rollout, documented and handled (each such
    request is answered 503 and logged at WARNING), and an error-level line per rollout would page
    someone. It goes out as a WARNING."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.ERROR and "timeout graceful shutdown exceeded" in str(record.msg):
            record.levelno, record.levelname = logging.WARNING, "WARNING"
        return True


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    # One line per upstream call would double the log volume of the access log for nothing.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    uvicorn_errors = logging.getLogger("uvicorn.error")
    if not any(isinstance(f, _RoutineShutdown) for f in uvicorn_errors.filters):
        uvicorn_errors.addFilter(_RoutineShutdown())
