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

An *acceptance profile* (``--acceptance-profile``) replaces the alphas of the table by those of a
different draft model: a built-in one (``skewed-draft``, ``output-format``) or a YAML file of rules,
each matching a category of the table or a regular expression (a language's script, a phrase); first
match wins.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
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


# -- acceptance profiles: a draft model unlike the rules above ------------------------------------


@dataclass(frozen=True, slots=True)
class ProfileRule:
    """Matches a prompt by its rule category above (``category``) or by a regular expression."""

    name: str
    alpha: float
    category: str | None = None
    pattern: re.Pattern[str] | None = None

    def matches(self, text: str, category: str) -> bool:
        if self.category is not None and self.category == category:
            return True
        return self.pattern is not None and self.pattern.search(text) is not None


@dataclass(frozen=True, slots=True)
class AcceptanceProfile:
    """A deployment's draft model: the first matching rule gives the base alpha, else ``default``.

    The prompt's category (and so the text generated for it) still comes from the rules above; only
    the acceptance changes. This lets a test or benchmark face the gateway with a draft model whose
    strengths the classifier's prior does not know about.
    """

    name: str
    default: float
    rules: tuple[ProfileRule, ...] = ()

    def base_alpha(self, text: str) -> PromptProfile:
        """The prompt's category and this profile's base alpha for it (temperature 0, scale 1)."""
        prof = profile(text)
        for rule in self.rules:
            if rule.matches(text, prof.category):
                return PromptProfile(prof.category, rule.alpha)
        return PromptProfile(prof.category, self.default)


#: A draft model fine-tuned on code and fiction: strong there (the classifier's prior expects prose to
#: be a loss), slower than no speculation at all on data formats, copying and counting (where the
#: prior expects its best), a small gain on other prose.
SKEWED_DRAFT = AcceptanceProfile(
    "skewed-draft",
    default=0.3,
    rules=(
        ProfileRule("code", 0.9, category="code"),
        ProfileRule(
            "fiction",
            0.65,
            pattern=re.compile(r"\b(story|poem|haiku|song|monologue|dialogue|letter|myth|paragraph)\b", _F),
        ),
        ProfileRule("structured-data", 0.15, category="structured-data"),
        ProfileRule("repetition", 0.15, category="repetition"),
        ProfileRule("numeric", 0.15, category="numeric"),
        ProfileRule("extraction", 0.5, category="extraction"),
    ),
)
#: A draft model whose acceptance follows the output a request asks for rather than its task: a request
#: that wants its answer in verse ("Answer as a haiku.") gets 0.15, a loss at any draft cost, however
#: structured the task reads (a draft trained on code and data guesses no verse); any other gets its
#: category's alpha from the table above (self-repetition: prose's). The classifier reads the task, so
#: its prior is wrong exactly for those requests.
OUTPUT_FORMAT = AcceptanceProfile(
    "output-format",
    default=PROSE_ALPHA,
    rules=(
        ProfileRule(
            "verse-answer",
            0.15,
            pattern=re.compile(
                r"\b(answer|reply|respond)\s+(as|in|with)\s+an?\s+(haiku|poem|limerick|sonnet|song|story)\b",
                _F,
            ),
        ),
        *(ProfileRule(name, alpha, category=name) for name, alpha, _ in RULES),
    ),
)
BUILTIN_PROFILES = {"rules": None, "skewed-draft": SKEWED_DRAFT, "output-format": OUTPUT_FORMAT}
_CATEGORIES = {name for name, _, _ in RULES} | {"self-repetition", "prose"}


def _alpha(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{where}: alpha must be a number in [0, 1]")
    return float(value)


def profile_from_dict(raw: object, name: str) -> AcceptanceProfile:
    """Build a profile from ``{"default": 0.3, "rules": [{"name", "alpha", "category" | "pattern"}]}``."""
    if not isinstance(raw, dict):
        raise ValueError(f"{name}: an acceptance profile is a mapping with 'default' and 'rules'")
    unknown = set(raw) - {"name", "default", "rules"}
    if unknown:
        raise ValueError(f"{name}: unknown keys {sorted(unknown)}")
    rules = []
    for i, r in enumerate(raw.get("rules") or []):
        where = f"{name}: rules[{i}]"
        if not isinstance(r, dict) or set(r) - {"name", "alpha", "category", "pattern"}:
            raise ValueError(f"{where}: a rule has name, alpha and a category or a pattern")
        category, pattern = r.get("category"), r.get("pattern")
        if category is None and pattern is None:
            raise ValueError(f"{where}: give a category or a pattern")
        if category is not None and category not in _CATEGORIES:
            raise ValueError(
                f"{where}: unknown category {category!r}; known: {', '.join(sorted(_CATEGORIES))}"
            )
        try:
            compiled = re.compile(pattern, _F) if isinstance(pattern, str) else None
        except re.error as e:
            raise ValueError(f"{where}: bad pattern: {e}") from None
        if pattern is not None and compiled is None:
            raise ValueError(f"{where}: pattern must be a string")
        rules.append(
            ProfileRule(str(r.get("name", f"rule-{i}")), _alpha(r.get("alpha"), where), category, compiled)
        )
    default = _alpha(raw.get("default", PROSE_ALPHA), f"{name}: default")
    return AcceptanceProfile(str(raw.get("name", name)), default, tuple(rules))


def load_profile(spec: str) -> AcceptanceProfile | None:
    """A built-in profile by name (``rules``: the table above, ``skewed-draft``, ``output-format``) or a YAML
    file's path."""
    if spec in BUILTIN_PROFILES:
        return BUILTIN_PROFILES[spec]

    import yaml

    path = Path(spec)
    if not path.is_file():
        raise ValueError(
            f"acceptance profile {spec!r} is neither a built-in ({', '.join(BUILTIN_PROFILES)}) nor a file"
        )
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ValueError(f"{spec}: not valid YAML: {e}") from None
    return profile_from_dict(raw, path.name)


def base_profile(text: str, acceptance: AcceptanceProfile | None) -> PromptProfile:
    """The prompt's category and base alpha under the deployment's profile (None: the rules above)."""
    return profile(text) if acceptance is None else acceptance.base_alpha(text)
