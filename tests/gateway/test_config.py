"""Configuration: YAML, environment overrides, and errors that name the bad field."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.config import ConfigError, Strategy, load_settings

BASE = {
    "pools": {
        "speculative": {
            "endpoints": [{"name": "s0", "url": "http://127.0.0.1:9001"}],
            "models": ["m"],
            "num_speculative_tokens": 7,
            "draft_cost_ratio": 0.05,
        },
        "baseline": {"endpoints": [{"name": "b0", "url": "http://127.0.0.1:9002"}], "models": ["m"]},
    }
}


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_defaults_and_values(tmp_path):
    s = load_settings(_write(tmp_path, BASE))
    assert s.routing.strategy is Strategy.ADAPTIVE
    assert s.pools.speculative.num_speculative_tokens == 7
    assert s.pools.baseline.endpoints[0].base_url == "http://127.0.0.1:9002"
    assert s.served_models() == ["m"]


def test_environment_overrides_file(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECROUTE_ROUTING__STRATEGY", "always-baseline")
    monkeypatch.setenv("SPECROUTE_AUTH__API_KEYS", '["k1", "k2"]')
    s = load_settings(_write(tmp_path, BASE))
    assert s.routing.strategy is Strategy.ALWAYS_BASELINE
    assert s.auth.api_keys == ["k1", "k2"]


def test_the_environment_can_unset_what_the_file_sets(tmp_path, monkeypatch):
    """``null``, as the file writes it; a setting that cannot be null says so, naming the variable."""
    path = _write(tmp_path, {**BASE, "routing": {"seed": 5, "state_file": str(tmp_path / "learned.json")}})
    monkeypatch.setenv("SPECROUTE_ROUTING__SEED", "null")
    monkeypatch.setenv("SPECROUTE_ROUTING__STATE_FILE", "null")
    s = load_settings(path)
    assert s.routing.seed is None and s.routing.state_file is None
    monkeypatch.setenv("SPECROUTE_SERVER__PORT", "null")
    with pytest.raises(
        ConfigError, match=r"server.port: .*\(from environment variable SPECROUTE_SERVER__PORT\)"
    ):
        load_settings(path)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"routing": {"strategy": "fastest"}}, "routing.strategy"),
        ({"timeouts": {"connect_s": -1}}, "timeouts.connect_s"),
        ({"limits": {"max_body_bytes": "big"}}, "limits.max_body_bytes"),
        ({"pools": {"baseline": {"endpoints": [{"name": "b", "url": "not a url"}], "models": ["m"]}}}, "url"),
        ({"pools": {"baseline": {"endpoints": [], "models": ["m"]}}}, "pools.baseline"),
        (
            {"pools": {"baseline": {"endpoints": [{"name": "b", "url": "http://h"}], "models": ["x"]}}},
            "pools",
        ),
        ({"routing": {"exploration_rate": 2}}, "routing.exploration_rate"),
        ({"health": {"path": "health"}}, "health.path: Value error, must begin with '/', e.g. /health"),
        ({"health": {"eject_base_s": 100, "eject_max_s": 1}}, "eject_base_s (the first ejection) exceeds"),
        ({"unknown_section": {}}, "unknown_section"),
        (  # one server listed twice: two shares of the traffic, compared with itself for outliers
            {
                "pools": {
                    "baseline": {
                        "models": ["m"],
                        "endpoints": [
                            {"name": "b0", "url": "http://10.0.0.5:8000"},
                            {"name": "b1", "url": "http://10.0.0.5:8000/"},
                        ],
                    }
                }
            },
            "endpoints b0 and b1 name the same server (http://10.0.0.5:8000)",
        ),
    ],
)
def test_invalid_configuration_names_the_field(tmp_path, patch, field):
    data = {**BASE, **patch}
    if "pools" in patch:
        data["pools"] = {**BASE["pools"], **patch["pools"]}
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, data))
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("section", "key", "value"),
    [
        ("health", "timeout_s", ".inf"),  # every check raised in aiohttp; a dead endpoint stayed in
        ("timeouts", "total_s", ".inf"),
        ("routing", "margin", ".inf"),
        ("server", "shutdown_grace_s", ".nan"),
    ],
)
def test_a_number_that_is_not_finite_is_refused(tmp_path, monkeypatch, section, key, value):
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(BASE) + f"{section}:\n  {key}: {value}\n")
    with pytest.raises(
        ConfigError, match=rf"^invalid configuration: {section}\.{key}: .*finite number \(from "
    ):
        load_settings(path)
    monkeypatch.setenv(f"SPECROUTE_{section.upper()}__{key.upper()}", value.lstrip("."))
    with pytest.raises(ConfigError, match=rf"{section}\.{key}: .*finite.*\(from environment variable"):
        load_settings(_write(tmp_path, BASE))


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("pools: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(bad)


def test_a_file_that_is_not_utf8_text_is_one_line_not_a_traceback(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"server:\n  port: 1\n\xff\xfe bad\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert str(err.value) == f"configuration {path} is not UTF-8 text (byte 0xff at offset 18)"


def test_a_file_given_by_mistake_is_not_echoed_back(tmp_path):
    """A secrets file or .netrc given as --config: its keys may be secrets; the message goes to logs."""
    path = tmp_path / "c.yaml"
    path.write_text("machine: api.example.com\nlogin: someone\npassword: hunter2\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    message = str(err.value)
    assert "does not look like a SpecRoute configuration" in message and "server, pools" in message
    assert "hunter2" not in message and "password" not in message
    # among our sections, unknown keys are named, but a handful and each cut short
    long_key = "k" * 500
    path.write_text(POOLS_YAML + "".join(f"extra{i}: v\n" for i in range(30)) + f"{long_key}: v\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    message = str(err.value)
    assert "extra0: Extra inputs are not permitted" in message and message.endswith("and 19 more")
    assert long_key not in message and len(message) < 1500


POOLS_YAML = """\
pools:
  speculative: &pool
    endpoints: [{name: s0, url: "http://127.0.0.1:9001"}]
    models: [m]
  baseline:
    <<: *pool
    endpoints: [{name: b0, url: "http://127.0.0.1:9002"}]
"""


def test_a_key_written_twice_is_refused_with_its_line(tmp_path):
    """YAML keeps the last of two equal keys without a word: a second ``auth`` without keys would leave
    the gateway open. A merge (``<<``) is no repeat: the keys written beside it override it by design."""
    path = tmp_path / "c.yaml"
    path.write_text(POOLS_YAML)
    assert load_settings(path).pools.baseline.endpoints[0].name == "b0"
    path.write_text(f"auth:\n  api_keys: [client-secret]\n{POOLS_YAML}auth:\n  metrics_public: true\n")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    assert str(err.value) == (
        f"configuration {path}:10:1 is not valid YAML: the key 'auth' is given twice (first on line 1);"
        " one would be lost"
    )
    path.write_text(POOLS_YAML.replace("    models: [m]\n", "    models: [m]\n    models: [other]\n"))
    with pytest.raises(ConfigError, match=r":5:5 is not valid YAML: the key 'models' is given twice"):
        load_settings(path)


def test_serve_command_fails_with_the_field_name(tmp_path):
    import subprocess
    import sys

    path = _write(tmp_path, {**BASE, "routing": {"strategy": "fastest"}})
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 2
    assert "routing.strategy" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_example_configs_load():
    root = Path(__file__).parents[2] / "deploy" / "config"
    files = sorted(root.glob("*.yaml"))
    assert files, "deploy/config has example configurations"
    for path in files:
        load_settings(path)


def test_precedence_flag_over_environment_over_file(tmp_path, monkeypatch):
    data = {**BASE, "server": {"host": "10.0.0.1", "port": 7000}, "routing": {"margin": 0.3}}
    path = _write(tmp_path, data)
    # the file alone
    s = load_settings(path)
    assert (s.server.host, s.server.port, s.routing.margin) == ("10.0.0.1", 7000, 0.3)
    # the environment beats the file
    monkeypatch.setenv("SPECROUTE_SERVER__HOST", "0.0.0.0")
    s = load_settings(path)
    assert (s.server.host, s.server.port) == ("0.0.0.0", 7000)
    # a flag beats the environment, and leaves the rest of its section alone
    s = load_settings(path, {"server": {"host": "127.0.0.1"}})
    assert (s.server.host, s.server.port, s.routing.margin) == ("127.0.0.1", 7000, 0.3)
    # the default is the last resort
    assert load_settings(_write(tmp_path, BASE)).server.port == 8000


@pytest.mark.parametrize(
    ("variable", "value", "key"),
    [
        # empty: read as unset, which would open /admin/* to any API key (or to anyone) and /metrics
        ("SPECROUTE_AUTH__ADMIN_KEY", "", "auth.admin_key"),
        ("SPECROUTE_AUTH__METRICS_KEY", "", "auth.metrics_key"),
        # a key no client can send: every request would be refused
        ("SPECROUTE_AUTH__API_KEYS", '["k1", ""]', "auth.api_keys"),
        ("SPECROUTE_AUTH__API_KEYS", '["k1 "]', "auth.api_keys"),
        # a header carries printable ASCII: the bytes a client sends could never equal such a key
        ("SPECROUTE_AUTH__API_KEYS", '["k1", "caf\\u00e9"]', "auth.api_keys"),
        ("SPECROUTE_AUTH__ADMIN_KEY", "admin\nkey", "auth.admin_key"),
        ("SPECROUTE_AUTH__METRICS_KEY", "scrape\u2019key", "auth.metrics_key"),
    ],
)
def test_a_key_no_client_can_send_is_refused(tmp_path, monkeypatch, variable, value, key):
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, BASE))
    assert str(err.value).startswith(f"invalid configuration: {key}: ")
    assert f"(from environment variable {variable})" in str(err.value)


@pytest.mark.parametrize(
    ("env", "value", "where"),
    [
        ("SPECROUTE_ROUTING__STRATEGY", "fastest", "environment variable SPECROUTE_ROUTING__STRATEGY"),
        ("SPECROUTE_AUTH__API_KEYS", "k1", "environment"),
    ],
)
def test_errors_name_the_environment_not_the_file(tmp_path, monkeypatch, env, value, where):
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigError) as err:
        load_settings(_write(tmp_path, BASE))
    assert where in str(err.value)
    assert str(tmp_path) not in str(err.value)


def test_errors_name_the_flag_and_the_file(tmp_path):
    with pytest.raises(ConfigError, match=r"server.port.*\(from command line\)"):
        load_settings(_write(tmp_path, BASE), {"server": {"port": -5}})
    path = _write(tmp_path, {**BASE, "routing": {"strategy": "fastest"}})
    with pytest.raises(ConfigError, match=rf"routing.strategy.*\(from {path}\)"):
        load_settings(path)


def test_serve_flag_beats_environment(tmp_path):
    """`specroute serve --host` wins over SPECROUTE_SERVER__HOST (the image sets the variable)."""
    import subprocess
    import sys

    path = _write(tmp_path, BASE)
    env = {**__import__("os").environ, "SPECROUTE_SERVER__PORT": "not-a-port"}
    proc = subprocess.run(
        [sys.executable, "-m", "gateway", "serve", "--config", str(path), "--port", "-1"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    # the flag's value is the one validated (and rejected), not the environment's
    assert proc.returncode == 2
    assert "server.port" in proc.stderr and "command line" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_rule_across_keys_names_the_sources_of_those_keys(tmp_path, monkeypatch):
    """A section's own rule is blamed on whoever set the keys it compares, not on the whole section."""
    path = _write(tmp_path, BASE)
    monkeypatch.setenv("SPECROUTE_SERVER__TLS_KEY_FILE", "key.pem")
    with pytest.raises(ConfigError) as err:
        load_settings(path, {"server": {"port": 9000}})  # a flag in the same section, for another key
    assert "need `tls_cert_file` (from environment variable SPECROUTE_SERVER__TLS_KEY_FILE)" in str(err.value)
    monkeypatch.delenv("SPECROUTE_SERVER__TLS_KEY_FILE")

    in_file = _write(tmp_path, {**BASE, "server": {"tls_key_file": "key.pem"}})
    with pytest.raises(ConfigError) as err:
        load_settings(in_file, {"server": {"port": 9000}})
    assert f"need `tls_cert_file` (from {in_file})" in str(err.value)

    monkeypatch.setenv("SPECROUTE_POOLS__BASELINE__MODELS", '["other"]')
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    # the file gave the speculative pool's models, the environment the baseline's
    assert f"(from environment variable SPECROUTE_POOLS__BASELINE__MODELS and {path})" in str(err.value)


# what the project's own tools, its Dockerfile and Kubernetes (for the Service named specroute) set
ACCEPTED_ENV = {
    "SPECROUTE_RUN_TOKEN": "t",
    "SPECROUTE_PARENT_PID": "1",
    "SPECROUTE_CONFIG_FILE": "/etc/specroute/config.yaml",
    "SPECROUTE_GIT_REVISION": "abc1234",
    "SPECROUTE_WORKERS": "2",
    "SPECROUTE_SRC": "/src",
    "SPECROUTE_VLLM_HOME": "/cache",
    "SPECROUTE_SERVICE_HOST": "10.0.0.11",
    "SPECROUTE_SERVICE_PORT": "8000",
    "SPECROUTE_SERVICE_PORT_HTTP": "8000",
    "SPECROUTE_PORT": "tcp://10.0.0.11:8000",
    "SPECROUTE_PORT_8000_TCP": "tcp://10.0.0.11:8000",
    "SPECROUTE_PORT_8000_TCP_ADDR": "10.0.0.11",
    "SPECROUTE_UPSTREAM_KEY": "secret",  # named by the file's api_key_env
    "SPECROUTE_BASELINE_KEY": "secret",  # named by an api_key_env set from the environment
    "SPECROUTE_POOLS__BASELINE__API_KEY_ENV": "SPECROUTE_BASELINE_KEY",
}


@pytest.mark.parametrize(
    ("variable", "hint"),
    [
        ("SPECROUTE_ROUTNG__STRATEGY", " (did you mean SPECROUTE_ROUTING__STRATEGY?)"),
        ("SPECROUTE_SERVER_PORT", " (did you mean SPECROUTE_SERVER__PORT?)"),
        ("SPECROUTE_BOGUS", ""),
    ],
)
def test_a_variable_that_sets_no_setting_is_refused(tmp_path, monkeypatch, variable, hint):
    data = {**BASE, "pools": {**BASE["pools"], "speculative": {**BASE["pools"]["speculative"]}}}
    data["pools"]["speculative"]["api_key_env"] = "SPECROUTE_UPSTREAM_KEY"
    path = _write(tmp_path, data)
    for name, value in ACCEPTED_ENV.items():
        monkeypatch.setenv(name, value)
    assert load_settings(path).pools.baseline.api_key_env == "SPECROUTE_BASELINE_KEY"
    monkeypatch.setenv(variable, "always-baseline")
    with pytest.raises(ConfigError) as err:
        load_settings(path)
    message = str(err.value)
    assert message.startswith(
        f"invalid configuration: environment variable {variable} sets no setting{hint};"
    )
    assert "server, pools, timeouts" in message and "routing" in message
    assert not [name for name in ACCEPTED_ENV if name in message]


def test_the_projects_own_variables_are_the_ones_accepted():
    from gateway.config import NON_SETTING_ENV
    from gateway.observability import REVISION_ENV
    from gateway.server import CONFIG_ENV
    from gateway.types import RUN_TOKEN_ENV

    assert {RUN_TOKEN_ENV, CONFIG_ENV, REVISION_ENV, "SPECROUTE_PARENT_PID"} <= NON_SETTING_ENV
    assert not [name for name in NON_SETTING_ENV if "__" in name], "a setting's variable is no exception"


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9001/v1", "http://127.0.0.1:9001/v1/", "http://h:9/prefix/v1"]
)
def test_an_endpoint_url_with_the_openai_clients_v1_is_refused_with_the_fix(tmp_path, url):
    """The OpenAI clients' base_url habit: the gateway adds /v1/... (and /health) itself, and such an
    endpoint only ever failed its checks ('GET http://.../v1/health: answered 404')."""
    data = yaml.safe_load(yaml.safe_dump(BASE))
    data["pools"]["speculative"]["endpoints"][0]["url"] = url
    with pytest.raises(ConfigError, match=r"pools.speculative.endpoints.0.url: .*drop the trailing `/v1`"):
        load_settings(_write(tmp_path, data))
    data["pools"]["speculative"]["endpoints"][0]["url"] = url.replace("v1", "vllm")  # a path prefix is fine
    assert load_settings(_write(tmp_path, data)).pools.speculative.endpoints[0].base_url.endswith("/vllm")
