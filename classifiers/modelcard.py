"""Render ``classifiers/MODEL_CARD.md`` from a training run: data, licences, metrics, latency."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from classifiers import data, features
from classifiers.model import (
    CONSTRAINED_SHIFT,
    SHORT_OUTPUT_SHIFT,
    STOP_SHIFT,
    TEMPERATURE_SLOPE,
    TOOLS_SHIFT,
    Classifier,
)

CARD_FILE = Path(__file__).parent / "MODEL_CARD.md"


def _licences(rows: Sequence[data.Row]) -> str:
    lines = [
        "| source | licence (as recorded per row) | rows | commercial use (in the shipped model) |",
        "|---|---|---|---|",
    ]
    for s, lic, n, ok in data.licence_table(rows):
        lines.append(f"| {s} | {lic} | {n} | {'yes' if ok else 'no'} |")
    return "\n".join(lines)


def _calibration(clf: Classifier) -> str:
    opts = clf.meta["options"]
    folds = opts.get("calibration_folds", 4)
    if opts.get("calibration", "balanced") == "prior":
        return (
            f"- Calibration: Platt scaling on out-of-fold scores whose {folds} folds are split by "
            "source (so the scores are those of sources the fold's model never saw), fitted on the "
            "rows as they come and folded into the weights: `p_structured` matches the observed share "
            "of structured rows (no class balancing, which pulled the probabilities towards 0.5). The "
            f"label keeps the equal-prior decision: structured when `p_structured > {clf.threshold}`, "
            "the probability at which a class-balanced fit of the same scores crosses 0.5, so both "
            "classes keep the same recall."
        )
    return (
        f"- Calibration: Platt scaling on out-of-fold scores whose {folds} folds are split by source, folded "
        "into the weights. The scores are class-balanced, so probabilities are calibrated for equal priors."
    )


def render(clf: Classifier, everything: Sequence[data.Row], results: dict[str, Any], bench: str) -> str:
    from classifiers.evaluate import report

    shipped = [r for r in everything if r.commercial]
    labels = Counter(r.label for r in shipped)
    langs = len({r.language for r in shipped})
    opts = clf.meta["options"]
    parts = [
        "# SpecRoute prompt classifier — model card",
        "",
        "Predicts, before any token is generated, whether a request's output is *structured* (predictable "
        "from the prompt or tightly constrained: code, SQL/regex/shell, JSON/tables, tool calls, extraction, "
        "answers read from a given passage, summaries or rewrites of a provided text) — where speculative "
        "decoding pays off — or *open-ended* (stories, poems, opinions, advice, open questions, role-play, "
        "chit-chat). Output: a calibrated `p_structured`, a label (`p_structured > "
        f"{clf.threshold}`) and a coarse `kind`.",
        "",
        "Regenerate this card, the artefact and every figure below with `specroute train` (reads the corpus "
        "from `../shared/data` next to the repository, or `--data PATH`). The evaluation alone: "
        "`python -m classifiers.evaluate`; with the non-commercial rows: `python -m classifiers.evaluate "
        "--restricted`; latency: `python -m classifiers.benchmark`.",
        "",
        "## Model",
        "",
        "- Logistic regression fitted by scikit-learn's `SGDClassifier` (log loss, averaged, "
        f"alpha={opts['alpha']}, {opts['epochs']} epochs, fixed seed) on a sparse matrix built from the "
        "serving code's own feature extractor (`classifiers/features.py`).",
        "- Features, each namespace L2-normalised on its own: character n-grams (orders "
        f"{'/'.join(map(str, features._HT_ORDERS))}) of the first {features.CHAR_HEAD} and the last "
        f"{features.CHAR_TAIL} characters (head and tail: where the instruction of a long prompt sits), "
        f"character 3-grams of the body between them ({features.CHAR_BODY} characters read at each end) "
        "and of the first "
        f"{features.CHAR_CONTEXT} characters of the chat context (the system prompt); word unigrams+bigrams "
        f"of the first {features.HEAD_NS} and last {features.TAIL_NS} characters; the first two words; "
        "context words; ~40 structural cues (code fences, symbol density, JSON/key-value shape, bullets, "
        "tables, repeated lines, digit share, numeric sequences, question form, speaker markers, turn "
        "count, small cue lexicons). The pasted material (body) is its own namespace, so it cannot pass for "
        "the instruction. Text is lower-cased, digits folded to 0, whitespace collapsed. Length itself is "
        "not a feature.",
        f"- A gram enters the vocabulary only if it occurs in ≥ {opts['min_sources']} sources and ≥ "
        f"{opts['min_df']} rows of the training data (no single dataset's template can carry a decision); "
        f"the {clf.meta['features']} largest weights ship.",
        "- Row weights: 1/√(rows of the same source and class), so that no large source dominates; "
        f"red-team rows times {opts['redteam_weight']}; within each language but English the larger class is "
        "cut down to the weight of the smaller one (a language whose rows hold one class teaches nothing, so "
        "its script cannot stand in for the label); then every (length bucket, class) cell weighs the same "
        "(< 300 / 300-1,500 / > 1,500 characters), so that length cannot separate the classes.",
        "- `ambiguous` rows (math word problems, translation, label-only classification, multiple "
        "choice) are left out of the objective; their mean held-out `p_structured` is reported below.",
        _calibration(clf),
        "- Inference is plain Python (regexes, `str` methods, slicing with prebuilt slice objects, set and "
        "dict lookups; no scikit-learn or numpy). Artefact: gzipped JSON of feature → weight "
        "(`classifiers/model/model.json.gz`), no pickle; retraining on the same corpus gives the same bytes.",
        "- Request fields add fixed log-odds shifts (the prompt corpus cannot teach them): JSON schema / "
        f"guided regex, grammar or JSON +{CONSTRAINED_SHIFT} (json_object {CONSTRAINED_SHIFT * 0.75}, "
        f"guided_choice {CONSTRAINED_SHIFT * 0.5}), tools +{TOOLS_SHIFT}, stop sequences at code/line ends "
        f"+{STOP_SHIFT}, temperature -{TEMPERATURE_SLOPE}·(T - 0.8) clipped to [-1.5, +1], "
        f"max_tokens < 32 {SHORT_OUTPUT_SHIFT}.",
        "",
        "## Data",
        "",
        f"Training: the {len(shipped)} rows of the shared corpus (`prompts-train.jsonl`) marked `commercial` "
        f"— {dict(labels)} — from {len({r.source for r in shipped})} sources in {langs} languages. The "
        f"{len(everything) - len(shipped)} other rows (non-commercial, research-only or unspecified terms) "
        "are used only in the side measurement below, never in the shipped model. No generated prompts are "
        "used. The corpus is read where it lies and is not copied into the repository; none of the "
        "evaluation benchmarks named in its README is in it.",
        "",
        _licences(everything),
        "",
        "## Evaluation",
        "",
        "Leave-one-source-out (LOSO): for each source repository, a model trained on all the other sources "
        "(the full pipeline: vocabulary, weights, calibration) predicts it; the pooled held-out predictions "
        "are scored. Nothing generated is on either side. Length buckets are by characters of all text in "
        "the request. The length-only baseline is a class-balanced logistic regression on log length, "
        "evaluated the same way. Single-class sources report accuracy (AUC is n/a). ECE: expected "
        "calibration error over ten equal-width bins.",
        "",
        "Goal on sources never seen in training: balanced accuracy ≥ 0.95, AUC ≥ 0.985, every length bucket "
        "≥ 0.92, every source ≥ 0.90.",
        "",
    ]
    if "loso" in results:
        parts.append(report(results["loso"], "Shipped configuration (commercial rows)"))
    if "restricted" in results:
        from classifiers.evaluate import summary

        full = results["restricted"]
        m = full.binary(where=lambda r: r.commercial)
        parts += [
            "### What the non-commercial rows would add (not shipped)",
            "",
            "LOSO over all rows, commercial and not (`python -m classifiers.evaluate --restricted`): "
            f"{summary(full)}. On the commercial rows alone (the same rows as above): balanced accuracy "
            f"{m.balanced_accuracy:.3f}, AUC {m.auc:.3f} (shipped: "
            f"{results['loso'].binary().balanced_accuracy:.3f}, {results['loso'].binary().auc:.3f}).",
            "",
        ]
    parts += [
        "## Latency and memory",
        "",
        "`python -m classifiers.benchmark` (a fresh process pinned to one core; shared 2-core machine):",
        "",
        bench,
        "## Limitations",
        "",
        "- Labels are a proxy (the source's category) for draft acceptance, with a few percent noise.",
        "- Most sources hold one class, so a held-out source often tests one side of the boundary only.",
        "- Non-English open-ended rows are mostly red-team prompts; ordinary open-ended requests in "
        "languages other than English are scarce in the commercial rows (see the per-language table).",
        "- Request-field shifts are set by hand, not learned; temperature is the only sampling field used.",
        "- Only the first string of a batched completions prompt is read.",
        "",
    ]
    return "\n".join(parts)
