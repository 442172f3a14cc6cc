"""What a newcomer sees when a command cannot run: one line on stderr naming the fix, a non-zero exit.

Each case runs the real ``specroute`` entry point in a subprocess (``python -m gateway``), since the
point is what reaches the terminal: no usage block, no rich panel, no traceback.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml

from tests.gateway.test_config import BASE

SECRET = "not-json-secret-7f3a"


def specroute(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPECROUTE_")}
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**clean, **(env or {})},
        check=False,
    )


def one_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "╭" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return path


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["serve", "--port", "abc"], "specroute serve: Invalid value for '--port'"),
        (["serve"], "Missing option '--config'"),
        (["serve", "--no-such-flag"], "No such option: --no-such-flag"),
        (["nonsense"], "No such command 'nonsense'"),
        (["bench", "run"], "specroute bench run: Missing option '--url'"),
        (["health", "--timeout", "-1"], "specroute health: Invalid value for '--timeout'"),
        # an unbounded wait is not a health check (and overflows the socket's timeout)
        (["health", "--timeout", "inf"], "specroute health: Invalid value for '--timeout'"),
        (["emulate", "--port", "70000"], "specroute emulate: Invalid value for '--port'"),
    ],
)
def test_invalid_command_line_is_one_line_with_exit_2(config: Path, args: list[str], expected: str) -> None:
    if args[0] == "serve" and "--config" not in args and args != ["serve"]:
        args = [*args, "--config", str(config)]
    proc = specroute(*args)
    line = one_line(proc)
    assert proc.returncode == 2
    assert expected in line and "--help" in line


def test_a_list_in_the_environment_that_is_not_json_names_the_variable_not_its_value(config: Path) -> None:
    proc = specroute("serve", "--config", str(config), env={"SPECROUTE_AUTH__API_KEYS": SECRET})
    line = one_line(proc)
    assert proc.returncode == 2
    assert "SPECROUTE_AUTH__API_KEYS" in line and "auth.api_keys" in line and "JSON" in line
    assert SECRET not in line, "an API key must never be echoed"


def test_a_bad_value_in_the_environment_is_blamed_on_the_variable(config: Path) -> None:
    proc = specroute("serve", "--config", str(config), env={"SPECROUTE_ROUTING__STRATEGY": "fastest"})
    line = one_line(proc)
    assert "routing.strategy" in line and "environment variable SPECROUTE_ROUTING__STRATEGY" in line
    assert str(config) not in line


def test_bad_values_from_several_sources_each_name_theirs(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text(yaml.safe_dump({**BASE, "routing": {"margin": -1}}))
    proc = specroute("serve", "-c", str(path), "--workers", "0", env={"SPECROUTE_SERVER__PORT": "x"})
    line = one_line(proc)
    assert f"routing.margin: Input should be greater than or equal to 0 (from {path})" in line
    assert "server.workers" in line and "(from command line)" in line
    assert "server.port" in line and "(from environment variable SPECROUTE_SERVER__PORT)" in line


def test_an_upstream_key_no_header_can_carry_is_invalid_configuration(tmp_path: Path) -> None:
    key = tmp_path / "upstream.key"
    key.write_text(f"{SECRET}\nsecond-line\n")
    path = tmp_path / "gw.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                **BASE,
                "pools": {
                    **BASE["pools"],
                    "baseline": {**BASE["pools"]["baseline"], "api_key_file": str(key)},
                },
            }
        )
    )
    proc = specroute("serve", "-c", str(path))
    line = one_line(proc)
    assert proc.returncode == 2
    assert line.startswith("pools.baseline.api_key_file: ") and "line break" in line
    assert SECRET not in line, "a key must never be echoed"


def test_a_yaml_error_names_the_file_line_and_column(tmp_path: Path) -> None:
    path = tmp_path / "gw.yaml"
    path.write_text("pools:\n  speculative: [unclosed\n")
    line = one_line(specroute("serve", "-c", str(path)))
    assert line.startswith(f"configuration {path}:3:1 is not valid YAML: ")


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    line = one_line(specroute("serve", "-c", str(tmp_path / "nope.yaml")))
    assert line == f"cannot read configuration {tmp_path / 'nope.yaml'}: No such file or directory"


def test_a_taken_port_is_one_line_before_anything_starts(config: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        proc = specroute("serve", "--config", str(config), "--port", str(port))
    line = one_line(proc)
    assert proc.returncode == 3
    assert line.startswith(f"port {port} on 127.0.0.1 is in use: ")
    assert "--port" in line and "server.port" in line


def test_an_address_that_is_not_this_machines_names_the_host_keys(config: Path) -> None:
    # 192.0.2.0/24 is TEST-NET-1: never assigned to a local interface
    line = one_line(specroute("serve", "--config", str(config), "--host", "192.0.2.1", "--port", "18000"))
    assert line.startswith("cannot listen on 192.0.2.1: ") and "--host" in line


def test_an_unreachable_bench_target_is_one_line() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        proc = specroute(
            "bench", "run", "--url", f"http://127.0.0.1:{port}", "--requests", "1", "--no-progress"
        )
    line = one_line(proc)
    assert proc.returncode == 1
    assert line.startswith(f"cannot reach http://127.0.0.1:{port}: ") and "--url" in line


def test_a_bench_url_without_scheme_says_so() -> None:
    line = one_line(specroute("bench", "run", "--url", "127.0.0.1:9", "--requests", "1"))
    assert "needs a scheme" in line


def test_a_rule_across_keys_names_the_variable_not_the_command_line(config: Path) -> None:
    proc = specroute("serve", "--config", str(config), env={"SPECROUTE_SERVER__TLS_KEY_FILE": "key.pem"})
    line = one_line(proc)
    assert proc.returncode == 2
    assert line.endswith("need `tls_cert_file` (from environment variable SPECROUTE_SERVER__TLS_KEY_FILE)")


def test_a_misspelled_section_in_the_environment_is_refused(config: Path) -> None:
    proc = specroute("serve", "--config", str(config), env={"SPECROUTE_ROUTNG__STRATEGY": "always-baseline"})
    line = one_line(proc)
    assert proc.returncode == 2
    assert "SPECROUTE_ROUTNG__STRATEGY sets no setting (did you mean SPECROUTE_ROUTING__STRATEGY?)" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--strategy", "bogus"],
            "specroute demo: Invalid value for --strategy: 'bogus' is not one of adaptive",
        ),
        (["--time-scale", "-1"], "specroute demo: Invalid value for '--time-scale'"),
        (["--port", "-1"], "specroute demo: Invalid value for '--port'"),
    ],
)
def test_a_bad_demo_option_is_one_line_before_anything_starts(args: list[str], expected: str) -> None:
    proc = specroute("demo", *args)
    line = one_line(proc)
    assert proc.returncode == 2
    assert line.startswith(expected)


def test_a_demo_process_that_does_not_start_is_one_line_naming_its_log() -> None:
    # the gateway inherits the environment, and refuses it; the emulators started first
    proc = specroute(
        "demo", "--port", "0", "--time-scale", "0", env={"SPECROUTE_ROUTING__STRATEGY": "fastest"}
    )
    line = one_line(proc)
    assert proc.returncode == 1
    assert line.startswith("gateway did not start: invalid configuration: routing.strategy: ")
    log = Path(line.rsplit("(log: ", 1)[1].rstrip(")"))
    assert log.name == "gateway.log" and "routing.strategy" in log.read_text()


def test_the_demo_on_port_0_serves_on_a_free_port() -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SPECROUTE_")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "gateway", "demo", "--port", "0", "--time-scale", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**clean, "SPECROUTE_PARENT_PID": str(os.getpid())},
        start_new_session=True,
    )
    try:
        assert demo.stdout is not None
        lines = iter(demo.stdout.readline, "")
        banner = next((line for line in lines if "SpecRoute demo is up" in line), "")
        assert banner, "the demo ended without its banner"
        url = banner.split("gateway ", 1)[1].split()[0]
        assert not url.endswith(":0")
        assert httpx.get(url + "/health", timeout=5).status_code == 200
    finally:
        demo.send_signal(signal.SIGINT)
        demo.communicate(timeout=30)
    assert demo.returncode == 0


@pytest.mark.parametrize(
    "args",
    [
        ["config", "docs", "--out", "{blocked}/x.md"],
        ["tokenizer", "{blocked}/tok"],
        ["bench", "overhead", "--workdir", "{blocked}/work"],
        ["bench", "learning", "--virtual", "--out", "{blocked}/out"],
    ],
)
def test_an_output_path_that_cannot_be_written_is_one_line(tmp_path: Path, args: list[str]) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")  # a file where a folder is wanted
    proc = specroute(*(a.format(blocked=blocked) for a in args))
    line = one_line(proc)
    assert proc.returncode == 2
    assert str(blocked) in line and "Not a directory" in line
