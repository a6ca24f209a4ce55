"""`POST /v1/completions`' request (legacy text completions), declared once for the proxy,
its OpenAPI document and the local engine. One prompt per request: a batch of prompts
would be several conversations in one exchange."""

from __future__ import annotations

from typing import Annotated, Any

import msgspec
from msgspec import Meta

from .checks import validated
from .errors import InvalidRequest
from .fields import LogitBias, Penalty, StreamOptions, Temperature, TopLogprobs, TopP

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
