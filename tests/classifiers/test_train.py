from classifiers.data import OWN_SOURCE, PUBLIC_FILE, Row, commercial_ok, load
from classifiers.evaluate import metrics
from classifiers.features import as_dict, extract
from classifiers.request import view
from classifiers.train import Options, fit


def _rows() -> list[Row]:
    structured = [
        "Write a Python function to add two numbers.",
        "Convert this CSV to JSON: a,b\n1,2",
        "Repeat 'ok' 5 times.",
        "Give me a regex for dates.",
        "Continue: 1, 2, 3, 4,",
        "Write a bash command that lists files.",
    ]
    open_ended = [
        "Write a poem about love.",
        "What do you think about cats?",
        "Tell me a story about a bear.",
        "How can I be happier?",
        "hi, how are you?",
        "Pretend you are a pirate.",
    ]
    rows = []
    for i, (text, label) in enumerate(
        [(t, "structured") for t in structured] + [(t, "open-ended") for t in open_ended]
    ):
        rows.append(Row(str(i), f"src{i % 2}" if i % 3 else OWN_SOURCE, "MIT", "c", label, {"prompt": text}))
    return rows


def test_fit_is_deterministic_and_learns() -> None:
    opts = Options(calibrate=False, min_df=1)
    a, b = fit(_rows(), opts), fit(_rows(), opts)
    assert a.to_json() == b.to_json()
    assert (
        a.predict({"prompt": "Write a Python function to add two numbers."}).p_structured
        > a.predict({"prompt": "Write a poem about love."}).p_structured
    )


def test_features_are_namespaced() -> None:
    d = as_dict(extract(view({"prompt": "Write JSON\n```\n{}\n```"})))
    assert {k.split(":", 1)[0] for k in d} <= {"w", "t", "f", "c", "x", "d"}
    assert d["d:fence"] == 1.0


def test_licence_filter() -> None:
    assert commercial_ok("MIT") and commercial_ok("CC-BY-SA-4.0") and commercial_ok("Apache-2.0")
    for lic in (
        "CC-BY-NC-4.0 (x)",
        "research-only, non-commercial",
        "ODC-By; README: research use only",
        "underlying gigaword: LDC-derived",
        "underlying trec: unspecified",
    ):
        assert not commercial_ok(lic)


def test_repository_data_is_commercial_only() -> None:
    rows = load(PUBLIC_FILE)
    assert rows and all(commercial_ok(r.license) for r in rows)


def test_metrics() -> None:
    m = metrics([1, 1, 0, 0], [0.9, 0.4, 0.2, 0.6])
    assert m.balanced_accuracy == 0.5 and m.auc == 0.75


def test_loso_keeps_own_prompts_in_training_and_scores_them_apart() -> None:
    from classifiers.evaluate import leave_one_source_out

    rows = _rows()
    res = leave_one_source_out(rows, Options(calibrate=False, min_df=1), log=lambda _: None)
    assert set(res.per_source) == {"src0", "src1"}
    assert all(r.source != OWN_SOURCE for r in res.rows)
    own = res.pinned[OWN_SOURCE]
    assert len(own.rows) == sum(r.source == OWN_SOURCE for r in rows)
    assert 0.0 <= own.binary().balanced_accuracy <= 1.0
