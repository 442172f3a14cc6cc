"""The example gateway configurations load, and the documented one covers every option."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from gateway.config import DiscoveryConfig, EndpointConfig, PoolConfig, Settings, load_settings

CONFIGS = Path(__file__).resolve().parents[2] / "deploy" / "config"


@pytest.mark.parametrize("name", ["example.yaml", "demo.yaml"])
def test_loads(name: str) -> None:
    settings = load_settings(CONFIGS / name)
    assert settings.served_models()


def test_example_documents_every_option() -> None:
    """Each section lists all of its fields; pool options appear at least in a comment."""
    text = (CONFIGS / "example.yaml").read_text()
    raw = yaml.safe_load(text)
    assert set(raw) == set(Settings.model_fields)
    for section, field in Settings.model_fields.items():
        model = field.annotation
        if section != "pools" and isinstance(model, type) and issubclass(model, BaseModel):
            assert set(raw[section]) == set(model.model_fields), section
    for model in (PoolConfig, EndpointConfig, DiscoveryConfig):
        missing = [name for name in model.model_fields if f"{name}:" not in text]
        assert not missing, f"{model.__name__} options not documented: {missing}"


def test_demo_points_at_two_local_emulators() -> None:
    settings = load_settings(CONFIGS / "demo.yaml")
    urls = {pool: [e.base_url for e in cfg.endpoints] for pool, cfg in settings.pools.items()}
    assert urls == {"speculative": ["http://127.0.0.1:8101"], "baseline": ["http://127.0.0.1:8102"]}
    assert settings.served_models() == ["demo-model"]
