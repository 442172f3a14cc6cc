"""`pip install specroute` gives the gateway and nothing it does not serve with.

Builds the wheel from a copy of the sources (as the Dockerfile does), installs it into an empty virtual
environment with the versions pinned in constraints.txt (pip's cache makes this quick), and checks what a
newcomer gets: a working `specroute serve`, none of the heavy libraries of the extras, a one-line
pointer to the extra when a command needs one, and a wheel without training data.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "LICENSE", "gateway", "classifiers")
# what only the extras bring: plotting, arrays, training
HEAVY = ("numpy", "scipy", "sklearn", "matplotlib", "tqdm", "psutil")


def _run(*args: str | Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPECROUTE_", "PYTHON", "VIRTUAL_ENV"))}
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=300, env=env, check=False, **kwargs
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            # as a fresh clone has them: no bytecode, no extension built in place by an editable install
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
        else:
            shutil.copy(path, src / name)
    out = tmp_path_factory.mktemp("wheels")
    proc = _run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", out, src)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (found,) = out.glob("specroute-*.whl")
    return found


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty virtual environment holding the wheel and its serving dependencies only."""
    target = tmp_path_factory.mktemp("venv")
    venv.create(target, with_pip=False)
    python = target / "bin" / "python"
    proc = _run(
        sys.executable, "-m", "pip", "--python", python, "install", "-q",
        "-c", REPO / "constraints.txt", wheel,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    yield target


def _dist_info(wheel: Path) -> str:
    """``specroute-0.1.0.dist-info`` for ``specroute-0.1.0-cp311-cp311-linux_x86_64.whl`` (a wheel with the C
    gram counter is tagged for its platform) or ``specroute-0.1.0-py3-none-any.whl``."""
    return "-".join(wheel.name.split("-")[:2]) + ".dist-info"


def test_the_wheel_holds_the_packages_and_the_model_but_no_training_data(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"gateway", "classifiers", _dist_info(wheel)}, tops
    assert "classifiers/model/model.json.gz" in names, "the shipped classifier is what serving reads"
    assert any(n.startswith("classifiers/_grams.") and n.endswith(".so") for n in names), "the C gram counter"
    assert any(n.startswith("gateway/routing/_slots.") and n.endswith(".so") for n in names), "the C slots"
    data = [n for n in names if n.endswith((".jsonl", ".csv", ".parquet", ".arrow", ".tsv")) or "/data/" in n]
    assert not data, data
    assert not any(n.startswith("tests/") or "/fixtures/" in n for n in names)


def test_the_wheel_declares_serving_dependencies_and_extras(wheel: Path) -> None:
    meta = zipfile.ZipFile(wheel).read(f"{_dist_info(wheel)}/METADATA").decode()
    extras = {
        line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Provides-Extra:")
    }
    assert {"emulator", "bench", "train", "dev"} <= extras
    base = [
        line.split(":", 1)[1].strip()
        for line in meta.splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    for heavy in ("numpy", "scipy", "scikit-learn", "matplotlib", "psutil", "tqdm"):
        assert not any(req.lower().startswith(heavy) for req in base), base
    assert "License-Expression: Apache-2.0" in meta or "License: Apache-2.0" in meta


def test_serve_works_and_the_extras_libraries_are_absent(installed: Path) -> None:
    proc = _run(installed / "bin" / "specroute", "serve", "--help")
    assert proc.returncode == 0 and "--config" in proc.stdout, proc.stdout + proc.stderr
    # everything serving and the demo load (uvloop, httptools, the classifier's weights) is there
    serving = "import gateway.app, gateway.server, gateway.demo, gateway.emulator.server, classifiers; "
    proc = _run(installed / "bin" / "python", "-c", serving + "assert classifiers.load_default()._char_plan")
    assert proc.returncode == 0, proc.stderr
    probe = f"import importlib.util as u; print(','.join(m for m in {HEAVY!r} if u.find_spec(m)))"
    proc = _run(installed / "bin" / "python", "-c", probe)
    assert proc.returncode == 0 and proc.stdout.strip() == "", f"importable: {proc.stdout} {proc.stderr}"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["bench", "run", "--url", "http://127.0.0.1:9"], "`specroute bench` needs the bench extra: "
         "pip install 'specroute[bench]' (from a clone of its repository: pip install '.[bench]'"),
        (["train"], "`specroute train` needs the train extra: pip install 'specroute[train]' (from a clone"),
    ],
)  # fmt: skip
def test_a_command_that_needs_an_extra_says_which(installed: Path, args: list[str], expected: str) -> None:
    proc = _run(installed / "bin" / "specroute", *args)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(expected), proc.stderr
