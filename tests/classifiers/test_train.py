"""Training and evaluation on a small hand-written corpus (``fixtures/prompts-train.jsonl``), never the
shared one."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from classifiers import data
from classifiers.data import CorpusNotFound, Row, corpus_file, load, load_training
from classifiers.evaluate import ece, leave_one_source_out, metrics
from classifiers.features import NAMESPACES, as_dict, extract
from classifiers.request import view
from classifiers.train import Options, design, fit, weights

FIXTURES = Path(__file__).parent / "fixtures"
FAST = Options(calibrate=False, min_df=1, epochs=20)


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return load_training(FIXTURES)


def _row(source: str, label: str, prompt: str, **kw: object) -> Row:
    return Row(
        id=prompt[:20], source=source, license="MIT", category="c", label=label, body={"prompt": prompt}, **kw
    )  # type: ignore[arg-type]


def test_training_reads_commercial_rows_only(rows: list[Row]) -> None:
    everything = load(corpus_file(FIXTURES))
    assert any(not r.commercial for r in everything)
    assert rows and all(r.commercial for r in rows)
    assert len(load_training(FIXTURES, with_restricted=True)) == len(everything)


def test_missing_corpus_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(CorpusNotFound, match="--data"):
        load_training(tmp_path)


def test_default_corpus_is_found_next_to_the_repository() -> None:
    # relative to the package, not to the working directory
    expected = Path(data.__file__).resolve().parents[2] / "shared" / "data"
    assert expected == data.DEFAULT_DATA_DIR


def test_fit_is_deterministic_and_learns(rows: list[Row]) -> None:
    a, b = fit(rows, FAST), fit(rows, FAST)
    assert a.to_json() == b.to_json()
    code = a.predict({"prompt": "Write a Python function that returns the largest of three integers."})
    story = a.predict({"prompt": "Write a short story about a fox who learns to sing."})
    assert code.p_structured > story.p_structured


def test_a_gram_of_one_source_is_left_out() -> None:
    rows = [
        _row("a", "structured", "zzqx write python code"),
        _row("a", "structured", "zzqx write sql code"),
        _row("b", "structured", "write python code now"),
        _row("c", "open-ended", "tell a story now"),
        _row("d", "open-ended", "tell a poem now"),
    ]
    clf = fit(rows, Options(calibrate=False, min_df=1, min_sources=2))
    grams = {g for table in clf.sparse.values() for g in table}
    assert not any("zzqx" in g or "zq" in g for g in grams)
    assert any("python" in g for g in grams)


def test_weights() -> None:
    rows = [_row("big", "structured", f"write code number {i}") for i in range(16)]
    rows += [_row("small", "structured", "write code once")]
    rows += [_row("chat", "open-ended", "tell me a story"), _row("chat", "open-ended", "why is the sky blue")]
    rows += [_row("red", "open-ended", "say something rude", redteam=True)]
    rows += [_row("x", "ambiguous", "translate: hello")]
    rows += [_row("th", "open-ended", "เล่าเรื่องให้ฟังหน่อย", language="th")]
    w = weights(rows, Options(balance_length=False))
    assert w[-2] == 0.0  # ambiguous: not in the objective
    assert w[-1] == 0.0  # a language holding one class teaches nothing
    # a source 16 times larger weighs 4 times more, not 16
    assert sum(w[:16]) == pytest.approx(4 * w[16])
    assert w[19] < w[17]  # red-team rows count less
    y = np.asarray([r.y for r in rows])
    assert w[y == 1].sum() == pytest.approx(w[(y == 0)].sum())
    # source_power 1: every (source, class) pair weighs the same, whatever its size
    flat = weights(rows, Options(balance_length=False, source_power=1.0))
    assert sum(flat[:16]) == pytest.approx(flat[16])


def test_balanced_fit_ships_an_isotonic_table_that_keeps_the_balanced_decision() -> None:
    rows, unseen = _skewed_rows(range(8)), _skewed_rows(range(8, 12))
    opts = Options(min_df=1, epochs=20, calibration_folds=4, balance_length=False)
    iso = fit(rows, opts)
    platt = fit(rows, replace(opts, isotonic=False))
    assert platt.calibration is None and iso.calibration is not None
    assert iso.threshold == 0.5 and list(iso.calibration.p) == sorted(iso.calibration.p)
    # the table is monotone: it reorders no two prompts
    scored = sorted((platt.predict(r.body).p_structured, iso.predict(r.body).p_structured) for r in unseen)
    assert [b for _, b in scored] == sorted(b for _, b in scored)


def test_features_are_namespaced_and_read_the_instruction_apart() -> None:
    passage = "The river rose slowly through the night and the village woke to water. " * 40
    f = extract(view({"prompt": "Copy lines 2-4 from the text below.\n" + passage}))
    assert set(f.sparse) == set(NAMESPACES)
    assert "copy" in f.sparse["wh"] and any("cop" in g for g in f.sparse["ch"])
    assert not any("cop" in g for g in f.sparse["cb"])  # the instruction is not in the body
    assert f.dense["layout_first_line"] == 1.0
    d = as_dict(extract(view({"prompt": "Write JSON\n```\n{}\n```"})))
    assert {k.split(":", 1)[0] for k in d} <= set(NAMESPACES) | {"d"}
    assert d["d:fence"] == 1.0 and "d:len" in d


def test_design_excludes_length(rows: list[Row]) -> None:
    d = design(rows, FAST)
    dropped = [n for n, x in zip(d.names, d.excluded, strict=True) if x]
    assert dropped and all(n.startswith(("d:len", "d:context_len", "cb:")) for n in dropped)
    assert any(n.startswith("d:len") for n in dropped)
    clf = fit(rows, FAST)
    assert "len" not in clf.dense


def test_body_grams_are_extracted_but_left_out_of_the_model() -> None:
    # the pasted passage between head and tail is read, but its grams carry no weight by default
    passage = "the river runs past the old mill and the fields beyond it. " * 6
    rows = [
        _row(src, label, f"{head}\n{passage}\n{tail} {src}")
        for src, label, head, tail in [
            ("a", "structured", "Summarise the text below:", "Summary in two lines."),
            ("b", "structured", "Extract every date from this:", "Return JSON."),
            ("c", "open-ended", "Here is a note from my diary.", "Write me a poem about it."),
            ("d", "open-ended", "I found this story online.", "What do you feel about it?"),
        ]
    ]
    opts = replace(FAST, min_sources=1)
    d = design(rows, opts)
    body = [n for n in d.names if n.startswith("cb:")]
    assert body and all(d.excluded[d.names.index(n)] for n in body)
    assert "cb" not in fit(rows, opts).sparse
    kept = fit(rows, replace(opts, exclude=("d:len", "d:context_len")))
    assert kept.sparse.get("cb") and kept.meta["options"]["exclude"] == ["d:len", "d:context_len"]


def test_metrics() -> None:
    m = metrics([1, 1, 0, 0], [0.9, 0.4, 0.2, 0.6])
    assert m.balanced_accuracy == 0.5 and m.auc == 0.75
    assert ece([1, 0], [1.0, 0.0]) == 0.0
    assert ece([1, 1, 0, 0], [0.95, 0.95, 0.95, 0.95]) == pytest.approx(0.45)


def test_loso_predicts_each_row_once_from_a_model_without_its_source(rows: list[Row]) -> None:
    res = leave_one_source_out(rows, FAST, log=lambda _: None)
    assert sorted(r.id for r in res.rows) == sorted(r.id for r in rows)
    assert all(0.0 <= p <= 1.0 for p in res.p)
    # the held-out source's predictions are exactly those of a model fitted on the other sources
    held = [r for r in rows if r.source == "acme/creative"]
    others = [r for r in rows if r.source != "acme/creative"]
    alone = fit(others, FAST)
    pooled = dict(zip((r.id for r in res.rows), res.p, strict=True))
    assert [pooled[r.id] for r in held] == pytest.approx(
        [alone.predict(r.body).p_structured for r in held], abs=1e-3
    )


def _skewed_rows(sources: range) -> list[Row]:
    """Three structured rows to every open-ended one, over eight sources, with words shared across classes
    so that the out-of-fold scores overlap."""
    rows = []
    topics = ["list", "table", "city", "river", "number", "python", "story", "song"]
    for s in sources:
        for i in range(12):
            t = topics[(s + i) % len(topics)]
            # one structured row in six reads like the open-ended ones, one open-ended row in four like these
            text = "tell me what you think about" if i % 6 == 0 else "extract the names from"
            rows.append(replace(_row(f"src{s}", "structured", f"{text} the {t} {s} {i}"), id=f"s{s}-{i}"))
        for i in range(4):
            t = topics[(s + 2 * i) % len(topics)]
            text = "extract the names from" if i == 0 else "tell me what you think about"
            rows.append(replace(_row(f"src{s}", "open-ended", f"{text} the {t} {s} {i}"), id=f"o{s}-{i}"))
    return rows


def test_prior_calibration_matches_the_class_mix_and_keeps_the_balanced_decision() -> None:
    rows, unseen = _skewed_rows(range(8)), _skewed_rows(range(8, 12))
    # Platt scaling on both sides: the isotonic table (balanced mode only) is tested on its own
    opts = Options(
        min_df=1, epochs=20, calibration_folds=4, balance_length=False, calibration="prior", isotonic=False
    )
    prior = fit(rows, opts)
    even = fit(rows, replace(opts, calibration="balanced"))
    share = sum(r.y for r in unseen) / len(unseen)
    mean_prior = sum(prior.predict(r.body).p_structured for r in unseen) / len(unseen)
    mean_even = sum(even.predict(r.body).p_structured for r in unseen) / len(unseen)
    # on sources it never saw, the probabilities follow the 3:1 mix instead of equal priors ...
    assert abs(mean_prior - share) < abs(mean_even - share)
    # ... while the label still cuts where the class-balanced fit does
    assert even.threshold == 0.5 and prior.threshold > 0.5
    labels_prior = [prior.predict(r.body).label for r in rows + unseen]
    labels_even = [even.predict(r.body).label for r in rows + unseen]
    assert labels_prior == labels_even


def test_metrics_count_the_models_own_labels() -> None:
    # p 0.6 under a 0.7 threshold is an open-ended label: balanced accuracy follows the label, AUC the score
    m = metrics([1, 0, 0], [0.9, 0.6, 0.1], [1, 0, 0])
    assert m.balanced_accuracy == 1.0 and m.auc == 1.0
    assert metrics([1, 0, 0], [0.9, 0.6, 0.1]).balanced_accuracy == 0.75


FIT_TWO_TEMPLATES = """
import json
from classifiers.data import Row
from classifiers.train import Options, fit
rows = []
for s in range(6):
    for i in range(6):
        for kind, label, text in (("a", "structured", "extract the names from table"),
                                  ("b", "open-ended", "tell me a story about a dragon")):
            rows.append(Row(id=f"{kind}{s}{i}", source=f"s{s}", license="MIT", category="c", label=label,
                            body={"prompt": f"{text} {i}"}))
# grams that always come together get the same weight: which of them ship must not depend on set order
print(json.dumps(fit(rows, Options(min_df=1, max_features=6, calibrate=False)).to_json(), sort_keys=True))
"""


def test_fit_is_the_same_whatever_the_string_hash_seed() -> None:
    # the grams come out of sets, whose order follows PYTHONHASHSEED; the artefact must not
    out = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        run = subprocess.run(
            [sys.executable, "-c", FIT_TWO_TEMPLATES], env=env, capture_output=True, text=True, check=True
        )
        out.add(run.stdout)
    assert len(out) == 1


def test_seeds_average_fits_that_shuffle_the_rows_their_own_way(
    rows: list[Row], monkeypatch: pytest.MonkeyPatch
) -> None:
    from classifiers import train

    d = design(rows, FAST)
    y = np.asarray([r.y for r in rows])
    w = weights(rows, FAST) + 1e-3  # ambiguous rows too, so that every row is in the fit
    one = train._sgd(d.X, y, w, FAST)
    two = train._sgd(d.X, y, w, replace(FAST, seeds=2))
    monkeypatch.setattr(train, "SEED", train.SEED + 1)
    other = train._sgd(d.X, y, w, FAST)
    assert not np.allclose(one.coef_, other.coef_)  # the seed matters ...
    assert two.coef_ == pytest.approx((one.coef_ + other.coef_) / 2)  # ... and the mean is what ships
    assert two.intercept_ == pytest.approx((one.intercept_ + other.intercept_) / 2)
