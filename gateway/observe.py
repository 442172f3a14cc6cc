"""Observe: one finished request, recorded once, read by the metrics, the routing policy and the access log.

The last step of a request's path (validate → classify → decide → forward → observe). The API edge
hands over what happened (the decision, the upstream answer, the stream's meter or the body);
:meth:`Observer.record` turns it into one :class:`RequestRecord`, and :meth:`Observer.observe` feeds that
same record to the Prometheus metrics, to the policy's learning and to the access log, so the three never
disagree about a request.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import orjson

from gateway.accesslog import AccessLog
from gateway.config import Strategy
from gateway.observability import Metrics
from gateway.routing.measurement import ASSEMBLED
from gateway.routing.policy import Decision, Feedback, Outcome, Policy
from gateway.speculation import Measured, chunks_withheld, from_server, from_token_steps, sequences
from gateway.types import PoolName, Route
from gateway.upstream.forward import Sent
from gateway.upstream.pool import Endpoint
from gateway.upstream.resume import Resumption
from gateway.upstream.stream import StreamMeter

log = logging.getLogger("specroute.observe")


def _r(x: float, scale: float) -> float:
    """``x`` rounded to ``1 / scale`` for the access log: ``round(x, n)`` without its exact decimal
    conversion, which formats each value as a string first (5,400 instructions a request less). It
    may differ from ``round(x, n)`` in the last digit where ``x * scale`` falls a hair from a half,
    which a log does not mind; NaN, infinities and values too large to scale pass as they are."""
    y = x * scale
    return round(y) / scale if -1e15 < y < 1e15 else x


@dataclass(slots=True, kw_only=True)
class RequestRecord:
    """What one request did, from the first byte read to the last byte written."""

    ts: float
    request_id: str
    route: Route
    status: int
    trace_id: str | None = None  # of the caller's traceparent, which went upstream with the request
    decision: Decision | None = None
    served_pool: PoolName | None = None  # the pool whose endpoint answered
    endpoint: str | None = None  # the endpoint that served the start, else the last one tried
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float = 0.0
    completion_tokens: int | None = None
    prompt_tokens: int | None = None  # from the upstream's usage; counted, not logged
    chunks: int = 0
    measured: Measured | None = None  # acceptance measured on this response (speculative pool only)
    resumed_on: list[str] | None = None  # where a broken stream went on, in order
    measurement: str | None = None  # speculative: stream, uncertain, interval, passed or unmeasurable
    prompt: object | None = None  # only under ``logging.log_prompts``
    feedback: Feedback | None = None  # what the policy made of it, once observed
    sequences: int = 1  # generated side by side (n > 1): neither timed per token nor measured

    @property
    def pool(self) -> str:
        """The pool that served it, else the one it was sent to, else ``none`` (refused before routing)."""
        return self.served_pool or (self.decision.pool if self.decision else "none")

    @property
    def prompt_class(self) -> str:
        return self.decision.prompt_class if self.decision else "none"

    @property
    def served(self) -> bool:
        """Answered by an upstream with a success status: the requests whose timings mean something."""
        return self.decision is not None and self.endpoint is not None and self.status < 300

    def log_line(self) -> dict[str, object]:
        """The access-log line: every key of :data:`ACCESS_FIELDS`, ``None`` where unknown; times in ms.

        A fixed key set keeps the lines easy to query in a log store. ``alpha_hat`` is the acceptance the
        decision expected and ``alpha_sd`` its uncertainty (per-request model); ``acceptance`` and
        ``alpha`` are what this response showed, and ``measured_speedup`` the speedup model's TPOT ratio
        at the measured alpha, the counterpart of ``predicted_speedup``. ``resumed`` counts how often a
        broken stream went on elsewhere (``endpoint`` is the one that served the start).
        ``measurement`` says how a request decided for the speculative pool was measured: ``stream``
        (a streamed request), ``uncertain`` or ``interval`` (a non-streamed one streamed upstream and
        assembled, see :mod:`gateway.routing.measurement`), ``passed`` (sent as it came, unmeasured),
        ``unmeasurable`` (a non-streamed one that cannot be rebuilt from a stream: tools, logprobs...).
        """
        # written out rather than through helpers: this runs once per request, on the event loop
        d, m, f = self.decision, self.measured, self.feedback
        decided: str | None
        kind: str | None
        reason: str | None
        cls: str
        if d is not None:
            decided, cls, kind, reason, explore = d.pool, d.prompt_class, d.kind, d.reason, d.explore
            p_structured: float | None = _r(d.p_structured, 1e4)
            alpha_hat = None if d.alpha is None else _r(d.alpha, 1e4)
            predicted = None if d.predicted_speedup is None else _r(d.predicted_speedup, 1e3)
            alpha_sd = None if d.alpha_sd is None else _r(d.alpha_sd, 1e4)
        else:
            decided = kind = reason = p_structured = alpha_hat = predicted = alpha_sd = None
            cls, explore = "none", False
        if m is not None:
            acceptance: float | None = _r(m.rate, 1e4)
            alpha: float | None = _r(m.alpha, 1e4)
            steps: float | None = m.steps
            source: str | None = m.source
        else:
            acceptance = alpha = steps = source = None
        ttft, tpot, resumed_on = self.ttft_s, self.tpot_s, self.resumed_on
        line: dict[str, object] = {
            "ts": _r(self.ts, 1e3),
            "request_id": self.request_id,
            "trace_id": self.trace_id,
            "route": self.route,
            "status": self.status,
            "pool": self.served_pool or (decided or "none"),
            "decided_pool": decided,
            "endpoint": self.endpoint,
            "class": cls,
            "kind": kind,
            "reason": reason,
            "explore": explore,
            "p_structured": p_structured,
            "alpha_hat": alpha_hat,
            "predicted_speedup": predicted,
            "alpha_sd": alpha_sd,
            "acceptance": acceptance,
            "alpha": alpha,
            "measured_speedup": None if f is None or f.speedup is None else _r(f.speedup, 1e3),
            "spec_steps": steps,
            "acceptance_source": source,
            "measurement": self.measurement,
            "ttft_ms": None if ttft is None else _r(ttft * 1000, 1e2),
            "tpot_ms": None if tpot is None else _r(tpot * 1000, 1e3),
            "e2e_ms": _r(self.e2e_s * 1000, 1e2),
            "completion_tokens": self.completion_tokens,
            "resumed": len(resumed_on) if resumed_on else 0,
            "resumed_on": resumed_on or None,
        }
        if self.prompt is not None:
            line["prompt"] = self.prompt
        return line


class Observer:
    """Turns what the API edge saw into a :class:`RequestRecord` and feeds it to all that learn from it."""

    def __init__(
        self,
        *,
        metrics: Metrics,
        policy: Policy,
        speculative_k: Callable[[Endpoint], int | None],
        access_log: AccessLog | None = None,
        log_prompts: bool = False,
    ):
        self.metrics = metrics
        self.policy = policy
        self.speculative_k = speculative_k
        self.access_log = access_log
        self.log_prompts = log_prompts
        self._k_unknown: set[str] = set()  # endpoints told to have no known k (said once each)
        # the series every request counts, each label set looked up once (see Series)
        self._decisions = metrics.counters(metrics.decisions)
        self._predicted_speedup = metrics.histograms(metrics.predicted_speedup)
        self._exploration = metrics.counters(metrics.exploration)
        self._failovers = metrics.counters(metrics.failovers)
        self._requests = metrics.counters(metrics.requests)
        self._e2e = metrics.histograms(metrics.e2e)
        self._prompt_tokens = metrics.counters(metrics.prompt_tokens)
        self._completion_tokens = metrics.counters(metrics.completion_tokens)
        self._ttft = metrics.histograms(metrics.ttft)
        self._tpot = metrics.histograms(metrics.tpot)
        self._request_acceptance = metrics.histograms(metrics.request_acceptance)
        self._accepted_tokens = metrics.counters(metrics.accepted_tokens)
        self._draft_tokens = metrics.counters(metrics.draft_tokens)

    def close(self) -> None:
        """Write out the access-log lines still queued (at shutdown, once requests have finished)."""
        if self.access_log is not None:
            self.access_log.close()

    def decided(self, decision: Decision, strategy: Strategy) -> None:
        """Count a routing decision: which pool, why, the predicted speedup, exploration."""
        # ``_value_``: the member's value without ``Enum.value``'s descriptor, a Python call
        self._decisions[strategy._value_, decision.pool, decision.reason].inc()
        if decision.predicted_speedup is not None:
            self._predicted_speedup[(decision.prompt_class,)].observe(decision.predicted_speedup)
        if decision.explore:
            self._exploration[(decision.kind,)].inc()

    def forwarded(self, decision: Decision, pool: PoolName) -> None:
        """Count a request that an endpoint of the other pool took (the decided pool had none)."""
        if pool != decision.pool:
            self._failovers[decision.pool, pool].inc()

    def record(
        self,
        *,
        request_id: str,
        api: Route,
        started: float,
        status: int,
        decision: Decision | None = None,
        payload: Mapping[str, Any] | None = None,
        sent: Sent | None = None,
        meter: StreamMeter | None = None,
        content: bytes | None = None,
        resumption: Resumption | None = None,
        measurement: str | None = None,
        trace_id: str | None = None,
        tried: Sequence[Endpoint] = (),
    ) -> RequestRecord:
        """The record of a request that ``started`` (``perf_counter``) and just finished with ``status``."""
        e2e = perf_counter() - started
        resumed_on = resumption.endpoints if resumption is not None and resumption.endpoints else None
        rec = RequestRecord(
            ts=time.time(),
            request_id=request_id,
            trace_id=trace_id,
            route=api,
            status=status,
            decision=decision,
            # a resumed stream's pool is the one that started it: the pool its headers named to the client,
            # whose endpoint gave its first token (the endpoints it went on on are in ``resumed_on``)
            served_pool=(
                resumption.broken[0].pool if resumed_on and resumption else sent.pool if sent else None
            ),
            e2e_s=e2e,
            resumed_on=resumed_on,
            measurement=measurement,
            prompt=_prompt(payload) if self.log_prompts else None,
        )
        if sent is not None:
            rec.endpoint = resumption.broken[0].name if resumed_on and resumption else sent.endpoint.name
        elif tried:  # none answered (a time-out, a 5xx everywhere) or the client left first: the last try
            rec.endpoint = tried[-1].name
        if meter is not None:
            rec.completion_tokens, rec.chunks = meter.completion_tokens, meter.chunks
            rec.prompt_tokens = meter.prompt_tokens
            if meter.first_token_at is not None:
                rec.ttft_s = meter.first_token_at - started
        elif content is not None and status < 300:
            rec.prompt_tokens, rec.completion_tokens = _usage_tokens(content)
        # counts are the upstream's word: a negative one is none (counters cannot go down, and a request
        # whose bookkeeping failed would leave no log line and teach nothing)
        if rec.completion_tokens is not None and rec.completion_tokens < 0:
            rec.completion_tokens = None
        if rec.prompt_tokens is not None and rec.prompt_tokens < 0:
            rec.prompt_tokens = None
        if not rec.served:
            return rec
        # several sequences side by side (n > 1): their tokens add up and their chunks interleave, so
        # neither a time per token nor engine steps can be read from the stream
        rec.sequences = sequences(payload)
        if rec.sequences > 1:
            return rec
        # a resumed stream's decoding spans two endpoints and the break between them: no time per token
        if (
            rec.ttft_s is not None
            and rec.completion_tokens
            and rec.completion_tokens > 1
            and resumed_on is None
        ):
            rec.tpot_s = (e2e - rec.ttft_s) / (rec.completion_tokens - 1)
        # a resumed stream's acceptance would mix two upstreams: not measured
        if meter is not None and sent is not None and sent.pool == "speculative" and resumed_on is None:
            rec.measured = self._measure(sent.endpoint, meter, chunks_withheld(payload))
        return rec

    def observe(self, rec: RequestRecord) -> None:
        """Metrics, the policy's feedback, the access log: all from ``rec``."""
        served = rec.served
        self._count(rec, served)
        if served and rec.resumed_on is None and rec.decision and rec.served_pool and rec.endpoint:
            # a resumed stream's timing spans two endpoints and the break between them: not taught
            m = rec.measured
            rec.feedback = self.policy.observe(
                Outcome(
                    rec.decision,
                    rec.served_pool,
                    rec.endpoint,
                    rec.status,
                    rec.ttft_s,
                    rec.e2e_s,
                    rec.completion_tokens,
                    rec.chunks,
                    int(m.accepted) if m else None,
                    int(m.draft_tokens) if m else None,
                    int(m.steps) if m else None,
                    int(m.rejected) if m and m.rejected is not None else None,
                    rec.sequences,
                )
            )
        if self.access_log is not None:
            self.access_log.write(rec.log_line())

    def _count(self, rec: RequestRecord, served: bool) -> None:
        # rec.pool and rec.prompt_class written out: a property is a Python call, ~1,500 instructions
        d = rec.decision
        pool = rec.served_pool or (d.pool if d else "none")
        cls = d.prompt_class if d else "none"
        self._requests[rec.route, pool, cls, rec.status].inc()
        if not served:
            return
        labels = (pool, cls)
        self._e2e[labels].observe(rec.e2e_s)
        if rec.prompt_tokens:
            self._prompt_tokens[labels].inc(rec.prompt_tokens)
        if rec.completion_tokens:
            self._completion_tokens[labels].inc(rec.completion_tokens)
        # the client's first token: a non-streamed request streamed upstream to be measured had one there,
        # which its client never saw (and baseline's non-streamed requests have none to compare)
        if rec.ttft_s is not None and rec.measurement not in ASSEMBLED:
            self._ttft[labels].observe(rec.ttft_s)
        if rec.tpot_s is not None:
            self._tpot[labels].observe(rec.tpot_s)
        if rec.measured is not None:
            self._request_acceptance[(cls,)].observe(rec.measured.rate)
            self._accepted_tokens[(cls,)].inc(int(rec.measured.accepted))
            self._draft_tokens[(cls,)].inc(int(rec.measured.draft_tokens))

    def _measure(self, endpoint: Endpoint, meter: StreamMeter, withheld: bool) -> Measured | None:
        """The request's acceptance: the server's own summary when it sent one, else tokens per chunk
        (unless the server may have withheld chunks: :func:`~gateway.speculation.chunks_withheld`)."""
        k = self.speculative_k(endpoint)
        measured = from_server(meter.spec_metrics, k) if meter.spec_metrics else None
        if measured is None and withheld:
            return None
        if (
            measured is None
            and k is None
            and len(meter.token_steps) > 1
            and endpoint.name not in self._k_unknown
        ):
            # tokens per chunk say nothing without k: routing would rest on the prior for good and never
            # notice a draft gone bad, so the operator is told what to set
            self._k_unknown.add(endpoint.name)
            log.warning(
                "acceptance of %s/%s cannot be measured: its /metrics has no per-position acceptance "
                "counters and pools.speculative.num_speculative_tokens is not set; set it to the "
                "server's num_speculative_tokens",
                endpoint.pool,
                endpoint.name,
            )
        return measured or from_token_steps(meter.token_steps, k)


def _usage_tokens(content: bytes) -> tuple[int | None, int | None]:
    """``(prompt_tokens, completion_tokens)`` from a whole response body's ``usage``.

    A large body (logprobs make a response megabytes: 12 ms of the event loop to parse 1.3 MB) has its
    usage found by its key instead (:func:`_searched_usage`); a small one, or one where the search finds
    nothing it can read, is parsed whole.
    """
    if len(content) >= SEARCH_USAGE_FROM:
        found = _searched_usage(content)
        if found is not None:
            return found
    try:
        obj = orjson.loads(content)
    except orjson.JSONDecodeError:
        return None, None
    usage = obj.get("usage") if isinstance(obj, dict) else None
    return _tokens(usage) if isinstance(usage, dict) else (None, None)


#: bodies at least this long have their usage searched for rather than parsed out of the whole body
SEARCH_USAGE_FROM = 1 << 16
_USAGE_KEY = b'"usage":'
_USAGE_TAIL = 1 << 12  # vLLM writes usage after the choices: usually within the body's last few KiB


def _searched_usage(content: bytes) -> tuple[int | None, int | None] | None:
    """The token counts of the ``usage`` object found by its key; None where it cannot be read so.

    Outside a JSON string a quote is never escaped, so ``"usage":`` is a key wherever it stands, and in
    an OpenAI-shaped body nothing before the top-level usage (choices: text, messages, tool-call
    arguments and logprobs, all strings or numbers) has a key of that name: it is the last one in the
    tail, else the first one in the body (after it vLLM may send prompt logprobs, megabytes too). The
    object is read up to its matching brace (its values are numbers or objects of numbers).
    """
    i = content.rfind(_USAGE_KEY, len(content) - _USAGE_TAIL)
    if i < 0:
        i = content.find(_USAGE_KEY)
        if i < 0:
            return None
    start = i + len(_USAGE_KEY)
    end = start
    while True:
        end = content.find(b"}", end) + 1
        if end <= 0 or end - start > _USAGE_TAIL:
            return None
        if content.count(b"{", start, end) == content.count(b"}", start, end):
            break
    try:
        usage = orjson.loads(content[start:end])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(usage, dict):
        return None
    tokens = _tokens(usage)
    return None if tokens == (None, None) else tokens


def _tokens(usage: dict[str, Any]) -> tuple[int | None, int | None]:
    # chat and completions name them prompt/completion_tokens; a Responses body input/output_tokens
    prompt = usage.get("prompt_tokens", usage.get("input_tokens"))
    completion = usage.get("completion_tokens", usage.get("output_tokens"))
    return (
        prompt if isinstance(prompt, int) and not isinstance(prompt, bool) else None,
        completion if isinstance(completion, int) and not isinstance(completion, bool) else None,
    )


def _prompt(payload: Mapping[str, Any] | None) -> object | None:
    if payload is None:
        return None
    return payload.get("messages") if "messages" in payload else payload.get("prompt")


ACCESS_FIELDS: tuple[str, ...] = tuple(
    RequestRecord(ts=0.0, request_id="", route="chat", status=0).log_line()
)
"""Keys of every access-log line, in order; ``prompt`` follows only when ``logging.log_prompts`` is on."""
