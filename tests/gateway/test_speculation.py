"""Acceptance arithmetic and reading engine steps out of a stream."""

from __future__ import annotations

import random

import pytest

from gateway.speculation import alpha_from_length, expected_length, from_server, from_token_steps, sequences
from tests.streams import cut_stream


def test_expected_length_matches_the_reference_example():
    assert expected_length(0.8, 7) == pytest.approx(4.16, abs=0.01)
    assert expected_length(0.27, 7) == pytest.approx(1.37, abs=0.01)
    assert expected_length(0.0, 7) == 1.0
    assert expected_length(1.0, 7) == 8.0


@pytest.mark.parametrize("alpha", [0.05, 0.27, 0.5, 0.8, 0.95])
@pytest.mark.parametrize("k", [1, 4, 7, 15])
def test_alpha_inverts_expected_length(alpha, k):
    assert alpha_from_length(expected_length(alpha, k), k) == pytest.approx(alpha, abs=1e-6)


def _steps(alpha: float, k: int, n: int, rng: random.Random) -> list[int]:
    out = []
    for _ in range(n):
        a = 0
        while a < k and rng.random() < alpha:
            a += 1
        out.append(a)
    return out


def test_stream_steps_recover_alpha():
    rng = random.Random(3)
    accepted = _steps(0.7, 7, 4000, rng)
    tokens = [1] + [a + 1 for a in accepted]
    m = from_token_steps(tokens, 7)
    assert m is not None and m.source == "stream"
    assert m.alpha == pytest.approx(0.7, abs=0.02)


def test_prefill_chunk_is_not_a_step_and_last_short_chunk_is_censored():
    m = from_token_steps([1, 8, 3, 8, 2], 7)
    assert m is not None
    # the final 2 tokens were cut short: its accepted draft counts, its rejection was never seen
    assert (m.steps, m.accepted, m.rejected) == (4, 7 + 2 + 7 + 1, 1)
    assert m.alpha == pytest.approx(17 / 18) and m.trials == 18
    full_last = from_token_steps([1, 3, 8], 7)
    assert full_last is not None and (full_last.steps, full_last.accepted, full_last.rejected) == (2, 9, 1)


def test_merged_prefill_and_oversized_chunks_are_split():
    m = from_token_steps([3, 20, 8], 7)  # prefill + a 2-token step; 20 tokens = at least 3 steps
    assert m is not None
    assert (m.steps, m.accepted, m.rejected) == (1 + 3 + 1, 1 + 17 + 7, 2)


def test_too_little_to_measure():
    assert from_token_steps([1], 7) is None
    assert from_token_steps([1, 1], 7) is None  # a censored step that accepted nothing: nothing seen
    assert from_token_steps([1, 8, 8], None) is None
    one = from_token_steps([1, 3], 7)  # only the censored last step: two positions accepted, no more
    assert one is not None and (one.alpha, one.trials) == (1.0, 2)


@pytest.mark.parametrize("alpha", [0.3, 0.5, 0.8])
@pytest.mark.parametrize("max_tokens", [6, 10, 16, 64])
def test_short_outputs_measure_alpha_without_bias(alpha: float, max_tokens: int) -> None:
    """The step that reaches max_tokens is more often a long one: left out, short outputs read low
    (0.44 for 0.8 at max_tokens 6); counted as censored, the measurements pooled as the model pools
    them (by their trials) find alpha at every length."""
    rng = random.Random(7)
    found = [
        m for m in (from_token_steps(cut_stream(alpha, 7, max_tokens, rng), 7) for _ in range(3000)) if m
    ]
    pooled = sum(m.alpha * m.trials for m in found) / sum(m.trials for m in found)
    assert pooled == pytest.approx(alpha, abs=0.02)


def test_server_summary_preferred_fields():
    m = from_server(
        {
            "num_spec_steps": 10,
            "num_draft_tokens": 70,
            "num_accepted_draft_tokens": 35,
            "mean_acceptance_length": 4.5,
        },
        None,
    )
    assert m is not None and m.k == 7 and m.rate == pytest.approx(0.5) and m.mean_length == pytest.approx(4.5)
    assert from_server({"num_spec_steps": 0, "num_accepted_draft_tokens": 0}, 7) is None


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (None, 1),
        ({"prompt": "hi"}, 1),
        ({"prompt": "hi", "n": None, "best_of": None}, 1),
        ({"prompt": "hi", "n": 3}, 3),
        ({"prompt": "hi", "best_of": 4}, 4),
        ({"prompt": "hi", "n": 2, "best_of": 5}, 5),
        ({"prompt": "hi", "n": True}, 1),  # a boolean is no count
        ({"prompt": "hi", "n": 0, "best_of": "2"}, 1),
        ({"prompt": ["a", "b", "c"]}, 3),
        ({"prompt": ["a", "b"], "n": 2}, 4),
        ({"prompt": [1, 2, 3]}, 1),  # token ids: one prompt
        ({"messages": [], "n": 2}, 2),
    ],
)
def test_sequences_side_by_side_are_n_or_best_of_per_prompt(
    payload: dict[str, object] | None, expected: int
) -> None:
    assert sequences(payload) == expected
