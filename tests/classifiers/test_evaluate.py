"""Option overrides for measuring a variant (``python -m classifiers.evaluate --set NAME=VALUE``) and the
hand-written probes."""

from collections.abc import Mapping
from typing import Any

import pytest

from classifiers.evaluate import Probe, load_probes, main, options, probe_report
from classifiers.model import Prediction
from classifiers.request import view
from classifiers.train import Options


def test_no_overrides_give_the_shipped_options() -> None:
    assert options([]) == Options()


def test_overrides_take_the_type_of_the_default() -> None:
    opts = options(["source_power=1", "alpha=2e-4", "isotonic=false", "min_sources=3", "exclude=d:len,d:x"])
    assert opts.source_power == 1.0 and isinstance(opts.source_power, float)
    assert opts.alpha == 2e-4
    assert opts.isotonic is False
    assert opts.min_sources == 3 and isinstance(opts.min_sources, int)
    assert opts.exclude == ("d:len", "d:x")
    assert opts.epochs == Options().epochs  # untouched options keep their defaults


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("source_power", "NAME=VALUE"),
        ("nonsense=1", "NAME=VALUE"),
        ("min_sources=two", "expected a int"),
        ("isotonic=maybe", "true or false"),
    ],
)
def test_bad_overrides_say_what_is_expected(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        options([item])


def test_the_command_line_rejects_a_bad_override_before_reading_the_corpus(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--set", "nonsense=1", "--data", "/nonexistent"])
    assert exc.value.code == 2
    assert "nonsense" in capsys.readouterr().err


def test_the_probes_are_well_formed() -> None:
    probes = load_probes()
    assert len(probes) >= 300
    assert len({p.id for p in probes}) == len(probes)
    assert {p.label for p in probes} == {"structured", "open-ended", "ambiguous"}
    for p in probes:
        v = view(p.body)
        assert v.text.strip(), p.id
        assert len(p.language) == 2, p.id
        if "messages" in p.body:
            assert v.turns >= 2, p.id
    # each language other than English holds both labels, so its script cannot stand in for one
    by_language: dict[str, set[str]] = {}
    for p in probes:
        by_language.setdefault(p.language, set()).add(p.label)
    assert all({"structured", "open-ended"} <= labels for labels in by_language.values())
    lengths = [p.length for p in probes]
    assert min(lengths) < 300 and max(lengths) > 1500


class _ByWord:
    """Calls a request structured when its text holds "copy": one probe per group is then wrong."""

    def predict(self, body: Mapping[str, Any]) -> Prediction:
        structured = "copy" in view(body).text
        return Prediction(0.9 if structured else 0.2, "structured" if structured else "open-ended", "qa")


def test_the_probe_report_counts_right_and_wrong_per_group() -> None:
    def probe(i: int, label: str, text: str, language: str = "en") -> Probe:
        return Probe(f"p{i}", label, "copy" if "copy" in text else "other", language, {"prompt": text})

    probes = [
        probe(1, "structured", "copy these lines"),
        probe(2, "structured", "sort these lines", "de"),
        probe(3, "open-ended", "a poem"),
        probe(4, "open-ended", "copy a mood into a poem " + "x" * 400),
        probe(5, "ambiguous", "2 + 2?"),
    ]
    text = probe_report(_ByWord(), probes)  # type: ignore[arg-type]
    assert text.startswith("4 probes with a binary label: balanced accuracy 0.500")
    assert "1 ambiguous, mean p_structured 0.200" in text
    assert "copy 1/2, other 1/2" in text
    assert "300-1500 0/1, < 300 2/3" in text
    assert "English 2/3, other languages 0/1" in text
