"""The local engine's side of the OpenAI/vLLM contract: the chat and legacy requests are
`onjob.protocol`'s (the ones the proxy checks), with what this engine cannot honour
refused by name (`refused`); and the bodies of its own routes (adapters, threads, the
model list).
"""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ..logprobs import GRAMMAR_FIELDS
from ..protocol import ChatCompletionRequest, InvalidRequest

MOST_CHOICES = 64  # `n`: each choice is a row of the batch
ROLES = frozenset({"system", "developer", "user", "assistant", "tool"})


def refused(req: ChatCompletionRequest) -> InvalidRequest | None:
    """The 400 for the first field of a request the protocol takes that this engine cannot
    honour (beyond what no engine behind onjob honours: `protocol.chat.refused`)."""
    for name in GRAMMAR_FIELDS:
        if getattr(req, name) is not None:
            return InvalidRequest(
                f"`{name}` (a vLLM grammar) is not supported by the local engine: "
                "send `response_format` (json_object, json_schema) or `tool_choice`.",
                param=name,
            )
    if req.response_format is not None and req.response_format.type == "structural_tag":
        return InvalidRequest(
            "`response_format` of type `structural_tag` (vLLM's) is not supported by the "
            "local engine: send json_object or json_schema.",
            param="response_format.type",
        )
    if req.n is not None and req.n > MOST_CHOICES:
        return InvalidRequest(f"`n` must be at most {MOST_CHOICES}.", param="n")
    for i, m in enumerate(req.messages):
        if m.role not in ROLES:
            return InvalidRequest(
                f"`messages[{i}].role` must be one of {', '.join(sorted(ROLES))}.",
                param=f"messages[{i}].role",
            )
    return None


class LoadAdapter(msgspec.Struct, kw_only=True):
    lora_name: Annotated[str, Meta(min_length=1)]
    lora_path: Annotated[str, Meta(min_length=1)]


class UnloadAdapter(msgspec.Struct, kw_only=True):
    lora_name: Annotated[str, Meta(min_length=1)]
    lora_int_id: int | None = None


class Threads(msgspec.Struct, kw_only=True):
    """`POST /onjob/threads`: the forwards' CPU threads (null: as the engine started)."""

    threads: Annotated[int, Meta(ge=1, le=4096)] | None = None


class ThreadsSet(msgspec.Struct, kw_only=True):
    """`POST /onjob/threads`' answer: the threads now, before, and at start."""

    threads: int
    was: int
    started_with: int


class ModelCard(msgspec.Struct, kw_only=True):
    """A served model in `GET /v1/models`, vLLM's card with onjob's additions: the base
    model (`parent` None) or an adapter on it."""

    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "onjob"
    root: str
    parent: str | None
    max_model_len: int
    # What the trainer's importance ratio divides by: the raw distribution's logprobs
    # (log-softmax of the logits, before temperature and top-p), in this dtype.
    dtype: str
    logprobs: str
    threads: int  # onjob's: fewer while a training run shares the host


class ModelCards(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]
