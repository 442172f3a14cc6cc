"""Running the gateway under uvicorn (uvloop + httptools), one or several worker processes."""

from __future__ import annotations

import os
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from gateway.config import Settings, load_settings
from gateway.observability import configure_logging

CONFIG_ENV = "SPECROUTE_CONFIG_FILE"


def app_from_env() -> FastAPI:
    """Factory for worker processes: each loads the configuration named in the environment."""
    from gateway.app import create_app

    path = os.environ.get(CONFIG_ENV)
    return create_app(load_settings(path))


def serve(settings: Settings, config_path: Path | None = None) -> None:
    from gateway.app import create_app

    configure_logging(settings.logging.level)
    server = settings.server
    common = dict(
        host=server.host,
        port=server.port,
        loop="uvloop",
        http="httptools",
        log_level=settings.logging.level if settings.logging.level != "info" else "warning",
        access_log=False,
        timeout_graceful_shutdown=server.shutdown_grace_s,
        server_header=False,
    )
    if server.workers > 1:
        if config_path is None:
            raise ValueError("several workers need a configuration file")
        os.environ[CONFIG_ENV] = str(config_path)
        uvicorn.run("gateway.server:app_from_env", factory=True, workers=server.workers, **common)  # type: ignore[arg-type]
    else:
        uvicorn.run(create_app(settings), **common)  # type: ignore[arg-type]
