"""The row the proxy hands to the collector for each exchange."""

from __future__ import annotations

from typing import Any

import msgspec


class ExchangeRecord(msgspec.Struct, kw_only=True):
    id: str
    ts: float  # epoch seconds
    trajectory_id: str
    turn: int
    scenario_id: str
    scenario_key: str
    scenario_keyed: str
    model_alias: str | None = None
    api_key_id: str | None = None
    checkpoint: str | None = None
    arm: str | None = None
    stream: bool = False
    request: dict[str, Any] | None = None
    response: dict[str, Any] | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[list[int]] | None = None
    completion_logprobs: list[list[float]] | None = None
    usage: dict[str, Any] | None = None
    latency_ms: float | None = None
    status: int = 200
    error: str | None = None
    metadata: dict[str, Any] | None = None
    source: str = "production"
    continuation_hashes: list[str] | None = None


encode = msgspec.json.Encoder().encode
_decoder = msgspec.json.Decoder(ExchangeRecord)


def decode(line: bytes) -> ExchangeRecord:
    return _decoder.decode(line)
