"""Gateway configuration: one YAML file, overridable from the environment.

Environment variables use the prefix ``SPECROUTE_`` and ``__`` as the nesting separator, e.g.
``SPECROUTE_ROUTING__STRATEGY=always-baseline`` or ``SPECROUTE_AUTH__API_KEYS='["k1"]'``.
Invalid configuration raises :class:`ConfigError` whose message names the bad field.
"""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

PoolName = Literal["speculative", "baseline"]
POOL_NAMES: tuple[PoolName, PoolName] = ("speculative", "baseline")


class Strategy(StrEnum):
    ADAPTIVE = "adaptive"
    CLASSIFIER = "classifier"
    ALWAYS_SPECULATIVE = "always-speculative"
    ALWAYS_BASELINE = "always-baseline"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EndpointConfig(_Strict):
    name: str = Field(min_length=1, max_length=64)
    url: HttpUrl
    weight: float = Field(default=1.0, gt=0)

    @property
    def base_url(self) -> str:
        return str(self.url).rstrip("/")


class DiscoveryConfig(_Strict):
    """Endpoints from the DNS of a headless Service, re-resolved every ``interval_s``."""

    hostname: str = Field(min_length=1)
    port: int = Field(default=8000, ge=1, le=65535)
    scheme: Literal["http", "https"] = "http"
    interval_s: float = Field(default=10.0, gt=0)


class PoolConfig(_Strict):
    endpoints: list[EndpointConfig] = Field(default_factory=list)
    discovery: DiscoveryConfig | None = None
    models: list[str] = Field(min_length=1, description="Served model names")
    num_speculative_tokens: int | None = Field(default=None, ge=1, le=64)
    draft_cost_ratio: float | None = Field(default=None, ge=0, lt=1)

    @model_validator(mode="after")
    def _has_endpoints(self) -> PoolConfig:
        if not self.endpoints and self.discovery is None:
            raise ValueError("a pool needs `endpoints` or `discovery`")
        names = [e.name for e in self.endpoints]
        if len(names) != len(set(names)):
            raise ValueError("endpoint names must be unique within a pool")
        return self


class PoolsConfig(_Strict):
    speculative: PoolConfig
    baseline: PoolConfig

    def items(self) -> list[tuple[PoolName, PoolConfig]]:
        return [("speculative", self.speculative), ("baseline", self.baseline)]


class TimeoutsConfig(_Strict):
    connect_s: float = Field(default=2.0, gt=0)
    first_byte_s: float = Field(default=60.0, gt=0, description="until the upstream's response headers")
    chunk_gap_s: float = Field(default=30.0, gt=0, description="longest silence inside a stream")
    total_s: float = Field(default=600.0, gt=0)


class RetryConfig(_Strict):
    attempts: int = Field(default=3, ge=1, le=10, description="tries in all, across endpoints and pools")
    failover_to_other_pool: bool = True
    backoff_s: float = Field(default=0.0, ge=0)


class HealthConfig(_Strict):
    interval_s: float = Field(default=5.0, gt=0)
    timeout_s: float = Field(default=2.0, gt=0)
    path: str = "/health"
    eject_after_failures: int = Field(default=2, ge=1)
    eject_base_s: float = Field(default=2.0, gt=0)
    eject_max_s: float = Field(default=60.0, gt=0)


class AuthConfig(_Strict):
    api_keys: list[str] = Field(default_factory=list)
    admin_key: str | None = None


class LimitsConfig(_Strict):
    max_body_bytes: int = Field(default=4 * 1024 * 1024, gt=0)


class RoutingConfig(_Strict):
    strategy: Strategy = Strategy.ADAPTIVE
    allow_pool_override: bool = True
    margin: float = Field(
        default=0.1,
        ge=0,
        description="required relative TPOT gain to go speculative; with the per-request acceptance model"
        " it shrinks with the prediction's uncertainty (down to a fifth of it for a well-measured request)",
    )
    acceptance_model: Literal["per-request", "per-kind"] = Field(
        default="per-request",
        description="per-request: an online regression on each request's own features, exploring by"
        " Thompson sampling; per-kind: one decayed mean per (kind, class), exploring at exploration_rate",
    )
    exploration_rate: float = Field(
        default=0.02,
        ge=0,
        le=1,
        description="share of requests predicted for baseline sent to speculative anyway; with the"
        " per-request model a floor under the exploration its uncertainty asks for",
    )
    scrape_interval_s: float = Field(default=3.0, gt=0)
    half_life_s: float = Field(default=60.0, gt=0, description="how fast live estimates forget")
    acceptance_half_life_s: float = Field(
        default=600.0,
        gt=0,
        description="how fast the per-request acceptance model's certainty fades (its weights' variance"
        " grows back to the prior's); sudden changes are caught by its change detector, not by this",
    )
    seed: int | None = None


class LoggingConfig(_Strict):
    level: Literal["debug", "info", "warning", "error"] = "info"
    access_log: bool = True
    log_prompts: bool = False


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    workers: int = Field(default=1, ge=1, le=64)
    shutdown_grace_s: float = Field(default=30.0, ge=0)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SPECROUTE_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    server: ServerConfig = ServerConfig()
    pools: PoolsConfig
    timeouts: TimeoutsConfig = TimeoutsConfig()
    retries: RetryConfig = RetryConfig()
    health: HealthConfig = HealthConfig()
    auth: AuthConfig = AuthConfig()
    limits: LimitsConfig = LimitsConfig()
    routing: RoutingConfig = RoutingConfig()
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
        # The environment wins over the file (passed as init kwargs).
        return env_settings, init_settings

    @field_validator("pools")
    @classmethod
    def _models_match(cls, pools: PoolsConfig) -> PoolsConfig:
        spec, base = set(pools.speculative.models), set(pools.baseline.models)
        if spec != base:
            # Both pools serve the same target; a model on one side only cannot fail over.
            raise ValueError(f"both pools must serve the same models (speculative {spec}, baseline {base})")
        return pools

    def served_models(self) -> list[str]:
        return list(self.pools.baseline.models)


class ConfigError(Exception):
    """Configuration that cannot start the gateway; the message names the bad field."""


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration in {source}:"]
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


def load_settings(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read the YAML file at ``path`` (if any), apply ``overrides`` and the environment."""
    data: dict[str, Any] = {}
    source = "environment"
    if path is not None:
        source = str(path)
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except OSError as e:
            raise ConfigError(f"cannot read configuration {path}: {e.strerror}") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"configuration {path} is not valid YAML: {e}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise ConfigError(f"configuration {path} must be a mapping at the top level")
        data = raw
    if overrides:
        data = _deep_merge(data, overrides)
    try:
        return Settings(**data)
    except ValidationError as e:
        raise ConfigError(_format_validation_error(e, source)) from None


def _deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out
