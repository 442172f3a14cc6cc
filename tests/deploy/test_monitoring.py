"""The monitoring component: Operator objects and the dashboard ConfigMap, in step with their sources.

The PrometheusRule and the dashboard ConfigMap are copies of ``deploy/prometheus`` and
``deploy/grafana`` (kustomize cannot read files outside the component); these tests fail while a copy
differs, and check that the monitors find what they are meant to scrape in every overlay.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import ModuleType

import jsonschema
import pytest
import yaml

from tests.deploy.k8s import K8S, OVERLAYS, Doc, find, one, pod_spec, render
from tests.deploy.test_manifests import validate
from tests.observability.tooling import DASHBOARD, PROMETHEUS_DIR, binary, rule_files

COMPONENT = K8S / "components" / "monitoring"


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("monitoring_generate", COMPONENT / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _with_monitoring(root: Path, target: str) -> list[Doc]:
    """``target`` (relative to deploy/k8s) built with the monitoring component."""
    base, component = (os.path.relpath(K8S / p, root) for p in (target, "components/monitoring"))
    (root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {component}\n"
    )
    return render(root)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[Doc]]:
    """base and every overlay, each with the monitoring component."""
    return {
        target: _with_monitoring(tmp_path_factory.mktemp(target.replace("/", "-")), target)
        for target in ("base", *(f"overlays/{o}" for o in OVERLAYS))
    }


def _component_doc(name: str) -> Doc:
    doc: Doc = yaml.safe_load((COMPONENT / name).read_text())
    return doc


def test_generated_files_are_up_to_date() -> None:
    assert _generator().main(["--check"]) == 0, "run deploy/k8s/components/monitoring/generate.py"


def test_generator_notices_a_stale_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gen = _generator()
    stale = tmp_path / "prometheusrule.yaml"
    stale.write_text(gen.prometheus_rule().replace("severity: warning", "severity: info", 1))
    monkeypatch.setattr(gen, "RULE_OBJECT", stale)
    monkeypatch.setattr(gen, "DASHBOARD_OBJECT", tmp_path / "dashboard.yaml")
    assert gen.main(["--check"]) == 1
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
    assert stale.read_text() == (COMPONENT / "prometheusrule.yaml").read_text()


def test_rule_groups_equal_the_rule_files() -> None:
    rule = _component_doc("prometheusrule.yaml")
    groups = [g for path in rule_files() for g in yaml.safe_load(path.read_text())["groups"]]
    assert sorted(rule["spec"]["groups"], key=lambda g: g["name"]) == sorted(groups, key=lambda g: g["name"])
    assert {p.name for p in rule_files()} == set(_generator().RULE_FILES)


def test_promtool_accepts_the_rule_object(tmp_path: Path) -> None:
    path = tmp_path / "groups.yml"
    path.write_text(yaml.safe_dump({"groups": _component_doc("prometheusrule.yaml")["spec"]["groups"]}))
    done = subprocess.run([binary("promtool"), "check", "rules", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_dashboard_config_map_holds_the_dashboard() -> None:
    cm = _component_doc("dashboard.yaml")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    assert text == DASHBOARD.read_text()
    assert json.loads(text)["uid"] == json.loads(DASHBOARD.read_text())["uid"]


@pytest.mark.parametrize("target", ["base", *(f"overlays/{o}" for o in OVERLAYS)])
def test_builds_with_the_new_objects(built: dict[str, list[Doc]], target: str) -> None:
    docs = built[target]
    for doc in docs:
        validate(doc)
    for kind, name in (
        ("ServiceMonitor", "specroute"),
        ("PodMonitor", "specroute-vllm"),
        ("PrometheusRule", "specroute"),
        ("ConfigMap", "specroute-dashboard"),
    ):
        one(docs, kind, name)
    dashboard = one(docs, "ConfigMap", "specroute-dashboard")
    assert json.loads(dashboard["data"]["specroute.json"]) == json.loads(DASHBOARD.read_text())
    rule = one(docs, "PrometheusRule", "specroute")
    assert rule["spec"] == _component_doc("prometheusrule.yaml")["spec"]


def _matches(selector: Doc, labels: dict[str, str]) -> bool:
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        assert e["operator"] == "In", e
        ok = ok and labels.get(e["key"]) in e["values"]
    return ok


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pod_monitor_scrapes_both_pools(built: dict[str, list[Doc]], overlay: str) -> None:
    """Each pool's pods are selected, on a container port of the monitor's name, with job=vllm."""
    docs = built[f"overlays/{overlay}"]
    monitor = one(docs, "PodMonitor", "specroute-vllm")
    pools: set[str] = set()
    for workload in find(docs, "Deployment"):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        if not _matches(monitor["spec"]["selector"], labels):
            assert "specroute.io/pool" not in labels, workload["metadata"]["name"]
            continue
        pools.add(labels["specroute.io/pool"])
        ports = {p.get("name") for c in pod_spec(workload)["containers"] for p in c.get("ports", [])}
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports, workload["metadata"]["name"]
    assert pools == {"speculative", "baseline"}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    jobs = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert [r["replacement"] for r in jobs] == ["vllm"]  # the target-down alert matches job="vllm"
    assert {r.get("targetLabel") for r in endpoint["relabelings"]} >= {"pool", "endpoint"}


def test_pod_monitor_labels_like_the_plain_scrape_config() -> None:
    """``pool`` and ``endpoint`` come from the same sources as in prometheus.yml's vllm job."""
    plain = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (job,) = [j for j in plain["scrape_configs"] if j["job_name"] == "vllm"]
    wanted = {
        r["target_label"]: (r["source_labels"], r.get("separator"))
        for r in job["relabel_configs"]
        if r.get("target_label") in ("pool", "endpoint")
    }
    (endpoint,) = _component_doc("podmonitor-vllm.yaml")["spec"]["podMetricsEndpoints"]
    got = {
        r["targetLabel"]: (r["sourceLabels"], r.get("separator"))
        for r in endpoint["relabelings"]
        if r.get("targetLabel") in ("pool", "endpoint")
    }
    assert got == wanted


def test_rule_schema_is_live() -> None:
    rule = copy.deepcopy(_component_doc("prometheusrule.yaml"))
    rule["spec"]["groups"][0]["rules"][0]["fore"] = "5m"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)
