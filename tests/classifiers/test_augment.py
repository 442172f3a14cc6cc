"""Generated rows: what they hold, how training weighs them, and that evaluation never scores them."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from classifiers import augment, evaluate
from classifiers.data import Row, load_training
from classifiers.train import Options, design, weights

FIXTURES = Path(__file__).parent / "fixtures"
FAST = Options(calibrate=False, min_df=1, epochs=20)

PROSE = (
    "The river rose for three days after the storm.\nFarmers moved their animals to the hills.\n"
    "The old bridge held, though the water reached its rails.\nBy Sunday the fields were a lake.\n"
    "Children sailed paper boats from the church steps.\nNobody in the village had seen it so high.\n"
    "The baker kept his oven lit and fed whoever knocked.\nWhen the water fell, the mud smelled of the sea."
)
DATA = '{"name": "GetUserToken", "input": {"username": "str"}}\n' * 6


def _row(source: str, label: str, prompt: str, language: str = "en", i: int = 0) -> Row:
    return Row(
        id=f"{source}-{i}",
        source=source,
        license="MIT",
        category="c",
        label=label,
        body={"prompt": prompt},
        language=language,
    )


@pytest.fixture(scope="module")
def material() -> list[Row]:
    rows = [_row("news/prose", "structured", PROSE, i=i) for i in range(10)]
    rows += [_row("api/data", "structured", DATA, i=i) for i in range(10)]
    rows += [
        _row("es/prose", "open-ended", PROSE.replace("river", "río"), language="es", i=i) for i in range(25)
    ]
    return rows


def test_generated_rows_wrap_real_material_in_an_instruction_of_either_class(material: list[Row]) -> None:
    rows = augment.generate(material, per_class=200)
    assert rows and all(augment.is_generated(r) for r in rows)
    assert {r.label for r in rows} == {"structured", "open-ended"}
    assert {r.origin for r in rows} <= {"news/prose", "api/data", "es/prose"}
    for r in rows:
        prompt = r.body["prompt"]
        # some line of the material is in the prompt, and so is text the material does not hold
        assert any(line[:30] in prompt for line in (PROSE + "\n" + DATA).replace("river", "río").splitlines())
    # the instruction, not the material, separates the classes: open-ended rows wrap prose only, so code
    # and data keep their (real) meaning
    assert all(r.origin != "api/data" for r in rows if r.label == "open-ended")
    assert any(r.origin == "api/data" for r in rows if r.label == "structured")
    # a language with enough rows of its own lends its material to its instructions
    assert all(r.origin == "es/prose" for r in rows if r.language == "es")
    assert len({r.id for r in rows}) == len(rows)


def test_generation_is_deterministic_and_needs_english_material(material: list[Row]) -> None:
    assert augment.generate(material, 50) == augment.generate(material, 50)
    assert augment.generate(material, 50, seed=1) != augment.generate(material, 50)
    assert augment.generate([r for r in material if r.language != "en"], 50) == []
    # one class alone: the same rows as in the set of both
    both = augment.generate(material, 50)
    assert augment.generate(material, 50, labels=["structured"]) == [
        r for r in both if r.label == "structured"
    ]


def test_generated_rows_weigh_a_fixed_share_outside_the_real_rows_balance(material: list[Row]) -> None:
    real = load_training(FIXTURES)
    generated = augment.generate(material, per_class=30)
    rows = [*real, *generated]
    is_gen = np.asarray([augment.is_generated(r) for r in rows])
    y = np.asarray([r.y for r in rows])
    opts = Options(generated_share=0.1)
    w = weights(rows, opts)
    # the real rows weigh among themselves exactly as they do alone
    alone = weights(real, opts)
    assert w[~is_gen] / w[~is_gen].sum() == pytest.approx(alone / alone.sum())
    # the generated rows weigh the set share of the real rows' total, half for each class
    for c in (0, 1):
        assert w[is_gen & (y == c)].sum() == pytest.approx(0.05 * w[~is_gen].sum())
    assert weights(rows, replace(opts, generated_share=0.0))[is_gen].sum() == 0.0


def test_generated_rows_are_not_a_source_when_the_vocabulary_is_chosen(material: list[Row]) -> None:
    # a gram in min_sources - 1 real sources stays out even when generated rows hold it too
    real = [_row(f"s{k}", "structured" if k % 2 else "open-ended", f"zebra {k} text", i=k) for k in range(4)]
    generated = [
        replace(_row(augment.SOURCE, "structured", "zebra copy these lines", i=i), origin="s0")
        for i in range(5)
    ]
    opts = replace(FAST, min_sources=5)
    from classifiers.train import _vocabulary

    d = design([*real, *generated], opts)
    train = np.arange(len(d.sources))
    kept = {n for n, k in zip(d.names, _vocabulary(d, train, opts), strict=True) if k}
    assert not any("zebra" in n for n in kept)
    d4 = design([*real, *generated], replace(opts, min_sources=4))
    kept4 = {
        n for n, k in zip(d4.names, _vocabulary(d4, train, replace(opts, min_sources=4)), strict=True) if k
    }
    assert any("zebra" in n for n in kept4)


def test_loso_never_scores_generated_rows_and_drops_those_cut_from_the_held_out_source(
    material: list[Row], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = load_training(FIXTURES)
    sources = sorted({r.source for r in real})
    # generated rows whose material came from each real source
    generated = [
        replace(r, origin=sources[i % len(sources)]) for i, r in enumerate(augment.generate(material, 40))
    ]
    trained_on: dict[str, set[str]] = {}
    fit = evaluate.fit_design

    def recording(d, train_idx, opts=None):  # type: ignore[no-untyped-def]
        held = {r.source for r in d.rows if not augment.is_generated(r)} - {
            d.rows[i].source for i in train_idx
        }
        trained_on[held.pop()] = {d.rows[i].origin for i in train_idx if augment.is_generated(d.rows[i])}
        return fit(d, train_idx, opts)

    monkeypatch.setattr(evaluate, "fit_design", recording)
    res = evaluate.leave_one_source_out(real, FAST, log=lambda _: None, generated=generated)
    assert sorted(r.id for r in res.rows) == sorted(r.id for r in real)  # every real row once, nothing else
    assert set(trained_on) == set(sources)
    for held, origins in trained_on.items():
        assert held not in origins and origins  # the others' generated rows are there, its own are not


def test_the_evaluation_command_puts_generated_rows_on_the_training_side_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    corpus = (FIXTURES / "prompts-train.jsonl").read_text(encoding="utf-8")
    long = [
        {
            "id": f"long-{i}",
            "source": "acme/long",
            "license": "MIT",
            "commercial": True,
            "category": "c",
            "label": "structured" if i % 2 else "open-ended",
            "prompt": PROSE + f"\nLine {i}.",
        }
        for i in range(6)
    ]
    (tmp_path / "prompts-train.jsonl").write_text(
        corpus + "".join(json.dumps(d) + "\n" for d in long), encoding="utf-8"
    )
    evaluate.main(
        ["--data", str(tmp_path), "--augment", "20", "--set", "calibrate=false", "--set", "min_df=1"]
    )
    out = capsys.readouterr().out
    assert "generated rows on the training side" in out
    assert augment.SOURCE not in out  # never a held-out source, in no table
    assert "acme/long" in out
