"""How a worker under the supervisor takes the signals that stop it (``gateway.server.drain_on_signals``)."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from types import FrameType, SimpleNamespace
from typing import Any

import pytest
from fastapi import FastAPI

from gateway.server import CONFIG_ENV, app_from_env, drain_on_signals

STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@pytest.fixture
def handlers() -> Iterator[list[int]]:
    """A stand-in for the worker's uvicorn server: its handler on SIGINT and SIGTERM records the signals
    it is given; every handler is put back afterwards."""
    before = {sig: signal.getsignal(sig) for sig in STOPPING}
    told: list[int] = []

    def handle_exit(sig: int, frame: FrameType | None) -> None:
        told.append(sig)

    signal.signal(signal.SIGINT, handle_exit)
    signal.signal(signal.SIGTERM, handle_exit)
    try:
        yield told
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def _app() -> FastAPI:
    app = FastAPI()
    app.state.gateway = SimpleNamespace(draining=False)
    return app


@pytest.mark.parametrize("sig", STOPPING, ids=lambda s: signal.Signals(s).name)
def test_each_stopping_signal_marks_the_worker_draining_and_reaches_its_server(
    handlers: list[int], sig: int
) -> None:
    app = _app()
    drain_on_signals(app)
    signal.raise_signal(sig)  # SIGHUP's default action would end this process here
    assert app.state.gateway.draining
    assert handlers == [sig]


def test_outside_a_server_the_signals_are_left_alone() -> None:
    before = {sig: signal.getsignal(sig) for sig in STOPPING}
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:
        drain_on_signals(_app())
        assert signal.getsignal(signal.SIGHUP) == before[signal.SIGHUP]
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


def test_a_worker_whose_configuration_cannot_be_read_says_so_in_one_line_and_exits_2(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reload (SIGHUP) or a worker's restart after the file was edited wrong: the supervisor's worker
    ends with the configuration's own message, not a traceback on every try."""
    bad = tmp_path / "gw.yaml"
    bad.write_text("routing: {strategy: adaptiv}\n")
    monkeypatch.setenv(CONFIG_ENV, str(bad))
    with pytest.raises(SystemExit) as e:
        app_from_env()
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "routing.strategy" in err[0] and "not started" in err[0]
