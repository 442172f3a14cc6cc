"""Helpers for the deployment tests: render kustomizations and look into the rendered objects."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
# Overlays meant to be applied as they are; `base` is their common part.
OVERLAYS = ("emulated", "gpu", "trn2")
# Every kustomization that must build (bench Jobs are applied separately, per overlay).
BUILDS = ("base", *(f"overlays/{o}" for o in OVERLAYS), *(f"overlays/{o}/bench" for o in OVERLAYS))
GATEWAY = "specroute"
CONFIG_MOUNT = "/etc/specroute"

Doc = dict[str, Any]


@functools.cache
def kustomize_command() -> tuple[str, ...]:
    """``kubectl kustomize`` (or a standalone ``kustomize build``); `.ci/run` installs kubectl."""
    if kubectl := shutil.which("kubectl"):
        return (kubectl, "kustomize")
    if kustomize := shutil.which("kustomize"):
        return (kustomize, "build")
    missing = "neither kubectl nor kustomize on PATH (`make system-deps` installs kubectl)"
    if os.environ.get("CI"):
        pytest.fail(missing)  # CI installs it: a skip there would hide a broken install step
    pytest.skip(f"SKIPPED deploy build tests: {missing}")


@functools.cache
def _render(path: str) -> tuple[Doc, ...]:
    proc = subprocess.run(
        [*kustomize_command(), path], capture_output=True, text=True, timeout=60, check=False
    )
    if proc.returncode != 0:
        raise AssertionError(f"kustomize build of {path} failed:\n{proc.stderr}")
    return tuple(d for d in yaml.safe_load_all(proc.stdout) if d)


def render(path: str | Path) -> list[Doc]:
    """Rendered objects of a kustomization directory (absolute, or relative to deploy/k8s)."""
    full = Path(path) if Path(path).is_absolute() else K8S / path
    return list(_render(str(full)))


def find(docs: list[Doc], kind: str, name: str | None = None) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    found = find(docs, kind, name)
    assert len(found) == 1, f"expected exactly one {kind}/{name}, found {len(found)}"
    return found[0]


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def parse_args(argv: list[str]) -> dict[str, str]:
    """``--flag=value`` and ``--flag value`` into a mapping; bare flags map to ``""``."""
    out: dict[str, str] = {}
    it = iter(range(len(argv)))
    for i in it:
        arg = argv[i]
        if not arg.startswith("--"):
            continue
        if "=" in arg:
            key, value = arg.split("=", 1)
            out[key] = value
        elif i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            out[arg] = argv[i + 1]
            next(it)
        else:
            out[arg] = ""
    return out


def container_argv(container: Doc) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def iter_probes(container: Doc) -> Iterator[tuple[str, Doc]]:
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        if kind in container:
            yield kind, container[kind]
