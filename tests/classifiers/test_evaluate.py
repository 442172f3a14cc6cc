"""Option overrides for measuring a variant with ``python -m classifiers.evaluate --set NAME=VALUE``."""

import pytest

from classifiers.evaluate import main, options
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
