"""``specroute`` command line: serve, demo, emulate, train, classify, bench.

Each sub-command lives beside the code it drives; this module only assembles them, and heavy imports
happen inside the commands so that ``specroute --help`` stays instant.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from classifiers.cli import classify_command, train_command
from gateway.bench.cli import bench_app
from gateway.emulator.cli import emulate_command

app = typer.Typer(
    name="specroute",
    help="Speculation-aware inference gateway for vLLM pools.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("serve")
def serve_command(
    config: Annotated[Path, typer.Option("--config", "-c", help="YAML configuration file")],
    host: Annotated[str | None, typer.Option(help="override server.host")] = None,
    port: Annotated[int | None, typer.Option(help="override server.port")] = None,
    workers: Annotated[int | None, typer.Option(help="override server.workers")] = None,
) -> None:
    """Run the gateway."""
    from gateway.config import ConfigError, load_settings
    from gateway.server import serve

    overrides: dict[str, dict[str, object]] = {"server": {}}
    for key, value in (("host", host), ("port", port), ("workers", workers)):
        if value is not None:
            overrides["server"][key] = value
    try:
        settings = load_settings(config, overrides)
        serve(settings, config_path=config)
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(2) from None


@app.command("demo")
def demo_command(
    port: Annotated[int, typer.Option(help="gateway port")] = 8000,
    strategy: Annotated[str, typer.Option(help="routing strategy")] = "adaptive",
    time_scale: Annotated[float, typer.Option("--time-scale", help="multiply emulated delays")] = 1.0,
) -> None:
    """Start two emulated vLLM pools and the gateway on 127.0.0.1; Ctrl-C stops all."""
    from gateway.demo import run_demo

    raise typer.Exit(run_demo(port=port, strategy=strategy, time_scale=time_scale))


@app.command("tokenizer")
def tokenizer_command(
    out: Annotated[Path, typer.Argument(help="directory to write tokenizer.json and its config into")],
    max_model_len: Annotated[int, typer.Option(min=2, help="the model's context length")] = 1024,
) -> None:
    """Write a small tokenizer for the emulated model (for load tools such as guidellm's --processor)."""
    from gateway.emulator.hf_tokenizer import write

    typer.echo(write(out, max_model_len))


app.command("emulate")(emulate_command)
app.command("train")(train_command)
app.command("classify")(classify_command)
app.add_typer(bench_app, name="bench")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
