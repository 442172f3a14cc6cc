"""The trn2 overlay reproduces the reference deployment (docs: REFERENCE §1) value for value."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.deploy.k8s import Doc, container_argv, find, iter_probes, one, parse_args, pod_spec, render

IMAGE = "pytorch-inference-vllm-neuronx:0.9.1-neuronx-py311-sdk2.26.1"
TARGET, DRAFT, K = "Qwen3-32B", "Qwen3-1.7B", 7
POOLS = {"qwen-vllm": False, "qwen-sd-vllm": True}  # name -> speculative


@pytest.fixture(scope="module")
def docs() -> list[Doc]:
    return render("overlays/trn2")


def server(docs: list[Doc], name: str) -> tuple[Doc, Doc]:
    deployment = one(docs, "Deployment", name)
    (container,) = pod_spec(deployment)["containers"]
    return deployment, container


@pytest.mark.parametrize("name", POOLS)
def test_shared_server_settings(docs: list[Doc], name: str) -> None:
    _, container = server(docs, name)
    argv = container_argv(container)
    args = parse_args(argv)
    assert container["image"].endswith("/" + IMAGE)
    assert argv[:2] == ["vllm", "serve"] and argv[2].endswith("/" + TARGET)
    assert args["--served-model-name"] == f"Qwen/{TARGET}"
    assert args["--tensor-parallel-size"] == "32"
    assert args["--max-num-seqs"] == "4"
    assert args["--max-model-len"] == "1024"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["VLLM_NEURON_FRAMEWORK"] == "neuronx-distributed-inference"
    assert env["NEURON_COMPILED_ARTIFACTS"].startswith("/models/")


def test_pools_share_everything_but_speculation(docs: list[Doc]) -> None:
    """Same target and limits: only the speculation flags and artefact paths may differ."""
    differing = {"--speculative-config", "--override-neuron-config"}
    base, spec = (parse_args(container_argv(server(docs, n)[1])) for n in POOLS)
    assert {k: v for k, v in spec.items() if k not in differing} == base
    assert not differing & base.keys()
    base_env, spec_env = ({e["name"]: e.get("value") for e in server(docs, n)[1]["env"]} for n in POOLS)
    assert base_env["NEURON_COMPILED_ARTIFACTS"] != spec_env["NEURON_COMPILED_ARTIFACTS"]


def test_fused_speculation_with_the_draft(docs: list[Doc]) -> None:
    args = parse_args(container_argv(server(docs, "qwen-sd-vllm")[1]))
    speculative = json.loads(args["--speculative-config"])
    assert speculative["model"].endswith("/" + DRAFT)
    assert speculative["num_speculative_tokens"] == K
    assert speculative["max_model_len"] <= int(args["--max-model-len"])
    neuron = json.loads(args["--override-neuron-config"])
    assert neuron == {"enable_fused_speculation": True, "speculation_length": K}


@pytest.mark.parametrize("name", POOLS)
def test_neuron_devices_through_dra(docs: list[Doc], name: str) -> None:
    deployment, container = server(docs, name)
    (claim,) = pod_spec(deployment)["resourceClaims"]
    assert container["resources"]["claims"] == [{"name": claim["name"]}]
    template = one(docs, "ResourceClaimTemplate", claim["resourceClaimTemplateName"])
    assert template["apiVersion"] == "resource.k8s.io/v1"
    devices = template["spec"]["spec"]["devices"]
    (request,) = devices["requests"]
    assert request["exactly"]["allocationMode"] == "ExactCount"
    assert request["exactly"]["count"] == 8
    (config,) = devices["config"]
    assert config["requests"] == [request["name"]]
    assert config["opaque"]["parameters"]["logicalNeuronCore"] == 2
    # A Trainium2 device has 8 physical NeuronCores; at LNC 2 that is 4 logical cores each, and the
    # claim must give exactly one logical core per tensor-parallel rank.
    tp = int(parse_args(container_argv(container))["--tensor-parallel-size"])
    logical_cores = request["exactly"]["count"] * 8 // config["opaque"]["parameters"]["logicalNeuronCore"]
    assert logical_cores == tp


@pytest.mark.parametrize("name", POOLS)
def test_health_probes_with_a_long_start_budget(docs: list[Doc], name: str) -> None:
    _, container = server(docs, name)
    probes = dict(iter_probes(container))
    assert set(probes) == {"startupProbe", "readinessProbe", "livenessProbe"}
    assert all(p["httpGet"]["path"] == "/health" for p in probes.values())
    startup = probes["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60, "Neuron load takes many minutes"


@pytest.mark.parametrize("name", POOLS)
def test_weights_and_artefacts_on_the_s3_volume(docs: list[Doc], name: str) -> None:
    deployment, container = server(docs, name)
    env = {e["name"]: e.get("value") for e in container["env"]}
    mount = next(
        m for m in container["volumeMounts"] if env["NEURON_COMPILED_ARTIFACTS"].startswith(m["mountPath"])
    )
    volume = next(v for v in pod_spec(deployment)["volumes"] if v["name"] == mount["name"])
    claim = one(docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    volume_object = one(docs, "PersistentVolume", claim["spec"]["volumeName"])
    assert volume_object["spec"]["csi"]["driver"] == "s3.csi.aws.com"
    assert "ReadWriteMany" in claim["spec"]["accessModes"]


def test_gateway_points_at_the_pools(docs: list[Doc]) -> None:
    (config_map,) = [c for c in find(docs, "ConfigMap") if "config.yaml" in c.get("data", {})]
    config = yaml.safe_load(config_map["data"]["config.yaml"])
    pools = config["pools"]
    assert pools["speculative"]["discovery"]["hostname"] == "qwen-sd-vllm"
    assert pools["baseline"]["discovery"]["hostname"] == "qwen-vllm"
    assert pools["speculative"]["num_speculative_tokens"] == K
    assert pools["speculative"]["draft_cost_ratio"] == 0.05
    assert pools["speculative"]["models"] == pools["baseline"]["models"] == [f"Qwen/{TARGET}"]
