"""``specroute train`` and ``specroute classify``.

scikit-learn and the training modules are imported inside ``train_command`` only, so that ``specroute
--help`` and ``specroute classify`` start fast.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer


def train_command(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="folder holding the training corpus prompts-train.jsonl "
            "(default: ../shared/data next to the repository)",
        ),
    ] = None,
    evaluate: Annotated[
        bool,
        typer.Option(
            "--evaluate/--no-evaluate", "--loso/--no-loso", help="run leave-one-source-out evaluation"
        ),
    ] = True,
    restricted: Annotated[
        bool,
        typer.Option(
            "--restricted/--no-restricted",
            help="also measure a model trained with the non-commercial rows (never shipped)",
        ),
    ] = False,
    card: Annotated[
        Path | None, typer.Option(help="model card to write (default classifiers/MODEL_CARD.md)")
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="artefact to write (default classifiers/model/model.json.gz)")
    ] = None,
    bench: Annotated[
        bool, typer.Option("--bench/--no-bench", help="measure latency and memory for the model card")
    ] = True,
) -> None:
    """Retrain the prompt classifier, evaluate it and write the shipped artefact and model card."""
    import subprocess

    from classifiers import data, modelcard, train
    from classifiers import evaluate as ev
    from classifiers.model import MODEL_FILE

    def log(msg: str) -> None:
        typer.echo(msg, err=True)

    try:
        corpus = data.corpus_file(data_dir)
    except data.CorpusNotFound as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(2) from None
    everything = data.load(corpus)
    rows = [r for r in everything if r.commercial]
    log(f"training rows: {len(rows)} commercial of {len(everything)} in {corpus}")
    results: dict[str, Any] = {}
    if evaluate:
        log("leave-one-source-out, shipped configuration:")
        res = ev.leave_one_source_out(rows, log=log)
        results["loso"] = res
        typer.echo(ev.report(res, "Leave-one-source-out (commercial rows, as shipped)"))
        typer.echo(ev.summary(res))
        if restricted:
            log("leave-one-source-out, with the non-commercial rows:")
            full = ev.leave_one_source_out(everything, log=log)
            results["restricted"] = full
            typer.echo(ev.summary(full))
    clf = train.fit(rows)
    if ev.PROBES_FILE.is_file():
        results["probes"] = ev.probe_report(clf, ev.load_probes())
        typer.echo(results["probes"])
    path = model or MODEL_FILE
    clf.save(path)
    log(f"wrote {path} ({path.stat().st_size // 1024} KiB, {clf.meta['features']} features)")
    figures = "(not measured: `specroute train --no-bench`)\n"
    if bench:
        # a fresh process, so that memory and timings are not those of the training run
        cmd = [sys.executable, "-m", "classifiers.benchmark", "--model", str(path)]
        if data_dir is not None:
            cmd += ["--data", str(data_dir)]
        figures = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        typer.echo(figures)
    out = card or modelcard.CARD_FILE
    out.write_text(modelcard.render(clf, everything, results, figures), encoding="utf-8")
    log(f"wrote {out}")


def _body(line: str) -> dict[str, Any]:
    body = json.loads(line)
    if not isinstance(body, dict):
        raise ValueError("each line must be a JSON object")
    if "prompt" not in body and "messages" not in body:
        raise ValueError('expected "prompt" or "messages"')
    return body


def classify_command(
    explain: Annotated[bool, typer.Option("--explain", help="add the top contributing features")] = False,
    top: Annotated[int, typer.Option(help="features listed by --explain")] = 10,
) -> None:
    """Classify JSON lines from stdin ({"prompt": ...} or a request body); one JSON line out per line in."""
    from classifiers.model import load_default

    clf = load_default()
    out = sys.stdout
    for line in sys.stdin:
        try:
            body = _body(line)
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            out.write(json.dumps({"error": str(e)}) + "\n")
            out.flush()
            continue
        t = time.perf_counter_ns()
        pred = clf.predict(body)
        latency_us = (time.perf_counter_ns() - t) / 1000
        rec: dict[str, Any] = {
            "label": pred.label,
            "p_structured": round(pred.p_structured, 6),
            "latency_us": round(latency_us, 1),
            "kind": pred.kind,
        }
        if explain:
            rec["explain"] = clf.explain(body, top=top)
        out.write(json.dumps(rec, ensure_ascii=False) + "\n")
        out.flush()
