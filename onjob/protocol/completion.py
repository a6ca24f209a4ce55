"""`POST /v1/completions` (legacy text completions), declared once for the proxy, its
OpenAPI document and the local engine: the request (one prompt per request: a batch of
prompts would be several conversations in one exchange) and the answer (`TextCompletion`,
whole or each streamed event, `fields.Exact`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .checks import validated
from .errors import InvalidRequest
from .fields import (
    Count,
    Exact,
    Index,
    LogitBias,
    Logprob,
    Penalty,
    StreamOptions,
    Temperature,
    TokenId,
    TopLogprobs,
    TopP,
    Usage,
)

Tokens = Annotated[int, Meta(ge=1)]  # bounded above by the server (`proxy.max_tokens_limit`)
# Fields of chat alone: a legacy request carrying one is sent to the wrong route.
CHAT_ONLY = ("messages", "tools", "tool_choice", "response_format", "parallel_tool_calls")


class CompletionRequest(msgspec.Struct, kw_only=True):
    """A legacy text completion: one prompt (text or token ids) per request."""

    model: Annotated[str, Meta(min_length=1)]
    prompt: Annotated[
        str | list[Any], Meta(description="one string or one array of token ids")
    ]  # checked by `prompt_of`: msgspec takes one array type in a union
    n: Annotated[int, Meta(ge=1)] | None = None  # bounded above by the server
    max_tokens: Tokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: TopLogprobs | None = None  # how many alternatives to list; 0: the sampled one
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    logit_bias: LogitBias | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None  # kept with the exchange, not sent to the engine
    # Refused when set: the answer is the completion alone, sampled once.
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    # vLLM extensions.
    return_token_ids: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None


def checked(body: dict) -> CompletionRequest:
    """A client's decoded body as the legacy request it is, or the 400 naming what is not."""
    for key in CHAT_ONLY:
        if key in body:
            raise InvalidRequest(f"`{key}` is a chat field: use /v1/chat/completions.", param=key)
    request = validated(body, CompletionRequest)
    if request.echo:
        raise InvalidRequest(
            "`echo` is not supported: the answer is the completion alone.", param="echo"
        )
    if request.suffix is not None:
        raise InvalidRequest("`suffix` (insertion) is not supported.", param="suffix")
    if request.best_of not in (None, 1):
        raise InvalidRequest("`best_of` other than 1 is not supported.", param="best_of")
    return request


def prompt_of(prompt: Any) -> str | list[int]:
    """The one prompt a request holds: a non-empty string or array of token ids, alone or
    as a batch of one."""
    if type(prompt) is list and len(prompt) == 1 and type(prompt[0]) in (str, list):
        prompt = prompt[0]
    if type(prompt) is str and prompt:
        return prompt
    if type(prompt) is list and prompt and all(type(t) is int for t in prompt):
        return prompt
    raise InvalidRequest(
        "`prompt` must be one non-empty string or one array of token ids.", param="prompt"
    )


class LegacyLogprobs(Exact, kw_only=True):
    """A legacy completion's `logprobs`, as vLLM sends them: each token's text, logprob,
    alternatives (None where none were asked for) and offset in the text."""

    tokens: list[str] | UnsetType | None = UNSET
    token_logprobs: list[Logprob] | UnsetType | None = UNSET
    top_logprobs: list[dict[str, float] | None] | UnsetType | None = UNSET
    text_offset: list[int] | UnsetType | None = UNSET


class CompletionChoice(Exact, kw_only=True):
    index: Index | UnsetType = UNSET
    text: str | UnsetType | None = UNSET
    logprobs: LegacyLogprobs | UnsetType | None = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[TokenId] | UnsetType | None = UNSET  # with `return_token_ids`
    prompt_token_ids: list[TokenId] | UnsetType | None = UNSET  # per choice, on the first


class TextCompletion(Exact, kw_only=True):
    """A whole legacy answer, or one streamed event of this shape with a piece of text.
    Through the proxy, `id` is the exchange id and `model` the name the client asked for."""

    id: str | UnsetType = UNSET
    object: Literal["text_completion"] = "text_completion"
    created: Count | UnsetType | None = UNSET
    model: str | UnsetType | None = UNSET
    choices: list[CompletionChoice]
    usage: Usage | UnsetType | None = UNSET
    system_fingerprint: str | UnsetType | None = UNSET
