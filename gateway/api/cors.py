"""Cross-origin requests: Starlette's ``CORSMiddleware`` around the whole gateway, when configured.

Off by default (``cors.allow_origins`` empty): a browser's preflight then gets a 405 like any
unsupported method. On, the middleware answers preflights itself and adds the CORS headers to every
response, the two completion routes' fast path included (it wraps the outermost application).
"""

from __future__ import annotations

from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp

from gateway.config import CorsConfig


def with_cors(app: ASGIApp, cors: CorsConfig) -> ASGIApp:
    """``app`` behind the configured CORS policy, or ``app`` itself when CORS is off."""
    if not cors.enabled:
        return app
    return CORSMiddleware(
        app,
        allow_origins=cors.allow_origins,
        allow_methods=cors.allow_methods,
        allow_headers=cors.allow_headers,
        allow_credentials=cors.allow_credentials,
        expose_headers=cors.expose_headers,
        max_age=cors.max_age_s,
    )
