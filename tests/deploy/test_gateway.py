"""The gateway Deployment and its configuration, in the base and in every overlay."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gateway.config import Settings, load_settings
from tests.deploy.k8s import (
    CONFIG_MOUNT,
    GATEWAY,
    OVERLAYS,
    Doc,
    container_argv,
    find,
    iter_probes,
    one,
    parse_args,
    pod_spec,
    render,
    selects,
)

GATEWAY_BUILDS = ("base", *(f"overlays/{o}" for o in OVERLAYS))


def gateway_container(docs: list[Doc]) -> Doc:
    containers = pod_spec(one(docs, "Deployment", GATEWAY))["containers"]
    assert len(containers) == 1
    container: Doc = containers[0]
    return container


def mounted_settings(docs: list[Doc], tmp_path: Path) -> Settings:
    """The configuration the gateway Pods read: the ConfigMap volume mounted at CONFIG_MOUNT."""
    spec = pod_spec(one(docs, "Deployment", GATEWAY))
    mount = next(m for m in gateway_container(docs)["volumeMounts"] if m["mountPath"] == CONFIG_MOUNT)
    volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
    config_map = one(docs, "ConfigMap", volume["configMap"]["name"])
    path = tmp_path / "config.yaml"
    path.write_text(config_map["data"]["config.yaml"])
    return load_settings(path)


def prestop_sleep_s(container: Doc) -> int:
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep", command
    return int(command[1])


@pytest.mark.parametrize("build", GATEWAY_BUILDS)
def test_every_configmap_config_loads(build: str, tmp_path: Path) -> None:
    config_maps = [c for c in find(render(build), "ConfigMap") if "config.yaml" in c.get("data", {})]
    assert config_maps, f"{build} has no gateway ConfigMap"
    for config_map in config_maps:
        path = tmp_path / f"{config_map['metadata']['name']}.yaml"
        path.write_text(config_map["data"]["config.yaml"])
        settings = load_settings(path)
        assert settings.server.host == "0.0.0.0", "in a Pod the gateway must listen on all interfaces"


@pytest.mark.parametrize("build", GATEWAY_BUILDS)
def test_gateway_deployment(build: str, tmp_path: Path) -> None:
    docs = render(build)
    deployment = one(docs, "Deployment", GATEWAY)
    spec = pod_spec(deployment)
    container = gateway_container(docs)
    settings = mounted_settings(docs, tmp_path)
    assert deployment["spec"]["replicas"] >= 2
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert settings.server.port in ports.values()
    probes = {kind: (p["httpGet"]["path"], ports[p["httpGet"]["port"]]) for kind, p in iter_probes(container)}
    assert probes["readinessProbe"] == ("/ready", settings.server.port)
    assert probes["livenessProbe"] == ("/health", settings.server.port)

    # SIGTERM arrives after the preStop sleep; the drain must then fit before the kill.
    grace = spec["terminationGracePeriodSeconds"]
    assert grace >= settings.server.shutdown_grace_s + prestop_sleep_s(container)

    resources = container["resources"]
    assert {"cpu", "memory"} <= resources["requests"].keys()
    assert {"cpu", "memory"} <= resources["limits"].keys()


@pytest.mark.parametrize("build", GATEWAY_BUILDS)
def test_gateway_runs_unprivileged_on_a_read_only_root(build: str) -> None:
    docs = render(build)
    spec = pod_spec(one(docs, "Deployment", GATEWAY))
    container = gateway_container(docs)
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    tmp = next(m for m in container["volumeMounts"] if m["mountPath"] == "/tmp")
    assert "emptyDir" in next(v for v in spec["volumes"] if v["name"] == tmp["name"])
    assert spec["automountServiceAccountToken"] is False


@pytest.mark.parametrize("build", GATEWAY_BUILDS)
def test_scaling_objects_keep_two_gateways(build: str) -> None:
    docs = render(build)
    labels = one(docs, "Deployment", GATEWAY)["spec"]["template"]["metadata"]["labels"]
    hpa = one(docs, "HorizontalPodAutoscaler", GATEWAY)
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["minReplicas"] >= 2
    assert hpa["spec"]["maxReplicas"] > hpa["spec"]["minReplicas"]
    pdb = one(docs, "PodDisruptionBudget", GATEWAY)
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    assert pdb["spec"]["minAvailable"] >= 1


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_pools_are_discovered_through_headless_services(overlay: str, tmp_path: Path) -> None:
    """Each pool's discovery hostname is a headless Service in front of a server of that kind."""
    docs = render(f"overlays/{overlay}")
    settings = mounted_settings(docs, tmp_path)
    for pool_name, pool in settings.pools.items():
        assert pool.discovery is not None, f"{overlay}: pool {pool_name} has no discovery"
        service = one(docs, "Service", pool.discovery.hostname)
        assert service["spec"]["clusterIP"] == "None"
        assert pool.discovery.port in {p["port"] for p in service["spec"]["ports"]}
        servers = [
            d
            for d in find(docs, "Deployment")
            if selects(service["spec"]["selector"], d["spec"]["template"]["metadata"]["labels"])
        ]
        assert len(servers) == 1, (
            f"{overlay}: {service['metadata']['name']} selects {len(servers)} Deployments"
        )
        argv = container_argv(pod_spec(servers[0])["containers"][0])
        args = parse_args(argv)
        assert set(pool.models) == {args["--served-model-name"]}
        assert str(pool.discovery.port) == args["--port"]
        speculates, k = speculation(argv)
        assert speculates == (pool_name == "speculative"), f"{overlay}: {pool_name} pool runs {argv}"
        if k is not None:
            assert k == pool.num_speculative_tokens, (
                f"{overlay}: server k={k}, config {pool.num_speculative_tokens}"
            )


def speculation(argv: list[str]) -> tuple[bool, int | None]:
    """Whether a vLLM or emulator command line speculates, and its k when the command line says."""
    args = parse_args(argv)
    if "emulate" in argv:
        k = args.get("--num-speculative-tokens")
        return args["--mode"] == "speculative", None if k is None else int(k)
    if "--speculative-config" in args:
        return True, int(json.loads(args["--speculative-config"])["num_speculative_tokens"])
    return False, None
