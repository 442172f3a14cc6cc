"""The TLS context of every call to an ``https://`` endpoint: which CAs to trust, which certificate to show.

Built once at start-up from ``upstream_tls`` and given to the one aiohttp connector, so forwarding,
health checks, scrapes and discovery all check upstreams alike. An unreadable file stops start-up with
the field that names it, not the first request.
"""

from __future__ import annotations

import ssl

from gateway.config import ConfigError, UpstreamTLSConfig


def context(cfg: UpstreamTLSConfig) -> ssl.SSLContext:
    """The client context ``cfg`` describes; :class:`ConfigError` if one of its files cannot be used."""
    try:
        ctx = ssl.create_default_context(cafile=cfg.ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"upstream_tls.ca_file: cannot load {cfg.ca_file}: {_why(e)}") from None
    if not cfg.verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    if cfg.cert_file is not None:
        try:
            ctx.load_cert_chain(cfg.cert_file, cfg.key_file)
        except (OSError, ssl.SSLError) as e:
            files = f"{cfg.cert_file}" + (f" and {cfg.key_file}" if cfg.key_file else "")
            raise ConfigError(f"upstream_tls.cert_file: cannot load {files}: {_why(e)}") from None
    return ctx


def _why(error: OSError | ssl.SSLError) -> str:
    if isinstance(error, ssl.SSLError):
        return error.reason or str(error)
    return error.strerror or str(error)
