"""The decision point: called once per request, it names the pool, the prompt class and a reason.

Strategies:

- ``always-speculative`` / ``always-baseline`` — fixed pool (still classified, for headers and metrics);
- ``classifier`` — speculative exactly when the classifier says "structured";
- ``adaptive`` — see :mod:`gateway.routing.adaptive`.

Under every strategy a request may come with its pool forced: the client named it (reason ``forced``),
or it continues a stored Responses-API response, which only the endpoint that made it holds (reason
``affinity``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field
from typing import TYPE_CHECKING, Any, Protocol

from gateway.config import Strategy
from gateway.types import Api, PoolName, PromptClass, record

if TYPE_CHECKING:
    from gateway.routing.alpha_model import AlphaPrediction
    from gateway.routing.features import Features

__all__ = [
    "Api",
    "Classifier",
    "Decision",
    "Feedback",
    "Outcome",
    "PoolName",
    "Prediction",
    "PromptClass",
    "RouteRequest",
]

FORCED = "forced"  # the reason of a pool the client named (x-specroute-pool)
AFFINITY = "affinity"  # the reason of the pool whose endpoint holds the response a request continues


class Prediction(Protocol):
    @property
    def p_structured(self) -> float: ...
    @property
    def label(self) -> PromptClass: ...
    @property
    def kind(self) -> str: ...


class Classifier(Protocol):
    def predict(self, body: Mapping[str, Any]) -> Prediction: ...


@record
class RouteRequest:
    body: Mapping[str, Any]
    api: Api
    forced_pool: PoolName | None = None
    forced_reason: str = FORCED  # why ``forced_pool`` is forced: FORCED or AFFINITY


@record
class Decision:
    pool: PoolName
    prompt_class: PromptClass
    reason: str
    p_structured: float
    kind: str
    predicted_speedup: float | None = None
    explore: bool = False
    alpha: float | None = None  # the alpha the decision expected
    batch: float | None = None  # the batch the request was expected to join on its pool
    spec_batch: float | None = None  # the batches both pools offered at the decision: the measured
    base_batch: float | None = None  # speedup is evaluated at them, comparable with the predicted one
    alpha_sd: float | None = None  # the prediction's uncertainty (posterior sd of logit alpha)
    # the speculative pool refuses the request (see gateway.speculation.refused_by_speculation): it is
    # served by the baseline pool only, never failed over
    baseline_only: bool = False
    # what the per-request acceptance model saw and said, for learning from the outcome
    features: Features | None = field(default=None, repr=False, compare=False)
    prediction: AlphaPrediction | None = field(default=None, repr=False, compare=False)


@record
class Outcome:
    """What one finished request taught us; fed back to the policy."""

    decision: Decision
    pool: PoolName
    endpoint: str
    status: int
    ttft_s: float | None
    e2e_s: float
    completion_tokens: int | None
    chunks: int
    accepted_tokens: int | None = None
    draft_tokens: int | None = None
    steps: int | None = None
    # rejections seen, where a stream's chunks counted them: alpha is then the per-position estimate the
    # access log shows, which stays right for short outputs (see :mod:`gateway.speculation`)
    rejected_drafts: int | None = None
    # sequences generated side by side (n > 1): their tokens add up in ``completion_tokens``, so it
    # times no token and no step
    sequences: int = 1


@record
class Feedback:
    """What the policy made of one measured request: its acceptance and speedup, as measured.

    ``speedup`` is the speedup model's TPOT ratio (baseline / speculative) at the *measured* alpha
    and the batches the decision saw: the counterpart of the predicted speedup, with the prediction
    error of alpha being the only difference between the two.
    """

    alpha: float
    predicted_alpha: float | None
    speedup: float | None


class Policy(Protocol):
    strategy: Strategy

    def decide(self, request: RouteRequest) -> Decision: ...

    def observe(self, outcome: Outcome) -> Feedback | None: ...
