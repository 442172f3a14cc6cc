"""Acceptance arithmetic, and turning what one request showed into an acceptance measurement.

All three sources the gateway has — vLLM's counters, the server's per-request summary
(``metrics.speculative_decoding``) and the tokens per chunk of a stream — reduce to the same pair:
draft tokens accepted and verification steps, for a known ``k``. From it come the draft acceptance
rate (accepted / (steps·k), vLLM's definition), the mean acceptance length 1 + accepted / steps,
and alpha, the per-token acceptance probability, found by inverting
E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha) at the mean acceptance length. One estimator for
every source keeps them comparable.

Reading steps from a stream (tokens per chunk, from continuous usage):

* the first chunk is the prefill token; if it carries more, the rest is a merged decode step;
* the last chunk is censored — ``max_tokens``, a stop string or EOS cut the step short, so its
  size is a lower bound on the drafts accepted. It counts as a step whose accepted drafts were all
  seen and whose rejection was not: alpha is then the per-position estimate, accepted drafts over
  accepted drafts plus rejections seen, which stays right however short the output. Dropping the
  last chunk instead biased short outputs low (the step that reaches ``max_tokens`` is the long one
  more often than not: 0.44 instead of 0.8 at ``max_tokens`` 6, 0.73 at 10);
* a chunk of more than k + 1 tokens is several steps merged under back-pressure (or by
  ``--stream-interval``); it is split into the fewest steps that could have produced it. Merges
  that stay within k + 1 tokens cannot be seen and make acceptance look higher; the server's
  summary, when present, has none of these problems and is preferred.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeGuard

from gateway.types import record


def expected_length(alpha: float, k: int) -> float:
    """E(alpha, k): tokens emitted per verification step, bonus token included."""
    if alpha >= 1.0:
        return float(k + 1)
    if alpha <= 0.0:
        return 1.0
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def alpha_from_length(length: float, k: int) -> float:
    """The alpha at which E(alpha, k) equals ``length`` (bisection; E is increasing in alpha)."""
    if length <= 1.0:
        return 0.0
    if length >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(40):
        mid = (lo + hi) / 2
        if expected_length(mid, k) < length:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@record
class Measured:
    """Accepted draft tokens over verification steps, for one request or one scrape interval."""

    accepted: float
    steps: float
    k: int
    source: Literal["server", "stream", "counters"]
    # rejections seen, where they were counted (a stream's chunks): alpha is then per position
    rejected: float | None = None

    @property
    def draft_tokens(self) -> float:
        return self.steps * self.k

    @property
    def rate(self) -> float:
        return self.accepted / self.draft_tokens

    @property
    def mean_length(self) -> float:
        return 1.0 + self.accepted / self.steps

    @property
    def alpha(self) -> float:
        if self.rejected is not None:
            return self.accepted / (self.accepted + self.rejected)
        return alpha_from_length(self.mean_length, self.k)

    @property
    def trials(self) -> float:
        """Bernoulli draws behind the measurement: accepted ones plus (about) one rejection per short step."""
        if self.rejected is not None:
            return self.accepted + self.rejected
        a = self.alpha
        return self.accepted + self.steps * (1.0 - a**self.k)


def from_server(summary: Mapping[str, Any], k: int | None) -> Measured | None:
    """From vLLM's per-request ``metrics.speculative_decoding`` summary."""
    steps = summary.get("num_spec_steps")
    accepted = summary.get("num_accepted_draft_tokens")
    drafted = summary.get("num_draft_tokens")
    if not isinstance(steps, int) or not isinstance(accepted, int) or steps <= 0:
        return None
    if isinstance(drafted, int) and drafted > 0:
        k = round(drafted / steps)
    if not k:
        return None
    return Measured(accepted, steps, k, "server")


def from_token_steps(tokens: Sequence[int], k: int | None) -> Measured | None:
    """From the tokens each chunk of a stream carried (see the module notes)."""
    if not k or len(tokens) < 2:
        return None
    full = k + 1
    chunks = list(tokens[1:])
    if tokens[0] > 1:
        chunks.insert(0, tokens[0] - 1)
    steps = accepted = rejected = 0
    last = len(chunks) - 1
    for i, t in enumerate(chunks):
        n = -(-t // full)  # ceil: a merged chunk is at least this many steps
        steps += n
        accepted += t - n
        if t % full and i != last:  # the fewest steps: all full but the one that met its rejection
            rejected += 1
    if accepted + rejected == 0:
        return None
    return Measured(accepted, steps, k, "stream", rejected)


def chunks_withheld(payload: Mapping[str, Any] | None) -> bool:
    """Whether vLLM may leave engine steps of this request's stream without a chunk of their own.

    A chat with tools runs vLLM's tool-call parser over the output, and a step the parser holds back
    (a control token, a call's arguments not yet whole) sends no chunk unless ``return_token_ids`` or
    ``logprobs`` asked for one each step (vLLM 0.32's ``serving_chat``): the next chunk then carries
    two steps' tokens, which read as one step that accepted more drafts (two one-token steps, two
    rejections, read as one accepted draft; a third of the steps withheld took a true alpha of 0.2 to
    0.44). Such a stream's steps cannot be counted, so its acceptance is not measured from them. (A
    server started with a reasoning parser withholds the steps of the reasoning's markers too: a step
    or two a request, which the request does not show.)
    """
    if payload is None:
        return False
    if payload.get("include_reasoning") is not False and (
        payload.get("logprobs") is True or payload.get("return_token_ids") is True
    ):
        return False  # a chunk every step, by request (unless hidden reasoning withholds that too)
    tools = payload.get("tools")
    if isinstance(tools, list) and tools and payload.get("tool_choice") != "none":
        return True
    return bool(payload.get("functions")) and payload.get("function_call") != "none"


def sequences(payload: Mapping[str, Any] | None) -> int:
    """How many sequences a request has the upstream generate side by side: ``n`` (or ``best_of``) for
    each prompt, and a completion may hold a list of prompts.

    A stream interleaves them, one choice per chunk, and vLLM's per-chunk usage counts the tokens of
    that chunk's own choice: read as one sequence, the counts jump up and down between choices, and
    neither its steps nor a time per token (the choices' tokens add up in ``usage``) can be read from it.
    """
    if payload is None:
        return 1
    n, best_of = payload.get("n"), payload.get("best_of")
    # most requests give neither: one sequence per prompt without three calls
    per_prompt = 1 if n is None and best_of is None else max(_count(n), _count(best_of))
    prompt = payload.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int) else 1
    return per_prompt * prompts


def _count(value: Any) -> int:
    """An integer above 1 as it is; anything else (absent, null, a value the upstream refuses) as one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 1 else 1


#: vLLM's tolerance for a sampling parameter that is "off" (``vllm.sampling_params._SAMPLING_EPS``)
SAMPLING_EPS = 1e-5


def refused_by_speculation(payload: Mapping[str, Any] | None) -> str | None:
    """The request field a vLLM server with speculative decoding refuses the request for, or None.

    vLLM (0.32) answers a request with ``min_p`` above zero or a non-empty ``logit_bias`` with a 400 on
    such a server ("The min_p and logit_bias sampling parameters are not yet supported with speculative
    decoding") and serves it without speculation: only the baseline pool can serve it. Greedy sampling
    (a temperature of zero) sets ``min_p`` to zero before that check; without a temperature the
    server's default applies, which is not zero unless the model's generation config says so.
    """
    if payload is None:
        return None
    min_p = payload.get("min_p")
    if _number(min_p) and min_p > SAMPLING_EPS:
        temperature = payload.get("temperature")
        if not (_number(temperature) and temperature < SAMPLING_EPS):
            return "min_p"
    if payload.get("logit_bias"):
        return "logit_bias"
    return None


def _number(value: object) -> TypeGuard[float]:
    """A JSON number (an integer or a float; not a boolean)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
