"""Real ``vllm serve`` processes for the suite, started from the environment ``run.sh`` prepared.

Each server runs in its own process group (vLLM forks an engine process) so that stopping it kills the
whole tree, and a watchdog kills that group if the test process dies without tearing down. A
:class:`Fleet` keeps one server per slot (``baseline`` and ``speculative``) on a fixed port, so a gateway
configured once keeps working when a slot is restarted with another draft.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

MODEL_NAME = "tiny-target"
NUM_SPECULATIVE_TOKENS = 4
# Variants of the speculative slot; ``{models}`` is the models folder built by build_models.py.
VARIANTS: dict[str, dict[str, Any] | None] = {
    "baseline": None,
    "draft-same": {"model": "{models}/draft-same", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS},
    "draft-noisy": {"model": "{models}/draft-noisy", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS},
    "draft-other": {"model": "{models}/draft-other", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS},
    "ngram": {"method": "ngram", "num_speculative_tokens": NUM_SPECULATIVE_TOKENS, "prompt_lookup_max": 3},
}
START_TIMEOUT_S = float(os.environ.get("SPECROUTE_VLLM_START_TIMEOUT", "300"))

_WATCHDOG = (
    'while kill -0 "$1" 2>/dev/null; do sleep 2; done; '
    'kill -TERM -- "-$2" 2>/dev/null; sleep 15; kill -KILL -- "-$2" 2>/dev/null'
)


@dataclass(frozen=True)
class VllmSetup:
    """Where run.sh put the vLLM environment, the models and vLLM's own cache."""

    venv: Path
    models: Path
    cache_root: Path
    log_dir: Path

    @classmethod
    def from_env(cls) -> VllmSetup | None:
        venv, models = os.environ.get("SPECROUTE_VLLM_VENV"), os.environ.get("SPECROUTE_VLLM_MODELS")
        if not venv or not models:
            return None
        cache = Path(os.environ.get("SPECROUTE_VLLM_CACHE_ROOT", Path(venv).parent / "vllm-cache"))
        logs = Path(os.environ.get("SPECROUTE_VLLM_LOG_DIR", Path(venv).parent / "logs"))
        logs.mkdir(parents=True, exist_ok=True)
        return cls(Path(venv), Path(models), cache, logs)


def server_env(setup: VllmSetup, tmp: Path) -> dict[str, str]:
    """The environment a CPU vLLM needs here: offline, no telemetry, its cache inside ours, its temporary
    files in ``tmp`` (it leaves a ``vllm_dist_*`` file behind per start otherwise)."""
    return {
        **os.environ,
        "TMPDIR": str(tmp),
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "VLLM_CACHE_ROOT": str(setup.cache_root),
    }


def serve_args(setup: VllmSetup, variant: str, port: int) -> list[str]:
    args = [
        str(setup.venv / "bin" / "vllm"),
        "serve",
        str(setup.models / "target"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--served-model-name",
        MODEL_NAME,
        "--max-model-len",
        "1024",
        "--enforce-eager",
        # float32 (not the CPU default bfloat16) so the same-weights draft agrees with the target exactly.
        "--dtype",
        "float32",
        # tool calls (test_9_tools): vLLM refuses any tool_choice but "none" without a parser; the
        # pythonic one needs no special tokens in the tiny models' vocabulary
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "pythonic",
    ]
    spec = VARIANTS[variant]
    if spec is not None:
        config = {k: (v.format(models=setup.models) if isinstance(v, str) else v) for k, v in spec.items()}
        args += ["--speculative-config", json.dumps(config)]
    return args


class VllmServer:
    """One ``vllm serve`` process group plus its watchdog."""

    def __init__(self, setup: VllmSetup, variant: str, port: int) -> None:
        self.variant, self.port = variant, port
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = setup.log_dir / f"vllm-{variant}-{port}-{int(time.time())}.log"
        self.tmp = Path(tempfile.mkdtemp(prefix=f"specroute-vllm-{variant}-"))
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                serve_args(setup, variant, port),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=server_env(setup, self.tmp),
                start_new_session=True,
            )
        self._watchdog = subprocess.Popen(
            ["sh", "-c", _WATCHDOG, "watchdog", str(os.getpid()), str(self.popen.pid)],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def wait_healthy(self, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise RuntimeError(
                    f"vllm serve ({self.variant}) exited {self.popen.returncode}:\n{self.log_tail()}"
                )
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"vllm serve ({self.variant}) not healthy after {timeout:.0f}s:\n{self.log_tail()}"
        )

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_tail(self, chars: int = 4000) -> str:
        text = self.log_path.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if "is ignored: it is neither" not in ln]
        return "\n".join(lines)[-chars:]

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL what is left after ``timeout``."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.popen.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.popen.wait(wait)
                # The engine process may outlive the API server briefly; give the group a moment.
                if not _group_alive(self.popen.pid):
                    break
                time.sleep(1)
            except subprocess.TimeoutExpired:
                continue
        if self._watchdog.poll() is None:
            self._watchdog.kill()
            self._watchdog.wait(5)
        shutil.rmtree(self.tmp, ignore_errors=True)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def start_server(setup: VllmSetup, variant: str, port: int) -> VllmServer:
    server = VllmServer(setup, variant, port)
    try:
        server.wait_healthy()
    except BaseException:
        server.stop()
        raise
    return server


class Fleet:
    """At most one server per slot, each slot on a port fixed for the whole session."""

    SLOTS = ("baseline", "speculative")

    def __init__(self, setup: VllmSetup, ports: dict[str, int]) -> None:
        self.setup, self.ports = setup, ports
        self.servers: dict[str, VllmServer] = {}
        self.starts: list[str] = []
        atexit.register(self.stop_all)

    def url(self, slot: str) -> str:
        return f"http://127.0.0.1:{self.ports[slot]}"

    def ensure(self, slot: str, variant: str) -> VllmServer:
        """The server in ``slot`` running ``variant``; (re)started only if it is not already so."""
        current = self.servers.get(slot)
        if current is not None and current.variant == variant and current.alive():
            return current
        return self.restart(slot, variant)

    def restart(self, slot: str, variant: str) -> VllmServer:
        current = self.servers.pop(slot, None)
        if current is not None:
            current.stop()
        server = start_server(self.setup, variant, self.ports[slot])
        self.servers[slot] = server
        self.starts.append(f"{slot}={variant}")
        return server

    def stop_all(self) -> None:
        while self.servers:
            _, server = self.servers.popitem()
            server.stop()
