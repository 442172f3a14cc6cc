"""Start and stop local processes (emulators, gateways) on loopback.

Used by ``specroute demo``, ``specroute bench compare`` and the test-suite: each process is a real
server started with this interpreter, waited for on its health URL, and stopped on exit.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import yaml

from gateway.types import RUN_TOKEN_ENV, RUN_TOKEN_HEADER


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PortInUse(RuntimeError):
    """Another process holds the port a server was to listen on."""

    def __init__(self, port: int):
        super().__init__(f"port {port} is in use; pass --port")
        self.port = port


class StartFailed(RuntimeError):
    """A started server exited, or never answered healthy; the message ends with its log."""

    def __init__(self, name: str, log: str, log_path: Path | None, cause: str = ""):
        super().__init__(f"{name} did not start:\n{log[-4000:]}")
        self.name = name
        self.log_path = log_path
        lines = [line.strip() for line in log.splitlines() if line.strip()]
        # a server that cannot start says why last (the gateway's and the emulator's one-line errors)
        self.reason = lines[-1] if lines else cause or "no output"

    def line(self) -> str:
        """The failure in one line: the log's last line, and where the whole log is."""
        where = f" (log: {self.log_path})" if self.log_path else ""
        return f"{self.name} did not start: {self.reason}{where}"


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    """Raise :class:`PortInUse` when ``port`` cannot be bound (a server, of any kind, is there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds: TIME_WAIT is no obstacle
        try:
            s.bind((host, port))
        except OSError:
            raise PortInUse(port) from None


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    url: str
    log_path: Path | None

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        return self.popen.returncode

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


def wait_healthy(
    url: str, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30.0, token: str | None = None
) -> None:
    """Wait until ``url`` answers 200 and, with ``token``, carries it in :data:`RUN_TOKEN_HEADER`.

    A 200 without the token comes from another server already on the port (ours will fail to bind
    it): that ends in :class:`PortInUse` rather than in a wait on the wrong server.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    foreign = False
    # one client for every try: making one (its TLS context) costs some 40 ms of CPU, which a poll every
    # 50 ms would take from the server starting beside it
    with httpx.Client(timeout=1.0) as client:
        while time.monotonic() < deadline:
            exited = proc is not None and proc.poll() is not None
            try:  # asked once more after an exit: was it a server already on the port?
                r = client.get(url)
                ours = r.status_code == 200 and (token is None or r.headers.get(RUN_TOKEN_HEADER) == token)
                if ours and not exited:
                    return
                foreign = foreign or (r.status_code == 200 and not ours)
            except httpx.HTTPError as e:
                last = e
            if exited:
                assert proc is not None
                if foreign:
                    raise PortInUse(httpx.URL(url).port or 80)
                raise RuntimeError(f"process exited with {proc.returncode} before {url} was healthy")
            time.sleep(0.05)
    if foreign:
        raise PortInUse(httpx.URL(url).port or 80)
    raise TimeoutError(f"{url} not healthy after {timeout:.0f}s ({last})")


def start(
    name: str,
    args: Sequence[str],
    port: int,
    health_path: str = "/health",
    log_dir: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
) -> Process:
    """Run ``python -m gateway <args>`` and wait until ``health_path`` answers 200."""
    token = secrets.token_hex(16)
    log_path = (log_dir / f"{name}.log") if log_dir else None
    out = open(log_path, "wb") if log_path else subprocess.DEVNULL  # noqa: SIM115 - owned by the child
    popen = subprocess.Popen(
        [sys.executable, "-m", "gateway", *args],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "SPECROUTE_PARENT_PID": str(os.getpid()), RUN_TOKEN_ENV: token, **(env or {})},
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    proc = Process(name, popen, url, log_path)
    try:
        wait_healthy(url + health_path, popen, timeout, token if health_path == "/health" else None)
    except PortInUse:
        proc.stop()
        raise
    except Exception as e:
        proc.stop()
        raise StartFailed(name, proc.log(), log_path, str(e)) from None
    return proc


def start_emulator(
    mode: str, port: int | None = None, extra: Sequence[str] = (), log_dir: Path | None = None
) -> Process:
    port = port or free_port()
    args = ["emulate", "--host", "127.0.0.1", "--port", str(port), "--mode", mode, *extra]
    return start(f"emulator-{mode}-{port}", args, port, log_dir=log_dir)


def demo_config(
    speculative_urls: Sequence[str],
    baseline_urls: Sequence[str],
    port: int,
    model: str = "demo-model",
    strategy: str = "adaptive",
    extra: dict[str, object] | None = None,
) -> dict[str, object]:
    """A gateway configuration for local pools (the shape of ``deploy/config/demo.yaml``)."""
    from gateway.config import _deep_merge

    def pool(kind: str, urls: Sequence[str]) -> dict[str, object]:
        eps = [{"name": f"{kind[:4]}-{i}", "url": u} for i, u in enumerate(urls)]
        out: dict[str, object] = {"endpoints": eps, "models": [model]}
        if kind == "speculative":
            out.update(num_speculative_tokens=7, draft_cost_ratio=0.05)
        return out

    cfg: dict[str, object] = {
        "server": {"host": "127.0.0.1", "port": port},
        "pools": {
            "speculative": pool("speculative", speculative_urls),
            "baseline": pool("baseline", baseline_urls),
        },
        "routing": {"strategy": strategy},
        "health": {"interval_s": 0.5, "eject_base_s": 0.5},
    }
    return _deep_merge(cfg, extra or {})


def start_gateway(config: dict[str, object], workdir: Path, name: str = "gateway") -> Process:
    server = config.get("server")
    port = int(server["port"]) if isinstance(server, dict) and "port" in server else free_port()
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return start(name, ["serve", "--config", str(path), "--port", str(port)], port, log_dir=workdir)


@contextmanager
def running(*procs: Process) -> Iterator[tuple[Process, ...]]:
    with ExitStack() as stack:
        for p in procs:
            stack.callback(p.stop)
        yield procs
