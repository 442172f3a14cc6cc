"""``specroute`` command line: serve, health, demo, emulate, train, classify, bench.

Each sub-command lives beside the code it drives; this module only assembles them, and heavy imports
happen inside the commands so that ``specroute --help`` stays instant.

Whatever goes wrong before the gateway runs is said in one line on stderr that names what to change (a
flag, a configuration key and where it came from, a port, an extra to install), with a non-zero exit
and no traceback: a newcomer's first error should be the fix, not a stack.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from classifiers.cli import classify_command, train_command
from gateway.bench.cli import bench_app
from gateway.emulator.cli import emulate_command
from gateway.extras import MissingExtra, require

# Exit statuses: a usage or configuration error, and a gateway that could not start where it was told to.
EXIT_USAGE = 2
EXIT_STARTUP = 3

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
    from gateway.server import StartupError, serve

    # only the flags given: an empty section would read as one the command line set
    flags = {k: v for k, v in (("host", host), ("port", port), ("workers", workers)) if v is not None}
    try:
        settings = load_settings(config, {"server": flags} if flags else None)
        serve(settings, config_path=config)
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(EXIT_USAGE) from None
    except StartupError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(EXIT_STARTUP) from None


@app.command("health")
def health_command(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config", "-c", help="YAML configuration file, as given to serve (default: the environment)"
        ),
    ] = None,
    timeout: Annotated[
        float, typer.Option(min=0.01, max=3600.0, help="seconds to wait for the answer")
    ] = 4.0,
    cert: Annotated[
        Path | None, typer.Option(help="client certificate under mutual TLS (default: server.tls_cert_file)")
    ] = None,
    key: Annotated[Path | None, typer.Option(help="its key, when not in --cert's file")] = None,
) -> None:
    """Ask the gateway on this machine for /health where its configuration says it listens (exit 0: 200,
    else 1, a configuration it cannot read included: a container's health check reserves 2)."""
    from gateway.config import ConfigError, load_server
    from gateway.server import probe_health

    try:
        server = load_server(config)
    except ConfigError as e:
        typer.echo(str(e), err=True)
        raise typer.Exit(1) from None
    problem = probe_health(server, timeout, cert, key)
    if problem is not None:
        typer.echo(problem, err=True)
        raise typer.Exit(1)


@app.command("demo")
def demo_command(
    port: Annotated[int, typer.Option(min=0, max=65535, help="gateway port (0: a free one)")] = 8000,
    strategy: Annotated[str, typer.Option(help="routing strategy")] = "adaptive",
    time_scale: Annotated[
        float, typer.Option("--time-scale", min=0.0, help="multiply emulated delays")
    ] = 1.0,
) -> None:
    """Start two emulated vLLM pools and the gateway on 127.0.0.1; Ctrl-C stops all."""
    from gateway.config import Strategy
    from gateway.demo import run_demo

    if strategy not in set(Strategy):  # said here, not by a gateway that fails to start
        known = ", ".join(Strategy)
        raise typer.BadParameter(f"{strategy!r} is not one of {known}", param_hint="--strategy")

    raise typer.Exit(run_demo(port=port, strategy=strategy, time_scale=time_scale))


@app.command("tokenizer")
def tokenizer_command(
    out: Annotated[Path, typer.Argument(help="directory to write tokenizer.json and its config into")],
    max_model_len: Annotated[int, typer.Option(min=2, help="the model's context length")] = 1024,
) -> None:
    """Write a small tokenizer for the emulated model (for load tools such as guidellm's --processor)."""
    from gateway.emulator.hf_tokenizer import write

    try:
        typer.echo(write(out, max_model_len))
    except OSError as e:
        typer.echo(_cannot_write(out, e), err=True)
        raise typer.Exit(EXIT_USAGE) from None


config_app = typer.Typer(help="The configuration: its reference, generated from the settings model.")


@config_app.command("docs")
def config_docs_command(
    out: Annotated[
        Path | None, typer.Option(help="write here (docs/configuration.md) instead of stdout")
    ] = None,
) -> None:
    """Print the configuration reference (every key, type, default, environment variable) as Markdown."""
    from gateway.config_reference import markdown

    text = markdown()
    if out is None:
        typer.echo(text, nl=False)
        return
    try:
        out.write_text(text)
    except OSError as e:
        typer.echo(_cannot_write(out, e), err=True)
        raise typer.Exit(EXIT_USAGE) from None


def _cannot_write(path: Path, error: OSError) -> str:
    return f"cannot write {error.filename or path}: {error.strerror or error}"


def needs_extra(extra: str, command: str, run: Callable[..., Any]) -> Callable[..., Any]:
    """``run`` behind a check that ``extra`` is installed (typer reads the wrapped signature)."""

    @functools.wraps(run)
    def checked(*args: Any, **kwargs: Any) -> Any:
        require(extra, command)
        return run(*args, **kwargs)

    return checked


app.command("emulate")(emulate_command)
app.command("train")(needs_extra("train", "specroute train", train_command))
app.command("classify")(classify_command)
app.add_typer(bench_app, name="bench")
app.add_typer(config_app, name="config")


def _usage_line(error: Exception) -> str:
    """A click usage error in one line: the command, what is wrong, where help is."""
    ctx = getattr(error, "ctx", None)
    path = ctx.command_path if ctx is not None else "specroute"
    message = error.format_message() if hasattr(error, "format_message") else str(error)
    return f"{path}: {message} (see `{path} --help`)"


def run(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return its exit status instead of leaving the process."""
    try:
        result = app(
            args=list(argv) if argv is not None else None, prog_name="specroute", standalone_mode=False
        )
    except MissingExtra as e:
        typer.echo(str(e), err=True)
        return 1
    except Exception as e:
        # typer bundles its own click: its exceptions are recognised by what they carry, not by class.
        if type(e).__name__ == "NoArgsIsHelpError" and hasattr(e, "show"):
            e.show()
            return EXIT_USAGE
        if hasattr(e, "format_message") and hasattr(e, "exit_code"):
            typer.echo(_usage_line(e), err=True)
            return int(e.exit_code)
        if isinstance(e, typer.Abort):
            typer.echo("Aborted!", err=True)
            return 1
        raise
    return result if isinstance(result, int) else 0


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
