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
