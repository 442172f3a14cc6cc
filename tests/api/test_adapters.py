"""vLLM's LoRA adapter routes: the operator's (``auth.admin_key``), sent to every endpoint of both pools with
each one's own key, and answered with what the fleet did."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from tests.api.conftest import API_KEY, InProcess, metric, read_body

ADMIN = {"authorization": "Bearer admin-key"}
CLIENT = {"authorization": f"Bearer {API_KEY}"}
LOAD, UNLOAD = "/v1/load_lora_adapter", "/v1/unload_lora_adapter"
KEYS = ("spec-secret", "base-secret")  # each pool's upstream key, as its vLLM's --api-key


class Adapters:
    """vLLM 0.32's adapter routes (``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``) beside an emulator: the same
    statuses, bodies and content types (a success is plain text with no content type; an error is
    OpenAI-shaped JSON); ``fail`` makes every adapter request a server error."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.loaded: dict[str, str] = {}
        self.fail = False

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] not in (LOAD, UNLOAD):
            await self.inner(scope, receive, send)
            return
        body = await read_body(receive)
        status, content, json = self.handle(scope["path"], orjson.loads(body))
        headers = [(b"content-length", b"%d" % len(content))]
        if json:
            headers.append((b"content-type", b"application/json"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": content})

    def handle(self, path: str, request: dict[str, Any]) -> tuple[int, bytes, bool]:
        name = request.get("lora_name")
        if self.fail:
            return 500, b"Traceback: /srv/secret/path", False
        if path == LOAD:
            if name in self.loaded:
                message = f"The lora adapter '{name}' has already been loaded."
                return _error(400, "InvalidUserInput", message)
            self.loaded[name] = request["lora_path"]
            return 200, f"Success: LoRA adapter '{name}' added successfully.".encode(), False
        if name not in self.loaded:
            return _error(404, "NotFoundError", f"The lora adapter '{name}' cannot be found.")
        del self.loaded[name]
        return 200, f"Success: LoRA adapter '{name}' removed successfully.".encode(), False


def _error(status: int, kind: str, message: str) -> tuple[int, bytes, bool]:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return status, orjson.dumps(body), True


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[InProcess]:
    """API keys and an admin key; each pool's vLLM started with its own ``--api-key``."""
    keys = tmp_path_factory.mktemp("keys")
    pools = {}
    for pool, key in zip(("speculative", "baseline"), KEYS, strict=True):
        (keys / pool).write_text(key)
        pools[pool] = {"api_key_file": str(keys / pool)}
    auth = {"api_keys": [API_KEY], "admin_key": "admin-key"}
    with InProcess({"auth": auth, "pools": pools, "logging": {"access_log": False}}) as stack:
        for upstream, key in zip(stack.upstreams, KEYS, strict=True):
            upstream.key = key
            upstream.app = Adapters(upstream.app)  # type: ignore[assignment]
        yield stack


def _stubs(stack: InProcess) -> list[Adapters]:
    return [upstream.app for upstream in stack.upstreams]  # type: ignore[misc]


def _arrived(stack: InProcess, path: str) -> list[list[str | None]]:
    """Per upstream, the Authorization of each request to ``path`` that reached it."""
    return [[auth for p, auth in upstream.seen if p == path] for upstream in stack.upstreams]


def test_a_client_key_cannot_manage_adapters_when_an_admin_key_is_set(fleet: InProcess) -> None:
    body = {"lora_name": "sneaky", "lora_path": "/etc"}
    for path in (LOAD, UNLOAD, "/v1//load_lora_adapter", "/v1//unload_lora_adapter//"):
        for headers in (CLIENT, {}, {"authorization": "Bearer wrong"}):
            r = fleet.request("POST", path, json=body, headers=headers)
            assert r.status_code == 401, (path, headers, r.text)
            assert r.json()["error"]["type"] == "AuthenticationError"
    assert _arrived(fleet, LOAD) == [[], []] and _arrived(fleet, UNLOAD) == [[], []]
    assert all(not stub.loaded for stub in _stubs(fleet))


def test_the_admin_key_loads_and_unloads_on_every_endpoint_with_each_ones_key(fleet: InProcess) -> None:
    before = metric(fleet, "specroute_requests_total", route="lora", status="200")
    body = {"lora_name": "sql", "lora_path": "/adapters/sql"}
    r = fleet.request("POST", LOAD, json=body, headers=ADMIN)
    assert r.status_code == 200, r.text
    assert r.text == "Success: LoRA adapter 'sql' added successfully."
    assert "content-type" not in r.headers  # vLLM's plain answer, as it came
    assert r.headers["x-request-id"]
    assert [stub.loaded.get("sql") for stub in _stubs(fleet)] == ["/adapters/sql", "/adapters/sql"]
    assert _arrived(fleet, LOAD) == [[f"Bearer {KEYS[0]}"], [f"Bearer {KEYS[1]}"]]  # once each, its own key

    r = fleet.request("POST", UNLOAD, json={"lora_name": "sql"}, headers=ADMIN)
    assert r.status_code == 200 and r.text == "Success: LoRA adapter 'sql' removed successfully."
    assert all("sql" not in stub.loaded for stub in _stubs(fleet))
    assert metric(fleet, "specroute_requests_total", route="lora", status="200") == before + 2


def test_the_same_4xx_from_every_endpoint_is_vllms_own(fleet: InProcess) -> None:
    body = {"lora_name": "twice", "lora_path": "/adapters/twice"}
    assert fleet.request("POST", LOAD, json=body, headers=ADMIN).status_code == 200
    again = fleet.request("POST", LOAD, json=body, headers=ADMIN)
    assert again.status_code == 400
    assert again.json()["error"] == {
        "message": "The lora adapter 'twice' has already been loaded.",
        "type": "InvalidUserInput",
        "param": None,
        "code": 400,
    }
    before = [len(auths) for auths in _arrived(fleet, UNLOAD)]
    missing = fleet.request("POST", UNLOAD, json={"lora_name": "never"}, headers=ADMIN)
    assert missing.status_code == 404
    assert missing.json()["error"]["message"] == "The lora adapter 'never' cannot be found."
    assert [len(auths) for auths in _arrived(fleet, UNLOAD)] == [
        n + 1 for n in before
    ]  # once each, not again


def test_a_mixed_outcome_is_a_502_naming_each_endpoint(fleet: InProcess, caplog) -> None:
    speculative, baseline = _stubs(fleet)
    baseline.loaded["half"] = "/adapters/half"  # loaded on one endpoint before
    body = {"lora_name": "half", "lora_path": "/adapters/half"}
    with caplog.at_level(logging.WARNING, logger="specroute.api"):
        r = fleet.request("POST", LOAD, json=body, headers=ADMIN)
    assert r.status_code == 502, r.text
    error = r.json()["error"]
    assert error["type"] == "BadGatewayError"
    message = error["message"]
    assert "succeeded on speculative/spec-0" in message
    assert "failed on baseline/base-0 (HTTP 400: The lora adapter 'half' has already been loaded.)" in message
    assert "127.0.0.1" not in message and r.headers["x-request-id"] in message
    assert speculative.loaded["half"] == "/adapters/half"
    warned = [rec.getMessage() for rec in caplog.records if "the endpoints now differ" in rec.getMessage()]
    assert len(warned) == 1 and "speculative/spec-0" in warned[0] and "baseline/base-0" in warned[0]


def test_a_server_error_is_named_without_its_text(fleet: InProcess) -> None:
    speculative, baseline = _stubs(fleet)
    baseline.fail = True
    try:
        r = fleet.request("POST", LOAD, json={"lora_name": "x5", "lora_path": "/a"}, headers=ADMIN)
    finally:
        baseline.fail = False
    assert r.status_code == 502
    message = r.json()["error"]["message"]
    assert "baseline/base-0 (the upstream returned HTTP 500)" in message and "secret" not in message
    assert "x5" in speculative.loaded


def test_other_methods_and_a_trailing_slash(fleet: InProcess) -> None:
    r = fleet.request("GET", LOAD, headers=ADMIN)
    assert r.status_code == 405 and r.headers["allow"] == "POST"
    r = fleet.request("POST", LOAD + "/", json={}, headers=ADMIN, follow_redirects=False)
    assert r.status_code == 307 and r.headers["location"] == LOAD
    assert _arrived(fleet, LOAD + "/") == [[], []]


def test_without_an_admin_key_an_api_key_manages_adapters() -> None:
    with InProcess({"auth": {"api_keys": [API_KEY]}, "logging": {"access_log": False}}) as stack:
        for upstream in stack.upstreams:
            upstream.app = Adapters(upstream.app)  # type: ignore[assignment]
        body = {"lora_name": "open", "lora_path": "/a"}
        assert stack.request("POST", LOAD, json=body).status_code == 401
        assert stack.request("POST", LOAD, json=body, headers=CLIENT).status_code == 200
        assert all("open" in stub.loaded for stub in _stubs(stack))
