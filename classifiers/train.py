"""Fit the linear model with scikit-learn and export it as a plain ``Classifier``.

Choices that matter for generalisation, each checked by leave-one-source-out evaluation:
- a gram enters the vocabulary only if it occurs in at least ``MIN_SOURCES`` sources, so that the words of
  one dataset's template cannot carry a decision;
- rows are weighted so that every source and both classes weigh about the same;
- ambiguous rows count half for each class, which pulls in-between prompts towards the middle;
- Platt scaling on out-of-fold scores (class-balanced) is folded into the weights.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from classifiers.data import OWN_SOURCE, Row
from classifiers.features import extract
from classifiers.model import Classifier
from classifiers.request import view

SEED = 20240611
MIN_SOURCES = 2
MIN_DF = 2
C = 4.0
MAX_FEATURES = 60_000
AMBIGUOUS_WEIGHT = 0.5


@dataclass(frozen=True, slots=True)
class Options:
    c: float = C
    min_sources: int = MIN_SOURCES
    min_df: int = MIN_DF
    ambiguous_weight: float = AMBIGUOUS_WEIGHT
    calibrate: bool = True
    exclude: tuple[str, ...] = ("d:len",)  # feature prefixes left out of the model


_cache: dict[str, dict[str, float]] = {}


def featurise(rows: Sequence[Row]) -> list[dict[str, float]]:
    """Feature dicts per row, cached by id within the process (evaluation refits many times)."""
    from classifiers.features import as_dict

    out = []
    for r in rows:
        key = f"{r.source}/{r.id}"
        d = _cache.get(key)
        if d is None:
            d = _cache[key] = as_dict(extract(view(r.body)))
        out.append(d)
    return out


def _vocabulary(rows: Sequence[Row], feats: Sequence[dict[str, float]], opts: Options) -> set[str]:
    df: Counter[str] = Counter()
    sources: defaultdict[str, set[str]] = defaultdict(set)
    for r, d in zip(rows, feats, strict=True):
        for k in d:
            df[k] += 1
            if len(sources[k]) < opts.min_sources or r.source == OWN_SOURCE:
                sources[k].add(r.source)
    # SpecRoute's own prompts are written to vary their wording, so their grams need no second source
    keep = {
        k
        for k, n in df.items()
        if k.startswith("d:")
        or (n >= opts.min_df and (len(sources[k]) >= opts.min_sources or OWN_SOURCE in sources[k]))
    }
    return {k for k in keep if not k.startswith(opts.exclude)} if opts.exclude else keep


def _design(rows: Sequence[Row], opts: Options) -> tuple[list[dict[str, float]], list[int], list[float]]:
    """Training examples, labels and weights: ambiguous rows appear once per class at reduced weight."""
    feats = featurise(rows)
    per_group: Counter[tuple[str, int]] = Counter()
    for r in rows:
        if r.label != "ambiguous":
            per_group[(r.source, r.y)] += 1
    X: list[dict[str, float]] = []
    y: list[int] = []
    w: list[float] = []
    for r, d in zip(rows, feats, strict=True):
        if r.label == "ambiguous":
            if opts.ambiguous_weight > 0:
                for label in (0, 1):
                    X.append(d)
                    y.append(label)
                    w.append(opts.ambiguous_weight)
            continue
        X.append(d)
        y.append(r.y)
        # damp big sources: weight ~ 1/sqrt(size of the source's share of this class)
        w.append(10.0 / math.sqrt(per_group[(r.source, r.y)]))
    # balance the classes
    tot = {c: sum(wi for wi, yi in zip(w, y, strict=True) if yi == c) for c in (0, 1)}
    w = [wi * (tot[0] + tot[1]) / (2 * tot[yi]) for wi, yi in zip(w, y, strict=True)]
    return X, y, w


def fit(rows: Sequence[Row], opts: Options | None = None) -> Classifier:
    import numpy as np
    from sklearn.feature_extraction import DictVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold

    opts = opts or Options()
    X_dicts, y_list, w_list = _design(rows, opts)
    vocab = _vocabulary(rows, featurise(rows), opts)
    X_dicts = [{k: v for k, v in d.items() if k in vocab} for d in X_dicts]
    vec = DictVectorizer(sort=True)
    X = vec.fit_transform(X_dicts).tocsr()
    X.indices = X.indices.astype(np.int32)  # liblinear accepts 32-bit indices only
    X.indptr = X.indptr.astype(np.int32)
    y = np.asarray(y_list)
    w = np.asarray(w_list)

    def lr() -> Any:
        return LogisticRegression(C=opts.c, solver="liblinear", max_iter=2000)

    model = lr().fit(X, y, sample_weight=w)
    a, b = 1.0, 0.0
    if opts.calibrate:
        oof = np.zeros(len(y))
        for tr, te in StratifiedKFold(n_splits=4, shuffle=True, random_state=SEED).split(X, y):
            oof[te] = lr().fit(X[tr], y[tr], sample_weight=w[tr]).decision_function(X[te])
        platt = LogisticRegression(C=1e4, solver="lbfgs").fit(oof.reshape(-1, 1), y, sample_weight=w)
        a, b = float(platt.coef_[0, 0]), float(platt.intercept_[0])
    coef = model.coef_[0] * a
    bias = float(model.intercept_[0]) * a + b
    names = vec.get_feature_names_out()
    order = np.argsort(-np.abs(coef))
    sparse: dict[str, dict[str, float]] = {}
    dense: dict[str, float] = {}
    kept = 0
    for i in order:
        weight = float(coef[i])
        if abs(weight) < 1e-4:
            break
        ns, _, gram = str(names[i]).partition(":")
        if ns == "d":
            dense[gram] = round(weight, 5)
        elif kept < MAX_FEATURES:
            sparse.setdefault(ns, {})[gram] = round(weight, 5)
            kept += 1
    meta = {
        "options": {
            "c": opts.c,
            "min_sources": opts.min_sources,
            "min_df": opts.min_df,
            "ambiguous_weight": opts.ambiguous_weight,
        },
        "platt": [a, b],
        "rows": len(rows),
        "features": kept + len(dense),
    }
    return Classifier(bias=round(bias, 5), sparse=sparse, dense=dense, meta=meta)
