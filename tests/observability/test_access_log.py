"""The access-log record: fixed keys, milliseconds, and no prompt unless asked for."""

from __future__ import annotations

import orjson
import pytest

from gateway.observability import ACCESS_FIELDS, access_log, access_record

REQUIRED = {
    "request_id",
    "pool",
    "class",
    "p_structured",
    "alpha_hat",
    "ttft_ms",
    "tpot_ms",
    "status",
    "endpoint",
}


def _record(request_id: str = "abc", **extra: object) -> dict[str, object]:
    return access_record(
        ts=1700000000.12345,
        request_id=request_id,
        route="chat",
        status=200,
        pool="speculative",
        decided_pool="speculative",
        endpoint="spec-0",
        prompt_class="structured",
        kind="code",
        reason="adaptive",
        p_structured=0.912345,
        alpha_hat=0.71234,
        predicted_speedup=1.8765,
        acceptance=0.65,
        ttft_s=0.1234567,
        tpot_s=0.0123456,
        e2e_s=1.5,
        completion_tokens=100,
        **extra,  # type: ignore[arg-type]
    )


def test_fields_and_units() -> None:
    rec = _record()
    assert tuple(rec) == ACCESS_FIELDS
    assert set(rec) >= REQUIRED
    assert rec["ttft_ms"] == 123.46 and rec["tpot_ms"] == 12.346 and rec["e2e_ms"] == 1500.0
    assert rec["p_structured"] == 0.9123 and rec["alpha_hat"] == 0.7123
    assert rec["alpha"] is None  # unknown stays present, as null


def test_prompt_only_when_given() -> None:
    assert "prompt" not in _record()
    assert _record(prompt="hello")["prompt"] == "hello"


def test_one_json_line(capsys: pytest.CaptureFixture[str]) -> None:
    access_log(_record())
    access_log(_record(request_id="def"))
    lines = capsys.readouterr().out.splitlines()
    assert [orjson.loads(line)["request_id"] for line in lines] == ["abc", "def"]
