"""``specroute health``, the container's health check: /health where the configuration says the gateway is.

A real gateway (the protocol and options ``specroute serve`` gives uvicorn) on 127.0.0.1, plain and https,
with and without client certificates; the command reads the same kind of file (and environment) it would.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from gateway.cli import run
from gateway.stack import demo_config, free_port
from tests.gateway.test_connections import NOWHERE, serving


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The gateway's certificate and key; a CA for client certificates and a client certificate it signed."""
    d = tmp_path_factory.mktemp("health-tls")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    server = ca.issue_cert("127.0.0.1")
    server.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    server.private_key_pem.write_to_path(str(d / "key.pem"))
    clients = trustme.CA()
    clients.cert_pem.write_to_path(str(d / "clients.pem"))
    client = clients.issue_cert("probe@specroute.test")
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    yield {
        "ca": d / "ca.pem",
        "cert": d / "cert.pem",
        "key": d / "key.pem",
        "clients": d / "clients.pem",
        "client": d / "client.pem",
    }


def _config(tmp_path: Path, port: int, **server: Any) -> Path:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(demo_config([NOWHERE], [NOWHERE], port, extra={"server": server})))
    return path


def test_the_check_follows_the_configured_port_and_the_environment(tmp_path, monkeypatch, capsys):
    with serving() as port:
        assert run(["health", "--config", str(_config(tmp_path, port))]) == 0
        # the port given in the environment wins over the file's, as it does for the server
        monkeypatch.setenv("SPECROUTE_SERVER__PORT", str(port))
        assert run(["health", "--config", str(_config(tmp_path, free_port()))]) == 0
        monkeypatch.delenv("SPECROUTE_SERVER__PORT")
        assert run(["health", "--config", str(_config(tmp_path, free_port()))]) == 1
        assert "connection refused" in capsys.readouterr().err.lower()


def test_without_a_file_the_check_reads_the_environment_and_needs_no_pools(monkeypatch, capsys):
    """Only ``server`` says where the gateway listens: a container configured by its environment alone
    (and the option is optional) must not be told that its pools are missing."""
    for name in [n for n in os.environ if n.startswith("SPECROUTE_")]:
        monkeypatch.delenv(name)
    with serving() as port:
        monkeypatch.setenv("SPECROUTE_SERVER__PORT", str(port))
        assert run(["health"]) == 0
    monkeypatch.setenv("SPECROUTE_SERVER__PORT", "not-a-port")
    assert run(["health"]) == 1
    err = capsys.readouterr().err
    assert "server.port" in err and "SPECROUTE_SERVER__PORT" in err and "pools" not in err


def test_an_ipv6_address_is_written_in_brackets(tmp_path, capsys):
    with serving(host="::1") as port:
        assert run(["health", "--config", str(_config(tmp_path, port, host="::1"))]) == 0
    assert run(["health", "--config", str(_config(tmp_path, free_port(), host="::"))]) == 1
    assert "GET http://[::1]:" in capsys.readouterr().err


def test_the_check_speaks_https_when_the_gateway_serves_it(tmp_path, certs, capsys):
    tls = {"tls_cert_file": str(certs["cert"]), "tls_key_file": str(certs["key"])}
    with serving(**tls) as port:
        assert run(["health", "--config", str(_config(tmp_path, port, **tls))]) == 0
        # told plain http, the same probe fails: the gateway refuses it
        assert run(["health", "--config", str(_config(tmp_path, port))]) == 1
        assert f"http://127.0.0.1:{port}/health" in capsys.readouterr().err


def test_under_mutual_tls_the_check_shows_a_client_certificate(tmp_path, certs, capsys):
    tls = {
        "tls_cert_file": str(certs["cert"]),
        "tls_key_file": str(certs["key"]),
        "tls_client_ca_file": str(certs["clients"]),
    }
    with serving(**tls) as port:
        config = str(_config(tmp_path, port, **tls))
        assert run(["health", "--config", config, "--cert", str(certs["client"])]) == 0
        # the gateway's own certificate is not one the client CAs signed here: refused, and said so
        assert run(["health", "--config", config]) == 1
        assert f"https://127.0.0.1:{port}/health" in capsys.readouterr().err
    # where the client CAs include the one that signed the gateway's certificate, that certificate does
    tls["tls_client_ca_file"] = str(certs["ca"])
    with serving(**tls) as port:
        assert run(["health", "--config", str(_config(tmp_path, port, **tls))]) == 0


def test_a_port_the_system_chooses_cannot_be_checked(tmp_path, capsys):
    assert run(["health", "--config", str(_config(tmp_path, 0))]) == 1
    assert "server.port is 0" in capsys.readouterr().err


def test_a_configuration_it_cannot_read_fails_the_check_with_1_not_the_reserved_2(tmp_path, capsys):
    """Docker's HEALTHCHECK reserves exit status 2: a configuration edited wrong in a running container
    is an unhealthy check (1), said in one line."""
    bad = tmp_path / "gw.yaml"
    bad.write_text("routing: {strategy: adaptiv}\n")
    assert run(["health", "--config", str(bad)]) == 1
    assert "routing.strategy" in capsys.readouterr().err
