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
    restricted: Annotated[
        bool | None,
        typer.Option(
            "--restricted/--no-restricted",
            help="also measure a model trained with the non-commercial rows "
            "(default: if the shared corpus exists)",
        ),
    ] = None,
    loso: Annotated[
        bool, typer.Option("--loso/--no-loso", help="run leave-one-source-out evaluation")
    ] = True,
    card: Annotated[
        Path | None, typer.Option(help="model card to write (default classifiers/MODEL_CARD.md)")
    ] = None,
) -> None:
    """Retrain the prompt classifier, evaluate it and write the shipped artefact and model card."""
    import subprocess

    from classifiers import data, evaluate, modelcard, train
    from classifiers.model import MODEL_FILE

    def log(msg: str) -> None:
        typer.echo(msg, err=True)

    rows = data.load_training()
    log(f"training rows: {len(rows)} ({sum(r.source == data.OWN_SOURCE for r in rows)} SpecRoute prompts)")
    results: dict[str, Any] = {}
    if loso:
        log("leave-one-source-out, shipped configuration:")
        res = evaluate.leave_one_source_out(rows, log=log)
        results["loso"] = res
        typer.echo(evaluate.report(res, "Leave-one-source-out (shipped training set)"))
    if restricted is None:
        restricted = data.SHARED_FILE.exists()
    if restricted and loso:
        log("leave-one-source-out, with the restricted rows:")
        full = evaluate.leave_one_source_out(data.load_training(with_restricted=True), log=log)
        results["restricted"] = full
        typer.echo(evaluate.report(full, "Leave-one-source-out with restricted rows (not shipped)"))
    clf = train.fit(rows)
    clf.save(MODEL_FILE)
    log(f"wrote {MODEL_FILE} ({MODEL_FILE.stat().st_size // 1024} KiB, {clf.meta['features']} features)")
    showcase = modelcard.showcase_rates(clf)
    if showcase:
        typer.echo("Showcase sets: " + ", ".join(f"{k} {v:.3f}" for k, v in showcase.items()))
    # a fresh process, so that memory and timings are not those of the training run
    bench = subprocess.run(
        [sys.executable, "-m", "classifiers.benchmark"], capture_output=True, text=True, check=True
    ).stdout
    typer.echo(bench)
    out = card or modelcard.CARD_FILE
    out.write_text(modelcard.render(clf, results, showcase, bench), encoding="utf-8")
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
