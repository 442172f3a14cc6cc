"""TLS on both sides: ``https://`` endpoints (the CAs the gateway trusts, the certificate it shows, what it
says when TLS fails) and the gateway serving https itself (``server.tls_*``).

The upstreams are the scripted raw-socket servers (:mod:`tests.upstream.scripted`), behind real TLS
where it is under test, with a throw-away CA (``trustme``); the gateway is the whole app on uvicorn
with the options ``specroute serve`` gives it; the client the real ``openai`` SDK. Forwarding, health
checks and ``/v1/models`` all go through the one connector, so all are checked.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trustme

from gateway.config import ConfigError, ServerConfig, Settings, UpstreamTLSConfig, load_settings
from gateway.server import uvicorn_options
from gateway.tls import check_server
from gateway.tls import upstream_context as context
from gateway.upstream import health
from tests.upstream.scripted import Script, Scripted, serving
from tests.upstream.wiring import serving_gateway


@pytest.fixture(scope="module")
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture(scope="module")
def files(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The CA's certificate, and a client certificate it signed with its key, as PEM files."""
    d = tmp_path_factory.mktemp("tls")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client = ca.issue_cert("gateway@specroute.test")
    client.cert_chain_pems[0].write_to_path(str(d / "client.pem"))
    client.private_key_pem.write_to_path(str(d / "client.key"))
    yield {"ca": d / "ca.pem", "cert": d / "client.pem", "key": d / "client.key"}


def _server_context(
    ca: trustme.CA, require_client_cert: bool = False, host: str = "127.0.0.1"
) -> ssl.SSLContext:
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(host).configure_cert(ctx)
    if require_client_cert:
        ca.configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def _settings(servers: list[Scripted], tls: dict[str, Any]) -> Settings:
    def pool(names: list[Scripted]) -> dict[str, Any]:
        return {"endpoints": [{"name": s.name, "url": s.url} for s in names], "models": ["m"]}

    return load_settings(
        overrides={
            "pools": {"speculative": pool(servers[:1]), "baseline": pool(servers[1:])},
            "upstream_tls": tls,
            "logging": {"access_log": False},
            "health": {"interval_s": 60},
        }
    )


@asynccontextmanager
async def _gateway(server_tls: ssl.SSLContext, tls: dict[str, Any]) -> AsyncIterator[openai.AsyncOpenAI]:
    """One speculative and one baseline https upstream that always answer, and a client of the gateway."""
    async with serving(Script(["ok"]), "spec-0", "base-0", tls=server_tls) as servers:
        assert all(s.url.startswith("https://") for s in servers)
        async with (
            serving_gateway(_settings(servers, tls)) as url,
            openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=30) as client,
        ):
            yield client


async def _answers(client: openai.AsyncOpenAI) -> None:
    """Both pools answer through TLS, a stream and a whole answer alike, and the models list too."""
    for pool in ("speculative", "baseline"):
        headers = {"x-specroute-pool": pool}  # the forced-pool header: one request to each pool
        answer = await client.completions.create(model="m", prompt="hi", max_tokens=2, extra_headers=headers)
        assert answer.choices[0].text == "Hello there"
        stream = await client.completions.create(
            model="m", prompt="hi", max_tokens=2, stream=True, extra_headers=headers
        )
        assert "".join([c.choices[0].text async for c in stream if c.choices]) == "Hello there"
    assert [m.id async for m in client.models.list()] == ["m"]


async def test_an_upstream_signed_by_the_configured_ca_is_trusted(ca, files):
    async with _gateway(_server_context(ca), {"ca_file": str(files["ca"])}) as client:
        await _answers(client)


async def test_an_untrusted_certificate_is_refused_and_the_health_log_says_so(ca, caplog):
    """Without the CA the upstream's certificate is not trusted: no request reaches it, and the log
    says why (before, the health check called it a time-out)."""
    with caplog.at_level(logging.WARNING, logger="specroute.health"):
        async with _gateway(_server_context(ca), {}) as client:
            with pytest.raises(openai.APIStatusError) as e:
                await client.completions.create(model="m", prompt="hi", max_tokens=2)
            assert e.value.status_code == 503
    unhealthy = [r.getMessage() for r in caplog.records if "unhealthy" in r.getMessage()]
    assert unhealthy and all("TLS certificate is not trusted" in m for m in unhealthy)
    assert not any("within" in m for m in unhealthy)


async def test_a_certificate_for_another_host_is_said_to_be_one_not_an_untrusted_one(ca, files, caplog):
    """Signed by the trusted CA but naming another host: the fix is the endpoint's URL (or the
    certificate), not a CA file."""
    with caplog.at_level(logging.WARNING, logger="specroute.health"):
        async with _gateway(_server_context(ca, host="vllm.specroute.test"), {"ca_file": str(files["ca"])}):
            pass
    unhealthy = [r.getMessage() for r in caplog.records if "unhealthy" in r.getMessage()]
    assert unhealthy and all("TLS certificate does not name the host" in m for m in unhealthy)
    assert not any("ca_file" in m for m in unhealthy)


async def test_verification_can_be_turned_off(ca):
    async with _gateway(_server_context(ca), {"verify": False}) as client:
        await _answers(client)


async def test_an_upstream_that_asks_for_a_client_certificate_gets_the_configured_one(ca, files):
    server = _server_context(ca, require_client_cert=True)
    tls = {"ca_file": str(files["ca"]), "cert_file": str(files["cert"]), "key_file": str(files["key"])}
    async with _gateway(server, tls) as client:
        await _answers(client)
    async with _gateway(server, {"ca_file": str(files["ca"])}) as client:  # no certificate: refused
        with pytest.raises(openai.APIStatusError) as e:
            await client.completions.create(model="m", prompt="hi", max_tokens=2)
        assert e.value.status_code == 503


def test_files_that_cannot_be_used_stop_start_up_naming_the_field(files, tmp_path):
    with pytest.raises(ConfigError, match=r"upstream_tls\.ca_file: cannot load .*missing\.pem"):
        context(UpstreamTLSConfig(ca_file=tmp_path / "missing.pem"))
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"upstream_tls\.ca_file"):
        context(UpstreamTLSConfig(ca_file=not_pem))
    with pytest.raises(ConfigError, match=r"upstream_tls\.cert_file: cannot load .*client\.pem"):
        context(UpstreamTLSConfig(cert_file=files["cert"]))  # the key is in neither file
    with pytest.raises(ConfigError, match=r"key_file. needs .cert_file"):
        load_settings(overrides={"pools": _pools(), "upstream_tls": {"key_file": str(files["key"])}})


def test_without_settings_the_system_cas_check_upstreams():
    ctx = context(UpstreamTLSConfig())
    assert ctx.verify_mode == ssl.CERT_REQUIRED and ctx.check_hostname
    off = context(UpstreamTLSConfig(verify=False))
    assert off.verify_mode == ssl.CERT_NONE and not off.check_hostname


def test_a_tls_failure_other_than_trust_is_named():
    error = httpx.ConnectError("handshake")
    error.__cause__ = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number")
    error.__cause__.reason = "WRONG_VERSION_NUMBER"
    assert health.failure(error, 2.0) == "TLS failed: WRONG_VERSION_NUMBER"


def _pools() -> dict[str, Any]:
    return {
        "speculative": {"endpoints": [{"name": "s", "url": "https://127.0.0.1:1"}], "models": ["m"]},
        "baseline": {"endpoints": [{"name": "b", "url": "https://127.0.0.1:2"}], "models": ["m"]},
    }


@asynccontextmanager
async def _https_gateway(
    server_tls: dict[str, Any], client: ssl.SSLContext
) -> AsyncIterator[openai.AsyncOpenAI]:
    """The gateway serving https (``server`` settings ``server_tls``) in front of plain upstreams, and an
    SDK client that connects with ``client``."""
    async with serving(Script(["ok"]), "spec-0", "base-0") as servers:
        settings = _settings(servers, {})
        settings = settings.model_copy(update={"server": ServerConfig(**server_tls)})
        async with (
            serving_gateway(settings, **uvicorn_options(settings)) as url,
            openai.AsyncOpenAI(
                base_url=url + "/v1",
                api_key="none",
                max_retries=0,
                timeout=30,
                http_client=httpx.AsyncClient(verify=client),
            ) as sdk,
        ):
            assert url.startswith("https://")
            yield sdk


@pytest.fixture(scope="module")
def served(ca: trustme.CA, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The gateway's certificate for 127.0.0.1 and its key, apart and in one file."""
    d = tmp_path_factory.mktemp("served")
    cert = ca.issue_cert("127.0.0.1")
    cert.cert_chain_pems[0].write_to_path(str(d / "cert.pem"))
    cert.private_key_pem.write_to_path(str(d / "key.pem"))
    cert.private_key_and_cert_chain_pem.write_to_path(str(d / "both.pem"))
    return {"cert": d / "cert.pem", "key": d / "key.pem", "both": d / "both.pem"}


def _trusting(ca: trustme.CA, client_cert: bool = False) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ca.configure_trust(ctx)
    if client_cert:
        ca.issue_cert("client@specroute.test").configure_cert(ctx)
    return ctx


async def test_the_gateway_serves_https_with_its_certificate(ca, served):
    for server_tls in (
        {"tls_cert_file": str(served["cert"]), "tls_key_file": str(served["key"])},
        {"tls_cert_file": str(served["both"])},  # the key in the certificate's file
    ):
        async with _https_gateway(server_tls, _trusting(ca)) as client:
            await _answers(client)  # streams go out through the gateway's own writer, over TLS


async def test_a_caller_without_a_client_certificate_is_refused_when_one_is_required(ca, files, served):
    server_tls = {
        "tls_cert_file": str(served["cert"]),
        "tls_key_file": str(served["key"]),
        "tls_client_ca_file": str(files["ca"]),
    }
    async with _https_gateway(server_tls, _trusting(ca, client_cert=True)) as client:
        await _answers(client)
    async with _https_gateway(server_tls, _trusting(ca)) as client:
        with pytest.raises(openai.APIConnectionError):
            await client.completions.create(model="m", prompt="hi", max_tokens=2)


def test_server_files_that_cannot_be_used_stop_start_up_naming_the_field(files, served, tmp_path):
    check_server(ServerConfig())  # plain http: nothing to load
    check_server(ServerConfig(tls_cert_file=served["both"]))
    with pytest.raises(ConfigError, match=r"server\.tls_cert_file: cannot load .*missing\.pem"):
        check_server(ServerConfig(tls_cert_file=tmp_path / "missing.pem"))
    with pytest.raises(ConfigError, match=r"server\.tls_cert_file: cannot load .*cert\.pem"):
        check_server(ServerConfig(tls_cert_file=served["cert"]))  # no key anywhere
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"server\.tls_client_ca_file"):
        check_server(ServerConfig(tls_cert_file=served["both"], tls_client_ca_file=not_pem))
    with pytest.raises(ValueError, match="need `tls_cert_file`"):
        ServerConfig(tls_key_file=served["key"])
