"""The proxy's protocol: the typed answers of chat completions, legacy completions, the
Responses API and the proxy's own routes, one declaration each, and what the proxy reads
of an engine's answer.

The chat and legacy requests are `onjob.protocol`'s, shared with the local engine.
Answers are built as these Structs (`ResponseObject`), so what is documented is what is
sent.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from ..collector.writer import CollectorStats
from ..protocol.chat import ToolCall
from ..protocol.fields import Temperature, TopP

# A metric's name: a word, as a score source's name and a settings key hold it.
MetricName = Annotated[str, Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]


class Feedback(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """A signal about one exchange or a whole conversation (one of the ids is needed),
    unnamed or of a named metric ("thumbs", "resolved"): each metric is a score source of
    its own (`feedback:<metric>`), so metrics on different scales are never averaged."""

    value: float
    exchange_id: str | None = None
    trajectory_id: str | None = None
    comment: str | None = None
    metric: MetricName | None = None


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class AnswerMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | None = None
    tool_calls: list[ToolCall] | None = None


class Choice(msgspec.Struct, kw_only=True):
    index: int
    message: AnswerMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(msgspec.Struct, kw_only=True):
    """`id` is the exchange id (also in the `X-Onjob-Exchange-Id` header)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[Choice]
    usage: Usage | None = None


class Delta(msgspec.Struct, kw_only=True):
    role: str | None = None
    content: str | None = None
    tool_calls: list[dict[str, Any]] | None = None


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    finish_reason: str | None = None
    logprobs: dict[str, Any] | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One server-sent event of a streamed answer; the usage comes last, when asked for."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class Model(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"]
    data: list[Model]


class FeedbackRecorded(msgspec.Struct, kw_only=True):
    object: Literal["feedback"]
    id: str
    ts: float
    exchange_id: str | None
    trajectory_id: str | None
    api_key_id: str | None
    value: float
    comment: str | None
    metric: str | None


class Health(msgspec.Struct, kw_only=True):
    status: Literal["ok", "engine down"]  # 503 with "engine down": no engine answers
    # Only to the admin key (`Authorization: Bearer <admin key>`): this process's counters.
    pid: int | None = None  # which process answered (several answer on one port, --workers)
    engines: list[str] | None = None  # each engine's state (up, reloading, down), as configured
    collector: CollectorStats | None = None


class CompletionChoice(msgspec.Struct, kw_only=True):
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class TextCompletion(msgspec.Struct, kw_only=True):
    """`id` is the exchange id; streamed, each event has this shape with a piece of text."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


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


# -- What the proxy reads of an engine's answer (vLLM's chat and legacy completions, whole
# or one streamed event). Checked once, where the answer arrives (`Exchange.answer`,
# `Exchange.absorb`): a field the proxy records of the wrong type or out of range is the
# engine's malformed answer (a 502, logged), never a crash while the exchange is recorded.
# Other fields pass to the client as the engine sent them.

TokenId = Annotated[int, Meta(ge=0, lt=2**31)]  # stored as int32 (`array("i")`)
Count = Annotated[int, Meta(ge=0)]
Index = Annotated[int, Meta(ge=0, lt=1024)]  # a choice's or a tool call's place
# Stored as FLOAT (float32): a value past its range would refuse the whole spool line.
Logprob = Annotated[float, Meta(ge=-3.4e38, le=3.4e38)]


class EngineFunction(msgspec.Struct, kw_only=True):
    name: str | None = None
    arguments: str | None = None


class EngineToolCall(msgspec.Struct, kw_only=True):
    index: Index = 0
    id: str | None = None
    type: str | None = None
    function: EngineFunction | None = None


class EngineMessage(msgspec.Struct, kw_only=True):
    """A whole answer's `message` or a streamed `delta`."""

    role: str | None = None
    content: str | None = None
    tool_calls: list[EngineToolCall] | None = None
    reasoning_content: str | None = None  # vLLM's reasoning parser's text (0.11)
    reasoning: str | None = None  # (later)


class EngineTokenLogprob(msgspec.Struct, kw_only=True):
    logprob: Logprob


class EngineLogprobs(msgspec.Struct, kw_only=True):
    content: list[EngineTokenLogprob] | None = None  # chat
    token_logprobs: list[Logprob] | None = None  # legacy completions


class EngineChoice(msgspec.Struct, kw_only=True):
    index: Index = 0
    message: EngineMessage | None = None
    delta: EngineMessage | None = None
    text: str | None = None  # legacy completions
    token_ids: list[TokenId] | None = None
    prompt_token_ids: list[TokenId] | None = None  # legacy completions, per choice
    logprobs: EngineLogprobs | None = None
    finish_reason: str | None = None


class EngineUsage(msgspec.Struct, kw_only=True):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    total_tokens: Count | None = None


class EngineAnswer(msgspec.Struct, kw_only=True):
    model: str | None = None
    created: Count | None = None
    choices: list[EngineChoice]
    prompt_token_ids: list[TokenId] | None = None
    usage: EngineUsage | None = None


# -- One streamed chat event read exactly (`Exchange.chunk`'s common path): every field
# vLLM and the local engine send is declared, a field the event leaves out stays UNSET
# (so the event re-encoded for the client carries the fields the engine sent, no more),
# and one the declaration does not know sends the event the general way (decoded as a
# dict, checked as `EngineAnswer`, every field passed on). Decoding into these costs
# what a dict does, and what the log reads of them is attribute access:
# bench/proxy_overhead.py, issue 68.


class _Exact(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Every field declared; an undeclared one refuses the event (the general path)."""


class EngineChunkFunction(_Exact, kw_only=True):
    name: str | UnsetType | None = UNSET
    arguments: str | UnsetType | None = UNSET


class EngineChunkToolCall(_Exact, kw_only=True):
    index: Index | UnsetType = UNSET
    id: str | UnsetType | None = UNSET
    type: str | UnsetType | None = UNSET
    function: EngineChunkFunction | UnsetType | None = UNSET


class EngineChunkDelta(_Exact, kw_only=True):
    role: str | UnsetType | None = UNSET
    content: str | UnsetType | None = UNSET
    tool_calls: list[EngineChunkToolCall] | UnsetType | None = UNSET
    reasoning_content: str | UnsetType | None = UNSET  # vLLM's reasoning parser's (0.11)
    reasoning: str | UnsetType | None = UNSET  # (later)


class EngineChunkTopLogprob(_Exact, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | UnsetType | None = UNSET


class EngineChunkTokenLogprob(_Exact, kw_only=True):
    token: str
    logprob: Logprob
    bytes: list[int] | UnsetType | None = UNSET
    top_logprobs: list[EngineChunkTopLogprob] | UnsetType | None = UNSET


class EngineChunkLogprobs(_Exact, kw_only=True):
    content: list[EngineChunkTokenLogprob] | UnsetType | None = UNSET


class EngineChunkChoice(_Exact, kw_only=True):
    index: Index | UnsetType = UNSET
    delta: EngineChunkDelta | UnsetType | None = UNSET
    logprobs: EngineChunkLogprobs | UnsetType | None = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET  # vLLM's: the stop string or token
    token_ids: list[TokenId] | UnsetType | None = UNSET


class EngineChunkUsage(_Exact, kw_only=True):
    prompt_tokens: Count | UnsetType | None = UNSET
    completion_tokens: Count | UnsetType | None = UNSET
    total_tokens: Count | UnsetType | None = UNSET
    prompt_tokens_details: dict[str, Any] | UnsetType | None = UNSET


class EngineChunk(_Exact, kw_only=True):
    """A streamed chat event as vLLM and the local engine send it."""

    id: str | UnsetType = UNSET
    object: str | UnsetType = UNSET
    created: Count | UnsetType | None = UNSET
    model: str | UnsetType | None = UNSET
    choices: list[EngineChunkChoice]
    usage: EngineChunkUsage | UnsetType | None = UNSET
    prompt_token_ids: list[TokenId] | UnsetType | None = UNSET
    system_fingerprint: str | UnsetType | None = UNSET
