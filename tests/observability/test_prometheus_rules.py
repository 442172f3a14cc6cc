"""``promtool`` on the Prometheus files: rules parse, alerts fire on synthetic series, configs load."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from tests.observability.tooling import PROMETHEUS_DIR, binary, rule_files

UNIT_TESTS = sorted((PROMETHEUS_DIR / "tests").glob("*_test.yml"))


def _promtool(*args: str, cwd: Path = PROMETHEUS_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([binary("promtool"), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def _alert_names() -> set[str]:
    names: set[str] = set()
    for path in rule_files():
        for group in yaml.safe_load(path.read_text())["groups"]:
            names |= {r["alert"] for r in group["rules"] if "alert" in r}
    return names


def test_rule_files_exist() -> None:
    names = {p.name for p in rule_files()}
    assert {"specroute-recording-rules.yml", "specroute-alert-rules.yml"} <= names


@pytest.mark.parametrize("path", rule_files(), ids=lambda p: p.name)
def test_promtool_check_rules(path: Path) -> None:
    done = _promtool("check", "rules", str(path))
    assert done.returncode == 0, done.stdout + done.stderr


def test_alert_unit_tests_pass() -> None:
    assert UNIT_TESTS, "no promtool unit tests under deploy/prometheus/tests"
    done = _promtool("test", "rules", *[str(p) for p in UNIT_TESTS])
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_alert_has_a_firing_unit_test() -> None:
    """Each alert appears in some test case expecting it to fire (non-empty ``exp_alerts``)."""
    fired: set[str] = set()
    for path in UNIT_TESTS:
        for case in yaml.safe_load(path.read_text())["tests"]:
            fired |= {t["alertname"] for t in case.get("alert_rule_test", []) if t.get("exp_alerts")}
    assert _alert_names() - fired == set()


def test_unit_tests_catch_a_wrong_threshold(tmp_path: Path) -> None:
    """The unit tests are sharp: the error-rate alert with a 50 % threshold no longer fires where expected."""
    rule = "specroute:requests_5xx:ratio_rate5m > "
    for path in rule_files():
        (tmp_path / path.name).write_text(path.read_text().replace(rule + "0.05", rule + "0.5"))
    (tmp_path / "tests").mkdir()
    for path in UNIT_TESTS:
        (tmp_path / "tests" / path.name).write_text(path.read_text())
    done = _promtool("test", "rules", *[f"tests/{p.name}" for p in UNIT_TESTS], cwd=tmp_path)
    assert done.returncode != 0
    assert "SpecRouteHighErrorRate" in done.stdout + done.stderr


def test_static_config_is_valid() -> None:
    done = _promtool("check", "config", "prometheus-static.yml")
    assert done.returncode == 0, done.stdout + done.stderr


def test_kubernetes_config_is_valid(tmp_path: Path) -> None:
    """prometheus.yml with Pod discovery swapped for file discovery (Debian's build lacks Kubernetes SD).

    Everything else — relabelling, rule files, globals — is checked as shipped.
    """
    config = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    for job in config["scrape_configs"]:
        assert job.pop("kubernetes_sd_configs") == [{"role": "pod"}]
        job["file_sd_configs"] = [{"files": [f"{job['job_name']}.json"]}]
    config["rule_files"] = [str(PROMETHEUS_DIR / f) for f in config["rule_files"]]
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
    done = _promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert {j["job_name"] for j in config["scrape_configs"]} == {"specroute", "vllm"}
