"""Gateway configuration: one YAML file, overridable from the environment and the command line.

Precedence, highest first: a command-line flag, the environment, the file, the default. Environment
variables use the prefix ``SPECROUTE_`` and ``__`` as the nesting separator, e.g.
``SPECROUTE_ROUTING__STRATEGY=always-baseline`` or ``SPECROUTE_AUTH__API_KEYS='["k1"]'``.
A ``SPECROUTE_`` variable that sets no setting is refused as a misspelling, except those the project
uses itself (:data:`NON_SETTING_ENV`), an upstream key an ``api_key_env`` names, and the service links
Kubernetes sets for a Service named ``specroute``.
Invalid configuration raises :class:`ConfigError` whose message names the bad field and where it came from.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
from contextvars import ContextVar
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, SettingsError

from gateway.types import POOL_NAMES, PoolName

__all__ = [
    "NON_SETTING_ENV",
    "POOL_NAMES",
    "ConfigError",
    "PoolName",
    "Settings",
    "Strategy",
    "load_server",
    "load_settings",
    "unsendable",
]

ENV_PREFIX = "SPECROUTE_"


class Strategy(StrEnum):
    ADAPTIVE = "adaptive"
    CLASSIFIER = "classifier"
    ALWAYS_SPECULATIVE = "always-speculative"
    ALWAYS_BASELINE = "always-baseline"


class _Conflict(ValueError):
    """A rule across fields, naming the fields it compares (relative to the model that raises it).

    An error from a model's own validator is located at the model, not at a field: the fields tell
    which sources set the values the rule found at odds, so the error names those and no other.
    """

    def __init__(self, message: str, *fields: str):
        super().__init__(message)
        self.fields = fields


def unsendable(key: str) -> str | None:
    """What in ``key`` cannot travel in an ``Authorization`` header as written, or None when nothing.

    A line break or another control character would end the header (every HTTP client refuses to send
    it), and a character beyond ASCII leaves as different bytes depending on the client (latin-1 from
    the gateway's own, UTF-8 from aiohttp) and is read back as latin-1 by the server that receives it,
    so it never compares equal to the key as written.
    """
    if "\n" in key or "\r" in key:
        return "a line break"
    if not key.isascii():
        return "a character outside ASCII"
    if not key.isprintable():
        return "a control character"
    return None


class _Strict(BaseModel):
    """A section: unknown keys refused, and every number finite.

    A bound like ``gt=0`` lets infinity through, and no setting means it: an infinite time-out breaks
    the clients it is given to (every health check raised in aiohttp, and a dead endpoint stayed in),
    an infinite interval or weight breaks the arithmetic done with it.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class UpstreamKeyConfig(_Strict):
    """Where the key of an upstream started with ``vllm serve --api-key`` is read from, never the key.

    The key itself stays out of the configuration (and so out of any dump or log of it): it is read
    once at start-up from an environment variable or a file (a mounted Kubernetes Secret).
    """

    api_key_env: str | None = Field(
        default=None, min_length=1, description="environment variable holding the upstream's API key"
    )
    api_key_file: Path | None = Field(default=None, description="file holding the upstream's API key")

    @model_validator(mode="after")
    def _one_source(self) -> UpstreamKeyConfig:
        if self.api_key_env is not None and self.api_key_file is not None:
            raise _Conflict("set `api_key_env` or `api_key_file`, not both", "api_key_env", "api_key_file")
        return self

    @property
    def has_key_source(self) -> bool:
        return self.api_key_env is not None or self.api_key_file is not None


class EndpointConfig(UpstreamKeyConfig):
    name: str = Field(
        min_length=1, max_length=64, description="shown in logs, `/ready` and the `endpoint` metric label"
    )
    url: HttpUrl = Field(description="the vLLM server's root URL (without /v1), e.g. http://10.0.0.5:8000")
    weight: float = Field(
        default=1.0, gt=0, description="share of the pool's traffic, relative to the others"
    )

    @field_validator("url")
    @classmethod
    def _root(cls, url: HttpUrl) -> HttpUrl:
        # the OpenAI clients' base_url habit: the gateway adds /v1/... (and /health, /metrics) itself
        if (url.path or "").rstrip("/").endswith("/v1"):
            raise ValueError(
                "is the vLLM server's root, without `/v1` (the gateway adds `/v1/...`, `/health` and"
                " `/metrics` itself): drop the trailing `/v1`"
            )
        return url

    @property
    def base_url(self) -> str:
        return str(self.url).rstrip("/")


class DiscoveryConfig(_Strict):
    """Endpoints from the DNS of a headless Service, re-resolved every ``interval_s``."""

    hostname: str = Field(
        min_length=1, description="a headless Service's name: one A/AAAA record per ready vLLM Pod"
    )
    port: int = Field(default=8000, ge=1, le=65535, description="the vLLM servers' port")
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(default=10.0, gt=0, description="how often the name is resolved again")


class PoolConfig(UpstreamKeyConfig):
    """A pool's key source applies to each of its endpoints that names none of its own."""

    endpoints: list[EndpointConfig] = Field(
        default_factory=list, description="static endpoints (beside or instead of `discovery`)"
    )
    discovery: DiscoveryConfig | None = None
    models: list[str] = Field(min_length=1, description="served model names, the same in both pools")
    num_speculative_tokens: int | None = Field(
        default=None, ge=1, le=64, description="k, draft tokens per step (speculative pool; else learned)"
    )
    draft_cost_ratio: float | None = Field(
        default=None,
        ge=0,
        lt=1,
        description="c, one draft step's cost relative to a target step (speculative pool)",
    )

    @model_validator(mode="after")
    def _has_endpoints(self) -> PoolConfig:
        if not self.endpoints and self.discovery is None:
            raise _Conflict("a pool needs `endpoints` or `discovery`", "endpoints", "discovery")
        names = [e.name for e in self.endpoints]
        if len(names) != len(set(names)):
            raise _Conflict("endpoint names must be unique within a pool", "endpoints")
        # one server listed twice would take two shares of the pool's traffic, count twice towards its
        # ejection limits, and be compared with itself for acceptance outliers
        seen: dict[str, str] = {}
        for e in self.endpoints:
            if (twin := seen.setdefault(e.base_url, e.name)) != e.name:
                raise _Conflict(
                    f"endpoints {twin} and {e.name} name the same server ({e.base_url})", "endpoints"
                )
        return self


class PoolsConfig(_Strict):
    speculative: PoolConfig
    baseline: PoolConfig

    def items(self) -> list[tuple[PoolName, PoolConfig]]:
        return [("speculative", self.speculative), ("baseline", self.baseline)]


class TimeoutsConfig(_Strict):
    connect_s: float = Field(default=2.0, gt=0, description="to open a connection to an upstream")
    first_byte_s: float = Field(default=60.0, gt=0, description="until the upstream's response headers")
    chunk_gap_s: float = Field(
        default=30.0,
        gt=0,
        description="longest silence inside a stream, and longest an engine may hold requests running"
        " without a step before its endpoint is taken out",
    )
    total_s: float = Field(
        default=600.0,
        gt=0,
        description="longest a request may take upstream: its tries, the wait for its first byte and its"
        " stream (resumptions included) or its whole non-streamed answer, together",
    )


class RetryConfig(_Strict):
    attempts: int = Field(
        default=4,
        ge=1,
        le=10,
        description="tries in all, across endpoints and pools, including the resends of a non-streamed "
        "request whose upstream body broke before the client received anything",
    )
    failover_to_other_pool: bool = Field(
        default=True, description="retry on the other pool (same model) when the decided one cannot serve"
    )
    backoff_s: float = Field(
        default=0.0,
        ge=0,
        description="base of the pause before a retry: the n-th retry waits a random time in "
        "[0, min(backoff_max_s, backoff_s * 2^(n-1))] (exponential back-off, full jitter); 0 retries at once",
    )
    backoff_max_s: float = Field(default=2.0, ge=0, description="the longest pause before a retry")
    panic: bool = Field(
        default=True,
        description="when no endpoint of the candidate pools is usable, try ejected or unhealthy ones "
        "anyway instead of answering 503",
    )
    resume_streams: bool = Field(
        default=True,
        description="continue a stream that breaks after the client had part of it on another endpoint, "
        "from the text sent so far, within `attempts`",
    )
    resume_with_token_ids: bool = Field(
        default=False,
        description="ask vLLM for token ids on resumable completion streams (removed again where the client "
        "did not ask), so that a resumed completion continues from the exact tokens rather than "
        "re-tokenised text; costs a rewrite of every chunk",
    )


class HealthConfig(_Strict):
    interval_s: float = Field(default=5.0, gt=0, description="active check period; a pass ends an ejection")
    timeout_s: float = Field(default=2.0, gt=0, description="a check that takes longer fails")
    path: str = Field(default="/health", description="checked on every endpoint; 200 = healthy")
    eject_after_failures: int = Field(
        default=2, ge=1, description="consecutive failed requests that eject an endpoint"
    )
    eject_base_s: float = Field(default=2.0, gt=0, description="first ejection; doubled on each repeat")
    eject_max_s: float = Field(default=60.0, gt=0, description="longest ejection")
    max_ejection_percent: float = Field(
        default=50.0,
        ge=0,
        le=100,
        description="most of a pool ejected at once; the last usable endpoint of a pool is never ejected",
    )
    busy_s: float = Field(
        default=2.0, ge=0, description="how long an endpoint that answered 503/429 (busy) gets less traffic"
    )
    busy_weight: float = Field(
        default=0.25, gt=0, le=1, description="share of its weight a busy endpoint keeps meanwhile"
    )

    @model_validator(mode="after")
    def _ejections_grow(self) -> HealthConfig:
        if self.eject_base_s > self.eject_max_s:
            raise _Conflict(
                "eject_base_s (the first ejection) exceeds eject_max_s", "eject_base_s", "eject_max_s"
            )
        return self

    @field_validator("path")
    @classmethod
    def _absolute_path(cls, path: str) -> str:
        """The path is appended to each endpoint's base URL: without its leading slash it would run into
        the port (``http://10.0.0.5:8000health``), and every check would fail without reaching anyone."""
        if not path.startswith("/"):
            raise ValueError(f"must begin with '/', e.g. /{path.lstrip('/') or 'health'}")
        return path


class AuthConfig(_Strict):
    api_keys: list[str] = Field(default_factory=list, description="keys clients send as a bearer token")
    admin_key: str | None = Field(
        default=None,
        description="key for /admin/* and the LoRA adapter routes; without it, any of api_keys opens them",
    )
    metrics_key: str | None = Field(
        default=None, description="key for /metrics (a Prometheus bearer token), besides api_keys"
    )
    metrics_public: bool = Field(
        default=False, description="serve /metrics to anyone even when api_keys are set"
    )
    forward_client_authorization: bool = Field(
        default=False,
        description="pass the client's Authorization header upstream (only while api_keys is empty)",
    )

    @field_validator("api_keys", "admin_key", "metrics_key")
    @classmethod
    def _sendable(cls, value: list[str] | str | None) -> list[str] | str | None:
        """Keys a client can send: the bearer token received is stripped, so an empty key, or one with
        whitespace at either end, would never match, nor would one a header cannot carry (see
        :func:`unsendable`); an empty ``admin_key`` or ``metrics_key`` would read as unset and leave its
        route open (a Secret that came out empty, say)."""
        for key in [value] if isinstance(value, str) else value or []:
            if not key.strip():
                raise ValueError("a key must not be empty")
            if key != key.strip():
                raise ValueError("a key must not begin or end with whitespace: no client can send it")
            if (why := unsendable(key)) is not None:
                raise ValueError(f"a key must be printable ASCII, not hold {why}: no client can send it")
        return value


class CorsConfig(_Strict):
    """Cross-origin requests from browsers: off unless origins are listed; the gateway answers preflights."""

    allow_origins: list[str] = Field(
        default_factory=list,
        description='origins allowed to call the gateway from a browser ("*": any); empty: CORS off',
    )
    allow_methods: list[str] = Field(
        default_factory=lambda: ["GET", "POST"], description="methods a browser may use across origins"
    )
    allow_headers: list[str] = Field(
        default_factory=lambda: ["*"],
        description='request headers a browser may send ("*": any, as vLLM allows; the OpenAI SDKs send'
        " their own `x-stainless-*` headers with every call)",
    )
    expose_headers: list[str] = Field(
        default_factory=lambda: [
            "x-request-id",
            "retry-after",
            "x-specroute-pool",
            "x-specroute-class",
            "x-specroute-reason",
            "x-specroute-predicted-speedup",
        ],
        description="response headers a browser script may read",
    )
    allow_credentials: bool = Field(default=False, description="let browsers send cookies and credentials")
    max_age_s: int = Field(default=600, ge=0, description="how long a browser may cache a preflight answer")

    @property
    def enabled(self) -> bool:
        return bool(self.allow_origins)

    @model_validator(mode="after")
    def _no_wildcard_with_credentials(self) -> CorsConfig:
        if self.allow_credentials and "*" in self.allow_origins:
            raise _Conflict(
                '`allow_credentials` needs explicit `allow_origins`, not "*"',
                "allow_credentials",
                "allow_origins",
            )
        return self


class LimitsConfig(_Strict):
    # vLLM itself sets no limit: images and audio come inline, base64 in the JSON (a 4 MB photo is a
    # 5.6 MB body), so the default leaves room for several; a body is read whole before it is forwarded
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        gt=0,
        description="larger request bodies get a 413 (images and audio come inline, base64-encoded)",
    )
    max_response_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=1024,
        description="the most of an upstream answer the gateway holds at once (a non-streamed body, one"
        " event of a stream, a stream assembled into one body): a larger one ends in a 502, not in"
        " the gateway's memory running out",
    )


class RoutingConfig(_Strict):
    strategy: Strategy = Field(
        default=Strategy.ADAPTIVE,
        description="adaptive: the pool predicted to finish sooner; classifier: by the prompt's class;"
        " always-speculative / always-baseline: one pool (all strategies measure and learn alike)",
    )
    allow_pool_override: bool = Field(
        default=True, description="a request header `x-specroute-pool` forces the pool"
    )
    margin: float = Field(
        default=0.1,
        ge=0,
        description="required relative TPOT gain to go speculative; with the per-request acceptance model"
        " it shrinks with the prediction's uncertainty (down to a fifth of it for a well-measured request)",
    )
    acceptance_model: Literal["per-request", "per-kind"] = Field(
        default="per-request",
        description="per-request: an online regression on each request's own features, exploring by"
        " what a measurement is worth; per-kind: one decayed mean per (kind, class), exploring at"
        " exploration_rate",
    )
    exploration_rate: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="share of requests predicted for baseline sent to speculative anyway; with the"
        " per-request model a floor under the exploration its uncertainty asks for",
    )
    exploration_horizon: float = Field(
        default=6.0,
        ge=0,
        description="with the per-request model, a request predicted for baseline is sent to speculative"
        " to be measured when what it may lose there is outweighed by what the measurement may win for"
        " it and this many later requests like it: average TPOT gain over the acceptance it may have,"
        " plus this many times the average of the gains that clear the margin, above 0 (and some must)",
    )
    scrape_interval_s: float = Field(
        default=3.0, gt=0, description="how often each endpoint's vLLM `/metrics` is read"
    )
    half_life_s: float = Field(default=60.0, gt=0, description="how fast live estimates forget")
    acceptance_half_life_s: float = Field(
        default=600.0,
        gt=0,
        description="how fast the per-request acceptance model's certainty fades (its weights' variance"
        " grows back to the prior's); sudden changes are caught by its change detector, not by this",
    )
    measure_interval_s: float = Field(
        default=0.02,
        ge=0,
        description="a non-streamed request to the speculative pool is streamed upstream and assembled, to"
        " measure its acceptance, when the per-request model is uncertain about it or this long has passed"
        " since that pool's last measured request; the others go upstream as sent (0: measure every one)",
    )
    measure_sd_share: float = Field(
        default=0.4,
        ge=0,
        le=1,
        description="uncertain: the prediction's sd is above this share of the prior's (0: measure every"
        " request the per-request model has a prediction for)",
    )
    seed: int | None = Field(default=None, description="seeds exploration, for reproducible runs")
    state_file: Path | None = Field(
        default=None,
        description="a file where what routing has learned is kept across restarts: read at start, written"
        " every state_save_interval_s and at shutdown (none: every start begins from the prior)",
    )
    state_save_interval_s: float = Field(
        default=60.0, ge=1, description="how often the learned state is written to state_file"
    )


class UpstreamTLSConfig(_Strict):
    """How the gateway checks ``https://`` endpoints, and the certificate it shows them (mutual TLS).

    One for every upstream: both pools serve the same model, usually behind the same CA.
    """

    ca_file: Path | None = Field(
        default=None,
        description="PEM bundle of the CAs that sign the upstreams' certificates; default: the system's",
    )
    cert_file: Path | None = Field(
        default=None, description="PEM client certificate (and its chain) for upstreams that ask for one"
    )
    key_file: Path | None = Field(
        default=None, description="the client certificate's private key, when not in cert_file"
    )
    verify: bool = Field(
        default=True, description="check the upstreams' certificates and host names (off: for tests only)"
    )

    @model_validator(mode="after")
    def _key_needs_cert(self) -> UpstreamTLSConfig:
        if self.key_file is not None and self.cert_file is None:
            raise _Conflict("`key_file` needs `cert_file`", "key_file", "cert_file")
        return self


class LoggingConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = Field(default=True, description="one JSON line per request on stdout")
    log_prompts: bool = Field(default=False, description="add the prompt to the access log line")


class ServerConfig(_Strict):
    host: str = Field(default="127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(
        default=1, ge=1, le=64, description="gateway processes; one per core the gateway has to itself"
    )
    shutdown_grace_s: float = Field(
        default=30.0, ge=0, description="after SIGTERM, how long in-flight requests and streams may finish"
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, description="to receive a request's line and headers once it has begun"
    )
    body_timeout_s: float = Field(default=30.0, gt=0, description="to receive a request's whole body")
    # Longer than the idle time after which common clients drop a pooled connection themselves (httpx, and
    # so the OpenAI SDK: 5 s; aiohttp: 15 s; Go's net/http, and so Go load tools: 90 s). A server that closes
    # first races the client's next request on that connection, which then fails without an answer (a POST
    # is not resent). Idle connections count towards ``max_connections``, which bounds what they can hold.
    keep_alive_s: float = Field(
        default=120.0,
        gt=0,
        description="an idle keep-alive connection is closed; keep it above your clients' own idle expiry",
    )
    max_header_bytes: int = Field(
        default=65536, ge=1024, description="longest request line and headers; beyond it a 431"
    )
    max_connections: int = Field(
        default=2048, ge=1, description="open connections per worker; beyond it a request gets a 503"
    )
    backlog: int = Field(default=2048, ge=1, description="connections the kernel queues before accept")
    tls_cert_file: Path | None = Field(
        default=None, description="PEM certificate (and chain) to serve https with; unset: plain http"
    )
    tls_key_file: Path | None = Field(
        default=None, description="the certificate's private key, when not in tls_cert_file"
    )
    tls_client_ca_file: Path | None = Field(
        default=None,
        description="CAs whose client certificates every caller must show (mutual TLS); unset: none asked",
    )

    @model_validator(mode="after")
    def _tls_needs_cert(self) -> ServerConfig:
        if self.tls_cert_file is None and (self.tls_key_file or self.tls_client_ca_file):
            raise _Conflict(
                "`tls_key_file` and `tls_client_ca_file` need `tls_cert_file`",
                "tls_key_file",
                "tls_client_ca_file",
                "tls_cert_file",
            )
        return self


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="__",
        env_parse_none_str="null",  # as the file writes it: a setting the file gives can be unset
        extra="forbid",
        frozen=True,
    )

    server: ServerConfig = ServerConfig()
    pools: PoolsConfig
    timeouts: TimeoutsConfig = TimeoutsConfig()
    retries: RetryConfig = RetryConfig()
    health: HealthConfig = HealthConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    cors: CorsConfig = CorsConfig()
    routing: RoutingConfig = RoutingConfig()
    upstream_tls: UpstreamTLSConfig = UpstreamTLSConfig()
    logging: LoggingConfig = LoggingConfig()

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Flags (init kwargs) beat the environment, which beats the file.
        return init_settings, env_settings, _FileSource(settings_cls)

    @field_validator("pools")
    @classmethod
    def _models_match(cls, pools: PoolsConfig) -> PoolsConfig:
        spec, base = set(pools.speculative.models), set(pools.baseline.models)
        if spec != base:
            # Both pools serve the same target; a model on one side only cannot fail over.
            raise _Conflict(
                f"both pools must serve the same models (speculative {spec}, baseline {base})",
                "speculative.models",
                "baseline.models",
            )
        return pools

    def served_models(self) -> list[str]:
        return list(self.pools.baseline.models)


_FILE_DATA: ContextVar[dict[str, Any] | None] = ContextVar("specroute_config_file", default=None)


class _FileSource(PydanticBaseSettingsSource):
    """The YAML file's values, below the environment: the file read by :func:`load_settings`."""

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return (_FILE_DATA.get() or {}).get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_FILE_DATA.get() or {})


class ConfigError(Exception):
    """Configuration that cannot start the gateway; the message names the bad field."""


_MISSING = object()


def _has(data: Any, loc: tuple[str | int, ...]) -> bool:
    node: Any = data
    for part in loc:
        if isinstance(node, list) and isinstance(part, int):
            node = node[part] if -len(node) <= part < len(node) else _MISSING  # a JSON list's index
        else:
            node = node.get(part, _MISSING) if isinstance(node, dict) else _MISSING
        if node is _MISSING:
            return False
    return True


def _env_var(loc: tuple[str | int, ...]) -> str:
    return ENV_PREFIX + "__".join(str(p).upper() for p in loc)


def _env_name(loc: tuple[str | int, ...]) -> str | None:
    """The environment variable that set ``loc``: its own, a parent's whose JSON holds it, or one below it.

    One below it: a key the section does not have (``SPECROUTE_ROUTING__BOGUS``) is reported at that key,
    and a section's own rule at the section, while the environment sets their fields one by one.
    """
    names = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
    own = _env_var(loc)
    if own in names:
        return own
    for n in range(len(loc) - 1, 0, -1):
        parent = _env_var(loc[:n])
        if parent in names:
            try:
                value = json.loads(names[parent])
            except ValueError:
                continue
            if _has(value, loc[n:]):
                return parent
    below = sorted(name for name in names if name.startswith(own + "__"))
    return below[0] if below else None


def _source(
    loc: tuple[str | int, ...], file: str | None, file_data: dict[str, Any], flags: dict[str, Any]
) -> str | None:
    """The source whose value of ``loc`` the settings hold (the highest that set it), or None if none did."""
    if _has(flags, loc):
        return "command line"
    env = _env_name(loc)
    if env is not None:
        return f"environment variable {env}"
    if file is not None and _has(file_data, loc):
        return file
    return None


def _where(
    loc: tuple[str | int, ...],
    fields: tuple[str, ...],
    file: str | None,
    file_data: dict[str, Any],
    flags: dict[str, Any],
) -> str:
    """Which sources gave the bad value: for a rule across ``fields``, those that set any of them."""
    found: list[str] = []
    for field in fields:
        source = _source(loc + tuple(field.split(".")), file, file_data, flags)
        if source is not None and source not in found:
            found.append(source)
    if not found:
        found.append(_source(loc, file, file_data, flags) or file or "defaults")
    # the overriding source first: the command line, then the environment, then the file
    rank = {"command line": 0}
    return " and ".join(sorted(found, key=lambda s: rank.get(s, 1 if s.startswith("environment") else 2)))


def _format_validation_error(
    err: ValidationError, file: str | None, file_data: dict[str, Any], flags: dict[str, Any]
) -> str:
    """One line: every bad key, what is wrong with it and the source that gave it."""
    problems = []
    errors = err.errors()
    for e in errors[:MAX_PROBLEMS]:
        loc = tuple(e["loc"])
        key = _shown(".".join(str(p) for p in loc) or "<root>")
        cause = e.get("ctx", {}).get("error")
        fields = cause.fields if isinstance(cause, _Conflict) else ()
        problems.append(f"{key}: {e['msg']} (from {_where(loc, fields, file, file_data, flags)})")
    if len(errors) > MAX_PROBLEMS:
        problems.append(f"and {len(errors) - MAX_PROBLEMS} more")
    return "invalid configuration: " + "; ".join(problems)


#: the most problems one message lists, and the longest key it shows: a key comes from the file, and a file
#: given by mistake (a secrets file, a .netrc) would otherwise be echoed into the log line by line
MAX_PROBLEMS = 12
MAX_KEY_SHOWN = 60


def _shown(key: str) -> str:
    return key if len(key) <= MAX_KEY_SHOWN else key[: MAX_KEY_SHOWN - 1] + "…"


def _is_structured(annotation: Any) -> bool:
    """Whether a field's value is a list, mapping or section: what the environment must spell as JSON."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    origin = get_origin(annotation)
    if origin in (list, dict, set, tuple):
        return True
    return any(_is_structured(arg) for arg in get_args(annotation) if arg is not type(None))


def _field_at(path: list[str]) -> Any:
    """The annotation of the settings field at ``path`` (lower-case names), or None if there is none."""
    model: Any = Settings
    annotation: Any = None
    for part in path:
        fields = getattr(model, "model_fields", None)
        if not fields or part not in fields:
            return None
        annotation = fields[part].annotation
        model = annotation
    return annotation


def _undecodable_env() -> list[tuple[str, str]]:
    """(variable, key) for each ``SPECROUTE_`` variable that sets a list or mapping with non-JSON text."""
    found = []
    for name, value in sorted(os.environ.items()):
        if not name.upper().startswith("SPECROUTE_"):
            continue
        path = name[len("SPECROUTE_") :].lower().split("__")
        annotation = _field_at(path)
        if annotation is None or not _is_structured(annotation):
            continue
        try:
            json.loads(value)
        except ValueError:
            found.append((name, ".".join(path)))
    return found


def _env_decode_error(err: SettingsError) -> str:
    """pydantic-settings names only the section: name the variable, never its value (keys are secret)."""
    culprits = _undecodable_env()
    if not culprits:
        cause = f": {err.__cause__}" if err.__cause__ else ""
        return f"invalid configuration in the environment: {err}{cause}"
    name, key = culprits[0]
    return (
        f"invalid configuration: {key}: the value of environment variable {name} is not JSON; lists and"
        f' mappings are written as JSON there, e.g. SPECROUTE_AUTH__API_KEYS=\'["k1", "k2"]\''
    )


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key written twice in one mapping.

    PyYAML keeps the last of two equal keys without a word: a section written twice (``auth:`` near the
    top with the keys, again further down with one flag) would lose the first one whole, and a gateway
    meant to ask for keys would start open. YAML itself says a mapping's keys are unique.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_at: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: keys written here override it
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = first_at.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key: the safe loader itself says what is wrong with it
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"the key {key!r} is given twice (first on line {first.line + 1}); one would be lost",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _yaml_problem(path: str | Path, err: yaml.YAMLError) -> str:
    """A YAML error in one line, with the line and column it was found at."""
    mark = getattr(err, "problem_mark", None)
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark is not None else str(path)
    return f"configuration {where} is not valid YAML: {problem}"


#: ``SPECROUTE_`` variables that are no setting but the project's own, accepted beside the settings.
NON_SETTING_ENV = frozenset(
    {
        "SPECROUTE_RUN_TOKEN",  # gateway.types.RUN_TOKEN_ENV: proves a started server is the one started
        "SPECROUTE_PARENT_PID",  # gateway.stack: a started server stops with the process that started it
        "SPECROUTE_CONFIG_FILE",  # gateway.server.CONFIG_ENV: the file each of several workers loads
        "SPECROUTE_SUPERVISOR_PID",  # gateway.server.SUPERVISOR_ENV: the process each worker watches
        "SPECROUTE_GIT_REVISION",  # gateway.observability.REVISION_ENV: the image's revision (Dockerfile)
        "SPECROUTE_SRC",  # the peer benchmark (shared/tools/peer_bench): the checkout it runs
        "SPECROUTE_WORKERS",  # the peer benchmark's run script: its gateway's server.workers
        # the real-vLLM test run (tests/integration/real_vllm), whose gateways inherit its environment
        "SPECROUTE_VLLM_HOME",
        "SPECROUTE_VLLM_PYTHON",
        "SPECROUTE_MAIN_PYTHON",
        "SPECROUTE_TORCH_INDEX_URL",
        "SPECROUTE_VLLM_VENV",
        "SPECROUTE_VLLM_MODELS",
        "SPECROUTE_VLLM_CACHE_ROOT",
        "SPECROUTE_VLLM_LOG_DIR",
        "SPECROUTE_VLLM_START_TIMEOUT",
    }
)


def _env_names(model: Any, prefix: str) -> list[str]:
    """Every variable that sets a key or a whole section of ``model``, for a "did you mean"."""
    names = []
    for name, info in model.model_fields.items():
        var = f"{prefix}{name.upper()}"
        names.append(var)
        for arg in (info.annotation, *get_args(info.annotation)):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                names.extend(_env_names(arg, var + "__"))
    return names


def _key_variables(data: Any) -> set[str]:
    """The variables a configuration names as ``api_key_env``: an upstream's key, no setting."""
    if isinstance(data, list):
        return set().union(*(_key_variables(v) for v in data))
    if not isinstance(data, dict):
        return set()
    found = {data["api_key_env"].upper()} if isinstance(data.get("api_key_env"), str) else set()
    return found.union(*(_key_variables(v) for v in data.values()))


def _is_service_link(name: str, names: set[str]) -> bool:
    """One of the variables Kubernetes sets in every Pod for each Service of the namespace.

    A Service named ``specroute`` (deploy/k8s/base/service.yaml) gives ``SPECROUTE_SERVICE_HOST``,
    ``SPECROUTE_SERVICE_PORT[_<port name>]``, ``SPECROUTE_PORT`` and ``SPECROUTE_PORT_<port>_TCP[_...]``;
    one named ``specroute-x``, the same with ``SPECROUTE_X_``. ``<name>_SERVICE_HOST`` is always among them.
    """
    for host in names:
        if host.endswith("_SERVICE_HOST"):
            service = host[: -len("_SERVICE_HOST")]
            if name.startswith((service + "_SERVICE_", service + "_PORT_")) or name == service + "_PORT":
                return True
    return False


def _unknown_env(file_data: dict[str, Any], flags: dict[str, Any]) -> str | None:
    """A line naming each ``SPECROUTE_`` variable that sets no setting, or None when there is none.

    pydantic-settings reads only the variables of known sections and ignores the rest, so a misspelled
    section (``SPECROUTE_ROUTNG__STRATEGY``) would leave its key at the default without a word.
    """
    env = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
    sections = list(Settings.model_fields)
    allowed = set(NON_SETTING_ENV) | _key_variables(file_data) | _key_variables(flags)
    for name, value in env.items():
        path = name[len(ENV_PREFIX) :].lower().split("__")
        if path[0] not in sections:
            continue
        if path[-1] == "api_key_env":
            allowed.add(value.upper())
        else:
            with contextlib.suppress(ValueError):  # not JSON: a scalar, or an error reported later
                allowed |= _key_variables(json.loads(value))
    unknown = [
        name
        for name in sorted(env)
        if name[len(ENV_PREFIX) :].split("__")[0].lower() not in sections
        and name not in allowed
        and not _is_service_link(name, set(env))
    ]
    if not unknown:
        return None
    known = _env_names(Settings, ENV_PREFIX)
    problems = []
    for name in unknown:
        suffixes = [k[len(ENV_PREFIX) :] for k in known]  # the shared prefix would make every name close
        close = difflib.get_close_matches(name[len(ENV_PREFIX) :], suffixes, n=1, cutoff=0.8)
        hint = f" (did you mean {ENV_PREFIX}{close[0]}?)" if close else ""
        problems.append(f"environment variable {name} sets no setting{hint}")
    return (
        "invalid configuration: "
        + "; ".join(problems)
        + f"; settings are {ENV_PREFIX}<SECTION>__<KEY>, the sections "
        + ", ".join(sections)
    )


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read the YAML file at ``path`` (if any), then the environment, then ``overrides`` (flags) on top."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            # YAML is UTF-8 whatever the locale says (a minimal container's is often C/POSIX)
            raw = yaml.load(Path(path).read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # safe loader
        except OSError as e:
            raise ConfigError(f"cannot read configuration {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise ConfigError(
                f"configuration {path} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start})"
            ) from None
        except yaml.YAMLError as e:
            raise ConfigError(_yaml_problem(path, e)) from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"configuration {path} must be a mapping at the top level")
        if raw and not any(isinstance(k, str) and k in Settings.model_fields for k in raw):
            # not one section of ours: most likely another file given by mistake, whose keys (secrets,
            # perhaps) need not be listed back
            raise ConfigError(
                f"configuration {path} does not look like a SpecRoute configuration: none of its"
                f" {len(raw)} top-level keys is a section ({', '.join(Settings.model_fields)})"
            )
        data = raw
    flags = overrides or {}
    unknown = _unknown_env(data, flags)
    if unknown is not None:
        raise ConfigError(unknown)
    token = _FILE_DATA.set(data)
    try:
        return Settings(**flags)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, str(path) if path else None, data, flags)) from None
    except SettingsError as e:
        # pydantic-settings could not decode a variable (a list or mapping must be JSON there)
        raise ConfigError(_env_decode_error(e)) from None
    finally:
        _FILE_DATA.reset(token)


class _ServerOnly(BaseSettings):
    """The ``server`` section alone, from the environment: where a gateway listens, pools or not."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", env_parse_none_str="null", frozen=True
    )

    server: ServerConfig = ServerConfig()


def load_server(path: str | Path | None = None) -> ServerConfig:
    """Where the gateway started with ``path`` listens: the whole configuration checked, as it would be
    at start; without a file, the ``server`` section from the environment alone (the defaults for the
    rest), since a caller that only needs the address needs no pools."""
    if path is not None:
        return load_settings(path).server
    try:
        return _ServerOnly().server
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, None, {}, {})) from None
    except SettingsError as e:
        raise ConfigError(_env_decode_error(e)) from None


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
