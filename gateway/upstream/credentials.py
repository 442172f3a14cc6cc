"""API keys of upstreams started with ``vllm serve --api-key``: read once, sent on every upstream call.

Every call the gateway makes to an upstream goes through the one aiohttp session (forwarding
directly; health checks, scrapes, discovery and ``/v1/models`` through httpx over it), so a session
middleware adds the key to all of them, and it replaces any ``Authorization`` header a request
carried. The middleware sees a URL only, so keys are looked up by the endpoint whose base URL the
call's URL starts with, the longest one winning: two vLLM servers behind one proxy at different paths
of the same origin each get their own key. Configured endpoints are known from the start; discovered
ones carry the key of the pool that lists them. One URL is one server, so endpoints configured at the
same base URL must name the same key (or only one of them names one). Keys are held as
:class:`~pydantic.SecretStr`, so no repr or log line shows them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import aiohttp
from pydantic import SecretStr
from yarl import URL

from gateway.config import ConfigError, PoolName, Settings, UpstreamKeyConfig, unsendable
from gateway.upstream.pool import Endpoint, Pool


def read_key(cfg: UpstreamKeyConfig, where: str) -> SecretStr | None:
    """The key from ``cfg``'s source, or None when it names none; :class:`ConfigError` if unusable.

    Unusable is also a key no header can carry (:func:`~gateway.config.unsendable`): taken, it would
    fail every call to its upstream inside the HTTP client, requests and health checks alike.
    """
    if cfg.api_key_env is not None:
        field, value = f"{where}.api_key_env", os.environ.get(cfg.api_key_env)
        if value is None:
            raise ConfigError(f"{field}: environment variable {cfg.api_key_env} is not set")
        source = f"environment variable {cfg.api_key_env}"
    elif cfg.api_key_file is not None:
        field = f"{where}.api_key_file"
        try:
            value = cfg.api_key_file.read_text()
        except OSError as e:
            raise ConfigError(f"{field}: cannot read {cfg.api_key_file}: {e.strerror}") from None
        except UnicodeDecodeError:
            raise ConfigError(f"{field}: {cfg.api_key_file} is not text") from None
        source = str(cfg.api_key_file)
    else:
        return None
    return SecretStr(_usable(value.strip(), field, source))


def _usable(key: str, field: str, source: str) -> str:
    """``key`` if a header can carry it; else :class:`ConfigError` naming ``field``, never the key."""
    if not key:
        raise ConfigError(f"{field}: {source} is empty")
    if (why := unsendable(key)) is not None:
        raise ConfigError(f"{field}: the key in {source} holds {why}; a key must be printable ASCII")
    return key


#: the most call paths whose discovered endpoint's key is remembered at once
FOUND_MAX = 4096


def _split(url: str | URL) -> tuple[str, str]:
    """``(origin, path)`` with the path's trailing ``/`` dropped, as base URLs are compared."""
    u = URL(url)
    return str(u.origin()), u.path.rstrip("/")


def _under(path: str, prefix: str) -> bool:
    """Whether ``path`` is ``prefix`` or below it (``/spec`` covers ``/spec/health``, not ``/specx``)."""
    return not prefix or path == prefix or path.startswith(prefix + "/")


class UpstreamKeys:
    """Which key goes to which upstream."""

    def __init__(self, settings: Settings, pools: Mapping[PoolName, Pool]):
        self.pools = pools
        self.by_pool: dict[PoolName, SecretStr | None] = {}
        #: per origin, the configured endpoints' ``(path, key)``, longest path first
        self.by_origin: dict[str, list[tuple[str, SecretStr | None]]] = {}
        # discovered endpoints' keys by (origin, path) of the call, valid while the pools' endpoint
        # lists are the ones in ``_lists`` (discovery replaces a list when it changes the membership,
        # and an address that left one pool may join the other)
        self._found: dict[tuple[str, str], SecretStr | None] = {}
        self._lists: list[list[Endpoint]] = []
        configured: dict[tuple[str, str], tuple[str, SecretStr | None]] = {}
        for name, cfg in settings.pools.items():
            pool_key = self.by_pool[name] = read_key(cfg, f"pools.{name}")
            for i, e in enumerate(cfg.endpoints):
                at = f"pools.{name}.endpoints.{i}"
                key = (read_key(e, at) if e.has_key_source else None) or pool_key
                spot = _split(e.base_url)
                if spot in configured:  # one server listed twice (in both pools, say)
                    first, other = configured[spot]
                    if (
                        key is not None
                        and other is not None
                        and key.get_secret_value() != other.get_secret_value()
                    ):
                        raise ConfigError(
                            f"{at}: {first} has the same URL and another key; one URL takes one key"
                        )
                    at, key = first, key or other  # where only one names a key, that server needs it
                configured[spot] = (at, key)
        for (origin, path), (_, key) in sorted(configured.items(), key=lambda item: -len(item[0][1])):
            self.by_origin.setdefault(origin, []).append((path, key))

    def __bool__(self) -> bool:
        return any(self.by_pool.values()) or any(k for entries in self.by_origin.values() for _, k in entries)

    def key_for(self, url: URL) -> SecretStr | None:
        """The key of the endpoint ``url`` calls: the longest base URL that ``url`` starts with decides."""
        origin, path = str(url.origin()), url.path
        for prefix, key in self.by_origin.get(origin, ()):
            if _under(path, prefix):
                return key
        return self._discovered(origin, path)

    def _discovered(self, origin: str, path: str) -> SecretStr | None:
        """The key of the pool listing an endpoint at ``origin`` whose path covers ``path``, if one does."""
        lists = [p.endpoints for p in self.pools.values()]
        if len(lists) != len(self._lists) or any(a is not b for a, b in zip(lists, self._lists, strict=True)):
            self._found.clear()
            self._lists = lists
        if (origin, path) in self._found:
            return self._found[origin, path]
        if len(self._found) >= FOUND_MAX:  # paths of passed-through calls are the clients' to choose
            self._found.clear()
        for name, pool in self.pools.items():
            for e in pool.endpoints:
                o, p = _split(e.base_url)
                if o == origin and _under(path, p):
                    key = self._found[origin, path] = self.by_pool.get(name)
                    return key
        return None  # not cached: a new endpoint is health-checked before its pool lists it

    async def middleware(
        self, request: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        key = self.key_for(request.url)
        if key is not None:
            request.headers["Authorization"] = "Bearer " + key.get_secret_value()
        return await handler(request)
