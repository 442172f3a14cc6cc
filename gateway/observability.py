"""Gateway metrics (Prometheus) and the structured access log.

Names carry the ``specroute_`` prefix and base units; labels are bounded (pool, class, endpoint
name, status, reason) — never prompt text or request ids.
"""

from __future__ import annotations

import logging
import sys

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
TPOT_BUCKETS = (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.045, 0.06, 0.08, 0.1, 0.15, 0.25, 0.5, 1)


class Metrics:
    """Every collector the gateway exports, registered in one registry."""

    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
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
        self.upstream_errors = Counter(
            "specroute_upstream_errors",
            "Upstream failures by pool, endpoint and kind (connect, timeout, status_5xx, stream).",
            ["pool", "endpoint", "kind"],
            registry=r,
        )
        self.retries = Counter(
            "specroute_upstream_retries", "Requests retried on another endpoint.", ["pool"], registry=r
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
            registry=r,
        )
        self.inflight = Gauge(
            "specroute_inflight_requests",
            "Requests in flight to each endpoint.",
            ["pool", "endpoint"],
            registry=r,
        )


def configure_logging(level: str) -> None:
    logging.basicConfig(
        level=level.upper(), stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )


_access = logging.getLogger("specroute.access")


def access_log(record: dict[str, object]) -> None:
    """One JSON line per request, written to stdout without the logging machinery's cost."""
    sys.stdout.write(orjson.dumps(record).decode() + "\n")
    sys.stdout.flush()
