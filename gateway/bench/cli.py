"""``specroute bench``: placeholder, replaced by the benchmark implementation."""

from __future__ import annotations

import typer

bench_app = typer.Typer(help="Benchmark an OpenAI-compatible endpoint.", no_args_is_help=True)
