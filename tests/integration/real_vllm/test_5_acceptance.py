"""Per-request acceptance measured by the gateway equals what vLLM's own counters moved by.

Runs once per speculative variant (same-weights draft, noisy draft, n-gram); pytest groups the tests by
variant, so the speculative server restarts once per variant.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from . import admin
from .client import MAX_TOKENS, PROMPTS, USAGE_EVERY_CHUNK, chat, completion, spec_counters, stream, wait_for
from .servers import MODEL_NAME, NUM_SPECULATIVE_TOKENS, Fleet, VllmServer

pytestmark = pytest.mark.real_vllm


@pytest.fixture(scope="module", params=["draft-same", "draft-noisy", "ngram"])
def spec(request: pytest.FixtureRequest, fleet: Fleet, baseline: VllmServer) -> VllmServer:
    return fleet.ensure("speculative", request.param)


def requests() -> list[tuple[str, dict[str, Any]]]:
    """Sequential streamed requests of both kinds (the gateway measures acceptance on streams)."""
    out: list[tuple[str, dict[str, Any]]] = [("/v1/completions", completion(MODEL_NAME, p)) for p in PROMPTS]
    out += [("/v1/chat/completions", chat(MODEL_NAME, p)) for p in PROMPTS[:2]]
    return out


def test_variant_acceptance_as_built(spec: VllmServer) -> None:
    """The suite's drafts behave as designed: the same weights always agree, noise sometimes does."""
    before = spec_counters(spec.url)
    assert before is not None, "speculative server exposes no spec-decode counters"
    for path, body in requests():
        s = stream(spec.url, path, {**body, **USAGE_EVERY_CHUNK})
        assert sum(s.tokens_per_chunk()) == MAX_TOKENS
    after = spec_counters(spec.url)
    assert after is not None
    delta = after - before
    assert delta.drafts > 0 and delta.draft_tokens > 0
    rate = delta.accepted_tokens / delta.draft_tokens
    # Every decode step verifies the drafts of the step before, except where the n-gram proposer found none.
    if spec.variant == "ngram":
        assert 0 < delta.drafts <= delta.decode_steps
    else:
        assert delta.drafts == delta.decode_steps
    if spec.variant == "draft-same":
        assert rate == 1.0
        assert delta.draft_tokens == NUM_SPECULATIVE_TOKENS * delta.drafts
    else:
        assert 0.0 < rate < 1.0


@pytest.fixture(scope="module")
def spec_gateway(gateway_factory: Callable[..., str], spec: VllmServer) -> str:
    return gateway_factory("always-speculative")


def test_gateway_acceptance_equals_counter_deltas(spec_gateway: str, spec: VllmServer) -> None:
    # After a restart of the upstream the gateway may still hold it as down; wait until it routes there.
    probe = completion(MODEL_NAME, max_tokens=2)
    routed = wait_for(
        lambda: stream(spec_gateway, "/v1/completions", probe).headers.get("x-specroute-pool"),
        lambda pool: pool == "speculative",
        timeout=60,
        every=1.0,
    )
    assert routed == "speculative"
    m0 = admin.measured_totals(spec_gateway) or (0.0, 0.0)
    r0 = admin.requests_total(spec_gateway)
    c0 = spec_counters(spec.url)
    sent = requests()
    for path, body in sent:
        s = stream(spec_gateway, path, body)
        assert s.status == 200 and s.done
        assert s.headers["x-specroute-pool"] == "speculative"
    c1 = spec_counters(spec.url)
    assert c0 is not None and c1 is not None
    counted = c1 - c0
    # The gateway records a request once its stream has ended; give the last one a moment.
    recorded = wait_for(lambda: admin.requests_total(spec_gateway), lambda n: n >= r0 + len(sent), timeout=10)
    assert recorded == r0 + len(sent)
    m1 = admin.measured_totals(spec_gateway)
    if m1 is None:
        pytest.skip(f"needs the gateway's per-request acceptance counters {admin.MEASURED} on its /metrics")
    accepted, drafted = m1[0] - m0[0], m1[1] - m0[1]
    if spec.variant == "draft-same":
        assert accepted == counted.accepted_tokens
        assert drafted == counted.draft_tokens
    else:
        # Two things keep the gateway's count from the server's. The last step of each request is cut by
        # max_tokens: the gateway counts it as a step, with the drafts it saw accepted, but what it accepted
        # beyond the limit never reaches the client (at most k fewer per request). And when the server's
        # stream falls behind its engine (two processes, a gateway and a client share two cores here), vLLM
        # sends several steps as one chunk; a merge that stays within k + 1 tokens reads as one step with
        # one more accepted token, and the step it hides is unseen (at most k fewer, or one more, each).
        k = NUM_SPECULATIVE_TOKENS
        seen = drafted / k  # the gateway counts k drafted tokens for each step it saw
        unseen = counted.decode_steps - seen
        assert unseen >= 0
        cut = len(sent)  # one cut last step per request
        assert counted.accepted_tokens - k * (unseen + cut) <= accepted <= counted.accepted_tokens + unseen
        assert drafted > 0 and accepted <= drafted
