"""Upstream API keys go to the endpoint they belong to, even where two endpoints share an origin."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import httpx
import orjson
import pytest
from yarl import URL

from gateway.config import ConfigError, Settings, load_settings
from gateway.observability import Metrics
from gateway.upstream.credentials import FOUND_MAX, UpstreamKeys
from gateway.upstream.forward import Upstreams
from gateway.upstream.pool import Endpoint, Pool
from tests.upstream.scripted import read_request, stream_events
from tests.upstream.wiring import serving_gateway

MODELS = orjson.dumps({"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]})


@asynccontextmanager
async def proxy() -> AsyncIterator[tuple[int, list[tuple[str, str]]]]:
    """One origin in front of two vLLM servers (``/spec/...``, ``/base/...``); records each call's path
    and ``Authorization``."""
    seen: list[tuple[str, str]] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head, _ = await read_request(reader)
        lines = head.decode().split("\r\n")
        path = lines[0].split(" ")[1]
        auth = next(
            (ln.split(":", 1)[1].strip() for ln in lines if ln.lower().startswith("authorization:")), ""
        )
        seen.append((path, auth))
        if "/v1/completions" in path:  # streamed, whether the client asked for a stream or not
            kind, body = b"text/event-stream", b"".join(stream_events())
        else:
            kind, body = b"application/json", MODELS if path.endswith("/v1/models") else b"{}"
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: %s\r\ncontent-length: %d\r\nconnection: close\r\n\r\n%s"
            % (kind, len(body), body)
        )
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], seen
    finally:
        server.close()
        await server.wait_closed()


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The speculative pool's key in the environment (UPKEY), the baseline's in this file."""
    monkeypatch.setenv("UPKEY", "env-secret")
    path = tmp_path / "key"
    path.write_text("file-secret\n")
    return path


def _settings(port: int, key_file: Path) -> Settings:
    origin = f"http://127.0.0.1:{port}"
    speculative = {"api_key_env": "UPKEY", "endpoints": [{"name": "spec-0", "url": f"{origin}/spec"}]}
    baseline = {"endpoints": [{"name": "base-0", "url": f"{origin}/base", "api_key_file": str(key_file)}]}
    return load_settings(
        overrides={
            "pools": {
                "speculative": {**speculative, "models": ["m"]},
                "baseline": {**baseline, "models": ["m"]},
            },
            "health": {"interval_s": 0.05},
            "routing": {"scrape_interval_s": 0.05},
        }
    )


async def test_two_endpoints_at_one_origin_each_get_their_own_key_on_every_call(
    key_file: Path,
) -> None:
    wanted = {"/spec": "Bearer env-secret", "/base": "Bearer file-secret"}
    calls = {"/health", "/metrics", "/v1/models", "/v1/completions"}
    async with proxy() as (port, seen), serving_gateway(_settings(port, key_file)) as url:
        async with httpx.AsyncClient(base_url=url) as client:
            for pool in ("speculative", "baseline"):
                body = {"model": "m", "prompt": "hi", "max_tokens": 2}
                answer = await client.post("/v1/completions", json=body, headers={"x-specroute-pool": pool})
                assert answer.status_code == 200, answer.text
            assert (await client.get("/v1/models")).json()["data"][0]["owned_by"] == "vllm"

        def every_call_seen() -> bool:
            return all({p.removeprefix(b) for p, _ in seen if p.startswith(b)} >= calls for b in wanted)

        async with asyncio.timeout(10):
            while not every_call_seen():  # noqa: ASYNC110 - health checks and scrapes run on their own clocks
                await asyncio.sleep(0.02)
    for path, auth in seen:
        assert auth == wanted[path[:5]], path


def test_a_longer_base_url_wins_and_a_discovered_endpoint_gets_its_pools_key(
    key_file: Path,
) -> None:
    settings = _settings(9, key_file)
    pools = {"speculative": Pool("speculative", ["m"]), "baseline": Pool("baseline", ["m"])}
    keys = UpstreamKeys(settings, pools)

    def key(url: str) -> str | None:
        found = keys.key_for(URL(url))
        return None if found is None else found.get_secret_value()

    assert key("http://127.0.0.1:9/spec/v1/completions") == "env-secret"
    assert key("http://127.0.0.1:9/base/health") == "file-secret"
    assert key("http://127.0.0.1:9/specx/health") is None  # a path boundary, not a string prefix
    assert key("http://10.0.0.5:8000/health") is None
    pools["baseline"].endpoints = [Endpoint("baseline", "baseline-1", "http://10.0.0.5:8000")]
    assert key("http://10.0.0.5:8000/health") is None  # the baseline pool names no key of its own
    # the address moves to the speculative pool: its key, not an answer remembered from before
    pools["baseline"].endpoints = []
    pools["speculative"].endpoints = [Endpoint("speculative", "speculative-1", "http://10.0.0.5:8000")]
    assert key("http://10.0.0.5:8000/health") == "env-secret"


def test_one_url_with_two_different_keys_stops_start_up(
    key_file: Path,
) -> None:
    same = {"endpoints": [{"name": "e", "url": "http://127.0.0.1:9/v"}], "models": ["m"]}
    pools = {
        "speculative": {**same, "api_key_env": "UPKEY"},
        "baseline": {**same, "api_key_file": str(key_file)},
    }
    with pytest.raises(ConfigError, match=r"pools\.baseline\.endpoints\.0: pools\.speculative\.endpoints\.0"):
        UpstreamKeys(load_settings(overrides={"pools": pools}), {})
    key_file.write_text("env-secret")  # the same key twice is one server's key
    pools["baseline"] = {**same}  # and a listing without one gets the key the other names
    keys = UpstreamKeys(load_settings(overrides={"pools": pools}), {})
    found = keys.key_for(URL("http://127.0.0.1:9/v/health"))
    assert found is not None and found.get_secret_value() == "env-secret"


@pytest.mark.parametrize(
    ("source", "text", "problem"),
    [
        ("file", "key-text\nsecond-line\n", "holds a line break"),  # a Secret of two lines
        ("env", "key-text\u2019s", "holds a character outside ASCII"),  # a pasted quotation mark
        ("env", "key-text\tmore", "holds a control character"),
    ],
)
def test_a_key_no_header_can_carry_stops_start_up_naming_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str, text: str, problem: str
) -> None:
    """Taken, such a key would fail every call to the upstream inside the HTTP client: each request a
    500 with no failover, each health check a traceback."""
    if source == "file":
        (tmp_path / "key").write_text(text)
        where: dict[str, str] = {"api_key_file": str(tmp_path / "key")}
    else:
        monkeypatch.setenv("UPKEY", text)
        where = {"api_key_env": "UPKEY"}
    pool = {"endpoints": [{"name": "e", "url": "http://127.0.0.1:9"}], "models": ["m"]}
    settings = load_settings(overrides={"pools": {"speculative": pool, "baseline": {**pool, **where}}})
    with pytest.raises(ConfigError) as err:
        UpstreamKeys(settings, {})
    (field,) = where
    message = str(err.value)
    assert message.startswith(f"pools.baseline.{field}: ") and problem in message
    assert "key-text" not in message, "a key is never shown"


def test_an_empty_key_variable_is_called_empty_not_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    pool = {"endpoints": [{"name": "e", "url": "http://127.0.0.1:9"}], "models": ["m"]}
    settings = load_settings(
        overrides={"pools": {"speculative": pool, "baseline": {**pool, "api_key_env": "UPKEY"}}}
    )
    monkeypatch.setenv("UPKEY", "  ")
    with pytest.raises(
        ConfigError, match=r"^pools\.baseline\.api_key_env: environment variable UPKEY is empty$"
    ):
        UpstreamKeys(settings, {})
    monkeypatch.delenv("UPKEY")
    with pytest.raises(ConfigError, match=r"environment variable UPKEY is not set$"):
        UpstreamKeys(settings, {})


async def test_an_address_moved_to_the_other_pool_is_sent_with_that_pools_key(
    key_file: Path,
) -> None:
    """The forwarding client keeps each endpoint's ``Authorization``: an address discovery moves to the
    other pool (a Pod's IP given to another Pod) is another endpoint, whose key is looked up anew."""
    settings = load_settings(
        overrides={
            "pools": {
                "speculative": {"api_key_env": "UPKEY", "discovery": {"hostname": "spec"}, "models": ["m"]},
                "baseline": {
                    "api_key_file": str(key_file),
                    "discovery": {"hostname": "base"},
                    "models": ["m"],
                },
            }
        }
    )
    pools = {"speculative": Pool("speculative", ["m"]), "baseline": Pool("baseline", ["m"])}
    keys = UpstreamKeys(settings, pools)
    async with aiohttp.ClientSession() as session, httpx.AsyncClient() as client:
        upstreams = Upstreams(settings, client, session, pools, Metrics(), keys)
        before = Endpoint("baseline", "baseline-1", "http://10.0.0.5:8000")
        pools["baseline"].endpoints = [before]
        target = upstreams._target(before)
        assert target is not None and target.authorization == "Bearer file-secret"
        pools["baseline"].endpoints = []
        after = Endpoint("speculative", "speculative-1", "http://10.0.0.5:8000")
        pools["speculative"].endpoints = [after]
        target = upstreams._target(after)
        assert target is not None and target.authorization == "Bearer env-secret"


def test_keys_remembered_for_call_paths_stay_bounded(key_file: Path) -> None:
    """A passed-through call's path is the client's to choose: one remembered key per path, bounded."""
    pools = {"speculative": Pool("speculative", ["m"]), "baseline": Pool("baseline", ["m"])}
    pools["speculative"].endpoints = [Endpoint("speculative", "speculative-1", "http://10.0.0.5:8000")]
    keys = UpstreamKeys(_settings(9, key_file), pools)
    for i in range(2 * FOUND_MAX):
        found = keys.key_for(URL(f"http://10.0.0.5:8000/v1/anything/{i}"))
        assert found is not None and found.get_secret_value() == "env-secret"
    assert len(keys._found) <= FOUND_MAX
