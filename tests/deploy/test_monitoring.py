"""The monitoring component: Operator objects and the dashboard ConfigMap, in step with their sources.

The PrometheusRule and the dashboard ConfigMap are copies of ``deploy/prometheus`` and
``deploy/grafana`` (kustomize cannot read files outside the component); these tests fail while a copy
differs, and check that the monitors find what they are meant to scrape in every overlay.
"""

from __future__ import annotations

import asyncio
import copy
import importlib.util
import json
import os
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import jsonschema
import pytest
import yaml

from gateway.config import load_settings
from gateway.upstream import discovery
from gateway.upstream.pool import Pool
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


_LABEL_RULES = ("pool", "endpoint", "__tmp_endpoint_hash")


def _plain_vllm_job() -> dict[str, Any]:
    plain = yaml.safe_load((PROMETHEUS_DIR / "prometheus.yml").read_text())
    (job,) = [j for j in plain["scrape_configs"] if j["job_name"] == "vllm"]
    return dict(job)


def _pod_monitor_relabel_configs() -> list[dict[str, Any]]:
    """The PodMonitor's relabelings in a scrape config's spelling."""
    (endpoint,) = _component_doc("podmonitor-vllm.yaml")["spec"]["podMetricsEndpoints"]
    spelling = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{spelling.get(k, k): v for k, v in r.items()} for r in endpoint["relabelings"]]


def test_pod_monitor_labels_like_the_plain_scrape_config() -> None:
    """``pool`` and ``endpoint`` are made by the same rules as in prometheus.yml's vllm job."""
    wanted = [r for r in _plain_vllm_job()["relabel_configs"] if r.get("target_label") in _LABEL_RULES]
    got = [r for r in _pod_monitor_relabel_configs() if r.get("target_label") in _LABEL_RULES]
    assert got == wanted


#: Pods as Kubernetes Pod discovery presents them: ``__address__`` is ``<pod ip>:<container port>``
PODS = [
    ("speculative", "10.1.2.3", 8000),
    ("speculative", "10.1.2.4", 8000),
    ("baseline", "10.1.9.7", 8000),
    ("baseline", "fd00::5", 8000),
]


def _relabelled_endpoints(
    tmp_path: Path, relabel_configs: list[dict[str, Any]]
) -> dict[tuple[str, str], str]:
    """``(pool, __address__) -> endpoint`` after ``relabel_configs``, as ``promtool`` applies them."""
    groups = [
        {
            "targets": [discovery.address_label(address, port)],
            "labels": {
                "__meta_kubernetes_pod_label_specroute_io_pool": pool,
                "__meta_kubernetes_pod_container_port_name": "http",
                "__meta_kubernetes_namespace": "specroute",
                "__meta_kubernetes_pod_name": f"vllm-{pool}-{i}",
            },
        }
        for i, (pool, address, port) in enumerate(PODS)
    ]
    (tmp_path / "pods.json").write_text(json.dumps(groups))
    job = {
        "job_name": "vllm",
        "file_sd_configs": [{"files": ["pods.json"]}],
        "relabel_configs": relabel_configs,
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({"scrape_configs": [job]}))
    done = subprocess.run(
        [binary("promtool"), "check", "service-discovery", "--timeout=1s", "prometheus.yml", "vllm"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    targets = json.loads(done.stdout)
    assert len(targets) == len(PODS), done.stdout
    return {(t["labels"]["pool"], t["labels"]["__address__"]): t["labels"]["endpoint"] for t in targets}


def _gateway_names() -> dict[tuple[str, str], str]:
    """``(pool, address:port) -> name`` the gateway gives the same Pods found through DNS."""
    pools = {}
    for name in ("speculative", "baseline"):
        pools[name] = {"discovery": {"hostname": f"vllm-{name}", "port": 8000}, "models": ["m"]}
    settings = load_settings(overrides={"pools": pools})

    async def dns(hostname: str, port: int) -> list[tuple[str, int]]:
        return [(a, p) for pool, a, p in PODS if hostname == f"vllm-{pool}"]

    async def refresh() -> dict[tuple[str, str], str]:
        ok = httpx.MockTransport(lambda request: httpx.Response(200))
        found = {name: Pool(name, ["m"]) for name in ("speculative", "baseline")}
        async with httpx.AsyncClient(transport=ok) as client:
            await discovery.refresh(client, found, settings, dns)
        return {
            (p.name, e.base_url.removeprefix("http://")): e.name for p in found.values() for e in p.endpoints
        }

    return asyncio.run(refresh())


@pytest.mark.parametrize("source", ["prometheus.yml", "podmonitor-vllm.yaml"])
def test_a_discovered_vllm_target_is_labelled_with_the_gateways_name_for_it(
    tmp_path: Path, source: str
) -> None:
    """The vLLM series of a Pod and the gateway's series of the endpoint it found at that Pod share
    ``endpoint``: what the dashboard's gateway-against-vLLM panels and the per-endpoint alerts join on."""
    rules = (
        _plain_vllm_job()["relabel_configs"] if source == "prometheus.yml" else _pod_monitor_relabel_configs()
    )
    labelled = _relabelled_endpoints(tmp_path, rules)
    named = _gateway_names()
    assert labelled == named
    assert len(set(named.values())) == len(PODS)


def test_rule_schema_is_live() -> None:
    rule = copy.deepcopy(_component_doc("prometheusrule.yaml"))
    rule["spec"]["groups"][0]["rules"][0]["fore"] = "5m"
    with pytest.raises(jsonschema.ValidationError):
        validate(rule)
