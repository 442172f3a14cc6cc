"""Small HTTP helpers shared by the tests: requests, SSE streams, Prometheus text, comparisons."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx
from prometheus_client.parser import text_string_to_metric_families

T = TypeVar("T")
TIMEOUT = httpx.Timeout(120.0, connect=5.0)
# Fields that differ between two otherwise identical responses.
VOLATILE = frozenset({"id", "created", "system_fingerprint"})


@dataclass
class Stream:
    status: int
    headers: httpx.Headers
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    body: bytes = b""

    def text(self) -> str:
        """All generated text, for completions (``text``) and chat (``delta.content``)."""
        out = []
        for ev in self.events:
            for ch in ev.get("choices") or []:
                out.append(ch.get("text") or (ch.get("delta") or {}).get("content") or "")
        return "".join(out)

    def tokens_per_chunk(self) -> list[int]:
        """Tokens each content chunk carried, from cumulative ``usage.completion_tokens``."""
        counts, last = [], 0
        for ev in self.events:
            usage = ev.get("usage")
            if ev.get("choices") and usage:
                counts.append(usage["completion_tokens"] - last)
                last = usage["completion_tokens"]
        return [c for c in counts if c > 0]


def post(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=headers, timeout=TIMEOUT)


def stream(url: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None) -> Stream:
    """POST with ``stream: true`` and collect every ``data:`` event."""
    with httpx.stream(
        "POST", url + path, json={**body, "stream": True}, headers=headers, timeout=TIMEOUT
    ) as r:
        out = Stream(r.status_code, r.headers)
        if r.status_code != 200:
            out.body = r.read()
            return out
        for line in r.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                out.done = True
            else:
                out.events.append(json.loads(data))
    return out


def strip_volatile(obj: Any) -> Any:
    """``obj`` without ids and timestamps, recursively."""
    if isinstance(obj, dict):
        return {k: strip_volatile(v) for k, v in obj.items() if k not in VOLATILE}
    if isinstance(obj, list):
        return [strip_volatile(v) for v in obj]
    return obj


def shape(obj: Any) -> Any:
    """The structure of a JSON value: keys and value types, with lists reduced to their first item."""
    if isinstance(obj, dict):
        return {k: shape(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [shape(obj[0])] if obj else []
    if isinstance(obj, bool) or obj is None:
        return type(obj).__name__
    if isinstance(obj, int | float):
        return "number"
    return type(obj).__name__


@dataclass(frozen=True)
class Series:
    name: str
    type: str
    labels: frozenset[str]


def metric_series(text: str, prefix: str = "vllm:") -> dict[str, Series]:
    """Metric families under ``prefix`` with their type and label names (``_created`` samples ignored)."""
    out: dict[str, Series] = {}
    for fam in text_string_to_metric_families(text):
        if not fam.name.startswith(prefix):
            continue
        labels: set[str] = set()
        for s in fam.samples:
            if not s.name.endswith("_created"):
                labels |= set(s.labels) - {"le", "quantile"}
        out[fam.name] = Series(fam.name, fam.type, frozenset(labels))
    return out


def metric_value(text: str, sample: str, **labels: str) -> float | None:
    """Sum of ``sample`` over all label sets matching ``labels`` (e.g. over ``engine``); None if absent."""
    total, seen = 0.0, False
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
                seen = True
    return total if seen else None


@dataclass(frozen=True)
class SpecCounters:
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    # Decode steps, one inter-token latency per request per engine step: vLLM observes it before its
    # output collector merges steps that a slow stream has not yet taken, so merges do not hide steps here.
    decode_steps: float

    def __sub__(self, other: SpecCounters) -> SpecCounters:
        return SpecCounters(
            self.drafts - other.drafts,
            self.draft_tokens - other.draft_tokens,
            self.accepted_tokens - other.accepted_tokens,
            self.decode_steps - other.decode_steps,
        )


def spec_counters(url: str) -> SpecCounters | None:
    text = httpx.get(url + "/metrics", timeout=TIMEOUT).text
    names = [f"vllm:spec_decode_num_{n}_total" for n in ("drafts", "draft_tokens", "accepted_tokens")]
    values = [metric_value(text, n) for n in (*names, "vllm:inter_token_latency_seconds_count")]
    if any(v is None for v in values):
        return None
    return SpecCounters(*(float(v or 0) for v in values))


# --- requests the tests send -------------------------------------------------------------------------

# 1 + (k + 1) * 6 with k = 4: a same-weights draft then fills its last step exactly, so nothing accepted is
# discarded at max_tokens and per-request counts must match the server's counters to the token.
MAX_TOKENS = 31
PROMPTS = (
    "1, 2, 3, 4, 5, 6, 7, 8,",
    "def add(a, b):\n    return",
    "Repeat after me: the tree, the tree, the tree,",
    "I believe the meaning of life is",
)


def completion(model: str, prompt: str = PROMPTS[0], **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


def chat(model: str, content: str = PROMPTS[3], **extra: Any) -> dict[str, Any]:
    messages = [{"role": "user", "content": content}]
    return {"model": model, "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}


USAGE_EVERY_CHUNK = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}


def wait_for(
    probe: Callable[[], T], done: Callable[[T], bool], timeout: float = 30.0, every: float = 0.25
) -> T:
    """Call ``probe`` until ``done`` holds of its value or ``timeout`` passes; return the last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(every)
        value = probe()
    return value
