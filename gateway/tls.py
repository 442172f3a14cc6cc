"""TLS on both sides of the gateway: the context for ``https://`` endpoints, and uvicorn's for callers.

Upstream (``upstream_tls``): built once at start-up and given to the one aiohttp connector, so
forwarding, health checks, scrapes and discovery all check upstreams alike. Callers (``server.tls_*``):
uvicorn serves https with the certificate and, for mutual TLS, asks every caller for one. Either way a
file that cannot be used stops start-up with a line naming its field, not the first request or
uvicorn's traceback after the pools have started.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

from gateway.config import ConfigError, ServerConfig, UpstreamTLSConfig


def upstream_context(cfg: UpstreamTLSConfig) -> ssl.SSLContext:
    """The client context ``cfg`` describes; :class:`ConfigError` if one of its files cannot be used."""
    try:
        ctx = ssl.create_default_context(cafile=cfg.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"upstream_tls.ca_file: cannot load {cfg.ca_file}: {_why(e)}") from None
    if not cfg.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file is not None:
        _load_chain(ctx, cfg.cert_file, cfg.key_file, "upstream_tls.cert_file")
    return ctx


def server_options(server: ServerConfig) -> dict[str, Any]:
    """uvicorn's options for serving https, from ``server.tls_*``; none for plain http."""
    if server.tls_cert_file is None:
        return {}
    options: dict[str, Any] = {"ssl_certfile": str(server.tls_cert_file)}
    if server.tls_key_file is not None:
        options["ssl_keyfile"] = str(server.tls_key_file)
    if server.tls_client_ca_file is not None:
        options["ssl_ca_certs"] = str(server.tls_client_ca_file)
        options["ssl_cert_reqs"] = ssl.CERT_REQUIRED
    return options


def check_server(server: ServerConfig) -> None:
    """Load the files ``server.tls_*`` name, as uvicorn will; :class:`ConfigError` if one cannot be used."""
    if server.tls_cert_file is None:
        return
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _load_chain(ctx, server.tls_cert_file, server.tls_key_file, "server.tls_cert_file")
    if server.tls_client_ca_file is not None:
        try:
            ctx.load_verify_locations(server.tls_client_ca_file)
        except (OSError, ssl.SSLError) as e:
            where = f"server.tls_client_ca_file: cannot load {server.tls_client_ca_file}"
            raise ConfigError(f"{where}: {_why(e)}") from None


def _load_chain(ctx: ssl.SSLContext, cert: Path, key: Path | None, field: str) -> None:
    try:
        ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as e:
        files = f"{cert}" + (f" and {key}" if key else "")
        raise ConfigError(f"{field}: cannot load {files}: {_why(e)}") from None


def _why(error: OSError) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    return error.strerror or str(error)
