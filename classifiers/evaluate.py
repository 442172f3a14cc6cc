"""Evaluation: pooled leave-one-source-out predictions, scored overall, per length bucket and per source,
against a length-only baseline (the classes differ in length on average, so length must not be the signal).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from classifiers.data import OWN_SOURCE, Row
from classifiers.model import Classifier
from classifiers.request import view
from classifiers.train import SEED, Options, fit

BUCKETS = (("< 300", 0, 300), ("300-1500", 300, 1500), ("> 1500", 1500, math.inf))


def length(row: Row) -> int:
    v = view(row.body)
    return len(v.text) + len(v.context)


def bucket(n: int) -> str:
    return next(name for name, lo, hi in BUCKETS if lo <= n < hi)


@dataclass(slots=True)
class Metrics:
    n: int
    balanced_accuracy: float
    f1: float
    auc: float
    brier: float
    accuracy: float


def metrics(y: Sequence[int], p: Sequence[float]) -> Metrics:
    pos = [pi for yi, pi in zip(y, p, strict=True) if yi == 1]
    neg = [pi for yi, pi in zip(y, p, strict=True) if yi == 0]
    tp = sum(1 for pi in pos if pi > 0.5)
    tn = sum(1 for pi in neg if pi <= 0.5)
    fp = len(neg) - tn
    recalls = [r for r in (tp / len(pos) if pos else None, tn / len(neg) if neg else None) if r is not None]
    ba = sum(recalls) / len(recalls) if recalls else float("nan")
    f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if pos else float("nan")
    return Metrics(
        n=len(y),
        balanced_accuracy=ba,
        f1=f1,
        auc=_auc(pos, neg),
        brier=sum((pi - yi) ** 2 for yi, pi in zip(y, p, strict=True)) / max(len(y), 1),
        accuracy=(tp + tn) / max(len(y), 1),
    )


def _auc(pos: Sequence[float], neg: Sequence[float]) -> float:
    if not pos or not neg:
        return float("nan")
    ranked = sorted([(p, 1) for p in pos] + [(p, 0) for p in neg])
    # average ranks for ties
    rank_sum, i = 0.0, 0
    while i < len(ranked):
        j = i
        while j + 1 < len(ranked) and ranked[j + 1][0] == ranked[i][0]:
            j += 1
        avg = (i + j) / 2 + 1
        rank_sum += avg * sum(1 for k in range(i, j + 1) if ranked[k][1] == 1)
        i = j + 1
    return (rank_sum - len(pos) * (len(pos) + 1) / 2) / (len(pos) * len(neg))


def reliability(y: Sequence[int], p: Sequence[float], bins: int = 10) -> list[tuple[str, int, float, float]]:
    """(bin, count, mean predicted, observed fraction structured)."""
    out = []
    for b in range(bins):
        lo, hi = b / bins, (b + 1) / bins
        idx = [i for i, pi in enumerate(p) if lo <= pi < hi or (b == bins - 1 and pi == 1.0)]
        if idx:
            out.append(
                (
                    f"{lo:.1f}-{hi:.1f}",
                    len(idx),
                    sum(p[i] for i in idx) / len(idx),
                    sum(y[i] for i in idx) / len(idx),
                )
            )
    return out


@dataclass(slots=True)
class PinnedResult:
    """A pinned source held out on its own: predictions of a model trained on all the other sources."""

    rows: list[Row]
    p: list[float]

    def binary(self, where: Callable[[Row], bool] = lambda r: True) -> Metrics:
        pairs = [
            (r.y, pi) for r, pi in zip(self.rows, self.p, strict=True) if r.label != "ambiguous" and where(r)
        ]
        return metrics([a for a, _ in pairs], [b for _, b in pairs])


@dataclass(slots=True)
class Result:
    """Predictions for every row, each made by a model that never saw the row's source."""

    rows: list[Row]
    p: list[float]
    baseline: list[float]
    per_source: dict[str, Metrics] = field(default_factory=dict)
    # sources kept in every training fold, each also scored once when held out on its own
    pinned: dict[str, PinnedResult] = field(default_factory=dict)

    def binary(self, which: str = "model", where: Callable[[Row], bool] = lambda r: True) -> Metrics:
        probs = self.p if which == "model" else self.baseline
        pairs = [
            (r.y, pi) for r, pi in zip(self.rows, probs, strict=True) if r.label != "ambiguous" and where(r)
        ]
        return metrics([a for a, _ in pairs], [b for _, b in pairs])

    def ambiguous_mean(self) -> float:
        ps = [pi for r, pi in zip(self.rows, self.p, strict=True) if r.label == "ambiguous"]
        return sum(ps) / len(ps) if ps else float("nan")


def _length_baseline(train: Sequence[Row], test: Sequence[Row]) -> list[float]:
    """Class-balanced logistic regression on log length (and its square)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    def x(rows: Sequence[Row]) -> np.ndarray:
        ln = np.log1p(np.asarray([length(r) for r in rows], dtype=float))
        return np.column_stack([ln, ln**2])

    binary = [r for r in train if r.label != "ambiguous"]
    model = LogisticRegression(class_weight="balanced", random_state=SEED)
    model.fit(x(binary), [r.y for r in binary])
    return [float(v) for v in model.predict_proba(x(test))[:, 1]]


def leave_one_source_out(
    rows: Sequence[Row],
    opts: Options | None = None,
    log: Callable[[str], None] = print,
    pinned: tuple[str, ...] = (OWN_SOURCE,),
) -> Result:
    """Pooled LOSO over the public sources; ``pinned`` sources (SpecRoute's own prompts, which are
    augmentation rather than a public dataset) stay in every training fold and are scored separately,
    each held out on its own."""
    sources = sorted({r.source for r in rows if r.label != "ambiguous" and r.source not in pinned})
    ordered: list[Row] = []
    p: list[float] = []
    base: list[float] = []
    per_source: dict[str, Metrics] = {}
    for s in sources:
        train = [r for r in rows if r.source != s]
        test = [r for r in rows if r.source == s]
        clf = fit(train, opts)
        ps = [clf.predict(r.body).p_structured for r in test]
        ordered.extend(test)
        p.extend(ps)
        base.extend(_length_baseline(train, test))
        binary = [(r.y, pi) for r, pi in zip(test, ps, strict=True) if r.label != "ambiguous"]
        per_source[s] = metrics([a for a, _ in binary], [b for _, b in binary])
        log(f"  held out {s:<40} n={len(binary):>5}  balanced acc {per_source[s].balanced_accuracy:.3f}")
    # rows of sources with no binary rows (ambiguous only) are predicted by the model trained on all others
    public = set(sources) | set(pinned)
    rest = [r for r in rows if r.source not in public]
    if rest:
        clf = fit([r for r in rows if r.source in public], opts)
        ordered.extend(rest)
        p.extend(clf.predict(r.body).p_structured for r in rest)
        base.extend(_length_baseline(rows, rest))
    res = Result(ordered, p, base, per_source)
    for s in pinned:
        test = [r for r in rows if r.source == s]
        if test:
            clf = fit([r for r in rows if r.source != s], opts)
            res.pinned[s] = PinnedResult(test, [clf.predict(r.body).p_structured for r in test])
            log(f"  held out {s:<40} (pinned)  balanced acc {res.pinned[s].binary().balanced_accuracy:.3f}")
    return res


def in_sample(clf: Classifier, rows: Sequence[Row]) -> Metrics:
    binary = [r for r in rows if r.label != "ambiguous"]
    return metrics([r.y for r in binary], [clf.predict(r.body).p_structured for r in binary])


def report(res: Result, title: str) -> str:
    """Markdown tables: overall, per length bucket (model vs length baseline), per source, reliability."""
    lines = [f"### {title}", ""]
    m = res.binary()
    b = res.binary("baseline")
    lines += [
        "| slice | n | balanced acc | F1 | AUC | Brier | length-only balanced acc |",
        "|---|---|---|---|---|---|---|",
        _row("overall", m, b),
    ]
    for name, _, _ in BUCKETS:

        def inside(r: Row, name: str = name) -> bool:
            return bucket(length(r)) == name

        lines.append(_row(name + " chars", res.binary(where=inside), res.binary("baseline", where=inside)))
    lines += [
        "",
        f"Ambiguous rows (not in the binary metrics): mean p_structured {res.ambiguous_mean():.3f}.",
        "",
    ]
    lines += ["| held-out source | n | balanced acc (accuracy where one class) |", "|---|---|---|"]
    for s, ms in sorted(res.per_source.items()):
        lines.append(f"| {s} | {ms.n} | {ms.balanced_accuracy:.3f} |")
    y = [r.y for r in res.rows if r.label != "ambiguous"]
    p = [pi for r, pi in zip(res.rows, res.p, strict=True) if r.label != "ambiguous"]
    lines += ["", "| p bin | n | mean p | observed structured |", "|---|---|---|---|"]
    lines += [f"| {b} | {n} | {mp:.3f} | {obs:.3f} |" for b, n, mp, obs in reliability(y, p)]
    for s, pr in sorted(res.pinned.items()):
        lines += ["", f"Held out on its own (trained on the public sources only), `{s}`:", ""]
        lines += [
            "| slice | n | balanced acc |",
            "|---|---|---|",
            f"| overall | {pr.binary().n} | {pr.binary().balanced_accuracy:.3f} |",
        ]
        for name, _, _ in BUCKETS:

            def inside_p(r: Row, name: str = name) -> bool:
                return bucket(length(r)) == name

            mb = pr.binary(inside_p)
            lines.append(f"| {name} chars | {mb.n} | {mb.balanced_accuracy:.3f} |")
    return "\n".join(lines) + "\n"


def _row(name: str, m: Metrics, b: Metrics) -> str:
    return (
        f"| {name} | {m.n} | {m.balanced_accuracy:.3f} | {m.f1:.3f} | {m.auc:.3f} | {m.brier:.3f} "
        f"| {b.balanced_accuracy:.3f} |"
    )
