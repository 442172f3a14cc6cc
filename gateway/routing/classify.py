"""Which prompt classifier the gateway runs: the trained one (``classifiers``)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.routing.policy import Classifier
from gateway.types import PromptClass

log = logging.getLogger("specroute.routing")


@dataclass(frozen=True, slots=True)
class NeutralPrediction:
    p_structured: float = 0.5
    label: PromptClass = "open-ended"
    kind: str = "unclassified"


class NeutralClassifier:
    """Says nothing about a prompt: routing then rests on what is measured for the one kind."""

    def predict(self, body: Mapping[str, Any]) -> NeutralPrediction:
        return NeutralPrediction()


def load_classifier() -> Classifier:
    """The trained classifier; a neutral one (with a warning) if its artefact cannot be loaded."""
    try:
        from classifiers import load_default

        clf: Classifier = load_default()
        return clf
    except Exception as e:  # a missing artefact must not stop the gateway; routing still learns
        log.warning("prompt classifier unavailable (%s); routing on measurements only", e)
        return NeutralClassifier()
