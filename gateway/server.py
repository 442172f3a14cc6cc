"""Running the gateway under uvicorn (uvloop + httptools), one or several worker processes."""

from __future__ import annotations

import contextlib
import errno
import http.client
import logging
import os
import shutil
import signal
import socket
import ssl
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp
from uvicorn.supervisors import Multiprocess

from gateway.config import ConfigError, ServerConfig, Settings, load_settings
from gateway.connections import ConnectionLimits, GuardedHttpProtocol
from gateway.observability import MULTIPROC_ENV, configure_logging
from gateway.tls import check_server, server_options, upstream_context

CONFIG_ENV = "SPECROUTE_CONFIG_FILE"
SUPERVISOR_ENV = "SPECROUTE_SUPERVISOR_PID"  # the supervisor's pid, set for its workers
EXIT_CONFIG = 2  # a worker's exit status when its configuration cannot be read (as `specroute serve`)

log = logging.getLogger("specroute.server")


class StartupError(Exception):
    """The gateway cannot listen where it was told to; the message says what to change."""


_PORT_KEYS = "--port, server.port or SPECROUTE_SERVER__PORT"
_HOST_KEYS = "--host, server.host or SPECROUTE_SERVER__HOST"


def check_listen_address(host: str, port: int) -> None:
    """Bind the address once and let it go, so that a taken port is one clear line before anything starts.

    uvicorn would find out only after the lifespan had started the pools and their health checks, and then
    log the bind error among their warnings. ``SO_REUSEADDR`` as uvicorn sets it, so a port that only has
    connections in TIME_WAIT is free here as it is there.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except socket.gaierror as e:
            raise StartupError(f"cannot listen on {host}: {e.strerror}; check {_HOST_KEYS}") from None
        except OSError as e:
            raise StartupError(_bind_problem(host, port, e)) from None


def _bind_problem(host: str, port: int, error: OSError) -> str:
    if error.errno == errno.EADDRINUSE:
        return (
            f"port {port} on {host} is in use: stop the process listening there"
            f" or choose another port ({_PORT_KEYS})"
        )
    if error.errno == errno.EACCES:
        return (
            f"port {port} on {host} needs privileges this user lacks: choose a port above 1023 ({_PORT_KEYS})"
        )
    if error.errno == errno.EADDRNOTAVAIL:
        return (
            f"cannot listen on {host}: no network interface of this machine has that address ({_HOST_KEYS})"
        )
    return f"cannot listen on {host} port {port}: {error.strerror}"


def app_from_env() -> ASGIApp:
    """Factory for worker processes: each loads the configuration named in the environment."""
    from gateway.app import create_app, fast_path

    path = os.environ.get(CONFIG_ENV)
    try:
        settings = load_settings(path)
    except ConfigError as e:
        # a configuration edited wrong before a reload (SIGHUP) or a worker's restart: one line, not a
        # traceback per try; the supervisor keeps the workers it has and tries again
        print(f"worker {os.getpid()} not started: {e}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_CONFIG) from None
    configure_logging(settings.logging.level)  # a spawned worker starts with Python's defaults
    guard_connections(settings.server)
    app = create_app(settings)
    drain_on_signals(app)
    # named by the supervisor, not read from getppid(): a worker still starting when its supervisor
    # died is already the child of another process, which it would take for its supervisor
    drain_when_orphaned(int(os.environ.get(SUPERVISOR_ENV) or os.getppid()))
    return fast_path(app)


def drain_when_orphaned(supervisor: int, every_s: float = 1.0) -> None:
    """Drain this worker, as on SIGTERM, once its supervisor is gone.

    A supervisor killed outright (SIGKILL, a crash) cannot stop its workers: they went on serving with
    nobody to replace them, holding the port, so the gateway could not be started again ("port in
    use") until each was found and killed by hand. A thread asks every ``every_s`` seconds whether the
    process is still the supervisor's child.
    """

    def watch() -> None:
        while os.getppid() == supervisor:
            time.sleep(every_s)
        log.warning("worker %d: its supervisor %d is gone; draining", os.getpid(), supervisor)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="supervisor-watch", daemon=True).start()


def drain_on_signals(app: FastAPI) -> None:
    """In a worker: mark the gateway draining on SIGINT, SIGTERM and SIGHUP, and drain on SIGHUP too.

    uvicorn's supervisor runs each worker with its own plain server, not :class:`DrainingServer`: the
    worker's ``/ready`` said 200 while it drained, and SIGHUP's default action ended it at once, cutting
    its streams (``pkill -HUP specroute``, or a service manager signalling every process of the unit,
    reaches the workers as well as the supervisor). Called while that server loads the app, when its
    handler is already on SIGTERM: each signal now marks the gateway draining, then goes to that handler,
    which drains as for SIGTERM. The supervisor replaces a worker that ended on SIGHUP.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    stop = signal.getsignal(signal.SIGTERM)
    if not callable(stop):
        return  # not under a server that drains: nothing to hand the signal to

    def handle(sig: int, frame: FrameType | None) -> None:
        mark_draining(app)
        stop(sig, frame)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handle)


def mark_draining(app: FastAPI) -> None:
    """``/ready`` says 503 from now on, so a load balancer still asking sends no new work here."""
    gateway = getattr(app.state, "gateway", None)
    if gateway is not None:
        gateway.draining = True


def guard_connections(server: ServerConfig) -> None:
    """Set this process's connection limits (the protocol class reads them; see ``gateway.connections``)."""
    GuardedHttpProtocol.limits = ConnectionLimits(
        header_timeout_s=server.header_timeout_s,
        max_connections=server.max_connections,
        max_header_bytes=server.max_header_bytes,
    )


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """How uvicorn runs the gateway, with every time-out and limit from ``server.*``.

    uvicorn's own ``limit_concurrency`` stays off: :class:`GuardedHttpProtocol` caps connections
    and answers beyond the cap in the API's error format.
    """
    server = settings.server
    return dict(
        host=server.host,
        port=server.port,
        loop="uvloop",
        http=GuardedHttpProtocol,
        log_level=settings.logging.level if settings.logging.level != "info" else "warning",
        access_log=False,
        timeout_graceful_shutdown=server.shutdown_grace_s,
        timeout_keep_alive=server.keep_alive_s,
        backlog=server.backlog,
        server_header=False,
        proxy_headers=False,
        # uvicorn's own lines (a malformed request, a port in use) through the gateway's handler and
        # format, not a second format of uvicorn's on the same stderr
        log_config=None,
        **server_options(server),
    )


@contextmanager
def shared_metrics_dir() -> Iterator[Path]:
    """A fresh directory for prometheus_client's multiprocess mode, removed when the server stops.

    Set in the environment before uvicorn spawns the workers, so each worker imports prometheus_client
    with it and writes its values there. Fresh per start: files left by an earlier run would otherwise
    be added to this run's counters. Created inside an operator-provided ``PROMETHEUS_MULTIPROC_DIR``
    (e.g. a Kubernetes emptyDir) when one is set.
    """
    previous = os.environ.get(MULTIPROC_ENV)
    try:
        path = Path(tempfile.mkdtemp(prefix="specroute-metrics-", dir=previous or None))
    except OSError as e:  # a volume that was not mounted, or read-only: a deployment mistake, not a crash
        raise ConfigError(
            f"{MULTIPROC_ENV}={previous}: cannot make the metrics directory there: {e.strerror or e}"
        ) from None
    os.environ[MULTIPROC_ENV] = str(path)
    try:
        yield path
    finally:
        if previous is None:
            os.environ.pop(MULTIPROC_ENV, None)
        else:
            os.environ[MULTIPROC_ENV] = previous
        shutil.rmtree(path, ignore_errors=True)


def serve(settings: Settings, config_path: Path | None = None) -> None:
    from gateway.app import create_app, fast_path
    from gateway.upstream.credentials import UpstreamKeys

    configure_logging(settings.logging.level)
    server = settings.server
    UpstreamKeys(settings, {})  # every upstream key readable, or a ConfigError before serving
    upstream_context(settings.upstream_tls)  # and every TLS file, the upstreams' and the gateway's own
    check_server(server)
    check_listen_address(server.host, server.port)
    guard_connections(server)
    common = uvicorn_options(settings)
    if server.workers > 1:
        if config_path is None:
            raise ValueError("several workers need a configuration file")
        os.environ[CONFIG_ENV] = str(config_path)
        os.environ[SUPERVISOR_ENV] = str(os.getpid())
        _tracker_ignores_sighup()
        with shared_metrics_dir():
            # what uvicorn.run does for several workers, with the socket in hand to say where it is
            config = uvicorn.Config(
                "gateway.server:app_from_env", factory=True, workers=server.workers, **common
            )
            sock = config.bind_socket()
            # uvicorn's bind does not listen: until the first worker had started, a client that took
            # the line below at its word was refused; listening here, the kernel queues it instead
            sock.listen(server.backlog)
            log.info("%s (%d workers)", listening(config.is_ssl, [sock]), server.workers)
            with contextlib.suppress(KeyboardInterrupt):
                Supervisor(config, sockets=[sock]).run()
    else:
        # one process needs no shared files, but where the operator's directory is set prometheus_client
        # writes them there: a fresh one inside it, as for several workers, or an earlier run's files
        # (an emptyDir outlives a container's restart) would be added to this run's counters
        with shared_metrics_dir() if os.environ.get(MULTIPROC_ENV) else contextlib.nullcontext():
            app = create_app(settings)
            graceful = DrainingServer(uvicorn.Config(fast_path(app), **common), app)
            graceful.run()
        if not graceful.started:
            sys.exit(3)  # uvicorn's start-up failure code


def _tracker_ignores_sighup() -> None:
    """Start multiprocessing's resource tracker ignoring SIGHUP: a service manager that signals every
    process of the unit on reload (``kill -HUP -- -PGID``) reaches it too, and SIGHUP's default action
    ended it ("resource_tracker: process died unexpectedly, relaunching. Some resources might leak").
    It starts once per process, so it keeps the disposition it was started with."""
    from multiprocessing import resource_tracker

    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        resource_tracker.ensure_running()
    finally:
        signal.signal(signal.SIGHUP, previous)


def listening(tls: bool, sockets: Iterable[socket.socket]) -> str:
    """The start-up line: every address and port bound (the one the system chose for port 0)."""
    scheme = "https" if tls else "http"
    urls = []
    for sock in sockets:
        host, port = sock.getsockname()[:2]
        urls.append(f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}")
    return "listening on " + ", ".join(urls)


def probe_health(
    server: ServerConfig, timeout_s: float = 4.0, cert: Path | None = None, key: Path | None = None
) -> str | None:
    """Ask the gateway on this machine for ``/health`` where ``server`` says it listens: None when it
    answers 200, else what went wrong, in one line.

    What a container's health check runs: it reads the configuration the server reads, so it follows
    ``server.port`` and, with ``server.tls_cert_file``, speaks https (the gateway then refuses plain
    http). The certificate is not checked (it is the gateway's own, often self-signed, and the address
    is the loopback); under mutual TLS the probe shows ``cert`` and ``key``, by default the gateway's own
    certificate, which must then be one the client CAs accept.
    """
    if server.port == 0:
        return "server.port is 0 (a port the system chooses): the health check cannot know it; set a port"
    host = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(server.host, server.host)
    authority = f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"  # IPv6 in brackets
    conn: http.client.HTTPConnection
    if server.tls_cert_file is None:
        conn = http.client.HTTPConnection(host, server.port, timeout=timeout_s)
        url = f"http://{authority}/health"
    else:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if server.tls_client_ca_file is not None:
            try:
                ctx.load_cert_chain(
                    cert or server.tls_cert_file, key if cert is not None else server.tls_key_file
                )
            except (OSError, ssl.SSLError) as e:
                return f"cannot load the client certificate {cert or server.tls_cert_file}: {e}"
        conn = http.client.HTTPSConnection(host, server.port, timeout=timeout_s, context=ctx)
        url = f"https://{authority}/health"
    try:
        conn.request("GET", "/health")
        status = conn.getresponse().status
    except (OSError, http.client.HTTPException) as e:
        return f"GET {url}: {str(e) or type(e).__name__}"
    finally:
        conn.close()
    return None if status == 200 else f"GET {url}: HTTP {status}"


class Supervisor(Multiprocess):
    """uvicorn's supervisor of several workers, letting go of the listening socket when told to stop.

    The supervisor binds the socket and every worker accepts on a copy of it. On SIGTERM each worker
    closes its copy and drains, but the supervisor's own copy would keep the port listening until the
    last worker had exited: the kernel would go on completing new connections that no process accepts,
    and their clients would wait, for up to ``server.shutdown_grace_s``, for an answer that ends in a
    reset, instead of being refused at once and going to another replica.
    """

    def terminate_all(self) -> None:
        for sock in self.sockets:
            sock.close()
        super().terminate_all()

    def handle_hup(self) -> None:
        """uvicorn's rolling restart of the workers, said in the gateway's log (uvicorn's own line is at
        the level it keeps quiet): a reload otherwise left no trace but its failures."""
        log.info("SIGHUP: replacing the %d workers one at a time", len(self.processes))
        super().handle_hup()

    def keep_subprocess_alive(self) -> None:
        """uvicorn's replacement of a worker that ended, saying so.

        uvicorn says it at its info level, which the gateway keeps quiet: a worker killed by the kernel
        for its memory, or crashing, was replaced without a line, and the requests it had in flight were
        cut with nothing to explain them.
        """
        before = list(self.processes)
        super().keep_subprocess_alive()
        for old, new in zip(before, self.processes, strict=False):
            if old is not new:
                log.warning("worker %s %s; a replacement was started", old.pid, _ended(old.exitcode))


def _ended(status: int | None) -> str:
    """How a worker process ended, from its exit status (negative: the signal that ended it)."""
    if status is None:
        return "stopped answering and was killed"
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with status {status}"


class DrainingServer(uvicorn.Server):
    """Marks the gateway draining on SIGTERM/SIGINT/SIGHUP, so ``/ready`` says 503 to anyone still asking.

    uvicorn does the rest of a graceful shutdown: it closes the listening socket, tells each connection
    to drain (:meth:`~gateway.connections.GuardedHttpProtocol.shutdown`: an idle keep-alive one answers
    a request already on its way, with ``Connection: close``, and ends after a quiet period), lets
    in-flight requests and streams finish (``Connection: close``) for up to
    ``timeout_graceful_shutdown`` seconds, then cancels what is left and runs the lifespan shutdown.

    uvicorn catches SIGINT and SIGTERM only; SIGHUP's default action ended the process at once, cutting
    every stream (a closed terminal, or a service manager's "reload"). It now drains the same way; a
    reload is a restart of the process by its supervisor, and several workers (``server.workers``)
    restart one at a time on a SIGHUP to the supervisor.
    """

    def __init__(self, config: uvicorn.Config, app: FastAPI):
        super().__init__(config)
        self.app = app

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's start-up, then one line saying where the gateway listens.

        uvicorn's own line is at its info level, which the gateway keeps quiet (its lines are warnings
        and errors only); this one goes through the gateway's logging, so ``--port 0`` can be found.
        """
        await super().startup(sockets)
        if self.started:
            bound = [sock for server in self.servers for sock in server.sockets or ()]
            log.info(listening(self.config.is_ssl, bound))

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(signal.SIGHUP, self.handle_exit)
            try:
                yield
            finally:
                signal.signal(signal.SIGHUP, previous)
                # uvicorn would raise the signals it caught again once drained, so that one worker ended
                # by its signal (status 143 on SIGTERM) where a supervisor of several exits 0: a stop that
                # drained is a clean exit, status 0, however many workers
                self._captured_signals.clear()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        mark_draining(self.app)
        super().handle_exit(sig, frame)
