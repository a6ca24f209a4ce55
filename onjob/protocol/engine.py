"""The engine's request, built from a client's checked one (the proxy forwarding it) or a
logged one (the judge re-sampling it): one function, so both ask the engine for what
onjob records of every answer."""

from __future__ import annotations

from collections.abc import Collection

from .. import logprobs
from .body import JsonObject

# Kept with the exchange and never sent: vLLM does not know it.
KEPT_HERE = "metadata"


def engine_body(
    request: JsonObject,
    model: str,
    *,
    legacy: bool = False,
    drop: Collection[str] = (),
) -> JsonObject:
    """`request` for `model`, with each sampled token's id and logprob asked for
    (`logprobs.ask_for_tokens`). A streamed one always asks for the usage (the exchange
    records it); `stream_options` go only with `stream: true`, as vLLM answers them on a
    request that is not streamed with a 400. `drop` names fields left out besides."""
    body = {
        k: v
        for k, v in request.items()
        if k != KEPT_HERE and k != "stream_options" and k not in drop
    }
    body["model"] = model
    logprobs.ask_for_tokens(body, legacy=legacy)
    if body.get("stream"):
        body["stream_options"] = {**(request.get("stream_options") or {}), "include_usage": True}
    return body
