"""Request bodies of the engine's OpenAI/vLLM contract, validated with msgspec.

`ChatRequest` declares every field of openai-python's chat `CompletionCreateParams`
(`tests/test_engine_fields.py` checks the list against the installed client), each in
one of three groups: honoured, ignored because the answer does not depend on it, or
refused with a 400 naming it (`ChatRequest.refused`). Every field may be `null`,
meaning absent, as OpenAI allows. Fields outside OpenAI's schema (vLLM's extensions
and anything newer) are accepted and ignored, as vLLM and OpenAI do; wrong types and
out-of-range values are a 400 whose `param` is the offending path. The bounds and the
tool and stream-option shapes are the ones the proxy checks (`onjob.openai_fields`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta

from ..logprobs import GRAMMAR_FIELDS
from ..openai_fields import (
    REFUSED,
    LogitBias,
    Penalty,
    StreamOptions,
    Temperature,
    Tool,
    TopLogprobs,
    TopP,
)


class Message(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class JsonSchema(msgspec.Struct, kw_only=True):
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | bool | None = None
    strict: bool | None = None  # strict or not, the answer is decoded under the schema


class ResponseFormat(msgspec.Struct, kw_only=True):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class NamedFunction(msgspec.Struct, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, kw_only=True, tag_field="type", tag="function"):
    function: NamedFunction


class AllowedToolChoice(msgspec.Struct, kw_only=True, tag_field="type", tag="allowed_tools"):
    """Declared so that it is refused by name (`ChatRequest.refused`), as vLLM refuses it."""

    allowed_tools: Any = None


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice | AllowedToolChoice

# The efforts vLLM 0.13, the oldest release onjob starts, accepts (later ones add more):
# vllm/entrypoints/openai/protocol.py, `ChatCompletionRequest.reasoning_effort`.
ReasoningEffort = Literal["low", "medium", "high"]


class ChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]

    # Honoured.
    n: Annotated[int, Meta(ge=1, le=64)] | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
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

    # Ignored: bookkeeping and hints to OpenAI's servers that do not change the answer.
    user: str | None = None
    store: bool | None = None
    metadata: dict[str, Any] | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    prompt_cache_options: dict[str, Any] | None = None
    service_tier: str | None = None
    prediction: dict[str, Any] | None = None  # a latency hint: the answer is the same without it

    # Refused when set: honouring them needs what the engine has not (audio output, the
    # legacy `function_call` answer shape, a moderation model, web search, a reasoning
    # model's verbosity control), and ignoring them would change the answer.
    audio: Any = None
    functions: Any = None
    function_call: Any = None
    moderation: Any = None
    web_search_options: Any = None
    verbosity: Any = None

    # vLLM's grammar fields. vLLM decodes under them and masks its logprobs; the local
    # engine has no decoder for them, so it refuses them rather than answer unconstrained
    # (response_format and tool_choice are its grammars; `onjob.logprobs.constrained`).
    structured_outputs: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None

    # vLLM extensions.
    return_token_ids: bool | None = None
    ignore_eos: bool | None = None
    min_tokens: Annotated[int, Meta(ge=0)] | None = None

    def refused(self) -> tuple[str, str] | None:
        """(param, message) for the first field the engine refuses, or None."""
        for name, why in REFUSED.items():
            if getattr(self, name) is not None:
                return name, f"`{name}` is not supported: {why}."
        for name in GRAMMAR_FIELDS:
            if getattr(self, name) is not None:
                return name, (
                    f"`{name}` (a vLLM grammar) is not supported by the local engine: "
                    "send `response_format` (json_object, json_schema) or `tool_choice`."
                )
        if isinstance(self.tool_choice, AllowedToolChoice):
            # vLLM's request model takes an object tool_choice for a named function only
            # (vllm/entrypoints/openai/protocol.py `check_tool_usage`, 0.13 to 0.33).
            return "tool_choice", (
                "`tool_choice` of type `allowed_tools` is not supported (nor by vLLM): send "
                'the allowed tools as `tools` with `tool_choice` "auto" or "required".'
            )
        if self.modalities and "audio" in self.modalities:
            return "modalities", "This engine generates text only: `modalities` must be ['text']."
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
