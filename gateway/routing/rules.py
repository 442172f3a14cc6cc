"""A small rule-based prompt classifier, the routing prior until the trained model is wired in."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.routing.policy import PromptClass

_STRUCTURED = re.compile(
    r"\b(repeat|copy|exactly \d+ times|continue the sequence|json|yaml|csv|sql|regex|function|def |class |"
    r"code|extract|convert|summari[sz]e|rewrite|config)\b|```|[{}\[\]]",
    re.IGNORECASE,
)


@dataclass(frozen=True, slots=True)
class RulePrediction:
    p_structured: float
    label: PromptClass
    kind: str


def _text(body: Mapping[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return " ".join(p for p in prompt if isinstance(p, str))
    messages = body.get("messages")
    if isinstance(messages, list):
        for m in reversed(messages):
            if isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str):
                return str(m["content"])
    return ""


class RulesClassifier:
    def predict(self, body: Mapping[str, Any]) -> RulePrediction:
        structured = bool(_STRUCTURED.search(_text(body)))
        return RulePrediction(0.9 if structured else 0.1, "structured" if structured else "open-ended", "rules")
