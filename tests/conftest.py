"""Shared fixtures: paths to the real vLLM captures."""

from __future__ import annotations

from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "vllm"


@pytest.fixture
def vllm_fixture():
    def read(name: str) -> bytes:
        return (FIXTURES / name).read_bytes()

    return read


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Everything under ``tests/integration`` starts real processes: marked ``integration``.

    They stay in the default run where fast (``-m "not integration"`` leaves the in-process tiers).
    """
    integration = Path(__file__).parent / "integration"
    for item in items:
        if integration in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
