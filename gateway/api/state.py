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
    # what every completion reads, read once from the (frozen) settings: each attribute of a pydantic
    # model goes through its __getattr__ hook, some 500 instructions
    api_keys: list[str] = field(init=False)
    max_body_bytes: int = field(init=False)
    body_timeout_s: float = field(init=False)
    allow_pool_override: bool = field(init=False)
    total_s: float = field(init=False)
    forward_client_key: bool = field(init=False)  # the caller's Authorization goes upstream

    def __post_init__(self) -> None:
        s = self.settings
        self.api_keys = s.auth.api_keys
        self.max_body_bytes = s.limits.max_body_bytes
        self.body_timeout_s = s.server.body_timeout_s
        self.allow_pool_override = s.routing.allow_pool_override
        self.total_s = s.timeouts.total_s
        self.forward_client_key = s.auth.forward_client_authorization and not s.auth.api_keys


def of(request: Request) -> Gateway:
    """The gateway serving ``request`` (set on the app's state at start-up).

    Read from the scope's app and the dictionary Starlette's ``State`` keeps its attributes in:
    ``request.app`` and ``State.__getattr__`` are two Python calls, some 5,800 instructions a request.
    """
    gw: Gateway = request.scope["app"].state._state["gateway"]
    return gw
