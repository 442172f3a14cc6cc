"""Render ``classifiers/MODEL_CARD.md`` from a training run: data, licences, metrics, latency."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from classifiers import data
from classifiers.model import (
    CONSTRAINED_SHIFT,
    SHORT_OUTPUT_SHIFT,
    STOP_SHIFT,
    TEMPERATURE_SLOPE,
    TOOLS_SHIFT,
    Classifier,
)

CARD_FILE = Path(__file__).parent / "MODEL_CARD.md"
SHOWCASE_DIR = Path(__file__).resolve().parents[1] / "tests" / "classifiers" / "data"


def showcase_rates(clf: Classifier) -> dict[str, float]:
    """Share of the hand-written showcase test prompts given their expected label (when the tests exist)."""
    out: dict[str, float] = {}
    for path in sorted(SHOWCASE_DIR.glob("showcase*.jsonl")):
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        if rows:
            hits = sum(clf.predict(r["body"]).label == r["label"] for r in rows)
            out[f"{path.stem} ({len(rows)})"] = hits / len(rows)
    return out


def _licences() -> str:
    source = data.SHARED_FILE if data.SHARED_FILE.exists() else data.PUBLIC_FILE
    rows = [json.loads(line) for line in source.open(encoding="utf-8")]
    lines = [
        "| source | licence (as recorded per row) | rows | commercial use | in repo / shipped model |",
        "|---|---|---|---|---|",
    ]
    for s, lic, n, ok in data.licence_table(rows):
        lines.append(f"| {s} | {lic} | {n} | {'yes' if ok else 'no'} | {'yes' if ok else 'no'} |")
    return "\n".join(lines)


def render(clf: Classifier, results: dict[str, Any], showcase: dict[str, float], bench: str) -> str:
    from classifiers.evaluate import report

    own = data.load(data.OWN_FILE)
    public = data.load(data.PUBLIC_FILE)
    fam = Counter((r.category, r.label) for r in own)
    fam_lines = "\n".join(f"| {c} | {lab} | {n} |" for (c, lab), n in sorted(fam.items()))
    labels = Counter(r.label for r in public + own)
    parts = [
        "# SpecRoute prompt classifier — model card",
        "",
        "Predicts, before any token is generated, whether a request's output is *structured* "
        "(predictable from "
        "the prompt or tightly constrained: code, SQL/regex/shell, JSON/YAML/config, templated output, "
        "repetition, extraction, data-to-text, summaries or rewrites of a provided text, tool calls) — where "
        "speculative decoding pays off — or *open-ended* (stories, poems, opinions, advice, open questions, "
        "role-play, chit-chat). Output: a calibrated `p_structured`, a label (`p > 0.5`) and a coarse "
        "`kind`.",
        "",
        "Regenerate this card with `specroute train` (the figures below come from that run).",
        "",
        "## Model",
        "",
        "- Logistic regression (scikit-learn, liblinear, class- and source-balanced weights, "
        f"C={clf.meta['options']['c']}) over: word unigrams+bigrams of the main text (head 500 + tail 1,000 "
        "characters), of the last 320 characters (where the instruction of a long prompt sits), the "
        "first two "
        "words, CJK character unigrams+bigrams, words of the chat context (system prompt and earlier turns), "
        "and ~30 structural cues (code fences, symbol density, JSON/YAML/key-value shape, bullets, tables, "
        "repeated lines, digit share, numeric sequences, code keywords, question form, speaker markers, turn "
        "count, cue lexicons for repeat/copy, code, formats, extraction, rewriting, creative, opinion, "
        "role-play and chit-chat read in the instruction windows; the extraction, role-play, code, format "
        "and creative cues also in the first 300 characters of the chat context, where a system prompt with "
        "retrieved documents or a persona sits).",
        f"- A gram is kept only if it occurs in ≥ {clf.meta['options']['min_sources']} sources "
        "(no single dataset's template words); "
        f"{clf.meta['features']} weights ship.",
        "- Ambiguous rows (math word problems, translation, label-only classification, MCQ) are trained as "
        f"half-weight ({clf.meta['options']['ambiguous_weight']}) examples of both classes, which pulls such "
        "prompts towards the middle.",
        "- Calibration: Platt scaling on 4-fold out-of-fold scores (class-balanced), folded into the weights "
        f"(a={clf.meta['platt'][0]:.3f}, b={clf.meta['platt'][1]:.3f}). Probabilities are calibrated for "
        "equal class priors.",
        "- Inference is plain Python (regexes, `str` methods, set lookups; no scikit-learn or numpy). "
        "Artefact: gzipped JSON of feature → weight (`classifiers/model/model.json.gz`), no pickle.",
        "- Request fields add fixed log-odds shifts (the prompt corpus cannot teach them): JSON schema / "
        f"guided regex, grammar or JSON +{CONSTRAINED_SHIFT} (json_object {CONSTRAINED_SHIFT * 0.75}, "
        f"guided_choice {CONSTRAINED_SHIFT * 0.5}), tools +{TOOLS_SHIFT}, stop sequences at code/line ends "
        f"+{STOP_SHIFT}, temperature -{TEMPERATURE_SLOPE}·(T - 0.8) clipped to [-1.5, +1], "
        f"max_tokens < 32 {SHORT_OUTPUT_SHIFT}.",
        "",
        "## Data",
        "",
        f"Training rows: {len(public)} public prompts whose licence allows commercial use "
        f"(`classifiers/data/prompts-commercial.jsonl`) and {len(own)} SpecRoute prompts "
        "(`classifiers/data/specroute-prompts.jsonl`, generated by `python -m classifiers.synth` from "
        f"hand-written fragments in `classifiers/fragments.py`). Labels: {dict(labels)}.",
        "",
        "Rows under non-commercial, research-only, LDC-derived or unspecified (research-use) terms are "
        "excluded from the repository and from the shipped model. The table lists every source/licence "
        "string of the shared corpus:",
        "",
        _licences(),
        "",
        "The SCAN rows (eshaanpathak/natural-instructions-code) are kept: the data is BSD-3-Clause and the "
        "task wording Apache-2.0, though the copying repository has no licence file of its own. "
        "CC-BY-SA rows "
        "(E2E, wiki_bio, adversarial_qa, DBpedia) are kept with their attribution and share-alike terms; see "
        "`classifiers/data/README.md`. Some open-ended rows are red-teaming requests; they are used as "
        "open-ended traffic and never quoted here.",
        "",
        "SpecRoute prompts per family:",
        "",
        "| family | label | rows |",
        "|---|---|---|",
        fam_lines,
        "",
        "## Evaluation",
        "",
        "Leave-one-source-out (LOSO) over the public sources: for each public source repository (the "
        "`source` field of the shared corpus), a model trained on all the other sources predicts it; the "
        "pooled predictions are scored. SpecRoute's own prompts are augmentation, not a public source: "
        "they stay in every training fold and are not part of the pooled score, which therefore answers "
        "'does the model generalise to a public source it never saw'. They are also scored separately, "
        "held out on their own (a model trained on the public sources only), reported below the "
        "per-source table. Length buckets are by characters of all text in the request. The length-only "
        "baseline is a class-balanced logistic regression on log length, evaluated the same way. "
        "Single-class sources report accuracy.",
        "",
    ]
    if "loso" in results:
        parts.append(report(results["loso"], "Shipped training set"))
    if "restricted" in results:
        full = results["restricted"]
        m = full.binary(where=lambda r: data.commercial_ok(r.license))
        parts += [
            "What the restricted rows would add (not shipped; `specroute train --restricted` reads them from "
            "`/work/shared/data` only when present). Overall balanced accuracy on the same rows as above: "
            f"{m.balanced_accuracy:.3f} (vs {results['loso'].binary().balanced_accuracy:.3f} shipped).",
            "",
            report(full, "With restricted rows (all sources)"),
        ]
    if showcase:
        parts += [
            "### Showcase test sets",
            "",
            "Hand-written prompts in `tests/classifiers/data/`, never used in training. `showcase-*` is the "
            "original set; `showcase_holdout_*` is a second set of fresh phrasings, written before the "
            "training generator was extended after looking at misses on the first set and without looking "
            "at the model's errors on it. The tests require ≥ 0.98 on every file.",
            "",
            *[f"- {k}: {v:.3f} given the expected label" for k, v in showcase.items()],
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
        "- Labels are a proxy (source category) for draft acceptance, with a few percent noise.",
        "- Request-field shifts are set by hand, not learned; temperature is the only sampling field used.",
        "- Only the first string of a batched completions prompt is read.",
        "- Chinese coverage of the shipped model comes from SpecRoute prompts only (the Chinese public "
        "rows are "
        "research-only); other non-English text falls back to structure and shared tokens.",
        "",
    ]
    return "\n".join(parts)
