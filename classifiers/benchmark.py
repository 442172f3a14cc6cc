"""Latency and memory of the shipped classifier on one core: ``python -m classifiers.benchmark [--data DIR]``.

Prompts are real corpus prompts (``../shared/data`` by default) plus long ones built from them (up to 4,000
characters, the budget's reference size) and a few huge ones (reported apart). Prompts of 4,000 characters
that mix scripts are reported apart too: pieces of corpus prompts in languages drawn at random, so that the
scanned windows hold CJK, kana, Hangul, Arabic, Cyrillic, Devanagari and Latin text side by side (the corpus
has few such prompts, and a window with CJK characters reads more than one without). Each prediction is
timed alone.
"""

from __future__ import annotations

import argparse
import gc
import os
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil


@dataclass(slots=True)
class Bench:
    load_s: float
    rss_before_mb: float
    rss_after_mb: float
    n: int
    p50_us: float
    p90_us: float
    p99_us: float
    max_us: float
    per_bucket: dict[str, tuple[int, float, float]]  # bucket -> (n, p50, p99)
    huge_p99_us: float
    mixed: tuple[int, float, float]  # prompts of 4,000 characters mixing scripts: (n, p50, p99)

    def markdown(self) -> str:
        lines = [
            f"- model load: {self.load_s * 1000:.0f} ms; resident memory {self.rss_before_mb:.0f} MB "
            "before load, "
            f"{self.rss_after_mb:.0f} MB after (model: {self.rss_after_mb - self.rss_before_mb:.0f} MB)",
            f"- {self.n} prompts of up to 4,000 characters, one core: p50 {self.p50_us:.0f} µs, "
            f"p90 {self.p90_us:.0f} µs, p99 {self.p99_us:.0f} µs, max {self.max_us:.0f} µs",
            "- prompts of 20,000-100,000 characters (scan window caps the work): p99 "
            f"{self.huge_p99_us:.0f} µs",
            f"- {self.mixed[0]} prompts of 4,000 characters mixing scripts (pieces of corpus prompts in "
            f"random languages): p50 {self.mixed[1]:.0f} µs, p99 {self.mixed[2]:.0f} µs",
            "",
            "| length | n | p50 µs | p99 µs |",
            "|---|---|---|---|",
        ]
        lines += [f"| {b} | {n} | {p50:.0f} | {p99:.0f} |" for b, (n, p50, p99) in self.per_bucket.items()]
        return "\n".join(lines) + "\n"


def _bucket(n: int) -> str:
    # the evaluation's length buckets (classifiers.evaluate imports scikit-learn; this must not)
    return "< 300" if n < 300 else "300-1500" if n < 1500 else "> 1500"


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _mixed(rows: list[Any], r: random.Random, n: int = 400, size: int = 4000) -> list[dict[str, Any]]:
    """Prompts of ``size`` characters made of pieces (40-400 characters) of corpus prompts, each from a
    language drawn at random: a head or tail window holds several languages and scripts."""
    by_language: dict[str, list[str]] = {}
    for row in rows:
        prompt = row.body.get("prompt")
        if isinstance(prompt, str) and prompt:
            by_language.setdefault(row.language, []).append(prompt)
    languages = sorted(by_language)
    out = []
    for _ in range(n):
        parts: list[str] = []
        while sum(map(len, parts)) + len(parts) < size:
            text = r.choice(by_language[r.choice(languages)])
            start = r.randrange(len(text))
            parts.append(text[start : start + r.randint(40, 400)])
        out.append({"prompt": r.choice([" ", "\n", "\n\n"]).join(parts)[:size]})
    return out


def _bodies(
    data_dir: Path | None = None, seed: int = 1, n: int = 3000
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    from classifiers.data import corpus_file, load

    everything = load(corpus_file(data_dir))
    rows = [r for r in everything if len(r.body.get("prompt", "")) <= 4000]
    r = random.Random(seed)
    bodies = [row.body for row in r.sample(rows, min(n, len(rows)))]
    texts = [row.body["prompt"] for row in rows if isinstance(row.body.get("prompt"), str)]
    for _ in range(n // 3):  # long prompts: context + instruction, 1,500-4,000 characters
        target = r.randint(1500, 4000)
        parts: list[str] = []
        while sum(map(len, parts)) < target:
            parts.append(r.choice(texts))
        bodies.append({"prompt": "\n\n".join(parts)[-target:]})
    huge = [
        {"prompt": "\n\n".join(r.choice(texts) for _ in range(400))[: r.randint(20_000, 100_000)]}
        for _ in range(50)
    ]
    return bodies, huge, _mixed(everything, r)


def run(data_dir: Path | None = None, model: Path | None = None, pin: bool = True) -> Bench:
    from classifiers.model import MODEL_FILE, Classifier
    from classifiers.request import view

    if pin and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    bodies, huge, mixed = _bodies(data_dir)
    proc = psutil.Process()
    gc.collect()
    before = proc.memory_info().rss / 2**20
    t0 = time.perf_counter()
    clf = Classifier.load(model or MODEL_FILE)
    load_s = time.perf_counter() - t0
    gc.collect()
    after = proc.memory_info().rss / 2**20
    for b in [*bodies[:200], *mixed[:50]]:  # warm up
        clf.predict(b)

    def timed(bs: list[dict[str, Any]]) -> list[float]:
        out = []
        for b in bs:
            t = time.perf_counter_ns()
            clf.predict(b)
            out.append((time.perf_counter_ns() - t) / 1000)
        return out

    gc.disable()
    try:
        lat = timed(bodies)
        huge_lat = timed(huge)
        mixed_lat = timed(mixed)
    finally:
        gc.enable()
    per: dict[str, list[float]] = {}
    for b, us in zip(bodies, lat, strict=True):
        v = view(b)
        per.setdefault(_bucket(len(v.text) + len(v.context)), []).append(us)
    return Bench(
        load_s=load_s,
        rss_before_mb=before,
        rss_after_mb=after,
        n=len(lat),
        p50_us=_pct(lat, 0.5),
        p90_us=_pct(lat, 0.9),
        p99_us=_pct(lat, 0.99),
        max_us=max(lat),
        per_bucket={k: (len(v), _pct(v, 0.5), _pct(v, 0.99)) for k, v in sorted(per.items())},
        huge_p99_us=_pct(huge_lat, 0.99),
        mixed=(len(mixed_lat), _pct(mixed_lat, 0.5), _pct(mixed_lat, 0.99)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description="latency and memory of the shipped prompt classifier")
    ap.add_argument("--data", type=Path, default=None, help="corpus folder (default ../shared/data)")
    ap.add_argument("--model", type=Path, default=None, help="artefact (default: the shipped one)")
    args = ap.parse_args()
    print(run(args.data, args.model).markdown())


if __name__ == "__main__":
    main()
