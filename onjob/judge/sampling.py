"""Re-sampling a logged turn: the same request (messages, tools, checkpoint) asked of the
engine again for `group_size` alternatives, with token ids and logprobs.

The engine is called directly (not through the proxy): these requests are not
traffic. One request with `n` choices lets the engine share the prompt's work
across the alternatives. Every one is marked background (`BACKGROUND`, vLLM's
`priority`): the engine serves users' requests first.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import httpx
import msgspec

from .. import logprobs
from ..collector.ids import new_id
from ..protocol import JsonObject, engine_body
from .errors import SamplingFailed, from_httpx
from .settings import JudgeSettings

if TYPE_CHECKING:
    from .tables import LoggedTurn

# What the client asked that must not shape the alternatives: they are sampled fresh,
# whole, with the trainer's fields on (a client seed would make every pass draw the same
# alternatives; the paired test sets its own, `deploy.decide.pairs.pair_seed`).
# `include_reasoning` too: false removes the token ids and logprobs a sample needs (the
# proxy refuses it; rows logged before that may carry it).
_DROP = {
    "priority",  # a client's (the proxy never forwards it): the sample sets its own
    "stream",
    "stream_options",
    "n",
    "seed",
    "logprobs",
    "top_logprobs",
    "user",
    "include_reasoning",
}


# vLLM's scheduling priority (lower is served earlier; users' requests carry none, 0):
# the judge's samples and the offline test's pairs wait behind users.
BACKGROUND = 10


@dataclass
class Sample:
    id: str
    ts: float
    request: dict
    response: dict  # the chat completion, token ids and logprobs moved to the columns
    prompt_token_ids: list[int] | None
    completion_token_ids: list[list[int]]
    completion_logprobs: list[list[float]]
    usage: dict | None
    latency_ms: float
    logprobs_mode: str | None = None  # the engine's logprob definition (`onjob.logprobs`)

    @property
    def n(self) -> int:
        return len(self.completion_token_ids)


def request_for(logged: LoggedTurn, model: str, s: JudgeSettings) -> JsonObject:
    request = json.loads(logged.request) if isinstance(logged.request, str) else {}
    body = engine_body(request, model, drop=_DROP)
    top_p = request.get("top_p")
    # The alternatives' sampling settings, written out in full (the request is stored with
    # the re-sampled exchange): the judge's temperature, the client's top-p. When the
    # client sampled its logged answer otherwise, the trainer keeps that answer out of
    # the group's baseline (`trainer.data`), which must be the mean of one distribution.
    body.update(
        n=s.group_size,
        temperature=s.temperature,
        top_p=top_p if isinstance(top_p, int | float) else 1.0,
    )
    if body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
        body["max_tokens"] = s.max_tokens
    return body


def token_estimate(body: JsonObject, logged: LoggedTurn) -> int:
    """What a sample may cost the engine: the prompt once, every completion at its cap."""
    prompt = len(logged.prompt_token_ids or ()) or 1000
    cap = body.get("max_completion_tokens") or body.get("max_tokens")
    return prompt + body["n"] * cap


class Card(msgspec.Struct, kw_only=True):
    """What the judge reads of a model in the engine's list: its `id`, whether it is an
    adapter (`parent`), and the logprob definition the local engine states (vLLM's card
    has none). Other fields are not read."""

    id: str
    parent: str | None = None
    logprobs: str | None = None


class _Cards(msgspec.Struct):
    data: list[Card]


async def base_model(engine: httpx.AsyncClient) -> str:
    """The engine's base model id (the model with no parent)."""
    return (await base_card(engine)).id


async def base_card(engine: httpx.AsyncClient) -> Card:
    """The engine's base model's card in its model list (the model with no parent)."""
    try:
        resp = await engine.get("/models")
        resp.raise_for_status()
        models = msgspec.json.decode(resp.content, type=_Cards).data
    except httpx.HTTPStatusError as exc:
        raise SamplingFailed(f"GET /models answered {exc.response.status_code}") from exc
    except httpx.HTTPError as exc:
        raise from_httpx(exc) from exc
    except ValueError as exc:  # msgspec's DecodeError and ValidationError among them
        raise SamplingFailed(f"GET /models did not list models: {exc}") from exc
    base = [m for m in models if not m.parent] or models[:1]
    if not base:
        raise SamplingFailed("GET /models listed no model")
    return base[0]


async def stated_definition(engine: httpx.AsyncClient, body: dict) -> str | None:
    """The definition `body` is sampled under by an engine that states its own (the local
    engine's model card); None when the engine does not say (vLLM) or cannot be asked."""
    try:
        said = (await base_card(engine)).logprobs
    except SamplingFailed:
        return None
    if said is None:
        return None
    return logprobs.recorded(said, stated=True, request=body)


async def _post(engine: httpx.AsyncClient, body: dict) -> httpx.Response:
    try:
        return await engine.post("/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise from_httpx(exc) from exc


async def sample(engine: httpx.AsyncClient, body: dict, *, definition: str | None = None) -> Sample:
    """`body`'s choices, with their token ids and logprobs, recorded as sampled under the
    engine's logprob `definition` (`onjob.logprobs`); without one, under the definition
    the engine's model list states (the canary's paired samples), else under none."""
    if definition is None:
        definition = await stated_definition(engine, body)
    started = time.perf_counter()
    resp = await _post(engine, {**body, "priority": BACKGROUND})
    if resp.status_code == 400 and "priority" in resp.text.lower():
        # An engine started without priority scheduling (vLLM without
        # `--scheduling-policy priority`) refuses any priority: asked again without.
        resp = await _post(engine, body)
    if resp.status_code != 200:
        raise SamplingFailed(
            f"the engine answered {resp.status_code}: {resp.text[:300]}",
            permanent=400 <= resp.status_code < 500 and resp.status_code not in (408, 429),
        )
    try:
        data = resp.json()
        choices = sorted(data["choices"], key=lambda c: c.get("index", 0))
        token_ids = [c.pop("token_ids") for c in choices]
        logprobs = [[t["logprob"] for t in c.pop("logprobs")["content"]] for c in choices]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SamplingFailed(
            f"the engine's answer lacks choices with token ids and logprobs: {exc!r}",
            permanent=True,
        ) from exc
    data["choices"] = choices
    return Sample(
        id=new_id("chatcmpl-"),
        ts=time.time(),
        request=body,
        response=data,
        prompt_token_ids=data.pop("prompt_token_ids", None),
        completion_token_ids=token_ids,
        completion_logprobs=logprobs,
        usage=data.get("usage"),
        latency_ms=(time.perf_counter() - started) * 1000,
        logprobs_mode=definition,
    )
