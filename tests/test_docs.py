"""The README stays a five-minute read whose recipe works, and every link in it and in docs/ resolves."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.config import load_settings

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    out = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            out.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return out


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_every_relative_link_resolves_to_a_file_and_heading() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.name}: {target}")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{page.name}: {target} (no such heading)")
    assert not broken, broken


def test_the_readme_configuration_for_two_vllm_servers_loads(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    (config,) = [b for b in blocks if "pools:" in b]
    path = tmp_path / "gateway.yaml"
    path.write_text(config)
    settings = load_settings(path)
    assert settings.pools.speculative.num_speculative_tokens == 7
    assert settings.served_models() == yaml.safe_load(config)["pools"]["baseline"]["models"]


def test_the_speculative_server_and_the_gateway_agree_on_k() -> None:
    text = README.read_text()
    spec = re.search(r"--speculative-config '(\{.*?\})'", text)
    assert spec is not None
    assert '"num_speculative_tokens": 7' in spec.group(1)
