"""Acceptance profiles: a draft model whose strengths differ from the emulator's default rules."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from gateway.emulator.acceptance import SKEWED_DRAFT, base_profile, load_profile, profile
from gateway.stack import start_emulator

from .conftest import MODEL

CODE = "Write a Python function that returns the factorial of n."
COUNT = "Count from 1 to 200 separated by commas."
PROSE = "What makes a good friend?"
RUSSIAN = "\u0438\u0441\u0442\u043e\u0440\u0438\u044f " * 4  # a word in Cyrillic script


def test_builtin_code_draft_differs_from_the_rules_where_it_says():
    assert base_profile(CODE, SKEWED_DRAFT).alpha == 0.9 > profile(CODE).alpha
    assert base_profile(COUNT, SKEWED_DRAFT).alpha == 0.15 < profile(COUNT).alpha
    assert base_profile("Write a poem about the sea.", SKEWED_DRAFT).alpha == 0.65
    assert base_profile(PROSE, SKEWED_DRAFT).alpha == 0.3
    # the category, and so the generated text, stays that of the rules
    assert base_profile(COUNT, SKEWED_DRAFT).category == profile(COUNT).category == "numeric"
    assert base_profile(PROSE, None) == profile(PROSE)  # no profile: the rules
    assert load_profile("rules") is None and load_profile("skewed-draft") is SKEWED_DRAFT


def test_yaml_profile_first_matching_rule_wins(tmp_path: Path):
    f = tmp_path / "draft.yaml"
    f.write_text(
        "default: 0.4\n"
        "rules:\n"
        '  - {name: cyrillic, pattern: "[\\u0400-\\u04ff]", alpha: 0.05}\n'
        "  - {name: code, category: code, alpha: 0.95}\n"
        "  - {name: also-code, category: code, alpha: 0.1}\n"
    )
    prof = load_profile(str(f))
    assert prof is not None
    assert base_profile(RUSSIAN, prof).alpha == 0.05
    assert base_profile(CODE, prof).alpha == 0.95
    assert base_profile(PROSE, prof).alpha == 0.4


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("rules: [{name: x, alpha: 0.5}]", "give a category or a pattern"),
        ("rules: [{name: x, alpha: 1.5, category: code}]", "alpha must be a number in [0, 1]"),
        ("rules: [{name: x, alpha: 0.5, category: poetry}]", "unknown category 'poetry'"),
        ("rules: [{name: x, alpha: 0.5, pattern: '('}]", "bad pattern"),
        ("defaults: 0.3", "unknown keys"),
        ("- 1\n- 2", "a mapping"),
    ],
)
def test_bad_profiles_are_refused_with_the_reason(tmp_path: Path, text: str, message: str):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(")):
        load_profile(str(f))
    with pytest.raises(ValueError, match="neither a built-in"):
        load_profile(str(tmp_path / "missing.yaml"))


def test_cli_refuses_a_bad_profile_before_serving(tmp_path: Path):
    r = subprocess.run(
        [sys.executable, "-m", "gateway", "emulate", "--acceptance-profile", str(tmp_path / "nope.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--acceptance-profile" in r.stderr


def test_emulator_serves_the_profiles_acceptance(tmp_path: Path):
    """A served request's measured acceptance follows the profile; the per-request override still wins."""
    proc = start_emulator(
        "speculative",
        extra=["--time-scale", "0", "--acceptance-profile", "skewed-draft",
               "--per-request-spec-decode-metrics", "summary", "--served-model-name", MODEL],
        log_dir=tmp_path,
    )  # fmt: skip
    try:

        def rate(prompt: str, **extra: object) -> float:
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 300, "temperature": 0, **extra}
            r = httpx.post(proc.url + "/v1/completions", json=body, timeout=30)
            assert r.status_code == 200, r.text
            return float(r.json()["metrics"]["speculative_decoding"]["draft_acceptance_rate"])

        assert rate(COUNT) < 0.15  # the rules would give ≈ 0.55 (alpha 0.8)
        assert rate(CODE) > 0.6
        assert rate(COUNT, vllm_xargs={"emulated_acceptance": 0.95}) > 0.7
        state = httpx.get(proc.url + "/emulator/state", timeout=10).json()
        assert state["settings"]["acceptance_profile"] == "skewed-draft"
    finally:
        proc.stop()
