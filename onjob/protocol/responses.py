"""`POST /v1/responses` (the Responses API, which the proxy translates into a chat
completion: `proxy/responses.py`), declared once: the request, checked against
`ResponseRequest` (an unknown field, a built-in tool, a refused field with a value is a
400 naming the `param`) and documented with it; the Response object, its output items
and usage, built as these Structs, so what is documented is what is sent; and what an
exchange keeps of a stored Response (`StoredResponse`), for `GET` and for a call that
continues it.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .fields import Temperature, TopP


class FunctionTool(msgspec.Struct, kw_only=True):
    """The only tool type served: built-in tools are refused with a 400 naming them."""

    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


# Responses fields refused unless null or their no-op value, with why.
RESPONSES_REFUSED: dict[str, tuple[Any, str]] = {
    "background": (False, "background responses are not served"),
    "conversation": (None, "conversations are not stored: use `previous_response_id`"),
    "prompt": (None, "stored prompts are not served: send `input` and `instructions`"),
    "context_management": (None, "context management is not served"),
    "moderation": (None, "moderation is not served"),
    "max_tool_calls": (None, "the engine cannot cap built-in tool calls"),
    "top_logprobs": (0, "logprobs are not returned by the Responses API here"),
    "truncation": ("disabled", "the engine does not truncate: `truncation` must be 'disabled'"),
}


def _refused(name: str) -> Any:
    noop, why = RESPONSES_REFUSED[name]
    allowed = "null" if noop is None else f"null or {msgspec.json.encode(noop).decode()}"
    return Annotated[Any, Meta(description=f"refused unless {allowed}: {why}")]


class ResponseRequest(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """`POST /v1/responses`, translated into a chat completion: checked against this type
    (`responses.parse`), so an unknown field, a built-in tool, a refused field with a value,
    `reasoning` with a value, an image or file input is a 400 naming the `param`."""

    model: Annotated[str, Meta(min_length=1)]
    input: Annotated[
        str | list[dict[str, Any]],
        Meta(description="a string, or messages, `function_call` and `function_call_output`"),
    ]  # the items checked by `responses.translate`
    instructions: str | None = None
    previous_response_id: (
        Annotated[str, Meta(description="continues that response's conversation")] | None
    ) = None
    tools: list[FunctionTool] | None = None
    tool_choice: (
        Annotated[str | dict[str, Any], Meta(description="auto, none, required or a function")]
        | None
    ) = None
    parallel_tool_calls: bool | None = None
    text: (
        Annotated[dict[str, Any], Meta(description="`format`: text, json_object, json_schema")]
        | None
    ) = None
    max_output_tokens: Annotated[int, Meta(ge=1)] | None = None  # at most proxy.max_tokens_limit
    temperature: Temperature | None = None
    top_p: TopP | None = None
    metadata: dict[str, Any] | None = None
    store: Annotated[bool, Meta(description="false: logged, never retrievable")] | None = None
    stream: bool | None = None
    user: str | None = None
    include: (
        Annotated[list[str], Meta(description="reasoning.encrypted_content alone (none made)")]
        | None
    ) = None
    reasoning: Annotated[dict[str, Any], Meta(description="every value null")] | None = None
    # Hints: accepted, not forwarded; they cannot change the answer.
    prompt_cache_key: Any = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    safety_identifier: Any = None
    service_tier: Any = None
    stream_options: Any = None  # `include_obfuscation`: no obfuscation padding is sent
    # Refused unless null or their no-op value (`RESPONSES_REFUSED`).
    background: _refused("background") = None
    conversation: _refused("conversation") = None
    prompt: _refused("prompt") = None
    context_management: _refused("context_management") = None
    moderation: _refused("moderation") = None
    max_tool_calls: _refused("max_tool_calls") = None
    top_logprobs: _refused("top_logprobs") = None
    truncation: _refused("truncation") = None


class TextPart(msgspec.Struct, kw_only=True):
    """A message item's text: `input_text` (a user's, a system's), `output_text` (the
    assistant's, with its annotations and, in an answer, logprobs: none here)."""

    type: Literal["input_text", "output_text"]
    text: str
    annotations: list[Any] | UnsetType = UNSET
    logprobs: list[Any] | UnsetType = UNSET


class MessageItem(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    role: str
    status: str
    content: list[TextPart]


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class FunctionCallOutputItem(
    msgspec.Struct, kw_only=True, tag_field="type", tag="function_call_output"
):
    id: str
    call_id: str
    output: str
    status: str


# A Responses item, in a request's input (each given an id) or a Response's output.
Item = MessageItem | FunctionCallItem | FunctionCallOutputItem


class TokensDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int = 0


class ReasoningDetails(msgspec.Struct, kw_only=True):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct, kw_only=True):
    """A Response's usage, from the chat answer's (no prompt caching or reasoning tokens are
    reported, so those details are 0)."""

    input_tokens: int
    input_tokens_details: TokensDetails = msgspec.field(default_factory=TokensDetails)
    output_tokens: int
    output_tokens_details: ReasoningDetails = msgspec.field(default_factory=ReasoningDetails)
    total_tokens: int


class ResponseObject(msgspec.Struct, kw_only=True):
    """A Response, as openai-python's `Response` reads it: `id` is the exchange id;
    `status` completed, incomplete, failed, or in_progress while it streams."""

    id: str
    object: Literal["response"] = "response"
    created_at: float
    status: str
    background: bool = False
    error: dict[str, Any] | None = None
    incomplete_details: dict[str, Any] | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)
    model: str
    output: list[Item]
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    store: bool = True
    temperature: float = 1.0
    text: dict[str, Any]
    tool_choice: str | dict[str, Any] = "auto"
    tools: list[FunctionTool] = msgspec.field(default_factory=list)
    top_p: float = 1.0
    truncation: Literal["auto", "disabled"] = "disabled"
    usage: ResponseUsage | None = None
    user: str | None = None


class StoredResponse(msgspec.Struct, kw_only=True):
    """What an exchange row keeps of a stored Response (`exchanges.api_object`), for `GET`
    and for a call that continues it."""

    response: ResponseObject
    input_items: list[Item]


class ResponseDeleted(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class InputItems(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Item]
    first_id: str | None
    last_id: str | None
    has_more: bool
