"""`POST /v1/chat/completions`, declared once. The request: the proxy checks a client's
body against it and documents it in `GET /openapi.json`; the local engine decodes its
requests into it; the engine-bound body is built from a checked or a logged one by one
function (`engine.engine_body`: the proxy's forwarded requests, the judge's re-samples).
The answer (`ChatCompletion`, `ChatCompletionChunk` and their parts, `fields.Exact`): the
local engine builds it, the proxy reads it (whole or streamed) and sends it on, the
OpenAPI document shows it and the log keeps it.

Every field of openai-python's chat `CompletionCreateParams` is declared
(`tests/test_engine_fields.py` checks the list against the installed client), each in one
of three groups: honoured, a hint (`fields.HINTS`: the answer is the same without it),
or refused with a 400 naming it (`refused`). Every field may be `null`, meaning absent,
as OpenAI allows. Fields outside OpenAI's schema (vLLM's extensions, anything newer) are
accepted and passed on as sent; wrong types and out-of-range values are a 400 whose
`param` is the offending path (`checks.validated`). The Responses edge builds its chat
request as this type (`proxy.responses.translate`), encoded with the fields it set and no
others (`omit_defaults`).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from .body import JsonObject
from .checks import invalid, validated
from .errors import InvalidRequest
from .fields import (
    REFUSED,
    Count,
    Exact,
    Index,
    LogitBias,
    Logprob,
    Penalty,
    StreamOptions,
    Temperature,
    TokenId,
    Tool,
    TopLogprobs,
    TopP,
    Usage,
)

Tokens = Annotated[int, Meta(ge=1)]  # bounded above by the server (`proxy.max_tokens_limit`)


class FunctionCall(msgspec.Struct, kw_only=True):
    name: str
    arguments: Annotated[str, Meta(description="the arguments as a JSON string")]


class ToolCall(msgspec.Struct, kw_only=True):
    id: str | None = None
    type: str = "function"
    function: FunctionCall | None = None  # absent in calls of other tool types (`custom`)


class ContentPart(msgspec.Struct, kw_only=True):
    """A part of a message's content: its `text`, or an image, audio or file part, whose
    own fields are passed on as sent."""

    type: str
    text: str | UnsetType = UNSET  # a string when present: the stitcher hashes it


# Encoded (a Responses call's messages), a null field is left out, absent as OpenAI reads
# it; but `content` as it came: an assistant's calls with `content: null` keep it, as sent.
class Message(msgspec.Struct, kw_only=True, omit_defaults=True):
    role: Annotated[
        str, Meta(description="system, developer, user, assistant, tool, or the engine's own")
    ]
    content: str | list[ContentPart] | UnsetType | None = UNSET
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class Metadata(msgspec.Struct, kw_only=True):
    """Other keys are kept with the exchange."""

    trajectory_id: Annotated[str, Meta(description="names the conversation")] | None = None
    scenario: Annotated[str, Meta(description="names its starting situation")] | None = None


class _MetadataOf(msgspec.Struct):
    metadata: Metadata


# The request's `metadata` is the object as sent, every key kept (the exchange logs it),
# documented and checked (`refused`) on the keys `Metadata` declares.
_METADATA = Annotated[
    JsonObject, Meta(extra_json_schema=msgspec.json.schema_components([Metadata])[1]["Metadata"])
]


class JsonSchema(msgspec.Struct, kw_only=True, omit_defaults=True):
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None  # strict or not, the answer is decoded under the schema


class ResponseFormat(msgspec.Struct, kw_only=True, omit_defaults=True):
    # `structural_tag` is vLLM's (its own fields pass on as sent).
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchema | None = None


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True, tag_field="type", tag="function"):
    function: NamedFunction


class AllowedToolChoice(msgspec.Struct, kw_only=True, tag_field="type", tag="allowed_tools"):
    """Declared so that it is refused by name (`refused`), as vLLM refuses it."""

    allowed_tools: Any = None


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolChoice

# The efforts vLLM 0.13, the oldest release onjob starts, accepts (later ones add more):
# vllm/entrypoints/openai/protocol.py, `ChatCompletionRequest.reasoning_effort`.
ReasoningEffort = Literal["low", "medium", "high"]


def _refused(why: str) -> Any:
    return Annotated[Any, Meta(description=f"refused when set: {why}")]


class ChatCompletionRequest(msgspec.Struct, kw_only=True, omit_defaults=True):
    model: Annotated[str, Meta(min_length=1)]
    messages: Annotated[list[Message], Meta(min_length=1)]

    # Honoured.
    n: Annotated[int, Meta(ge=1)] | None = None  # bounded above by the server
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: Tokens | None = None
    max_completion_tokens: Tokens | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    logit_bias: LogitBias | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # Given to the chat template as `reasoning_effort` (vLLM's way since 0.20, where 0.13
    # used it for gpt-oss alone); a template that does not read it ignores it.
    reasoning_effort: ReasoningEffort | None = None
    modalities: list[Literal["text", "audio"]] | None = None  # ["text"] only; audio refused

    # Kept with the exchange, not sent to the engine.
    metadata: _METADATA | None = None

    # Hints (`fields.HINTS`) and bookkeeping: the answer does not depend on them.
    user: str | None = None
    store: bool | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None  # a latency hint: the answer is the same without it

    # Refused when set (`fields.REFUSED`): honouring them needs what no engine behind onjob
    # has, and ignoring them would change the answer.
    audio: _refused(REFUSED["audio"]) = None
    functions: _refused(REFUSED["functions"]) = None
    function_call: _refused(REFUSED["function_call"]) = None
    moderation: _refused(REFUSED["moderation"]) = None
    web_search_options: _refused(REFUSED["web_search_options"]) = None
    verbosity: _refused(REFUSED["verbosity"]) = None

    # vLLM's grammar fields: vLLM decodes under them and masks its logprobs
    # (`onjob.logprobs.constrained`); the local engine refuses them.
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    # vLLM extensions.
    return_token_ids: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None
    include_reasoning: bool | None = None  # false is refused by the proxy (`exchange.py`)
    # vLLM's scheduling priority (lower is served earlier; vLLM started with
    # `--scheduling-policy priority`, as `onjob engine` starts it). onjob's own: the proxy
    # drops a client's, so every user is served alike, and marks its own work background.
    priority: int | None = None


def refused(request: ChatCompletionRequest) -> InvalidRequest | None:
    """The 400 for `metadata` keys onjob reads that are not as `Metadata` declares them, or
    for the first field no engine behind onjob honours; or None."""
    if request.metadata is not None:
        try:
            msgspec.convert({"metadata": request.metadata}, _MetadataOf, strict=True)
        except msgspec.ValidationError as exc:
            return invalid(exc)
    for name, why in REFUSED.items():
        if getattr(request, name) is not None:
            return InvalidRequest(f"`{name}` is not supported: {why}.", param=name)
    if isinstance(request.tool_choice, AllowedToolChoice):
        # vLLM's request model takes an object tool_choice for a named function only
        # (vllm/entrypoints/openai/protocol.py `check_tool_usage`, 0.13 to 0.33).
        return InvalidRequest(
            "`tool_choice` of type `allowed_tools` is not supported (nor by vLLM): send "
            'the allowed tools as `tools` with `tool_choice` "auto" or "required".',
            param="tool_choice",
        )
    if request.modalities and "audio" in request.modalities:
        return InvalidRequest(
            "Only text is generated: `modalities` must be ['text'].", param="modalities"
        )
    return None


def checked(body: JsonObject) -> ChatCompletionRequest:
    """A client's decoded body as the chat request it is, or the 400 naming what is not."""
    request = validated(body, ChatCompletionRequest)
    if error := refused(request):
        raise error
    return request


def text_of(content: str | list[ContentPart] | UnsetType | None) -> str:
    """A message's content (a string or a list of parts) as plain text; non-text parts (an
    image, a refusal) add nothing."""
    if content is None or content is UNSET:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.text for part in content if part.type == "text" and part.text)


def arguments_of(raw: Any) -> Any:
    """A tool call's arguments decoded from their JSON string where they are JSON (as chat
    templates and the stitcher's comparison take them), else as sent: text that is not
    JSON, or JSON nested too deep to decode."""
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except (json.JSONDecodeError, RecursionError):
            return raw
    return raw


# -- The answer. Every optional field may be absent (UNSET, left out when encoded) or
# null, as vLLM and the local engine send them; `choices` is always there.


class AnswerFunction(Exact, kw_only=True):
    name: str | UnsetType | None = UNSET
    arguments: str | UnsetType | None = UNSET


class AnswerToolCall(Exact, kw_only=True):
    """A call in a whole answer (`id`, `type`, `function`), or a streamed fragment of one
    (`index`, then the rest as it comes)."""

    index: Index | UnsetType = UNSET
    id: str | UnsetType | None = UNSET
    type: str | UnsetType | None = UNSET
    function: AnswerFunction | UnsetType | None = UNSET


class AnswerMessage(Exact, kw_only=True):
    """A whole answer's `message`, or what one streamed event's `delta` adds to it."""

    role: str | UnsetType | None = UNSET
    content: str | UnsetType | None = UNSET
    tool_calls: list[AnswerToolCall] | UnsetType | None = UNSET
    reasoning_content: str | UnsetType | None = UNSET  # vLLM's reasoning parser's (0.11)
    reasoning: str | UnsetType | None = UNSET  # (later)


class TopLogprob(Exact, kw_only=True):
    token: str
    logprob: float
    bytes: list[int] | UnsetType | None = UNSET


class TokenLogprob(Exact, kw_only=True):
    """A sampled token in `logprobs.content`, as OpenAI and vLLM send it."""

    token: str
    logprob: Logprob
    bytes: list[int] | UnsetType | None = UNSET
    top_logprobs: list[TopLogprob] | UnsetType | None = UNSET


class ChoiceLogprobs(Exact, kw_only=True):
    content: list[TokenLogprob] | UnsetType | None = UNSET


class Choice(Exact, kw_only=True):
    index: Index | UnsetType = UNSET
    message: AnswerMessage | UnsetType | None = UNSET
    logprobs: ChoiceLogprobs | UnsetType | None = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET  # vLLM's: the stop string or token
    token_ids: list[TokenId] | UnsetType | None = UNSET  # with `return_token_ids`


class ChunkChoice(Exact, kw_only=True):
    index: Index | UnsetType = UNSET
    delta: AnswerMessage | UnsetType | None = UNSET
    logprobs: ChoiceLogprobs | UnsetType | None = UNSET
    finish_reason: str | UnsetType | None = UNSET
    stop_reason: int | str | UnsetType | None = UNSET
    token_ids: list[TokenId] | UnsetType | None = UNSET


class ChatCompletion(Exact, kw_only=True):
    """A whole chat answer. Through the proxy, `id` is the exchange id (also in the
    `X-Onjob-Exchange-Id` header) and `model` the name the client asked for; the sampler's
    fields (`logprobs`, `token_ids`, `prompt_token_ids`) only when the client asked."""

    id: str | UnsetType = UNSET
    object: Literal["chat.completion"] = "chat.completion"
    created: Count | UnsetType | None = UNSET
    model: str | UnsetType | None = UNSET
    choices: list[Choice]
    usage: Usage | UnsetType | None = UNSET
    prompt_token_ids: list[TokenId] | UnsetType | None = UNSET
    system_fingerprint: str | UnsetType | None = UNSET


class ChatCompletionChunk(Exact, kw_only=True):
    """One server-sent event of a streamed answer: a choice's delta, or the usage last
    (`choices` empty, when asked for with `stream_options.include_usage`)."""

    id: str | UnsetType = UNSET
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: Count | UnsetType | None = UNSET
    model: str | UnsetType | None = UNSET
    choices: list[ChunkChoice]
    usage: Usage | UnsetType | None = UNSET
    prompt_token_ids: list[TokenId] | UnsetType | None = UNSET  # on the first event
    system_fingerprint: str | UnsetType | None = UNSET
