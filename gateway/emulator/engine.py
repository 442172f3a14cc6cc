"""A continuous-batching engine loop with emulated speculative decoding.

One asyncio task per process plays vLLM's engine core:

* requests wait in a FIFO queue; at most ``max_num_seqs`` run at once;
* whenever sequences were admitted, the next engine step is a *prefill step* for them, costing
  ``prefill_overhead_ms + prefill_ms_per_token x (their prompt tokens)``; it yields each one's first
  token (the same in both modes, so time to first token is the same);
* otherwise the step is a *decode step* over all running sequences. The target model verifies
  ``V = sum(k + 1)`` tokens with speculation (``V = n`` without); the step costs
  ``step_ms x max(1, V / knee_tokens)`` plus, with speculation, ``k x draft_cost_ratio x step_ms`` for
  the k draft-model steps. Each speculative sequence then emits ``1 + accepted`` tokens, where
  ``accepted`` is the number of leading successes of k Bernoulli(alpha) draws (drawing stops at the
  first rejection), in ONE output event (one SSE chunk);
* every delay is multiplied by ``time_scale``; with ``time_scale == 0`` requests bypass the loop and
  are computed inline (:meth:`Engine.run_inline`).

Draws come from a per-request RNG, so a request's tokens and chunking do not depend on batching.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from typing import Any, Protocol

from gateway.emulator.config import EmulatorConfig
from gateway.emulator.metrics import EngineMetrics
from gateway.emulator.tokenizer import piece_id


class Source(Protocol):
    """Where a sequence's tokens come from; fewer than asked means the answer is complete."""

    def take(self, n: int) -> list[str]: ...


#: an output event: (sequence, first new token index, end token index, new visible text, finished?)
Event = tuple["Seq", int, int, str, bool]


class Group:
    """The sequences of one HTTP request (one per prompt) and the events they produced."""

    __slots__ = ("aborted", "arrival", "done", "events", "remaining", "seqs", "stream", "wake")

    def __init__(self, stream: bool, timed: bool) -> None:
        self.seqs: list[Seq] = []
        self.events: list[Event] = []
        self.stream = stream
        self.wake: asyncio.Event | None = asyncio.Event() if timed else None
        self.remaining = 0
        self.done = False
        self.aborted = False
        self.arrival = time.monotonic()

    def take(self) -> list[Event]:
        evs = self.events
        self.events = []
        return evs


class Seq:
    """One generated sequence: its prompt, limits, acceptance probability and output so far."""

    __slots__ = (
        "accepted",
        "alpha",
        "emitted",
        "finish_reason",
        "group",
        "holdback",
        "include_stop",
        "index",
        "lp_offset",
        "lp_rng",
        "max_tokens",
        "out_ids",
        "pieces",
        "prompt_ids",
        "prompt_len",
        "rng",
        "source",
        "spec_steps",
        "stop_reason",
        "stops",
        "t_first",
        "t_last",
        "t_sched",
        "text",
    )

    def __init__(
        self,
        group: Group,
        index: int,
        prompt_ids: tuple[int, ...],
        max_tokens: int,
        source: Source,
        rng: random.Random,
        alpha: float,
        stops: list[str] | None = None,
        include_stop: bool = False,
    ) -> None:
        self.group = group
        self.index = index
        self.prompt_ids = prompt_ids
        self.prompt_len = len(prompt_ids)
        self.max_tokens = max_tokens
        self.source = source
        self.rng = rng
        self.alpha = alpha
        self.stops = stops or None
        self.include_stop = include_stop
        self.holdback = max(len(s) for s in stops) - 1 if stops else 0
        self.out_ids: list[int] = []
        self.pieces: list[str] = []
        self.text = ""
        self.emitted = 0
        self.finish_reason: str | None = None
        self.stop_reason: str | None = None
        self.spec_steps = 0
        self.accepted = 0
        self.t_sched = 0.0
        self.t_first = 0.0
        self.t_last = 0.0
        self.lp_rng: random.Random | None = None
        self.lp_offset = 0
        group.seqs.append(self)
        group.remaining += 1

    # -- token production ---------------------------------------------------------------------
    def produce(self, n: int) -> int:
        """Append up to ``n`` tokens, stopping at a stop string or ``max_tokens``; push one event."""
        start = len(self.out_ids)
        n = min(n, self.max_tokens - start)
        new = self.source.take(n)
        ended = len(new) < n  # a constrained answer is complete: the model emits EOS
        ids = self.out_ids
        pcs = self.pieces
        stops = self.stops
        if stops is None:
            pcs.extend(new)
            ids.extend(map(piece_id, new))
        else:
            for piece in new:
                pcs.append(piece)
                ids.append(piece_id(piece))
                before = len(self.text)
                self.text += piece
                hit = -1
                for s in stops:
                    i = self.text.find(s, max(0, before - len(s) + 1))
                    if i >= 0 and (hit < 0 or i < hit):
                        hit, self.stop_reason = i, s
                if hit >= 0:
                    assert self.stop_reason is not None
                    self.text = self.text[: hit + (len(self.stop_reason) if self.include_stop else 0)]
                    self.finish_reason = "stop"
                    break
        end = len(ids)
        if self.finish_reason is None and ended:
            self.finish_reason = "stop"
        if self.finish_reason is None and end >= self.max_tokens:
            self.finish_reason = "length"
        finished = self.finish_reason is not None
        if stops is None:
            delta = "".join(pcs[start:end])
        else:
            visible = len(self.text) if finished else max(self.emitted, len(self.text) - self.holdback)
            delta = self.text[self.emitted : visible]
            self.emitted = visible
        if self.group.stream:
            self.group.events.append((self, start, end, delta, finished))
        return end - start

    def full_text(self) -> str:
        return "".join(self.pieces) if self.stops is None else self.text

    def draws(self, k: int) -> int:
        """Accepted draft tokens of one verification step: leading successes of k Bernoulli(alpha)."""
        rnd = self.rng.random
        alpha = self.alpha
        n = 0
        while n < k and rnd() < alpha:
            n += 1
        return n

    def spec_summary(self, k: int) -> dict[str, Any]:
        steps = self.spec_steps
        drafted = steps * k
        return {
            "mean_acceptance_length": (1.0 + self.accepted / steps) if steps else 1.0,
            "draft_acceptance_rate": (self.accepted / drafted) if drafted else 0.0,
            "num_spec_steps": steps,
            "num_draft_tokens": drafted,
            "num_accepted_draft_tokens": self.accepted,
        }


class Engine:
    def __init__(self, cfg: EmulatorConfig, metrics: EngineMetrics) -> None:
        self.cfg = cfg
        self.m = metrics
        self.k = cfg.num_speculative_tokens
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._deadline = 0.0
        self.counters: dict[str, int] = {
            "requests": 0,
            "finished": 0,
            "aborted": 0,
            "engine_steps": 0,
            "prefill_steps": 0,
            "decode_steps": 0,
        }

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="emulator-engine")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    # -- requests ------------------------------------------------------------------------------
    def submit(self, group: Group) -> None:
        self.counters["requests"] += 1
        self.waiting.extend(group.seqs)
        self.m.waiting = len(self.waiting)
        assert self._wake is not None, "engine not started"
        self._wake.set()

    def abort(self, group: Group) -> None:
        """Remove a request from the engine (client gone), like vLLM's abort."""
        if group.done or group.aborted:
            return
        group.aborted = True
        self.counters["aborted"] += 1
        for seq in group.seqs:
            if seq.finish_reason is None:
                seq.finish_reason = "abort"
                self.m.success["abort"] += 1
        if group.seqs and any(s in self.running for s in group.seqs):
            self.running = [s for s in self.running if s.group is not group]
        self.m.running = len(self.running)
        self._update_waiting()
        if group.wake is not None:
            group.wake.set()

    def _update_waiting(self) -> None:
        while self.waiting and self.waiting[0].group.aborted:
            self.waiting.popleft()
        self.m.waiting = sum(1 for s in self.waiting if not s.group.aborted)

    # -- costs -------------------------------------------------------------------------------
    def prefill_cost_ms(self, prompt_tokens: int) -> float:
        c = self.cfg
        return c.prefill_overhead_ms + c.prefill_ms_per_token * prompt_tokens

    def decode_cost_ms(self, n_running: int) -> float:
        c = self.cfg
        if c.speculative:
            verified = n_running * (self.k + 1)
            return c.step_ms * max(1.0, verified / c.knee_tokens) + self.k * c.draft_cost_ratio * c.step_ms
        return c.step_ms * max(1.0, n_running / c.knee_tokens)

    # -- the loop ----------------------------------------------------------------------------
    async def _sleep(self, cost_ms: float) -> None:
        delay = cost_ms * self.cfg.time_scale / 1000.0
        loop = asyncio.get_running_loop()
        now = loop.time()
        # keep a steady cadence inside a busy period (absorb our own processing time and small
        # scheduling delays), but never start a step before it was due
        start = self._deadline if 0.0 <= now - self._deadline < max(0.005, delay) else now
        self._deadline = start + delay
        wait = self._deadline - now
        if wait > 0:
            await asyncio.sleep(wait)
        else:
            await asyncio.sleep(0)

    async def _run(self) -> None:
        assert self._wake is not None
        wake = self._wake
        m = self.m
        while True:
            if not self.running and not self.waiting:
                self._deadline = float("-inf")  # idle: the next step starts when it is scheduled
                wake.clear()
                await wake.wait()
                continue
            admitted: list[Seq] = []
            while self.waiting and len(self.running) < self.cfg.max_num_seqs:
                seq = self.waiting.popleft()
                if seq.group.aborted:
                    continue
                self.running.append(seq)
                admitted.append(seq)
            m.waiting = len(self.waiting)
            m.running = len(self.running)
            self.counters["engine_steps"] += 1
            if admitted:
                now = time.monotonic()
                for seq in admitted:
                    seq.t_sched = now
                tokens = sum(s.prompt_len for s in admitted)
                m.prompt_tokens += tokens
                self.counters["prefill_steps"] += 1
                await self._sleep(self.prefill_cost_ms(tokens))
                now = time.monotonic()
                m.h_iteration_tokens.observe(tokens)
                for seq in admitted:
                    if seq.finish_reason is None:
                        self._first_token(seq, now)
            elif self.running:
                batch = list(self.running)
                self.counters["decode_steps"] += 1
                await self._sleep(self.decode_cost_ms(len(batch)))
                now = time.monotonic()
                self._decode(batch, now)
            self._update_kv()
            self.running = [s for s in self.running if s.finish_reason is None]
            m.running = len(self.running)
            self._update_waiting()

    def _update_kv(self) -> None:
        bs = self.cfg.block_size
        used = sum(
            -(-(s.prompt_len + len(s.out_ids)) // bs) * bs for s in self.running if s.finish_reason is None
        )
        self.m.kv_cache_usage = min(1.0, used / self.cfg.kv_cache_tokens)

    def _first_token(self, seq: Seq, now: float) -> None:
        seq.t_first = seq.t_last = now
        self.m.h_ttft.observe(now - seq.group.arrival)
        self.m.generation_tokens += seq.produce(1)
        self._after_output(seq, now)

    def _decode(self, batch: list[Seq], now: float) -> None:
        m = self.m
        speculative = self.cfg.speculative
        k = self.k
        verified = 0
        n_spec = 0
        acc_total = 0
        per_pos = m.accepted_per_pos
        for seq in batch:
            if seq.finish_reason is not None:
                continue
            if speculative:
                acc = seq.draws(k)
                seq.spec_steps += 1
                seq.accepted += acc
                n_spec += 1
                acc_total += acc
                for i in range(acc):
                    per_pos[i] += 1
                verified += k + 1
                want = 1 + acc
            else:
                verified += 1
                want = 1
            m.h_itl.observe(now - seq.t_last)
            seq.t_last = now
            m.generation_tokens += seq.produce(want)
            self._after_output(seq, now)
        if n_spec:
            m.num_drafts += n_spec
            m.num_draft_tokens += n_spec * k
            m.num_accepted += acc_total
        m.h_iteration_tokens.observe(verified)

    def _after_output(self, seq: Seq, now: float) -> None:
        group = seq.group
        if seq.finish_reason is not None:
            self._finished(seq, now)
            group.remaining -= 1
            if group.remaining == 0:
                group.done = True
        if group.wake is not None and (group.stream or group.done):
            group.wake.set()

    def _finished(self, seq: Seq, now: float) -> None:
        m = self.m
        self.counters["finished"] += 1
        n = len(seq.out_ids)
        reason = seq.finish_reason or "stop"
        m.success[reason] = m.success.get(reason, 0) + 1
        arrival = seq.group.arrival
        m.h_e2e.observe(now - arrival)
        m.h_queue.observe(seq.t_sched - arrival)
        m.h_inference.observe(now - seq.t_sched)
        m.h_prefill.observe(seq.t_first - seq.t_sched)
        m.h_decode.observe(now - seq.t_first)
        m.h_tpot.observe((now - seq.t_first) / (n - 1) if n > 1 else 0.0)
        m.h_prompt_tokens.observe(seq.prompt_len)
        m.h_generation_tokens.observe(n)
        m.h_max_generation_tokens.observe(seq.max_tokens)
        m.h_params_n.observe(1)
        m.h_params_max_tokens.observe(seq.max_tokens)
        m.h_preemptions.observe(0)
        m.h_prefill_kv.observe(seq.prompt_len)

    # -- zero-delay path ---------------------------------------------------------------------
    def run_inline(self, group: Group) -> None:
        """Compute a whole request at once (``time_scale == 0``): same tokens, chunks and counters
        as the loop, no waiting, metrics recorded once per request."""
        self.counters["requests"] += 1
        m = self.m
        speculative = self.cfg.speculative
        k = self.k
        per_pos = m.accepted_per_pos
        for seq in group.seqs:
            now = time.monotonic()
            seq.t_sched = seq.t_first = now
            m.prompt_tokens += seq.prompt_len
            m.h_ttft.observe(now - group.arrival)
            produced = seq.produce(1)
            steps = 0
            while seq.finish_reason is None:
                steps += 1
                if speculative:
                    acc = seq.draws(k)
                    seq.accepted += acc
                    for i in range(acc):
                        per_pos[i] += 1
                    produced += seq.produce(1 + acc)
                else:
                    produced += seq.produce(1)
            m.generation_tokens += produced
            if speculative:
                seq.spec_steps = steps
                m.num_drafts += steps
                m.num_draft_tokens += steps * k
                m.num_accepted += seq.accepted
            now = time.monotonic()
            if steps:
                m.h_itl.observe((now - seq.t_first) / steps, steps)
            self._finished(seq, now)
        group.remaining = 0
        group.done = True
