"""Leave-one-source-out evaluation: every row is predicted by a model that never saw its source.

The pooled held-out predictions are scored overall, per source, per language and per length bucket, with a
reliability table and the expected calibration error, against a length-only baseline (the classes differ
in length in the corpus, so length must not be the signal). Run it with ``python -m classifiers.evaluate``
(or ``specroute train --evaluate``); it needs scikit-learn (the ``train`` extra).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from classifiers import augment
from classifiers.data import Row, load_training
from classifiers.model import Classifier
from classifiers.request import view
from classifiers.train import SEED, Options, design, fit, fit_design, text_length

BUCKETS = (("< 300", 0, 300), ("300-1500", 300, 1500), ("> 1500", 1500, math.inf))
PROBES_FILE = Path(__file__).parent / "probes" / "probes.jsonl"


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
    ece: float


def metrics(y: Sequence[int], p: Sequence[float], label: Sequence[int] | None = None) -> Metrics:
    """Ranking and calibration from ``p``; the counts from ``label`` (the model's own decision, whose
    threshold need not be 0.5), or ``p > 0.5`` without it."""
    hard = [int(pi > 0.5) for pi in p] if label is None else list(label)
    pos = [pi for yi, pi in zip(y, p, strict=True) if yi == 1]
    neg = [pi for yi, pi in zip(y, p, strict=True) if yi == 0]
    tp = sum(1 for yi, li in zip(y, hard, strict=True) if yi == 1 and li == 1)
    tn = sum(1 for yi, li in zip(y, hard, strict=True) if yi == 0 and li == 0)
    fp = len(neg) - tn
    recalls = [r for r in (tp / len(pos) if pos else None, tn / len(neg) if neg else None) if r is not None]
    ba = sum(recalls) / len(recalls) if recalls else float("nan")
    f1 = 2 * tp / (2 * tp + fp + len(pos) - tp) if pos else float("nan")
    return Metrics(
        n=len(y),
        balanced_accuracy=ba,
        f1=f1,
        auc=auc(pos, neg),
        brier=sum((pi - yi) ** 2 for yi, pi in zip(y, p, strict=True)) / max(len(y), 1),
        accuracy=(tp + tn) / max(len(y), 1),
        ece=ece(y, p),
    )


def auc(pos: Sequence[float], neg: Sequence[float]) -> float:
    """Area under the ROC curve (ties count half), by ranks."""
    if not pos or not neg:
        return float("nan")
    ranked = sorted([(p, 1) for p in pos] + [(p, 0) for p in neg])
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


def ece(y: Sequence[int], p: Sequence[float], bins: int = 10) -> float:
    """Expected calibration error: count-weighted |mean predicted - observed| over ten equal-width bins."""
    n = max(len(y), 1)
    return sum(k * abs(mp - obs) for _, k, mp, obs in reliability(y, p, bins)) / n


@dataclass(slots=True)
class Result:
    """Held-out predictions for every row, each made by a model that never saw the row's source."""

    rows: list[Row]
    p: list[float]
    baseline: list[float]
    label: list[int]  # the model's decision (1 = structured), at its own threshold

    def binary(self, which: str = "model", where: Callable[[Row], bool] = lambda r: True) -> Metrics:
        probs = self.p if which == "model" else self.baseline
        labels = self.label if which == "model" else [int(b > 0.5) for b in self.baseline]
        kept = [
            (r.y, pi, li)
            for r, pi, li in zip(self.rows, probs, labels, strict=True)
            if r.label != "ambiguous" and where(r)
        ]
        return metrics([a for a, _, _ in kept], [b for _, b, _ in kept], [c for _, _, c in kept])

    def ambiguous_mean(self) -> float:
        ps = [pi for r, pi in zip(self.rows, self.p, strict=True) if r.label == "ambiguous"]
        return sum(ps) / len(ps) if ps else float("nan")


def _length_baseline(train: Sequence[Row], test: Sequence[Row]) -> list[float]:
    """Class-balanced logistic regression on log length (and its square)."""
    import numpy as np
    from sklearn.linear_model import LogisticRegression

    def x(rows: Sequence[Row]) -> np.ndarray:
        ln = np.log1p(np.asarray([text_length(r) for r in rows], dtype=float))
        return np.column_stack([ln, ln**2])

    binary = [r for r in train if r.label != "ambiguous"]
    model = LogisticRegression(class_weight="balanced", random_state=SEED)
    model.fit(x(binary), [r.y for r in binary])
    return [float(v) for v in model.predict_proba(x(test))[:, 1]]


def leave_one_source_out(
    rows: Sequence[Row],
    opts: Options | None = None,
    log: Callable[[str], None] = print,
    generated: Sequence[Row] = (),
) -> Result:
    """One fold per source: fit on every other source (features extracted once), predict the held-out one.

    ``generated`` rows (:mod:`classifiers.augment`) join the training side only: they are never held out,
    and a fold leaves out those whose material was cut from its held-out source.
    """
    import numpy as np

    opts = opts or Options()
    d = design([*rows, *generated], opts)
    real = ~d.generated
    origin = np.asarray([r.origin for r in d.rows])
    ordered: list[Row] = []
    p: list[float] = []
    base: list[float] = []
    label: list[int] = []
    for k, s in enumerate(d.sources):
        if s == augment.SOURCE:
            continue
        test_idx = np.flatnonzero(d.source_of == k)
        train_idx = np.flatnonzero((d.source_of != k) & (real | (origin != s)))
        t0 = time.perf_counter()
        clf = fit_design(d, train_idx, opts)
        test = [d.rows[i] for i in test_idx]
        preds = [clf.predict(r.body) for r in test]
        ps = [pr.p_structured for pr in preds]
        ls = [int(pr.label == "structured") for pr in preds]
        ordered.extend(test)
        p.extend(ps)
        label.extend(ls)
        base.extend(_length_baseline([d.rows[i] for i in train_idx], test))
        binary = [(r.y, pi, li) for r, pi, li in zip(test, ps, ls, strict=True) if r.label != "ambiguous"]
        m = metrics([a for a, _, _ in binary], [b for _, b, _ in binary], [c for _, _, c in binary])
        log(
            f"  held out {s:<55} n={m.n:>5}  balanced acc {m.balanced_accuracy:.3f}"
            f"  ({time.perf_counter() - t0:.1f} s)"
        )
    return Result(ordered, p, base, label)


@dataclass(frozen=True, slots=True)
class Probe:
    """A request written for this project to read the model the way live traffic would (probes/README.md)."""

    id: str
    label: str  # structured | open-ended | ambiguous
    category: str
    language: str
    body: dict[str, object]

    @property
    def length(self) -> int:
        v = view(self.body)
        return len(v.text) + len(v.context)


def load_probes(path: Path = PROBES_FILE) -> list[Probe]:
    """The hand-written probes: each line a prompt or a chat, its label, category and language."""
    probes = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if not line.strip():
                continue
            d = json.loads(line)
            body = {"messages": d["messages"]} if "messages" in d else {"prompt": d["prompt"]}
            probes.append(Probe(d["id"], d["label"], d["category"], d.get("language", "en"), body))
    return probes


def probe_report(clf: Classifier, probes: Sequence[Probe]) -> str:
    """A model's reading of the probes: pooled figures, then right / total per category, length and language.

    The probes are never trained on and no setting is chosen by them alone; they show what
    leave-one-source-out cannot: requests unlike any corpus source (copy or pick lines of a pasted text,
    prose coding requests, tools defined in a system prompt, open-ended requests over pasted material).
    """
    scored = [(pr, clf.predict(pr.body)) for pr in probes if pr.label != "ambiguous"]
    y = [int(pr.label == "structured") for pr, _ in scored]
    p = [pred.p_structured for _, pred in scored]
    m = metrics(y, p, [int(pred.label == "structured") for _, pred in scored])
    right = [(pr, (pred.label == "structured") == (pr.label == "structured")) for pr, pred in scored]

    def tally(key: Callable[[Probe], str]) -> str:
        groups: dict[str, list[bool]] = {}
        for pr, ok in right:
            groups.setdefault(key(pr), []).append(ok)
        return ", ".join(f"{k} {sum(v)}/{len(v)}" for k, v in sorted(groups.items()))

    head = (
        f"{m.n} probes with a binary label: balanced accuracy {m.balanced_accuracy:.3f}, "
        f"AUC {m.auc:.3f}, Brier {m.brier:.3f}, ECE {m.ece:.3f}"
    )
    ambiguous = [clf.predict(pr.body).p_structured for pr in probes if pr.label == "ambiguous"]
    if ambiguous:
        head += f"; {len(ambiguous)} ambiguous, mean p_structured {sum(ambiguous) / len(ambiguous):.3f}"
    return "\n".join(
        [
            head + ".",
            "",
            f"- right / total per category: {tally(lambda pr: pr.category)}",
            f"- per length: {tally(lambda pr: bucket(pr.length))}",
            f"- per language: {tally(lambda pr: 'English' if pr.language == 'en' else 'other languages')}",
            "",
        ]
    )


def _slice_row(name: str, m: Metrics, b: Metrics | None = None) -> str:
    base = f" {b.balanced_accuracy:.3f} |" if b is not None else ""
    return (
        f"| {name} | {m.n} | {m.balanced_accuracy:.3f} | {m.auc:.3f} | {m.brier:.3f} | {m.ece:.3f} |" + base
    )


def _per_value(res: Result, heading: str, column: str, key: Callable[[Row], str]) -> list[str]:
    """A table of the held-out metrics for each value of ``key`` (a source, a language)."""
    lines = [
        "",
        heading,
        "",
        f"| {column} | n | balanced acc | AUC | Brier | ECE |",
        "|---|---|---|---|---|---|",
    ]
    for value in sorted({key(r) for r in res.rows}):
        m = res.binary(where=lambda r, value=value: key(r) == value)  # type: ignore[misc]
        if m.n:
            lines.append(_slice_row(value, m))
    return lines


def report(res: Result, title: str) -> str:
    """Markdown tables: overall and per length bucket (vs the length baseline), per source, per language,
    reliability."""
    lines = [f"### {title}", ""]
    lines += [
        "| slice | n | balanced acc | AUC | Brier | ECE | length-only balanced acc |",
        "|---|---|---|---|---|---|---|",
        _slice_row("overall", res.binary(), res.binary("baseline")),
    ]
    for name, _, _ in BUCKETS:

        def inside(r: Row, name: str = name) -> bool:
            return bucket(text_length(r)) == name

        lines.append(
            _slice_row(name + " chars", res.binary(where=inside), res.binary("baseline", where=inside))
        )
    lines += [
        "",
        f"Ambiguous rows (not in the binary metrics): mean p_structured {res.ambiguous_mean():.3f}.",
    ]
    lines += _per_value(
        res,
        "Per held-out source (accuracy where the source holds one class; AUC where it holds both):",
        "held-out source",
        lambda r: r.source,
    )
    lines += _per_value(res, "Per language:", "language", lambda r: r.language)
    y = [r.y for r in res.rows if r.label != "ambiguous"]
    p = [pi for r, pi in zip(res.rows, res.p, strict=True) if r.label != "ambiguous"]
    lines += ["", "Reliability of the pooled held-out predictions:", ""]
    lines += ["| p bin | n | mean p | observed structured |", "|---|---|---|---|"]
    lines += [f"| {b} | {n} | {mp:.3f} | {obs:.3f} |" for b, n, mp, obs in reliability(y, p)]
    return "\n".join(lines) + "\n"


def summary(res: Result) -> str:
    """One line: the headline figures."""
    m = res.binary()
    worst_bucket = min(
        res.binary(where=lambda r, n=name: bucket(text_length(r)) == n).balanced_accuracy  # type: ignore[misc]
        for name, _, _ in BUCKETS
    )
    return (
        f"balanced acc {m.balanced_accuracy:.3f}  AUC {m.auc:.3f}  Brier {m.brier:.3f}  ECE {m.ece:.3f}  "
        f"worst length bucket {worst_bucket:.3f}"
    )


def options(settings: Sequence[str]) -> Options:
    """Training options with ``name=value`` overrides (``--set source_power=1.0``), each value read as the
    type of the option's default, so that a variant is measured by the very code that ships."""
    fields = {f.name: f for f in dataclasses.fields(Options)}
    defaults = Options()
    changes: dict[str, object] = {}
    for item in settings:
        name, sep, raw = item.partition("=")
        if not sep or name not in fields:
            known = ", ".join(sorted(fields))
            raise ValueError(f"--set {item!r}: expected NAME=VALUE with NAME one of {known}")
        kind = type(getattr(defaults, name))
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--set {item!r}: expected true or false")
            changes[name] = raw.lower() in ("true", "1")
        elif kind is tuple:
            changes[name] = tuple(v for v in raw.split(",") if v)
        else:
            try:
                changes[name] = kind(raw)
            except ValueError:
                raise ValueError(f"--set {item!r}: expected a {kind.__name__}") from None
    return dataclasses.replace(defaults, **changes)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    ap.add_argument("--data", type=Path, default=None, help="corpus folder (default ../shared/data)")
    ap.add_argument(
        "--restricted", action="store_true", help="train with the non-commercial rows too (not shipped)"
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="measure a variant: override a training option (repeatable), e.g. --set source_power=1.0",
    )
    ap.add_argument(
        "--augment",
        type=int,
        default=0,
        metavar="N",
        help="add N generated rows per class to every fold's training side (classifiers.augment)",
    )
    ap.add_argument(
        "--probes",
        action="store_true",
        help="also fit on every row and score the hand-written probes (classifiers/probes)",
    )
    ap.add_argument(
        "--no-loso", dest="loso", action="store_false", help="skip leave-one-source-out (with --probes)"
    )
    ap.add_argument(
        "--augment-labels",
        default="structured,open-ended",
        metavar="LABELS",
        help="the classes of the generated rows to keep (comma-separated)",
    )
    args = ap.parse_args(argv)
    try:
        opts = options(args.set)
    except ValueError as e:
        ap.error(str(e))
    rows = load_training(args.data, with_restricted=args.restricted)
    labels = args.augment_labels.split(",")
    generated = augment.generate(rows, args.augment, labels=labels) if args.augment else []
    if args.loso:
        res = leave_one_source_out(rows, opts, generated=generated)
        title = "Leave-one-source-out" + (" with the non-commercial rows" if args.restricted else "")
        if generated:
            title += f", {len(generated)} generated rows on the training side"
        print(report(res, title))
        print(summary(res))
    if args.probes:
        print(probe_report(fit([*rows, *generated], opts), load_probes()))


if __name__ == "__main__":
    main()
