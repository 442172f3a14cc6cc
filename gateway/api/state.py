"""What a request handler reads: the gateway's parts, built once per process by :mod:`gateway.app`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from starlette.requests import Request

from gateway.config import Settings
from gateway.observability import Metrics
from gateway.observe import Observer
from gateway.routing.learned import LearnedState
from gateway.routing.measurement import MeasurementGate
from gateway.routing.policy import Policy
from gateway.upstream.forward import Upstreams
from gateway.upstream.scrape import Scraper


@dataclass
class Gateway:
    """Everything a request handler needs, built once per process."""

    settings: Settings
    policy: Policy
    metrics: Metrics
    upstreams: Upstreams
    models: frozenset[str]
    observer: Observer
    measurement: MeasurementGate
    scraper: Scraper | None = None
    learned: LearnedState | None = None  # routing.state_file, when set
    draining: bool = False
    tasks: list[asyncio.Task[None]] = field(default_factory=list)


def of(request: Request) -> Gateway:
    """The gateway serving ``request`` (set on the app's state at start-up)."""
    gw: Gateway = request.app.state.gateway
    return gw
