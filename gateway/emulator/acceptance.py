"""How the emulator decides a prompt's draft acceptance probability alpha.

These rules are the emulator's own ground truth and deliberately share no code with the gateway's
classifier: the gateway has to *learn* what the emulator does, as it would have to learn what a real
draft model does. A prompt's alpha is the largest among the rules that match it (case-insensitive):

================  =========  =============================================================
rule              alpha      matches
================  =========  =============================================================
repetition        0.80       "repeat", "copy", "echo", "verbatim", "duplicate", "N times"
numeric           0.80       a literal list of 4+ numbers, "count from/to", "continue the sequence"
structured-data   0.78       JSON/YAML/TOML/XML/CSV/config/schema words, ``{"key":`` literals,
                             ``key: value`` lines
code              0.75       code fences, keywords (def, class, import, SELECT, #include, ...),
                             "write/implement/fix ... function/script/query", language names
extraction        0.70       extract, summarise, TL;DR, list all, rewrite, translate, convert
self-repetition   0.27+0.6d  d = share of repeated word 3-grams in the prompt (at most 0.85)
prose (default)   0.27       anything else: open-ended questions, stories, opinions
================  =========  =============================================================

The effective alpha of a request is ``alpha * max(0.05, 1 - 0.45*T)`` for sampling temperature ``T``,
times the run-time ``acceptance_scale`` of the control endpoint, clipped to [0, 0.99]. A request can
bypass the rules with ``"vllm_xargs": {"emulated_acceptance": 0.8}`` (temperature is then not
applied; the acceptance scale still is).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import NamedTuple

PROSE_ALPHA = 0.27

_F = re.IGNORECASE | re.MULTILINE

RULES: tuple[tuple[str, float, re.Pattern[str]], ...] = (
    (
        "repetition",
        0.80,
        re.compile(r"\b(repeat(ing|ed)?|copy|echo|verbatim|duplicate)\b|\b\d+\s+times\b", _F),
    ),
    (
        "numeric",
        0.80,
        re.compile(
            r"(?:-?\d+(?:\.\d+)?\s*[,;]?\s+){3,}-?\d+|(?:-?\d+(?:\.\d+)?\s*[,;]\s*){3,}-?\d+"
            r"|\bcount(ing)?\s+(from|to|up|down)\b|\bcontinue\s+(the|this)\s+(sequence|series|pattern|list)\b"
            r"|\bnext\s+\d+\s+(numbers|terms|values)\b",
            _F,
        ),
    ),
    (
        "structured-data",
        0.78,
        re.compile(
            r"\b(json|yaml|yml|toml|xml|csv|ini|config(uration)?|schema|key[- ]value)\b"
            r"|[{\[]\s*\"[^\"\n]+\"\s*:|^\s*[\w.-]+:\s+\S+\s*$",
            _F,
        ),
    ),
    (
        "code",
        0.75,
        re.compile(
            r"```|^\s*(def|class|import|from\s+\w+\s+import|return|function|const|let|var|public|"
            r"private|static|#include|SELECT|INSERT|UPDATE|CREATE\s+TABLE)\b"
            r"|\b(write|implement|fix|refactor|complete|generate)\b.{0,40}?\b(function|code|script|program|"
            r"class|method|query|regex|snippet|unit tests?)\b"
            r"|\b(python|javascript|typescript|java|rust|golang|c\+\+|sql|bash|html|css)\b",
            _F,
        ),
    ),
    (
        "extraction",
        0.70,
        re.compile(
            r"\b(extract|summari[sz]e|summary|tl;?dr|list\s+(all|every|the)|rewrite|rephrase|paraphrase|"
            r"translate|convert|reformat|format\s+(this|the|it|as)|fix\s+the\s+(grammar|typos?|spelling)|"
            r"fill\s+in|classify)\b",
            _F,
        ),
    ),
)


class PromptProfile(NamedTuple):
    category: str
    alpha: float


def _self_repetition(text: str) -> float:
    words = text.lower().split()
    if len(words) < 12:
        return 0.0
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return 1.0 - len(set(grams)) / len(grams)


@lru_cache(maxsize=8192)
def profile(text: str) -> PromptProfile:
    """The rule-based category and base alpha (temperature 0, scale 1) of a prompt."""
    best = PromptProfile("prose", PROSE_ALPHA)
    for name, alpha, pattern in RULES:
        if alpha > best.alpha and pattern.search(text):
            best = PromptProfile(name, alpha)
    rep_alpha = min(0.85, PROSE_ALPHA + 0.6 * _self_repetition(text))
    if rep_alpha > best.alpha:
        best = PromptProfile("self-repetition", round(rep_alpha, 4))
    return best


def temperature_factor(temperature: float) -> float:
    return max(0.05, 1.0 - 0.45 * temperature)


def effective_alpha(base: float, temperature: float, scale: float, override: float | None = None) -> float:
    """alpha actually used for a request's Bernoulli draws."""
    alpha = override if override is not None else base * temperature_factor(temperature)
    return min(0.99, max(0.0, alpha * scale))


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """E(alpha, k) = (1 - alpha^(k+1)) / (1 - alpha): tokens emitted per verification step, bonus included."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)
