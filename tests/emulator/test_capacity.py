"""The demo's capacity figure: derived from the emulator's settings, and what the demo pools sustain."""

from __future__ import annotations

import math

import pytest

from gateway.demo import POOL, WORKLOAD, capacity_line
from gateway.emulator.capacity import Workload, capacity, decode_step_ms, tokens_per_step
from gateway.emulator.config import EmulatorConfig
from gateway.emulator.engine import Engine
from gateway.emulator.metrics import EngineMetrics


@pytest.mark.parametrize("mode", ["speculative", "baseline"])
def test_step_costs_are_the_engines_own(mode: str) -> None:
    cfg = EmulatorConfig(mode=mode, **POOL)  # type: ignore[arg-type]
    engine = Engine(cfg, EngineMetrics(cfg.num_speculative_tokens, cfg.max_model_len, cfg.speculative))
    for running in (1, 7, 64, 200):
        assert decode_step_ms(cfg, running) == engine.decode_cost_ms(running)


def test_tokens_per_step_is_the_expected_accepted_run() -> None:
    spec = EmulatorConfig(mode="speculative", num_speculative_tokens=3)
    assert tokens_per_step(spec, 0.5) == pytest.approx(1 + 0.5 + 0.25 + 0.125)
    assert tokens_per_step(spec, 0.0) == 1.0
    assert tokens_per_step(EmulatorConfig(mode="baseline"), 0.9) == 1.0


def test_capacity_scales_with_time_and_slots() -> None:
    cfg = EmulatorConfig(mode="baseline", **POOL)  # type: ignore[arg-type]
    slower = EmulatorConfig(mode="baseline", time_scale=2.0, **POOL)  # type: ignore[arg-type]
    assert capacity(slower) == pytest.approx(capacity(cfg) / 2)
    fewer = EmulatorConfig(mode="baseline", max_num_seqs=4)
    assert capacity(fewer) < capacity(EmulatorConfig(mode="baseline", max_num_seqs=16))
    assert math.isinf(capacity(EmulatorConfig(time_scale=0.0)))
    longer = Workload(prompt_tokens=256, output_tokens=512)
    assert capacity(cfg, longer) < capacity(cfg)


def test_the_demo_pools_sustain_five_requests_per_second_where_the_defaults_did_not() -> None:
    for mode in ("speculative", "baseline"):
        demo = EmulatorConfig(mode=mode, **POOL)  # type: ignore[arg-type]
        default = EmulatorConfig(mode=mode)  # type: ignore[arg-type]
        assert capacity(demo, WORKLOAD) > 5.0
        assert capacity(default, WORKLOAD) < 5.0


def test_capacity_line_states_the_workload_and_the_smaller_pool() -> None:
    line = capacity_line(1.0)
    base = capacity(EmulatorConfig(mode="baseline", **POOL), WORKLOAD)  # type: ignore[arg-type]
    assert f"{base:.1f} requests/s" in line
    assert f"{WORKLOAD.prompt_tokens}-token prompts" in line
