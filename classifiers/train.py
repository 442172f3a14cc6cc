"""Fit the linear model with scikit-learn and export it as a plain ``Classifier``.

The sparse matrix is built from ``features.extract`` -- the very code the gateway runs per request -- so
what the model learns is what it sees live. Choices that matter for generalisation, each checked by
leave-one-source-out evaluation (``classifiers.evaluate``):
- a gram enters the vocabulary only if it occurs in at least ``min_sources`` sources of the training rows,
  so that the words of one dataset's template cannot carry a decision;
- rows are weighted so that no large source dominates (weight ~ 1/sqrt(rows of its source and class)),
  red-team rows count less (they are real open-ended traffic, but not typical of it), and within each
  length bucket both classes weigh the same, so that length alone cannot separate them;
- ``ambiguous`` rows are left out of the binary objective: their label says neither class, and half-weight
  copies of both classes taught the model nothing that held up on unseen sources;
- Platt scaling on out-of-fold scores, the folds grouped by source (so the scores are those of unseen
  sources), is folded into the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from classifiers.augment import is_generated
from classifiers.calibration import Calibration, fit_isotonic
from classifiers.data import Row
from classifiers.features import as_dict, extract
from classifiers.model import Classifier
from classifiers.request import view

if TYPE_CHECKING:
    import numpy as np
    from scipy.sparse import csr_matrix

SEED = 20240611
LENGTH_EDGES = (300, 1500)  # the evaluation's length buckets, in characters of request text


@dataclass(frozen=True, slots=True)
class Options:
    alpha: float = 5e-5  # L2 strength of the SGD logistic regression
    epochs: int = 12
    seeds: int = 1  # SGD fits averaged, each shuffling the rows its own way
    # LOSO improved from 2 to 6 and levelled off at 9; 9 ships with head/tail character orders 2-4
    # (classifiers/VARIANTS.md)
    min_sources: int = 9
    min_df: int = 3
    redteam_weight: float = 0.3
    # a row weighs 1 / (rows of its source and class) ** source_power: 0 lets large sources dominate, 1 makes
    # every (source, class) pair weigh the same
    source_power: float = 0.5
    balance_length: bool = True
    balance_language: bool = True
    calibrate: bool = True
    calibration_folds: int = 10
    # "prior": Platt scaling on the out-of-fold scores as they come (probabilities match the corpus' class
    # mix); "balanced": each class weighing the same (probabilities for equal priors)
    calibration: str = "balanced"
    isotonic: bool = True  # an isotonic table on top of the Platt-scaled log-odds
    max_features: int = 40_000  # largest weights kept in the shipped artefact
    # generated rows (classifiers.augment) weigh this share of the real rows' total, half per class, outside
    # the real rows' balancing: they teach a cue the corpus lacks and must not outvote it
    generated_share: float = 0.05
    # length must not be the signal; the body's character grams (the pasted passage) cost more on unseen
    # sources than they bring (classifiers/VARIANTS.md)
    exclude: tuple[str, ...] = ("d:len", "d:context_len", "cb:")


_cache: dict[str, dict[str, float]] = {}


def featurise(rows: Sequence[Row]) -> list[dict[str, float]]:
    """Feature dicts per row, cached by id within the process (evaluation refits many times)."""
    out = []
    for r in rows:
        key = f"{r.source}/{r.id}"
        d = _cache.get(key)
        if d is None:
            d = _cache[key] = as_dict(extract(view(r.body)))
        out.append(d)
    return out


def text_length(row: Row) -> int:
    v = view(row.body)
    return len(v.text) + len(v.context)


@dataclass(slots=True)
class Design:
    """All rows' features as one sparse matrix, with what each fold needs to pick its own vocabulary."""

    rows: list[Row]
    X: csr_matrix
    names: list[str]
    source_of: np.ndarray  # row -> source index
    sources: list[str]
    per_source_df: csr_matrix  # source x feature: rows of the source holding the feature
    excluded: np.ndarray = field(default_factory=lambda: __import__("numpy").zeros(0, dtype=bool))
    generated: np.ndarray = field(default_factory=lambda: __import__("numpy").zeros(0, dtype=bool))  # rows


def design(rows: Sequence[Row], opts: Options | None = None) -> Design:
    import numpy as np
    from scipy.sparse import csr_matrix

    opts = opts or Options()
    feats = featurise(rows)
    # columns in name order: the grams come out of sets, whose order follows the per-process string hash,
    # and the order of the columns reaches the fitted weights (summation order, ties at the cut-off)
    index = {k: i for i, k in enumerate(sorted({k for d in feats for k in d}))}
    indptr = [0]
    indices: list[int] = []
    values: list[float] = []
    for d in feats:
        for k, v in d.items():
            indices.append(index[k])
            values.append(v)
        indptr.append(len(indices))
    X = csr_matrix(
        (np.asarray(values), np.asarray(indices, dtype=np.int32), np.asarray(indptr, dtype=np.int64)),
        shape=(len(feats), len(index)),
    )
    X.sort_indices()
    names = [""] * len(index)
    for k, i in index.items():
        names[i] = k
    sources = sorted({r.source for r in rows})
    sid = {s: i for i, s in enumerate(sources)}
    source_of = np.asarray([sid[r.source] for r in rows], dtype=np.int32)
    onehot = csr_matrix(
        (np.ones(len(rows)), (source_of, np.arange(len(rows)))), shape=(len(sources), len(rows))
    )
    binary = X.copy()
    binary.data[:] = 1.0
    per_source_df = (onehot @ binary).tocsr()
    excluded = np.asarray([n.startswith(opts.exclude) for n in names], dtype=bool)
    generated = np.asarray([is_generated(r) for r in rows], dtype=bool)
    return Design(list(rows), X, names, source_of, sources, per_source_df, excluded, generated)


def weights(rows: Sequence[Row], opts: Options) -> np.ndarray:
    """Per-row training weights (0 for ambiguous rows): source-damped, red-team-discounted, language- and
    length-balanced."""
    import numpy as np

    generated = np.asarray([is_generated(r) for r in rows], dtype=bool)
    group: dict[tuple[str, int], int] = {}
    for r, gen in zip(rows, generated, strict=True):
        if r.label != "ambiguous" and not gen:
            group[(r.source, r.y)] = group.get((r.source, r.y), 0) + 1
    w = np.zeros(len(rows))
    y = np.asarray([r.y for r in rows])
    bucket = np.asarray([sum(text_length(r) >= e for e in LENGTH_EDGES) for r in rows])
    for i, r in enumerate(rows):
        if r.label == "ambiguous" or generated[i]:
            continue
        w[i] = group[(r.source, r.y)] ** -opts.source_power
        if r.redteam:
            w[i] *= opts.redteam_weight
    if opts.balance_language:
        _balance_languages(rows, w, y)
    if not opts.balance_length:
        bucket[:] = 0
    cells = [(b, c) for b in np.unique(bucket) for c in (0, 1)]
    target = w.sum() / len(cells)
    for b, c in cells:
        # every (length bucket, class) cell weighs the same
        mask = (y == c) & (w > 0) & (bucket == b)
        s = w[mask].sum()
        if s > 0:
            w[mask] *= target / s
    for c in (0, 1):
        mask = generated & (y == c)
        if mask.any():
            w[mask] = opts.generated_share * w[~generated].sum() / 2 / mask.sum()
    out: np.ndarray = w * (len(rows) / max(w.sum(), 1e-12))
    return out


def _balance_languages(rows: Sequence[Row], w: np.ndarray, y: np.ndarray) -> None:
    """Within each language but English, cut the larger class down to the weight of the smaller one.

    Most non-English rows come from a few one-class sources (reading comprehension on one side, red-team
    prompts on the other), so a language's script would otherwise stand in for the label. A language whose
    rows hold one class only then teaches nothing, and its script stays neutral.
    """
    import numpy as np

    lang = np.asarray([r.language for r in rows])
    for code in set(lang.tolist()) - {"en"}:
        in_lang = (lang == code) & (w > 0)
        totals = [w[in_lang & (y == c)].sum() for c in (0, 1)]
        low = min(totals)
        for c in (0, 1):
            if totals[c] > 0:
                w[in_lang & (y == c)] *= low / totals[c]


def _vocabulary(d: Design, train_sources: np.ndarray, opts: Options) -> np.ndarray:
    """Column mask: features seen in >= min_sources training sources and >= min_df training rows.

    Generated rows are not a source here: their grams come from their templates and from material cut from
    real sources, and counting them would let a gram of eight real sources in.
    """
    import numpy as np

    train_sources = np.setdiff1d(train_sources, d.source_of[d.generated])
    sub = d.per_source_df[train_sources]
    df = np.asarray(sub.sum(axis=0)).ravel()
    nsrc = np.asarray((sub > 0).sum(axis=0)).ravel()
    is_dense = np.asarray([n.startswith("d:") for n in d.names], dtype=bool)
    keep = ((nsrc >= opts.min_sources) & (df >= opts.min_df)) | (is_dense & (df > 0))
    mask: np.ndarray = keep & ~d.excluded
    return mask


def _sgd(X: Any, y: np.ndarray, w: np.ndarray, opts: Options) -> Any:
    from sklearn.linear_model import SGDClassifier

    fits = [
        SGDClassifier(
            loss="log_loss",
            alpha=opts.alpha,
            max_iter=opts.epochs,
            tol=None,
            random_state=SEED + k,
            average=True,
        ).fit(X, y, sample_weight=w)
        for k in range(opts.seeds)
    ]
    model = fits[0]
    if len(fits) > 1:
        # the mean of fits that saw the rows in different orders: a linear model still, with less of the
        # order's noise (one held-out source's accuracy moved by 0.07 between two seeds)
        model.coef_ = sum(f.coef_ for f in fits) / len(fits)
        model.intercept_ = sum(f.intercept_ for f in fits) / len(fits)
    return model


def fit_design(d: Design, train_idx: np.ndarray, opts: Options | None = None) -> Classifier:
    """Fit on the rows ``train_idx`` of ``d`` (indices into ``d.rows``) and export a ``Classifier``."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    opts = opts or Options()
    rows = [d.rows[i] for i in train_idx]
    w_all = weights(rows, opts)
    keep_rows = w_all > 1e-9
    idx = np.asarray(train_idx)[keep_rows]
    w = w_all[keep_rows]
    y = np.asarray([d.rows[i].y for i in idx])
    cols = np.flatnonzero(_vocabulary(d, np.unique(d.source_of[idx]), opts))
    X = d.X[idx][:, cols]
    model = _sgd(X, y, w, opts)
    a, b, threshold = 1.0, 0.0, 0.5
    table: Calibration | None = None
    if opts.calibrate:
        oof = np.zeros(len(y))
        groups = d.source_of[idx]
        real = ~d.generated[idx]
        # folds by real source: the calibration scores are those of sources the fold's model never saw;
        # generated rows are on every fold's training side and are never scored (they are not traffic)
        fold_of = {s: k % opts.calibration_folds for k, s in enumerate(np.unique(groups[real]))}
        folds = np.asarray([fold_of.get(g, -1) for g in groups])
        for k in range(opts.calibration_folds):
            te = folds == k
            if te.any() and (~te).any() and len(np.unique(y[~te])) == 2:
                oof[te] = _sgd(X[~te], y[~te], w[~te], opts).decision_function(X[te])
        # the training weights stress the hard cells (languages, long open-ended prompts) and would flatten
        # the slope, so the calibration sees the real rows as they come
        oof, y_real = oof[real], y[real]
        s = oof.reshape(-1, 1)
        n_pos = y_real.sum()
        balanced = np.where(y_real == 1, 0.5 / max(n_pos, 1), 0.5 / max(len(y_real) - n_pos, 1))
        even = LogisticRegression(C=1e4, solver="lbfgs").fit(s, y_real, sample_weight=balanced)
        a, b = float(even.coef_[0, 0]), float(even.intercept_[0])
        if opts.calibration == "prior":
            # the label keeps the equal-prior decision (the score where the balanced fit crosses 0.5), so
            # both classes keep the same recall; p_structured itself matches the observed frequencies
            cut = -b / a if a else 0.0
            plain = LogisticRegression(C=1e4, solver="lbfgs").fit(s, y_real)
            a, b = float(plain.coef_[0, 0]), float(plain.intercept_[0])
            threshold = round(1.0 / (1.0 + math.exp(-(a * cut + b))), 5)
        if opts.isotonic and opts.calibration == "balanced":
            table = fit_isotonic(a * oof + b, y_real, balanced)
    coef = model.coef_[0] * a
    bias = float(model.intercept_[0]) * a + b
    clf = export(coef, bias, [d.names[c] for c in cols], opts, rows=len(idx))
    clf.threshold = threshold
    clf.calibration = table
    return clf


def export(coef: np.ndarray, bias: float, names: Sequence[str], opts: Options, rows: int) -> Classifier:
    import numpy as np

    order = np.argsort(-np.abs(coef), kind="stable")
    sparse: dict[str, dict[str, float]] = {}
    dense: dict[str, float] = {}
    kept = 0
    for i in order:
        weight = float(coef[i])
        if abs(weight) < 1e-4:
            break
        ns, _, gram = names[i].partition(":")
        if ns == "d":
            dense[gram] = round(weight, 4)
        elif kept < opts.max_features:
            sparse.setdefault(ns, {})[gram] = round(weight, 4)
            kept += 1
    meta = {
        "options": {
            "alpha": opts.alpha,
            "epochs": opts.epochs,
            "min_sources": opts.min_sources,
            "min_df": opts.min_df,
            "redteam_weight": opts.redteam_weight,
            "source_power": opts.source_power,
            "isotonic": opts.isotonic,
            "balance_length": opts.balance_length,
            "calibration": opts.calibration,
            "calibration_folds": opts.calibration_folds,
            "exclude": list(opts.exclude),
        },
        "rows": rows,
        "features": kept + len(dense),
    }
    return Classifier(bias=round(bias, 5), sparse=sparse, dense=dense, meta=meta)


def fit(rows: Sequence[Row], opts: Options | None = None) -> Classifier:
    import numpy as np

    opts = opts or Options()
    d = design(rows, opts)
    return fit_design(d, np.arange(len(rows)), opts)
