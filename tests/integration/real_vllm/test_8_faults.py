"""Real vLLM frozen and restarted under traffic.

A frozen server (every process of it stopped, as a hung host or a paused container leaves it) accepts
connections and answers nothing: the gateway's health check finds it unhealthy, and the requests that
were waiting on it for their answers go to the other pool, long before ``timeouts.total_s``. A server
whose engine process alone hangs still answers ``/health`` and ``/metrics``: its step count, still with
requests running, takes it out after ``timeouts.chunk_gap_s``. A server killed and started again on its
port starts its Prometheus counters from zero: the scrape reads the counts since the restart, never a
negative acceptance.
"""

from __future__ import annotations

import os
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from .client import PROMPTS, chat, completion, wait_for
from .conftest import GatewayFactory
from .servers import MODEL_NAME, Fleet, VllmServer

pytestmark = pytest.mark.real_vllm

FORCED = {"x-specroute-pool": "speculative"}
# a hung engine is out after this long without a step; the default (30 s) left the requests it held
# too little of the client's time to be answered again on a busy CPU
CHUNK_GAP_S = 10.0
CLIENT_TIMEOUT_S = 50.0  # well below the gateway's timeouts.total_s (600 s), above CHUNK_GAP_S


@pytest.fixture(scope="module")
def gateway(gateway_factory: GatewayFactory, baseline: VllmServer, speculative: VllmServer) -> str:
    return gateway_factory("adaptive", timeouts={"chunk_gap_s": CHUNK_GAP_S})


def _request(gateway: str, i: int) -> tuple[int, str]:
    """One request to the speculative pool, streamed or not, completions or chat: (status, finish)."""
    chat_, stream = i % 2 == 0, (i // 2) % 2 == 0
    body: dict[str, Any] = (chat if chat_ else completion)(
        MODEL_NAME, PROMPTS[i % len(PROMPTS)], max_tokens=300
    )
    path = "/v1/chat/completions" if chat_ else "/v1/completions"
    if not stream:
        r = httpx.post(gateway + path, json=body, headers=FORCED, timeout=CLIENT_TIMEOUT_S)
        finish = r.json()["choices"][0]["finish_reason"] if r.status_code == 200 else r.text
        return r.status_code, finish
    finish, done = "", False
    with httpx.stream(
        "POST", gateway + path, json={**body, "stream": True}, headers=FORCED, timeout=CLIENT_TIMEOUT_S
    ) as r:
        for line in r.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: ") and '"finish_reason":"' in line.replace(" ", ""):
                finish = "stop" if '"stop"' in line else "length"
        return r.status_code, finish if done else "no [DONE]"


def _available(gateway: str) -> int:
    return int(httpx.get(gateway + "/ready", timeout=10).json()["available_endpoints"]["speculative"])


def test_requests_waiting_on_a_frozen_vllm_are_answered_by_the_other_pool(gateway: str, fleet: Fleet) -> None:
    server = fleet.ensure("speculative", "draft-same")
    assert wait_for(lambda: _available(gateway), bool, timeout=60)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_request, gateway, i) for i in range(8)]
        time.sleep(0.5)  # all of them sent to the speculative server, none finished
        os.killpg(server.popen.pid, signal.SIGSTOP)
        try:
            results = [f.result() for f in futures]
        finally:
            os.killpg(server.popen.pid, signal.SIGCONT)
    assert results == [(200, r[1]) for r in results] and all(r[1] in ("stop", "length") for r in results), (
        results
    )
    # back in rotation once it answers its health check again
    assert wait_for(lambda: _available(gateway), bool, timeout=30)
    assert _request(gateway, 1)[0] == 200


def _engine_processes(pid: int) -> list[int]:
    """The engine processes vLLM forked (``VLLM::EngineCore``) under its API server ``pid``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            comm = Path(f"/proc/{entry}/comm").read_text()
        except OSError:
            continue
        if int(stat[1]) == pid and comm.startswith("VLLM::Engine"):
            found.append(int(entry))
    return found


def test_requests_on_a_vllm_whose_engine_hangs_are_answered_by_the_other_pool(
    gateway: str, fleet: Fleet
) -> None:
    server = fleet.ensure("speculative", "draft-same")
    engines = _engine_processes(server.popen.pid)
    assert engines
    assert wait_for(lambda: _available(gateway), bool, timeout=60)
    with ThreadPoolExecutor(8) as pool:
        futures = [pool.submit(_request, gateway, i) for i in range(8)]
        time.sleep(0.5)
        for pid in engines:  # the API server answers on: /health 200, /metrics with 8 running
            os.kill(pid, signal.SIGSTOP)
        try:
            assert httpx.get(fleet.url("speculative") + "/health", timeout=10).status_code == 200
            results = [f.result() for f in futures]
            assert not _available(gateway)  # out while its engine hangs
        finally:
            for pid in engines:
                os.kill(pid, signal.SIGCONT)
    assert all(status == 200 and finish in ("stop", "length") for status, finish in results), results
    assert wait_for(lambda: _available(gateway), bool, timeout=30)
    assert _request(gateway, 1)[0] == 200


def test_a_restarted_vllm_s_counters_from_zero_give_no_negative_acceptance(
    gateway: str, fleet: Fleet
) -> None:
    fleet.ensure("speculative", "draft-same")
    for i in range(4):  # counters well above zero before the restart
        assert _request(gateway, i)[0] == 200
    fleet.restart("speculative", "draft-same")
    assert wait_for(lambda: _available(gateway), bool, timeout=60)
    for i in range(4):
        assert _request(gateway, i)[0] == 200
    time.sleep(1.5)  # a few scrapes (routing.scrape_interval_s is 0.5 here)

    def scraped() -> dict[str, Any]:
        admin = httpx.get(gateway + "/admin/routing", timeout=10).json()
        return next(e for e in admin["endpoints"] if e["pool"] == "speculative")

    endpoint = wait_for(scraped, lambda e: e["scrape_error"] is None and "acceptance" in e, timeout=30)
    acceptance = endpoint["acceptance"]
    assert endpoint["scrape_error"] is None and endpoint["scrape_age_s"] < 5
    assert 0 <= acceptance["draft_acceptance_rate"] <= 1 and 0 <= acceptance["alpha"] <= 1
    assert acceptance["drafts"] > 0 and all(0 <= p <= 1 for p in acceptance["per_position"])
    assert 1 <= acceptance["mean_acceptance_length"] <= 1 + acceptance["k"]
