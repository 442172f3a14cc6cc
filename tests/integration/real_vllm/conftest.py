"""Fixtures for the real-vLLM suite: the server fleet, gateways and emulators in front of it.

Everything here is lazy: nothing starts unless a ``real_vllm`` test asks for it, so collecting this
folder in the default test run (which deselects the marker) costs nothing.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .servers import MODEL_NAME, NUM_SPECULATIVE_TOKENS, Fleet, VllmServer, VllmSetup


def _free_port() -> int:
    from gateway.stack import free_port

    return free_port()


@pytest.fixture(scope="session")
def vllm_setup() -> VllmSetup:
    setup = VllmSetup.from_env()
    if setup is None:
        pytest.skip(
            "real vLLM environment not prepared: run `make test-vllm` (tests/integration/real_vllm/run.sh)"
        )
    return setup


@pytest.fixture(scope="session")
def fleet(vllm_setup: VllmSetup) -> Iterator[Fleet]:
    f = Fleet(vllm_setup, {slot: _free_port() for slot in Fleet.SLOTS})
    try:
        yield f
    finally:
        f.stop_all()
        print(f"\nvLLM server starts this session: {', '.join(f.starts)}")


@pytest.fixture(scope="module")
def baseline(fleet: Fleet) -> VllmServer:
    return fleet.ensure("baseline", "baseline")


@pytest.fixture(scope="module")
def speculative(fleet: Fleet, request: pytest.FixtureRequest) -> VllmServer:
    """The speculative slot running the module's ``SPEC_VARIANT`` (default: the same-weights draft)."""
    return fleet.ensure("speculative", getattr(request.module, "SPEC_VARIANT", "draft-same"))


# --- the gateway -------------------------------------------------------------------------------------


def gateway_available() -> bool:
    return importlib.util.find_spec("gateway.server") is not None


GatewayFactory = Callable[..., str]


@pytest.fixture(scope="module")
def gateway_factory(fleet: Fleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayFactory]:
    """``start(strategy, timeouts=None, **routing)`` -> URL of a gateway in front of the fleet's two slots
    (``timeouts``: the ``timeouts`` section's settings that differ from the defaults)."""
    if not gateway_available():
        pytest.skip("needs the gateway server (`specroute serve`, gateway/server.py)")
    from gateway.stack import demo_config, start_gateway

    procs = []

    def start(strategy: str = "adaptive", timeouts: dict[str, float] | None = None, **routing: Any) -> str:
        extra = {
            "pools": {"speculative": {"num_speculative_tokens": NUM_SPECULATIVE_TOKENS}},
            "routing": {"scrape_interval_s": 0.5, "seed": 7, **routing},
            "timeouts": timeouts or {},
        }
        cfg = demo_config(
            [fleet.url("speculative")], [fleet.url("baseline")], _free_port(), MODEL_NAME, strategy, extra
        )
        workdir = tmp_path_factory.mktemp(f"gateway-{strategy}")
        proc = start_gateway(cfg, workdir, name=f"gateway-{strategy}")
        procs.append(proc)
        return proc.url

    try:
        yield start
    finally:
        for p in procs:
            p.stop()


@pytest.fixture(scope="module")
def gateway(gateway_factory: GatewayFactory, baseline: VllmServer, speculative: VllmServer) -> str:
    """A gateway (adaptive strategy) in front of the module's baseline and speculative servers."""
    return gateway_factory("adaptive")


# --- the emulator ------------------------------------------------------------------------------------

EMULATOR_OPTIONS = ("--mode", "--served-model-name", "--time-scale")


def emulator_help() -> str:
    try:
        return subprocess.run(
            [sys.executable, "-m", "gateway", "emulate", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"failed: {e}"


@pytest.fixture(scope="module")
def emulator_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., str]]:
    """``start(mode)`` -> URL of an emulator configured like the real servers (model name, k, length)."""
    help_text = emulator_help()
    missing = [o for o in EMULATOR_OPTIONS if o not in help_text]
    if missing:
        pytest.skip(f"needs `specroute emulate` with {', '.join(missing)}")
    from gateway.stack import start_emulator

    procs = []
    log_dir: Path = tmp_path_factory.mktemp("emulators")

    def start(mode: str) -> str:
        args = ["--served-model-name", MODEL_NAME, "--time-scale", "0.05"]
        optional = {"--max-model-len": "1024"}
        if mode == "speculative":
            optional["--num-speculative-tokens"] = str(NUM_SPECULATIVE_TOKENS)
        for opt, value in optional.items():
            if opt in help_text:
                args += [opt, value]
        proc = start_emulator(mode, extra=args, log_dir=log_dir)
        procs.append(proc)
        return proc.url

    try:
        yield start
    finally:
        for p in procs:
            p.stop()
