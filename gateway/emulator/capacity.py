"""How many requests per second an emulator sustains before requests queue, from its settings alone.

The engine (:mod:`gateway.emulator.engine`) alternates prefill steps and decode steps. At ``λ``
requests/s of ``P`` prompt and ``N`` output tokens, each second of engine time holds ``λ`` prefills
(``prefill_overhead_ms + prefill_ms_per_token x P`` each, counted unbatched: the cautious case) and
``λ (N - 1) / t`` decode steps shared by up to ``max_num_seqs`` sequences, where ``t`` is the
tokens one step gives a sequence (1, or ``1 + a + a^2 + ... + a^k`` with speculation at acceptance
``a``). Requests queue when that engine time reaches one second, or when the sequences running at
once (λ x a request's time in the engine, Little's law) reach ``max_num_seqs``; the capacity is the
smaller of the two rates, divided by ``time_scale``.
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.emulator.config import EmulatorConfig


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """The request the figure is for (the defaults: a typical short chat turn)."""

    prompt_tokens: int = 256
    output_tokens: int = 128
    alpha: float = 0.6  # draft acceptance (speculative pool only)


def tokens_per_step(cfg: EmulatorConfig, alpha: float) -> float:
    """Expected tokens one decode step gives a sequence: 1 + the accepted drafts' expectation."""
    if not cfg.speculative:
        return 1.0
    return 1.0 + sum(alpha**i for i in range(1, cfg.num_speculative_tokens + 1))


def decode_step_ms(cfg: EmulatorConfig, running: int) -> float:
    """One decode step over ``running`` sequences (the engine's own cost formula)."""
    if cfg.speculative:
        verified = running * (cfg.num_speculative_tokens + 1)
        draft = cfg.num_speculative_tokens * cfg.draft_cost_ratio * cfg.step_ms
        return cfg.step_ms * max(1.0, verified / cfg.knee_tokens) + draft
    return cfg.step_ms * max(1.0, running / cfg.knee_tokens)


def capacity(cfg: EmulatorConfig, work: Workload | None = None) -> float:
    """Requests/s sustained before requests wait for a slot or for the engine (``inf`` at time scale 0)."""
    w = work or Workload()
    if cfg.time_scale <= 0:
        return float("inf")
    slots = cfg.max_num_seqs
    prefill_s = (cfg.prefill_overhead_ms + cfg.prefill_ms_per_token * w.prompt_tokens) / 1000.0
    steps = max(0.0, w.output_tokens - 1) / tokens_per_step(cfg, w.alpha)
    step_s = decode_step_ms(cfg, slots) / 1000.0
    engine_bound = 1.0 / (prefill_s + steps * step_s / slots)
    # a request holds its slot for its prefill and its decode steps (at a full batch)
    slot_bound = slots / (prefill_s + steps * step_s)
    return min(engine_bound, slot_bound) / cfg.time_scale
