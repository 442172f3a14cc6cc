"""Training rows, read from the shared multilingual prompt corpus (``../shared/data`` next to the repository).

The corpus is never copied into the repository: ``specroute train --data PATH`` reads it where it lies. Each
row carries its source's licence and a ``commercial`` flag; the shipped model trains on the commercial rows
only, and the others are read solely to measure what they would add.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
CORPUS_FILE = "prompts-train.jsonl"

LABELS = ("structured", "open-ended", "ambiguous")


class CorpusNotFound(FileNotFoundError):
    """The training corpus is not where it was looked for."""


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    source: str  # repository name without commit and path
    license: str
    category: str
    label: str  # structured | open-ended | ambiguous
    body: dict[str, Any]  # an OpenAI request body ({"prompt": ...} for the corpus)
    language: str = "en"
    commercial: bool = True
    redteam: bool = False
    translated: bool = False
    origin: str = ""  # a generated row's material: the source it was cut from (classifiers.augment)

    @property
    def y(self) -> int:
        return 1 if self.label == "structured" else 0


def source_name(source: str) -> str:
    return source.split("@", 1)[0]


def corpus_file(data_dir: Path | None = None) -> Path:
    """The corpus file under ``data_dir`` (default: the shared folder next to the repository)."""
    path = (data_dir or DEFAULT_DATA_DIR) / CORPUS_FILE
    if not path.is_file():
        raise CorpusNotFound(f"training corpus not found: {path} (pass its folder with --data PATH)")
    return path


def _read(path: Path) -> Iterator[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                yield json.loads(line)


def _row(d: dict[str, Any]) -> Row:
    body = d.get("body") or {"prompt": d["prompt"]}
    return Row(
        id=str(d["id"]),
        source=source_name(str(d["source"])),
        license=str(d.get("license", "")),
        category=str(d.get("category", "")),
        label=str(d["label"]),
        body=body,
        language=str(d.get("language", "en")),
        commercial=bool(d.get("commercial", False)),
        redteam=bool(d.get("redteam", False)),
        translated=bool(d.get("translated", False)),
    )


def load(path: Path) -> list[Row]:
    return [_row(d) for d in _read(path)]


def load_training(data_dir: Path | None = None, with_restricted: bool = False) -> list[Row]:
    """Rows the shipped model trains on (commercial use allowed); ``with_restricted`` adds all the others."""
    rows = load(corpus_file(data_dir))
    return rows if with_restricted else [r for r in rows if r.commercial]


def licence_table(rows: Iterable[Row]) -> list[tuple[str, str, int, bool]]:
    """(source, licence, rows, commercial use allowed) for the model card."""
    counts: dict[tuple[str, str, bool], int] = {}
    for r in rows:
        key = (r.source, r.license, r.commercial)
        counts[key] = counts.get(key, 0) + 1
    return [(s, lic, n, ok) for (s, lic, ok), n in sorted(counts.items())]
