"""A command whose extra is not installed refuses in one line naming the ``pip install`` that fixes it."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateway import extras

PYPROJECT = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())


def test_every_checked_extra_is_declared_in_pyproject() -> None:
    declared = PYPROJECT["project"]["optional-dependencies"]
    for extra in extras.EXTRAS:
        assert extra in declared
        names = {d.split(">")[0].split("=")[0].split("[")[0].strip().lower() for d in declared[extra]}
        # the import names checked here come from the distributions the extra installs
        assert len(names) == len(extras.EXTRAS[extra])


def test_a_missing_module_names_the_extra_and_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "find_spec", lambda name: None if name == "matplotlib" else object())
    assert extras.missing("bench") == ["matplotlib"]
    with pytest.raises(extras.MissingExtra) as err:
        extras.require("bench", "specroute bench")
    assert str(err.value) == (
        "`specroute bench` needs the bench extra: pip install 'specroute[bench]'"
        " (from a clone of its repository: pip install '.[bench]'; missing: matplotlib)"
    )


def test_an_installed_extra_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(extras, "find_spec", lambda name: object())
    extras.require("train", "specroute train")
