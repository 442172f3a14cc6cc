"""Real emulator processes (uvicorn) shared by the emulator tests, time-scaled to stay fast."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.server import EmulatorApp
from gateway.stack import Process, start_emulator

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "vllm"
MODEL = "demo-model"
#: one emulated engine step of 45 ms lasts 9 ms here
TIME_SCALE = 0.2

STRUCTURED = "Repeat this line 50 times: the quick brown fox jumps over the lazy dog"
OPEN_ENDED = "I believe the meaning of life is"


@dataclass
class Emu:
    proc: Process
    client: httpx.Client = field(repr=False)

    @property
    def url(self) -> str:
        return self.proc.url

    def post(self, path: str, body: dict[str, Any], **kw: Any) -> httpx.Response:
        return self.client.post(self.url + path, json=body, **kw)

    def control(self, **changes: float) -> dict[str, Any]:
        r = self.client.post(self.url + "/emulator/control", json=changes)
        assert r.status_code == 200, r.text
        return r.json()

    def state(self) -> dict[str, Any]:
        return self.client.get(self.url + "/emulator/state").json()

    def metrics_text(self) -> str:
        return self.client.get(self.url + "/metrics").text

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        """POST with ``stream: true``; the parsed ``data:`` events (``[DONE]`` checked and dropped)."""
        events: list[dict[str, Any]] = []
        done = False
        with self.client.stream("POST", self.url + path, json={**body, "stream": True}) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if not line:
                    continue
                assert line.startswith("data: "), line
                assert not done, "data after [DONE]"
                if line == "data: [DONE]":
                    done = True
                else:
                    events.append(json.loads(line[6:]))
        assert done, "stream did not end with [DONE]"
        return events


def _emu(mode: str, tmp_path_factory: pytest.TempPathFactory, *extra: str) -> Iterator[Emu]:
    log_dir = tmp_path_factory.mktemp(f"emu-{mode}")
    proc = start_emulator(mode, extra=list(extra), log_dir=log_dir)
    client = httpx.Client(timeout=30.0)
    try:
        yield Emu(proc, client)
    finally:
        client.close()
        proc.stop()


@pytest.fixture(scope="session")
def spec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    yield from _emu(
        "speculative",
        tmp_path_factory,
        "--time-scale",
        str(TIME_SCALE),
        "--per-request-spec-decode-metrics",
        "summary",
        "--max-num-seqs",
        "8",
    )


@pytest.fixture(scope="session")
def base(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    yield from _emu("baseline", tmp_path_factory, "--time-scale", str(TIME_SCALE), "--max-num-seqs", "8")


@pytest.fixture(scope="session")
def zero(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    yield from _emu(
        "speculative", tmp_path_factory, "--time-scale", "0", "--per-request-spec-decode-metrics", "summary"
    )


@pytest.fixture(scope="session")
def faulty(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emu]:
    """An emulator of its own for fault injection, so other tests' counters stay clean."""
    yield from _emu("speculative", tmp_path_factory, "--time-scale", "0.05", "--served-model-name", MODEL)


def fixture_json(name: str) -> dict[str, Any]:
    return json.loads((FIXTURES / name).read_text())


def fixture_events(name: str) -> list[dict[str, Any]]:
    out = []
    for line in (FIXTURES / name).read_text().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            out.append(json.loads(line[6:]))
    return out


def fixture_error(name: str) -> tuple[int, dict[str, Any]]:
    text = (FIXTURES / name).read_text().strip().splitlines()
    return int(text[-1].split()[1]), json.loads(text[0])


def keys(d: dict[str, Any]) -> list[str]:
    return list(d.keys())


def scrape(text: str) -> dict[str, float]:
    """``{sample name + sorted labels: value}`` summed over engines; ``_created`` samples dropped."""
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.endswith("_created"):
                continue
            labels = ",".join(
                f"{k}={v}" for k, v in sorted(s.labels.items()) if k not in ("engine", "model_name")
            )
            key = f"{s.name}{{{labels}}}" if labels else s.name
            out[key] = out.get(key, 0.0) + s.value
    return out


@pytest.fixture(params=[0.0, 0.01], ids=["inline", "timed"])
async def inproc(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    """An emulator in process (httpx.ASGITransport), answering at once and with (short) emulated delays."""
    app = EmulatorApp(EmulatorConfig(time_scale=request.param, embedding_dim=32))
    app.engine.start()
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://emulator") as c:
            yield c
    finally:
        await app.engine.stop()
