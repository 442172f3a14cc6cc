"""The emulator's parts without a server: tokenizer, acceptance rules, engine arithmetic, metrics."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.emulator.acceptance import (
    PROSE_ALPHA,
    effective_alpha,
    expected_tokens_per_step,
    profile,
    temperature_factor,
)
from gateway.emulator.config import EmulatorConfig
from gateway.emulator.engine import Engine, Group, Seq
from gateway.emulator.metrics import EngineMetrics, buckets_1_2_5, make_registry, render
from gateway.emulator.textgen import TextSource
from gateway.emulator.tokenizer import VOCAB_SIZE, encode, encode_chat, encode_prompt, pieces


def test_tokenizer_is_lossless_stable_and_about_4_chars_per_token() -> None:
    text = "The quick brown fox, aged 1234, jumps over the lazy dog!\n\tdef f(x): return x_1 ** 2 — ünïcødé"
    assert "".join(pieces(text)) == text
    ids = encode(text)
    assert ids == encode(text) and all(300 <= i < VOCAB_SIZE for i in ids)
    prose = "Speculative decoding lets a small draft model propose tokens that the large model verifies. " * 4
    assert 3.0 <= len(prose) / len(encode(prose)) <= 5.0
    assert encode_prompt("hi")[0] == 1
    chat = encode_chat([("user", "hello there")])
    assert len(chat) == len(encode("hello there")) + 5 + 3


@pytest.mark.parametrize(
    ("prompt", "category"),
    [
        ("Repeat this line 50 times: hello", "repetition"),
        ("Please copy the following text verbatim", "repetition"),
        ("1, 2, 3, 4, 5, 6", "numeric"),
        ("Count from 1 to 100", "numeric"),
        ('Return {"name": "x", "age": 3} as valid JSON', "structured-data"),
        ("Write a YAML config for nginx", "structured-data"),
        ("Write a Python function that reverses a list", "code"),
        ("```\ndef f(x):\n    return x\n```", "code"),
        ("Summarize this article in three bullet points", "extraction"),
        ("Extract the email addresses from the text", "extraction"),
        ("I believe the meaning of life is", "prose"),
        ("Tell me a story about a dragon who learns to fly", "prose"),
        ("What do you think about modern art?", "prose"),
    ],
)
def test_prompt_rules(prompt: str, category: str) -> None:
    prof = profile(prompt)
    assert prof.category == category
    if category == "prose":
        assert prof.alpha == PROSE_ALPHA
    else:
        assert prof.alpha >= 0.7


def test_self_repetition_raises_alpha() -> None:
    text = "the cat sat on the mat and " * 8
    prof = profile(text)
    assert prof.category == "self-repetition" and 0.6 < prof.alpha <= 0.85


def test_alpha_arithmetic() -> None:
    assert temperature_factor(0) == 1.0 and temperature_factor(1) == pytest.approx(0.55)
    assert temperature_factor(5) == 0.05
    assert effective_alpha(0.8, 0.0, 1.0) == 0.8
    assert effective_alpha(0.8, 1.0, 1.0) == pytest.approx(0.44)
    assert effective_alpha(0.8, 0.0, 0.3) == pytest.approx(0.24)
    assert effective_alpha(0.8, 2.0, 1.0, override=0.6) == 0.6  # override skips the temperature
    assert effective_alpha(0.8, 0.0, 0.5, override=0.6) == 0.3  # but not the run-time scale
    assert effective_alpha(0.9, 0.0, 5.0) == 0.99
    # the reference deployment's worked example
    assert expected_tokens_per_step(0.8, 7) == pytest.approx(4.16, abs=0.01)
    assert expected_tokens_per_step(0.27, 7) == pytest.approx(1.37, abs=0.01)


def test_step_costs() -> None:
    cfg = EmulatorConfig()
    spec = Engine(cfg, EngineMetrics(7, 1024, True))
    assert spec.decode_cost_ms(1) == pytest.approx(45 * 1.35)
    assert spec.decode_cost_ms(8) == pytest.approx(45 * 1.0 + 45 * 0.35)  # 64 verified: at the knee
    assert spec.decode_cost_ms(16) == pytest.approx(45 * 2.0 + 45 * 0.35)  # 128: twice the knee
    base = Engine(EmulatorConfig(mode="baseline"), EngineMetrics(7, 1024, False))
    assert base.decode_cost_ms(4) == 45
    assert base.decode_cost_ms(128) == 90
    assert spec.prefill_cost_ms(64) == base.prefill_cost_ms(64) == 25 + 32
    # per token at alpha = 0.8: ~ 15 ms with speculation, 45 without
    assert spec.decode_cost_ms(4) / expected_tokens_per_step(0.8, 7) == pytest.approx(14.6, abs=0.1)


def _seq(group: Group, alpha: float, max_tokens: int, seed: int = 1, stops: list[str] | None = None) -> Seq:
    prompt = "Repeat this line 50 times: alpha beta"
    src = TextSource(prompt, profile(prompt).category, random.Random(seed))
    return Seq(group, 0, encode_prompt(prompt), max_tokens, src, random.Random(seed), alpha, stops)


def _inline(
    alpha: float, max_tokens: int, mode: str = "speculative", **kw: Any
) -> tuple[Group, EngineMetrics]:
    cfg = EmulatorConfig(mode=mode)  # type: ignore[arg-type]
    m = EngineMetrics(7, 1024, mode == "speculative")
    group = Group(stream=True, timed=False)
    _seq(group, alpha, max_tokens, **kw)
    Engine(cfg, m).run_inline(group)
    return group, m


def test_inline_engine_invariants() -> None:
    group, m = _inline(0.8, 300)
    seq = group.seqs[0]
    sizes = [end - start for _, start, end, _, _ in group.events]
    assert sizes[0] == 1 and sum(sizes) == 300 == m.generation_tokens
    assert max(sizes) <= 8
    assert m.num_drafts == len(sizes) - 1 == seq.spec_steps
    assert m.num_draft_tokens == 7 * m.num_drafts
    assert sum(m.accepted_per_pos) == m.num_accepted <= m.num_draft_tokens
    assert m.accepted_per_pos == sorted(m.accepted_per_pos, reverse=True)
    mean_len = 1 + m.num_accepted / m.num_drafts
    assert 3.3 < mean_len < 5.0  # E(0.8, 7) ~ 4.16
    assert "".join(d for _, _, _, d, _ in group.events) == seq.full_text()
    assert m.h_itl.count == m.num_drafts


def test_inline_baseline_and_determinism() -> None:
    g1, m1 = _inline(0.8, 50, mode="baseline")
    assert [e - s for _, s, e, _, _ in g1.events] == [1] * 50 and m1.num_drafts == 0
    g2, _ = _inline(0.8, 50)
    g3, _ = _inline(0.8, 50)
    assert g1.seqs[0].out_ids == g2.seqs[0].out_ids == g3.seqs[0].out_ids  # same text in both modes
    assert [(s, e) for _, s, e, _, _ in g2.events] == [(s, e) for _, s, e, _, _ in g3.events]


def test_stop_string_holds_back_text() -> None:
    group, _ = _inline(0.0, 100, stops=["beta"])
    seq = group.seqs[0]
    assert seq.finish_reason == "stop" and seq.stop_reason == "beta"
    assert seq.full_text() == "alpha "
    assert "".join(d for _, _, _, d, _ in group.events) == "alpha "


def test_engine_loop_batches_and_aborts() -> None:
    async def scenario() -> tuple[EngineMetrics, list[Group]]:
        cfg = EmulatorConfig(mode="speculative", time_scale=0.01, max_num_seqs=2)
        m = EngineMetrics(7, 1024, True)
        engine = Engine(cfg, m)
        engine.start()
        groups = []
        for i in range(4):
            g = Group(stream=True, timed=True)
            _seq(g, 0.8, 40, seed=i)
            groups.append(g)
            engine.submit(g)
        await asyncio.sleep(0)
        engine.abort(groups[3])  # aborted while waiting
        for _ in range(500):
            await asyncio.sleep(0.005)
            if all(g.done for g in groups[:3]):
                break
        await engine.stop()
        return m, groups

    m, groups = asyncio.run(scenario())
    assert all(g.done for g in groups[:3]) and groups[3].aborted and not groups[3].done
    assert m.success["length"] == 3 and m.success["abort"] == 1
    assert m.generation_tokens == 120
    assert m.running == 0 and m.waiting == 0


def test_metrics_render_parses() -> None:
    m = EngineMetrics(7, 1024, True)
    m.h_ttft.observe(0.05)
    m.h_itl.observe(0.01, 3)
    text = render(make_registry(m, "demo-model", 16, 4096)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    itl = fams["vllm:inter_token_latency_seconds"]
    count = next(s.value for s in itl.samples if s.name.endswith("_count"))
    assert count == 3
    assert buckets_1_2_5(1024) == (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)


def test_config_control_validation() -> None:
    cfg = EmulatorConfig()
    cfg.apply({"acceptance_scale": 0.3, "error_rate": 1})
    assert cfg.acceptance_scale == 0.3 and cfg.error_rate == 1.0
    for bad in ({"error_rate": 1.5}, {"nope": 1}, {"hang_rate": "x"}, {"reset_rate": True}):
        with pytest.raises(ValueError):
            cfg.apply(bad)
    assert cfg.acceptance_scale == 0.3


def test_spec_decode_counters_can_read_zero() -> None:
    """``--spec-decode-counters zero``: the series exist but stay at 0, as on Neuron."""
    m = EngineMetrics(7, 1024, True)
    m.num_drafts, m.num_draft_tokens, m.num_accepted = 10, 70, 30
    m.accepted_per_pos[0] = 10
    m.zero_spec_counters = True
    text = render(make_registry(m, "demo-model", 16, 4096)).decode()
    values = {
        s.name: s.value
        for f in text_string_to_metric_families(text)
        if f.name.startswith("vllm:spec_decode")
        for s in f.samples
        if s.name.endswith("_total")
    }
    assert values and set(values.values()) == {0.0}
