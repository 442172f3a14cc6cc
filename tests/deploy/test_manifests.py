"""Every kustomization builds, and every rendered object validates offline against a schema.

Kubernetes kinds validate with ``kubernetes-validate`` (strict: unknown fields fail). Custom
resources it cannot know validate against a schema in ``schemas/``; any other unknown kind fails.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
from kubernetes_validate.utils import SchemaNotFoundError

from tests.deploy.k8s import BUILDS, K8S, Doc, find, one, render, selects

# 1.34 is the first release with the DRA API (resource.k8s.io/v1) generally available.
K8S_VERSION = "1.34.0"
SCHEMAS = Path(__file__).parent / "schemas"
CUSTOM_SCHEMAS = {
    ("monitoring.coreos.com/v1", kind): SCHEMAS / f"{kind.lower()}.schema.json"
    for kind in ("ServiceMonitor", "PodMonitor", "PrometheusRule")
}


def validate(doc: Doc) -> None:
    """Raise if ``doc`` does not match its schema; never pass an object without one."""
    key = (doc["apiVersion"], doc["kind"])
    if key in CUSTOM_SCHEMAS:
        jsonschema.validate(doc, json.loads(CUSTOM_SCHEMAS[key].read_text()))
        return
    try:
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
    except SchemaNotFoundError:
        pytest.fail(f"no schema for {doc['apiVersion']} {doc['kind']}: add one to {SCHEMAS}")


@pytest.fixture(scope="module")
def base_with_servicemonitor(tmp_path_factory: pytest.TempPathFactory) -> list[Doc]:
    root = tmp_path_factory.mktemp("kustomize")
    # kustomize refuses absolute paths to bases and components; relative ones may leave the root.
    base, component = (os.path.relpath(K8S / p, root) for p in ("base", "components/servicemonitor"))
    (root / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n  - {base}\ncomponents:\n  - {component}\n"
    )
    return render(root)


def test_validation_version_is_bundled() -> None:
    versions = kubernetes_validate.utils.all_versions()
    assert any(v.startswith(K8S_VERSION.rsplit(".", 1)[0]) for v in versions), versions


@pytest.mark.parametrize("build", BUILDS)
def test_build_validates(build: str) -> None:
    docs = render(build)
    assert docs, f"{build} rendered nothing"
    for doc in docs:
        validate(doc)


def test_base_with_servicemonitor_validates(base_with_servicemonitor: list[Doc]) -> None:
    for doc in base_with_servicemonitor:
        validate(doc)
    monitor = one(base_with_servicemonitor, "ServiceMonitor", "specroute")
    service = one(base_with_servicemonitor, "Service", "specroute")
    assert selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    port_names = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["spec"]["endpoints"]:
        assert endpoint["port"] in port_names
        assert endpoint["path"] == "/metrics"
        # the gateway's own `endpoint` label must win over the Operator's target label of that name
        assert endpoint.get("honorLabels") is True


def test_validation_rejects_broken_objects(base_with_servicemonitor: list[Doc]) -> None:
    """The validators are live: an unknown field or a wrong type is caught."""
    deployment = copy.deepcopy(one(base_with_servicemonitor, "Deployment", "specroute"))
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(deployment)
    monitor = copy.deepcopy(one(base_with_servicemonitor, "ServiceMonitor", "specroute"))
    monitor["spec"]["endpoints"][0]["interval"] = "15 seconds"
    with pytest.raises(jsonschema.ValidationError):
        validate(monitor)
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}}
    with pytest.raises(pytest.fail.Exception):
        validate(unknown)


@pytest.mark.parametrize("build", BUILDS)
def test_selectors_match_their_pods(build: str) -> None:
    docs = render(build)
    pod_labels = [
        w["spec"]["template"]["metadata"]["labels"] for w in find(docs, "Deployment") + find(docs, "Job")
    ]
    for service in find(docs, "Service"):
        assert any(selects(service["spec"]["selector"], labels) for labels in pod_labels), service
    for deployment in find(docs, "Deployment"):
        assert selects(
            deployment["spec"]["selector"]["matchLabels"],
            deployment["spec"]["template"]["metadata"]["labels"],
        )
    for pdb in find(docs, "PodDisruptionBudget"):
        assert any(selects(pdb["spec"]["selector"]["matchLabels"], labels) for labels in pod_labels)
    for hpa in find(docs, "HorizontalPodAutoscaler"):
        ref = hpa["spec"]["scaleTargetRef"]
        assert find(docs, ref["kind"], ref["name"]), f"HPA target {ref} missing"
