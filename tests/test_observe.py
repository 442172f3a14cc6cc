"""One record per request, read alike by the metrics, the policy's learning and the access log."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import orjson
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from gateway.accesslog import AccessLog
from gateway.config import Strategy
from gateway.observability import Metrics
from gateway.observe import ACCESS_FIELDS, SEARCH_USAGE_FROM, Observer, RequestRecord, _r
from gateway.routing.policy import Decision, Feedback, Outcome
from gateway.speculation import Measured
from gateway.upstream.forward import Sent
from gateway.upstream.pool import Endpoint
from gateway.upstream.resume import Resumption
from gateway.upstream.stream import StreamMeter

DECISION = Decision(
    pool="speculative",
    prompt_class="structured",
    reason="predicted-gain",
    p_structured=0.912345,
    kind="code",
    predicted_speedup=1.8765,
    alpha=0.71234,
)
SPEC = Endpoint("speculative", "spec-0", "http://127.0.0.1:1")
SPEC_1 = Endpoint("speculative", "spec-1", "http://127.0.0.1:2")


@dataclass
class Learner:
    """A policy that keeps what it is taught."""

    strategy: Strategy = Strategy.ADAPTIVE
    outcomes: list[Outcome] = field(default_factory=list)

    def observe(self, outcome: Outcome) -> Feedback | None:
        self.outcomes.append(outcome)
        return Feedback(alpha=0.8, predicted_alpha=outcome.decision.alpha, speedup=2.5)


def _sent(endpoint: Endpoint = SPEC) -> Sent:
    return Sent(endpoint, response=None, first=b"", chunks=None, retries=0, sent_at=0.0)  # type: ignore[arg-type]


def _meter(started: float) -> StreamMeter:
    """A stream of 13 tokens in 5 chunks: the prefill token, then three full steps of k + 1 = 4, then 0."""
    meter = StreamMeter(started)
    meter.first_token_at = started + 0.1
    meter.completion_tokens, meter.chunks, meter.token_steps = 13, 5, [1, 4, 4, 4]
    return meter


def _observer(policy: Learner, metrics: Metrics, **kw: Any) -> Observer:
    kw.setdefault("access_log", AccessLog(gather_s=0))
    return Observer(metrics=metrics, policy=policy, speculative_k=lambda endpoint: 3, **kw)


def _logged(observer: Observer, capsys: pytest.CaptureFixture[str]) -> str:
    """What the observer's access log wrote, once its writer has caught up."""
    assert observer.access_log is not None
    observer.access_log.flush()
    return capsys.readouterr().out


def _sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_log_line_has_every_field_in_milliseconds() -> None:
    rec = RequestRecord(
        ts=1700000000.12345,
        request_id="abc",
        route="chat",
        status=200,
        decision=DECISION,
        served_pool="speculative",
        endpoint="spec-0",
        ttft_s=0.1234567,
        tpot_s=0.0123456,
        e2e_s=1.5,
        completion_tokens=100,
        measured=Measured(6, 3, 3, "stream"),
    )
    line = rec.log_line()
    assert tuple(line) == ACCESS_FIELDS
    assert line["ttft_ms"] == 123.46 and line["tpot_ms"] == 12.346 and line["e2e_ms"] == 1500.0
    assert line["p_structured"] == 0.9123 and line["alpha_hat"] == 0.7123
    assert (line["class"], line["kind"], line["pool"], line["decided_pool"]) == (
        "structured",
        "code",
        "speculative",
        "speculative",
    )
    assert line["acceptance"] == pytest.approx(6 / 9, abs=1e-4) and line["spec_steps"] == 3
    assert line["measured_speedup"] is None and line["resumed"] == 0  # unknown stays, as null
    assert "prompt" not in line
    assert (
        RequestRecord(ts=0, request_id="x", route="chat", status=200, prompt="hi").log_line()["prompt"]
        == "hi"
    )


def test_one_record_feeds_metrics_learning_and_the_log(capsys: pytest.CaptureFixture[str]) -> None:
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics)
    started = perf_counter() - 1.0
    rec = observer.record(
        request_id="r1",
        api="chat",
        started=started,
        status=200,
        decision=DECISION,
        payload={"messages": [{"role": "user", "content": "hi"}]},
        sent=_sent(),
        meter=_meter(started),
    )
    observer.observe(rec)

    # the measurement: three full steps of 3 drafts, all accepted
    assert rec.measured is not None and (rec.measured.accepted, rec.measured.steps) == (9, 3)
    assert rec.tpot_s == pytest.approx((rec.e2e_s - 0.1) / 12)
    # the policy learnt from exactly what was measured, and its feedback reached the log
    (outcome,) = policy.outcomes
    assert (outcome.pool, outcome.endpoint, outcome.accepted_tokens, outcome.steps) == (
        "speculative",
        "spec-0",
        9,
        3,
    )
    assert outcome.completion_tokens == 13 and outcome.ttft_s == rec.ttft_s
    assert outcome.rejected_drafts == rec.measured.rejected == 0  # the per-position estimate's other half
    line = orjson.loads(_logged(observer, capsys))
    assert line["measured_speedup"] == 2.5 and line["acceptance"] == 1.0 and "prompt" not in line
    # the metrics counted the same request
    labels = {"route": "chat", "pool": "speculative", "class": "structured", "status": "200"}
    assert _sample(metrics, "specroute_requests_total", **labels) == 1
    assert _sample(metrics, "specroute_accepted_tokens_total", **{"class": "structured"}) == 9
    assert (
        _sample(
            metrics,
            "specroute_time_per_output_token_seconds_count",
            pool="speculative",
            **{"class": "structured"},
        )
        == 1
    )


def test_a_resumed_stream_is_counted_and_logged_but_not_taught(capsys: pytest.CaptureFixture[str]) -> None:
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, log_prompts=True)
    started = perf_counter()
    resumption = Resumption(True, "/v1/chat/completions", {}, {}, broken=[SPEC], endpoints=["spec-1"])
    rec = observer.record(
        request_id="r2",
        api="chat",
        started=started,
        status=200,
        decision=DECISION,
        payload={"messages": [{"role": "user", "content": "hi"}]},
        sent=_sent(SPEC_1),
        meter=_meter(started),
        resumption=resumption,
    )
    observer.observe(rec)
    assert policy.outcomes == [] and rec.measured is None  # two upstreams and an outage: no lesson
    line = orjson.loads(_logged(observer, capsys))
    assert (line["endpoint"], line["resumed"], line["resumed_on"]) == ("spec-0", 1, ["spec-1"])
    assert line["prompt"] == [{"role": "user", "content": "hi"}]


BASE = Endpoint("baseline", "base-1", "http://127.0.0.1:3")


def test_a_stream_resumed_on_the_other_pool_is_counted_where_it_started(capsys) -> None:
    """Decided for baseline and started there (its headers said so, its first token came from there),
    broken, and resumed on a speculative endpoint: it was counted, logged and timed as speculative, its
    baseline TTFT in speculation's histogram. It is the pool that started it, with no time per token
    (its decoding spans two endpoints and the break)."""
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics)
    started = perf_counter() - 1.0
    resumption = Resumption(True, "/v1/completions", {}, {}, broken=[BASE], endpoints=["spec-0"])
    decision = Decision(
        pool="baseline", prompt_class="open-ended", reason="no-gain", p_structured=0.1, kind="qa"
    )
    rec = observer.record(
        request_id="r3", api="completions", started=started, status=200, decision=decision,
        payload={"prompt": "hi", "stream": True}, sent=_sent(SPEC), meter=_meter(started),
        resumption=resumption,
    )  # fmt: skip
    observer.observe(rec)
    assert rec.tpot_s is None and rec.ttft_s is not None
    labels = {"pool": "baseline", "class": "open-ended"}
    assert _sample(metrics, "specroute_requests_total", route="completions", status="200", **labels) == 1
    assert _sample(metrics, "specroute_time_to_first_token_seconds_count", **labels) == 1
    assert _sample(metrics, "specroute_time_per_output_token_seconds_count", **labels) == 0
    assert _sample(metrics, "specroute_completion_tokens_total", **labels) == 13
    assert _sample(metrics, "specroute_requests_total", route="completions", status="200", pool="speculative",
                   **{"class": "open-ended"}) == 0  # fmt: skip
    line = orjson.loads(_logged(observer, capsys))
    assert (line["pool"], line["decided_pool"], line["endpoint"], line["resumed_on"]) == (
        "baseline",
        "baseline",
        "base-1",
        ["spec-0"],
    )


def test_a_non_streamed_request_measured_upstream_has_no_client_ttft() -> None:
    """Streamed upstream to be measured and answered whole: its client saw no first token, so speculation's
    TTFT histogram, which baseline's non-streamed requests never reach, leaves it out; its time per
    token (the realised speedup's) counts."""
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, access_log=None)
    started = perf_counter() - 1.0
    for measurement, ttft in (("interval", 0), ("uncertain", 0), ("stream", 1)):
        rec = observer.record(
            request_id="a", api="chat", started=started, status=200, decision=DECISION,
            payload={"messages": [{"role": "user", "content": "hi"}]}, sent=_sent(), meter=_meter(started),
            measurement=measurement,
        )  # fmt: skip
        before = _sample(
            metrics,
            "specroute_time_to_first_token_seconds_count",
            pool="speculative",
            **{"class": "structured"},
        )
        observer.observe(rec)
        after = _sample(
            metrics,
            "specroute_time_to_first_token_seconds_count",
            pool="speculative",
            **{"class": "structured"},
        )
        assert after - before == ttft and rec.tpot_s is not None


def _two_choices(steps: list[list[int]]) -> list[bytes]:
    """A completion stream of ``n`` = 2 as vLLM sends it with continuous usage: one choice per chunk, each
    chunk's usage counting its own choice's tokens, then the usage chunk with their sum."""
    head = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m"}
    chunks, total = [], [0] * len(steps)
    for i in range(max(map(len, steps))):
        for c, choice in enumerate(steps):
            if i < len(choice):
                total[c] += choice[i]
                last = "length" if i == len(choice) - 1 else None
                text = {"index": c, "text": "x" * choice[i], "logprobs": None, "finish_reason": last}
                usage = {"prompt_tokens": 5, "total_tokens": 5 + total[c], "completion_tokens": total[c]}
                chunks.append({**head, "choices": [text], "usage": usage})
    usage = {"prompt_tokens": 5, "total_tokens": 5 + sum(total), "completion_tokens": sum(total)}
    chunks.append({**head, "choices": [], "usage": usage})
    return [b"data: " + orjson.dumps(chunk) + b"\n\n" for chunk in chunks] + [b"data: [DONE]\n\n"]


def test_a_stream_of_several_sequences_is_counted_but_neither_timed_nor_measured() -> None:
    """One choice that accepted every draft (k = 3), one that accepted none, interleaved: read as one
    sequence their counts jumped between the choices' (steps of 1, 4, 7, 10, 10, 1, ... tokens), and the
    time per token was halved (both choices' tokens over one sequence's time)."""
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, access_log=None)
    started = perf_counter()
    meter = StreamMeter(started)
    for event in _two_choices([[1, 4, 4, 4, 1], [1] * 13]):
        meter.feed(event)
    rec = observer.record(
        request_id="n2", api="completions", started=started, status=200, decision=DECISION,
        payload={"prompt": "Write JSON", "n": 2, "stream": True}, sent=_sent(), meter=meter,
    )  # fmt: skip
    observer.observe(rec)
    assert rec.completion_tokens == 27 and rec.ttft_s is not None  # counted, and its first token timed
    assert rec.measured is None and rec.tpot_s is None
    (outcome,) = policy.outcomes
    assert outcome.sequences == 2 and outcome.accepted_tokens is None
    labels = {"pool": "speculative", "class": "structured"}
    assert _sample(metrics, "specroute_completion_tokens_total", **labels) == 27


TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(
    ("extra", "measured"),
    [
        ({"tools": TOOLS}, False),  # vLLM's tool parser may hold a step back: steps merge
        ({"tools": TOOLS, "tool_choice": "auto"}, False),
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "f"}}}, False),
        ({"functions": [{"name": "f"}]}, False),
        ({"tools": TOOLS, "tool_choice": "none"}, True),  # no parser: a chunk every step
        ({"tools": TOOLS, "logprobs": True}, True),  # a chunk every step, by request
        ({"tools": TOOLS, "return_token_ids": True}, True),
        ({"tools": TOOLS, "logprobs": True, "include_reasoning": False}, False),  # hidden: withheld again
        ({"tools": []}, True),
    ],
)
def test_a_stream_whose_steps_the_server_may_withhold_is_not_measured(
    extra: dict[str, Any], measured: bool
) -> None:
    """Two one-token steps (two rejections) sent as one chunk of two read as one step that accepted a
    draft: a chat with tools, whose steps vLLM's tool parser may hold back, is timed and counted but its
    acceptance is not read from its chunks."""
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, access_log=None)
    started = perf_counter() - 1.0
    payload = {"messages": [{"role": "user", "content": "call f"}], "stream": True, **extra}
    rec = observer.record(
        request_id="t1", api="chat", started=started, status=200, decision=DECISION,
        payload=payload, sent=_sent(), meter=_meter(started),
    )  # fmt: skip
    observer.observe(rec)
    assert rec.tpot_s is not None and rec.completion_tokens == 13
    assert (rec.measured is not None) is measured
    (outcome,) = policy.outcomes
    assert (outcome.accepted_tokens is not None) is measured


def test_a_refused_request_is_counted_not_timed(capsys: pytest.CaptureFixture[str]) -> None:
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, access_log=None)
    observer.observe(observer.record(request_id="r3", api="completions", started=perf_counter(), status=400))
    assert policy.outcomes == [] and capsys.readouterr().out == ""
    labels = {"route": "completions", "pool": "none", "class": "none", "status": "400"}
    assert _sample(metrics, "specroute_requests_total", **labels) == 1
    assert _sample(metrics, "specroute_request_duration_seconds_count", pool="none", **{"class": "none"}) == 0


def test_tokens_are_counted_from_stream_usage() -> None:
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, access_log=None)
    started = perf_counter()
    meter = _meter(started)
    meter.prompt_tokens = 21
    for _ in range(2):
        observer.observe(
            observer.record(
                request_id="r4", api="chat", started=started, status=200, decision=DECISION, sent=_sent(),
                meter=meter,
            )
        )  # fmt: skip
    labels = {"pool": "speculative", "class": "structured"}
    assert _sample(metrics, "specroute_prompt_tokens_total", **labels) == 2 * 21
    assert _sample(metrics, "specroute_completion_tokens_total", **labels) == 2 * 13


def test_tokens_are_counted_from_a_whole_body_and_not_for_errors() -> None:
    metrics, policy = Metrics(), Learner()
    observer = _observer(policy, metrics, access_log=None)
    body = orjson.dumps({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 5}})
    for status in (200, 500):
        observer.observe(
            observer.record(
                request_id="r5", api="completions", started=perf_counter(), status=status,
                decision=DECISION, sent=_sent(), content=body,
            )
        )  # fmt: skip
    labels = {"pool": "speculative", "class": "structured"}
    assert _sample(metrics, "specroute_prompt_tokens_total", **labels) == 7
    assert _sample(metrics, "specroute_completion_tokens_total", **labels) == 5
    broken = orjson.dumps({"usage": {"prompt_tokens": True, "completion_tokens": "5"}})
    rec = observer.record(
        request_id="r6", api="completions", started=perf_counter(), status=200, decision=DECISION,
        sent=_sent(), content=broken,
    )  # fmt: skip
    assert (rec.prompt_tokens, rec.completion_tokens) == (None, None)
    # negative counts (a broken or hostile upstream) are none: the request is still counted and taught
    negative = orjson.dumps({"usage": {"prompt_tokens": -3, "completion_tokens": -1}})
    rec = observer.record(
        request_id="r7", api="completions", started=perf_counter(), status=200, decision=DECISION,
        sent=_sent(), content=negative,
    )  # fmt: skip
    assert (rec.prompt_tokens, rec.completion_tokens) == (None, None)
    observer.observe(rec)
    counted = {"route": "completions", "pool": "speculative", "class": "structured", "status": "200"}
    assert _sample(metrics, "specroute_requests_total", **counted) == 2
    meter = _meter(perf_counter())
    meter.completion_tokens, meter.prompt_tokens = -7, -2
    rec = observer.record(
        request_id="r8", api="chat", started=perf_counter(), status=200, decision=DECISION, sent=_sent(),
        meter=meter,
    )  # fmt: skip
    assert (rec.prompt_tokens, rec.completion_tokens) == (None, None)
    observer.observe(rec)


def _logprobs(n: int) -> list[dict[str, Any]]:
    """A chat response's logprobs for ``n`` tokens (20 alternatives each): 1,300 bytes a token."""
    alt = [{"token": f"t{j}", "logprob": -1.5 * j, "bytes": [116]} for j in range(20)]
    return [{"token": f"tok{i}", "logprob": -0.5, "bytes": [116], "top_logprobs": alt} for i in range(n)]


LARGE_BODIES = {
    "usage at the end": (
        {
            "choices": [{"logprobs": {"content": _logprobs(80)}}],
            "usage": {"prompt_tokens": 9, "completion_tokens": 80},
        },
        (9, 80),
    ),
    "usage with details, prompt logprobs after it": (
        {
            "choices": [{"message": {"content": 'a reply that quotes "usage": {"prompt_tokens": 1}'}}],
            "usage": {
                "prompt_tokens": 4,
                "completion_tokens": 2,
                "prompt_tokens_details": {"cached_tokens": 3},
            },
            "prompt_logprobs": [None, *({str(i): {"logprob": -1.0, "rank": 1}} for i in range(4000))],
        },
        (4, 2),
    ),
    "a Responses body": (
        {"output": [{"content": [{"text": "x" * 70_000}]}], "usage": {"input_tokens": 5, "output_tokens": 8}},
        (5, 8),
    ),
    "usage null": ({"choices": [{"logprobs": {"content": _logprobs(80)}}], "usage": None}, (None, None)),
    "no usage": ({"choices": [{"logprobs": {"content": _logprobs(80)}}]}, (None, None)),
    "usage of the wrong types": (
        {"choices": [{"text": "y" * 70_000}], "usage": {"prompt_tokens": True, "completion_tokens": "5"}},
        (None, None),
    ),
}


@pytest.mark.parametrize("case", LARGE_BODIES, ids=list(LARGE_BODIES))
@pytest.mark.parametrize("indent", [False, True], ids=["compact", "indented"])
def test_tokens_of_a_large_body_are_found_without_parsing_all_of_it(case: str, indent: bool) -> None:
    obj, expected = LARGE_BODIES[case]
    body = orjson.dumps(obj, option=orjson.OPT_INDENT_2 if indent else 0)
    assert len(body) >= SEARCH_USAGE_FROM
    rec = _observer(Learner(), Metrics(), access_log=None).record(
        request_id="r7", api="chat", started=perf_counter(), status=200, decision=DECISION,
        sent=_sent(), content=body,
    )  # fmt: skip
    assert (rec.prompt_tokens, rec.completion_tokens) == expected


@given(st.floats(-1e9, 1e9), st.sampled_from([(1e2, 2), (1e3, 3), (1e4, 4)]))
@example(879609303.1709499, (1e4, 4))  # a near-half where the floats are 1.2e-7 apart
def test_log_rounding_lands_on_the_decimal_grid_next_to_round(x: float, scale: tuple[float, int]) -> None:
    factor, digits = scale
    got = _r(x, factor)
    # the same, or one step over a near-half, give or take the spacing of floats as large as ``x``
    spacing = 4 * math.ulp(x)
    assert abs(got - round(x, digits)) <= 1.0001 / factor + spacing
    assert abs(got - x) <= 0.5001 / factor + spacing
    assert got * factor == pytest.approx(round(got * factor), rel=1e-12, abs=1e-6)


def test_log_rounding_passes_what_cannot_be_scaled() -> None:
    assert math.isnan(_r(math.nan, 1e4))
    assert _r(math.inf, 1e3) == math.inf and _r(-math.inf, 1e3) == -math.inf
    assert _r(1.7e20, 1e3) == 1.7e20
    assert _r(1_764_000_000.123456, 1e3) == 1_764_000_000.123  # a wall-clock timestamp to the millisecond


def test_every_field_of_a_log_line_rounded_as_documented() -> None:
    decision = Decision(
        "speculative",
        "structured",
        "explore",
        0.123456,
        "code",
        predicted_speedup=1.23456,
        explore=True,
        alpha=0.456789,
        alpha_sd=0.345678,
    )
    full = RequestRecord(
        ts=1700000000.123456,
        request_id="r1",
        trace_id="4bf92f3577b34da6a3ce929d0e0e4736",
        route="completions",
        status=200,
        decision=decision,
        served_pool="baseline",
        endpoint="base-0",
        ttft_s=0.0123456,
        tpot_s=0.00123456,
        e2e_s=0.0456789,
        completion_tokens=16,
        measured=Measured(6, 3, 3, "server"),
        resumed_on=["spec-1", "spec-2"],
        measurement="interval",
        feedback=Feedback(0.7, 0.45, 1.98765),
    )
    assert full.log_line() == {
        "ts": 1700000000.123,
        "request_id": "r1",
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "route": "completions",
        "status": 200,
        "pool": "baseline",
        "decided_pool": "speculative",
        "endpoint": "base-0",
        "class": "structured",
        "kind": "code",
        "reason": "explore",
        "explore": True,
        "p_structured": 0.1235,
        "alpha_hat": 0.4568,
        "predicted_speedup": 1.235,
        "alpha_sd": 0.3457,
        "acceptance": 0.6667,
        "alpha": round(Measured(6, 3, 3, "server").alpha, 4),
        "measured_speedup": 1.988,
        "spec_steps": 3,
        "acceptance_source": "server",
        "measurement": "interval",
        "ttft_ms": 12.35,
        "tpot_ms": 1.235,
        "e2e_ms": 45.68,
        "completion_tokens": 16,
        "resumed": 2,
        "resumed_on": ["spec-1", "spec-2"],
    }
    unknowns = Decision("baseline", "open-ended", "forced", 0.5, "qa")
    line = RequestRecord(ts=1.0, request_id="r2", route="chat", status=200, decision=unknowns).log_line()
    assert (line["pool"], line["decided_pool"], line["endpoint"]) == ("baseline", "baseline", None)
    for key in ("alpha_hat", "predicted_speedup", "alpha_sd", "acceptance", "alpha", "measured_speedup"):
        assert line[key] is None, key
    refused = RequestRecord(ts=1.0, request_id="r3", route="chat", status=401).log_line()
    assert (refused["pool"], refused["class"], refused["explore"], refused["resumed"]) == (
        "none",
        "none",
        False,
        0,
    )
    assert all(refused[key] is None for key in ("decided_pool", "kind", "reason", "p_structured", "ttft_ms"))
    assert refused["e2e_ms"] == 0.0 and refused["resumed_on"] is None


def test_a_speculative_endpoint_without_a_known_k_is_named_once_in_the_log(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """No per-position counters and no configured k: streams cannot be read, and the operator is told."""
    observer = Observer(metrics=Metrics(), policy=Learner(), speculative_k=lambda endpoint: None)
    started = perf_counter()
    with caplog.at_level(logging.WARNING, logger="specroute.observe"):
        for endpoint in (SPEC, SPEC, SPEC_1):
            rec = observer.record(
                request_id="r9", api="chat", started=started, status=200, decision=DECISION,
                sent=_sent(endpoint), meter=_meter(started),
            )  # fmt: skip
            assert rec.measured is None
    told = [r.getMessage() for r in caplog.records if "cannot be measured" in r.getMessage()]
    assert len(told) == 2 and "speculative/spec-0" in told[0] and "speculative/spec-1" in told[1]
    assert "num_speculative_tokens" in told[0]
