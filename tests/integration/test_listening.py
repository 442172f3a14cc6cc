"""``specroute serve`` says where it listens: the port the system chose for ``--port 0`` is in its log."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import yaml

from gateway.server import listening
from gateway.stack import demo_config

NOWHERE = "http://127.0.0.1:9"  # no upstream is needed to start and answer /health
PATIENCE_S = 30.0
LINE = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")


@contextmanager
def serving_on_port_zero(
    tmp_path: Path, workers: int = 1, env: dict[str, str] | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    config = demo_config([NOWHERE], [NOWHERE], 0, extra={"server": {"workers": workers}})
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    log = tmp_path / "gateway.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            # it exits if the test dies
            env={**os.environ, "SPECROUTE_PARENT_PID": str(os.getpid()), **(env or {})},
            start_new_session=True,
        )
    try:
        yield proc, log
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(PATIENCE_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _announced(proc: subprocess.Popen[bytes], log: Path) -> str:
    """The URL of the start-up line, once it is written."""
    deadline = time.monotonic() + PATIENCE_S
    while time.monotonic() < deadline and proc.poll() is None:
        found = LINE.search(log.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise AssertionError(f"no start-up line:\n{log.read_text(errors='replace')[-3000:]}")


def test_port_zero_is_announced_and_answers(tmp_path: Path) -> None:
    with serving_on_port_zero(tmp_path) as (proc, log):
        url = _announced(proc, log)
        assert int(url.rsplit(":", 1)[1]) != 0
        assert httpx.get(url + "/health", timeout=PATIENCE_S).status_code == 200


def test_several_workers_announce_their_shared_port_once(tmp_path: Path) -> None:
    with serving_on_port_zero(tmp_path, workers=2) as (proc, log):
        url = _announced(proc, log)
        # the workers start after the line, but the port listens from it on: a client taking the line at
        # its word waits in the kernel's queue for the first worker, it is not refused
        assert httpx.get(url + "/health", timeout=PATIENCE_S).status_code == 200
        assert len(LINE.findall(log.read_text(errors="replace"))) == 1


def test_the_line_names_https_and_every_address() -> None:
    with socket.socket() as v4, socket.socket(socket.AF_INET6) as v6:
        v4.bind(("127.0.0.1", 0))
        v6.bind(("::1", 0))
        line = listening(True, [v4, v6])
        assert (
            line
            == f"listening on https://127.0.0.1:{v4.getsockname()[1]}, https://[::1]:{v6.getsockname()[1]}"
        )


def _requests_total(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=PATIENCE_S).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("specroute_requests_total{")
    )


def test_an_operators_metrics_directory_holds_each_run_apart(tmp_path: Path) -> None:
    """``PROMETHEUS_MULTIPROC_DIR`` (a Kubernetes emptyDir, which outlives a container's restart): with one
    worker too, a run counts its own requests, not the files an earlier run left there."""
    shared = tmp_path / "metrics"
    shared.mkdir()
    for run in ("first", "second"):
        (tmp_path / run).mkdir()
        with serving_on_port_zero(tmp_path / run, env={"PROMETHEUS_MULTIPROC_DIR": str(shared)}) as (
            proc,
            log,
        ):
            url = _announced(proc, log)
            for _ in range(3):
                httpx.post(
                    url + "/v1/completions",
                    json={"model": "nothing-serves-this", "prompt": "x"},
                    timeout=PATIENCE_S,
                )
            assert _requests_total(url) == 3, run
    assert list(shared.iterdir()) == []  # each run's directory removed at its end


def test_a_metrics_directory_that_cannot_be_used_is_one_line(tmp_path: Path) -> None:
    config = demo_config([NOWHERE], [NOWHERE], 0)
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config))
    missing = tmp_path / "not-mounted"
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(missing)},
        timeout=PATIENCE_S,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (
        f"PROMETHEUS_MULTIPROC_DIR={missing}: cannot make the metrics directory there:"
        " No such file or directory"
    )
