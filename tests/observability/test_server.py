"""The multiprocess metrics directory the server sets up for its workers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gateway.observability import MULTIPROC_ENV
from gateway.server import shared_metrics_dir


def test_fresh_directory_set_then_removed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    with shared_metrics_dir() as first:
        assert os.environ[MULTIPROC_ENV] == str(first) and first.is_dir()
        (first / "counter_1.db").write_bytes(b"x")
    assert not first.exists() and MULTIPROC_ENV not in os.environ
    with shared_metrics_dir() as second:
        assert second != first and list(second.iterdir()) == []
    assert not second.exists()


def test_inside_an_operator_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    with shared_metrics_dir() as path:
        assert path.parent == tmp_path
    assert os.environ[MULTIPROC_ENV] == str(tmp_path) and tmp_path.exists() and not path.exists()
