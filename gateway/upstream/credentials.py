"""API keys of upstreams started with ``vllm serve --api-key``: read once, sent on every upstream call.

Every call the gateway makes to an upstream goes through the one aiohttp session (forwarding
directly; health checks, scrapes, discovery and ``/v1/models`` through httpx over it), so a session
middleware adds the key to all of them, and it replaces any ``Authorization`` header a request
carried. Keys are looked up by the URL's origin: configured endpoints by their own URL, discovered
ones by the pool that lists them. Keys are held as :class:`~pydantic.SecretStr`, so no repr or log
line shows them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import aiohttp
from pydantic import SecretStr
from yarl import URL

from gateway.config import ConfigError, PoolName, Settings, UpstreamKeyConfig
from gateway.upstream.pool import Pool


def read_key(cfg: UpstreamKeyConfig, where: str) -> SecretStr | None:
    """The key from ``cfg``'s source, or None when it names none; :class:`ConfigError` if unreadable."""
    if cfg.api_key_env is not None:
        value = os.environ.get(cfg.api_key_env, "").strip()
        if not value:
            raise ConfigError(f"{where}.api_key_env: environment variable {cfg.api_key_env} is not set")
        return SecretStr(value)
    if cfg.api_key_file is not None:
        try:
            value = cfg.api_key_file.read_text().strip()
        except OSError as e:
            raise ConfigError(f"{where}.api_key_file: cannot read {cfg.api_key_file}: {e.strerror}") from None
        if not value:
            raise ConfigError(f"{where}.api_key_file: {cfg.api_key_file} is empty")
        return SecretStr(value)
    return None


def _origin(url: str | URL) -> str:
    return str(URL(url).origin())


class UpstreamKeys:
    """Which key goes to which upstream."""

    def __init__(self, settings: Settings, pools: Mapping[PoolName, Pool]):
        self.pools = pools
        self.by_pool: dict[PoolName, SecretStr | None] = {}
        self.by_origin: dict[str, SecretStr | None] = {}
        for name, cfg in settings.pools.items():
            pool_key = self.by_pool[name] = read_key(cfg, f"pools.{name}")
            for i, e in enumerate(cfg.endpoints):
                own = read_key(e, f"pools.{name}.endpoints.{i}") if e.has_key_source else None
                self.by_origin[_origin(e.base_url)] = own or pool_key

    def __bool__(self) -> bool:
        return any(self.by_pool.values()) or any(self.by_origin.values())

    def key_for(self, url: URL) -> SecretStr | None:
        origin = _origin(url)
        if origin in self.by_origin:
            return self.by_origin[origin]
        for name, pool in self.pools.items():  # discovered endpoints carry their pool's key
            if any(_origin(e.base_url) == origin for e in pool.endpoints):
                key = self.by_origin[origin] = self.by_pool.get(name)
                return key
        return None

    async def middleware(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        key = self.key_for(request.url)
        if key is not None:
            request.headers["Authorization"] = "Bearer " + key.get_secret_value()
        return await handler(request)
