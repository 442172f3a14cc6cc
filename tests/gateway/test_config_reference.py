"""docs/configuration.md is what the settings model says: every key, its default and its variable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.config import Settings
from gateway.config_reference import markdown, rows, type_name

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_the_reference_in_docs_is_up_to_date() -> None:
    assert DOC.read_text() == markdown(), "regenerate it: make docs (specroute config docs --out ...)"


def test_every_leaf_key_of_the_model_is_listed_with_its_default() -> None:
    keys = {r.key: r for r in rows()}
    defaults = Settings.model_fields["server"].default
    assert keys["server.port"].default == f"`{defaults.port}`"
    assert keys["server.port"].env == "`SPECROUTE_SERVER__PORT`"
    assert (
        keys["routing.strategy"].type
        == "one of `adaptive`, `classifier`, `always-speculative`, `always-baseline`"
    )
    assert keys["pools.speculative.models"].default == "required"
    assert keys["pools.speculative.endpoints[].url"].type == "URL"
    assert keys["auth.api_keys"].env == "`SPECROUTE_AUTH__API_KEYS` (JSON)"
    assert "pools.baseline" in keys and "pools.baseline.models" not in keys  # same section, listed once
    for section, info in Settings.model_fields.items():
        if section == "pools":
            continue
        for name in info.annotation.model_fields:  # type: ignore[union-attr]
            assert f"{section}.{name}" in keys


def test_types_read_as_yaml_words() -> None:
    assert type_name(int | None) == "integer or null"
    assert type_name(list[str]) == "list of string"


def test_the_command_prints_the_same_text() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "config", "docs"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == markdown()
