"""``adaptive`` routing follows what it measures of the real speculative server.

The speculative server is restarted on the same port with a draft that never agrees with the target (so
speculation only costs), then with the target's own weights as the draft (every proposal accepted, but
each draft step as dear as a target step); the gateway is not told, and must notice both from what it
measures. That speculation pays again when a cheap draft agrees is shown against emulated pools, where a
draft can be cheap (``tests/integration/test_adaptive.py::test_share_follows_acceptance_drift``): on this
CPU no draft is both cheap and agreeing.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

import httpx
import pytest

from .client import PROMPTS, completion, spec_counters, stream
from .servers import MODEL_NAME, Fleet, VllmServer

pytestmark = pytest.mark.real_vllm

WINDOW = 8  # consecutive exploiting decisions that must agree
MAX_REQUESTS = 120  # per phase; each is a short greedy completion
PHASE_TWO = 60  # requests after the restart with the target's own weights as the draft, at least
MEASURED = 15  # and until this many of them were sent to the speculative server (five a prompt)
MAX_PHASE_TWO = 200


@pytest.fixture(scope="module")
def adaptive_gateway(fleet: Fleet, baseline: VllmServer, gateway_factory: Callable[..., str]) -> str:
    if importlib.util.find_spec("gateway.routing.adaptive") is None:
        pytest.skip("needs the adaptive strategy (gateway.routing.adaptive)")
    fleet.ensure("speculative", "draft-other")
    return gateway_factory("adaptive", exploration_rate=0.2, half_life_s=5.0)


def route_until(gateway: str, target: str) -> tuple[list[str], list[str]]:
    """Send sequential streamed requests until ``WINDOW`` exploiting decisions in a row chose ``target``
    (or ``MAX_REQUESTS`` were sent); returns (each request's pool and reason, exploiting pools)."""
    pools: list[str] = []
    exploiting: list[str] = []
    for i in range(MAX_REQUESTS):
        s = stream(gateway, "/v1/completions", completion(MODEL_NAME, PROMPTS[i % 3]))
        assert s.status == 200 and s.done
        pool, reason = s.headers["x-specroute-pool"], s.headers["x-specroute-reason"]
        pools.append(f"{pool}:{reason}")
        if "explor" not in reason.lower():
            exploiting.append(pool)
        if exploiting[-WINDOW:] == [target] * WINDOW:
            break
    return pools, exploiting


def explain(gateway: str, pools: list[str]) -> str:
    """What a phase routed, and what the gateway had learned by then."""
    learned = httpx.get(f"{gateway}/admin/routing", timeout=10).text
    return f"routed: {pools}\nlearned: {learned}"


def test_adaptive_leaves_a_useless_draft_and_weighs_an_agreeing_one_by_its_cost(
    fleet: Fleet, adaptive_gateway: str
) -> None:
    spec = fleet.ensure("speculative", "draft-other")
    before = spec_counters(spec.url)
    pools, exploiting = route_until(adaptive_gateway, "baseline")
    if exploiting[-WINDOW:] != ["baseline"] * WINDOW:
        pytest.fail("still routing to a useless draft\n" + explain(adaptive_gateway, pools))
    print(f"left the useless draft after {len(pools)} requests\n" + explain(adaptive_gateway, pools))
    after = spec_counters(spec.url)
    assert before is not None and after is not None
    tried = after - before
    # It did measure the speculative server (exploration or initial routing) and saw ~0 acceptance there.
    assert tried.draft_tokens > 0
    assert tried.accepted_tokens / tried.draft_tokens < 0.1

    # The target's own weights as the draft: every proposal is accepted, but a speculative step is k draft
    # passes and one verification for the k + 1 tokens it yields. The gateway must learn the acceptance
    # back and the draft's cost, and predict the gain the servers deliver, no more.
    spec = fleet.restart("speculative", "draft-same")
    before = spec_counters(spec.url)
    # Where speculation cannot pay (a draft step as dear as a target step), only the exploration floor
    # measures the speculative server: the phase runs until it has measured each prompt a few times
    predicted: list[float] = []
    pools = []
    for i in range(MAX_PHASE_TWO):
        s = stream(adaptive_gateway, "/v1/completions", completion(MODEL_NAME, PROMPTS[i % 3]))
        assert s.status == 200 and s.done
        pools.append(f"{s.headers['x-specroute-pool']}:{s.headers['x-specroute-reason']}")
        predicted.append(float(s.headers["x-specroute-predicted-speedup"]))
        if i + 1 >= PHASE_TWO and sum(p.startswith("speculative") for p in pools) >= MEASURED:
            break
    report = explain(adaptive_gateway, pools) + f"\npredicted: {predicted}"
    print(report)
    after = spec_counters(spec.url)
    assert before is not None and after is not None
    tried = after - before
    assert tried.draft_tokens > 0, "never measured the restarted server\n" + report
    assert tried.accepted_tokens / tried.draft_tokens > 0.9
    learned = httpx.get(f"{adaptive_gateway}/admin/routing", timeout=10).json()
    assert max(k["alpha"] for k in learned["estimates"]["kinds"]) >= 0.9, report  # the acceptance is back
    # What speculation gains here depends on this CPU, and too noisily to hold a prediction to it: vLLM's own
    # time per output token put the speculative server at 0.58x to 2.09x the baseline's speed in runs a few
    # minutes apart (a speculative step at 2.6 to 7.6 baseline steps). So the draft's cost must be the one
    # the gateway's own step timings give, unbounded (holding it at half a target step, an old bound,
    # promised 5 / 3 = 1.67x where a step cost six), and the predictions the speedup that cost gives.
    model = learned["speedup_model"]
    k, c = model["k"], model["draft_cost_ratio"]
    from_steps = (model["speculative_step_ms"] / model["step_ms"] - 1) / k
    assert c == pytest.approx(min(1.0, max(0.0, from_steps)), abs=0.01), report
    # the step medians move with each request, so the prediction is read from the request right after the
    # snapshot the cost was read from (the last ten predictions spanned 2.21-2.39 while c moved 0.27-0.31)
    at_full_acceptance = (k + 1) / (1 + k * c)
    s = stream(adaptive_gateway, "/v1/completions", completion(MODEL_NAME, PROMPTS[0]))
    assert s.status == 200 and s.done
    next_prediction = float(s.headers["x-specroute-predicted-speedup"])
    report += f"\nat full acceptance {at_full_acceptance:.2f}, next prediction {next_prediction:.2f}"
    assert 0.8 * at_full_acceptance <= next_prediction <= 1.05 * at_full_acceptance, report
