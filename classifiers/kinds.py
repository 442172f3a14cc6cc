"""A coarse, bounded prompt kind: the gateway keeps live acceptance estimates per kind.

The set is fixed (``KINDS``) and the rules are cheap keyword and shape tests on the instruction window,
checked in a fixed order so that a prompt always lands in the same kind.
"""

from __future__ import annotations

from classifiers.features import Features
from classifiers.request import RequestView

KINDS = (
    "tools",
    "repetition",
    "code",
    "data-format",
    "extraction",
    "rewrite",
    "math",
    "creative",
    "chat",
    "qa",
)


# the cue lexicons ``kind_of`` reads, in the order ``classifiers._grams.Scorer`` takes their places in
# ``features.CUES`` (the C scorer's kind follows these rules, tests/classifiers/test_grams_scorer.py)
KIND_CUES = ("repeat", "code", "format", "config", "template", "extract", "rewrite", "math", "creative")


def kind_of(view: RequestView, feats: Features) -> str:
    d = feats.dense
    if view.tools:
        return "tools"
    if view.constrained:
        return "data-format"
    if d["numseq"] or d["max_rep"] > 0.5 or d["cue_repeat"]:
        return "repetition"
    if d["fence"] or d["code_kw"] > 0.8 or d["cue_code"]:
        return "code"
    if d["json_keys"] > 0.5 or d["cue_format"] or d["cue_config"] or d["cue_template"]:
        return "data-format"
    if d["cue_extract"]:
        return "extraction"
    if d["cue_rewrite"]:
        return "rewrite"
    if d["digits"] > 0.15 and d["cue_math"]:
        return "math"
    if d["cue_creative"]:
        return "creative"
    if view.turns >= 3 or d["speakers"] > 0.5:
        return "chat"
    return "qa"
