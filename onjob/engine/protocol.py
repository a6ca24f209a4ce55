"""Request bodies of the engine's OpenAI/vLLM contract, validated with msgspec.

Unknown fields are accepted and ignored, as vLLM and OpenAI do; wrong types and
out-of-range values are a 400 with the offending path.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta


class Message(msgspec.Struct, kw_only=True):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class Function(msgspec.Struct, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct, kw_only=True):
    type: Literal["function"] = "function"
    function: Function


class StreamOptions(msgspec.Struct, kw_only=True):
    include_usage: bool = False


class ChatRequest(msgspec.Struct, kw_only=True):
    model: str
    messages: Annotated[list[Message], Meta(min_length=1)]
    n: Annotated[int, Meta(ge=1, le=64)] = 1
    temperature: Annotated[float, Meta(ge=0, le=2)] | None = None
    top_p: Annotated[float, Meta(gt=0, le=1)] | None = None
    max_tokens: Annotated[int, Meta(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Meta(ge=1)] | None = None
    stop: str | list[str] | None = None
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Meta(ge=0, le=20)] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    # vLLM extensions.
    return_token_ids: bool = False
    ignore_eos: bool = False
    min_tokens: Annotated[int, Meta(ge=0)] = 0


class LoadAdapter(msgspec.Struct, kw_only=True):
    lora_name: Annotated[str, Meta(min_length=1)]
    lora_path: Annotated[str, Meta(min_length=1)]


class UnloadAdapter(msgspec.Struct, kw_only=True):
    lora_name: Annotated[str, Meta(min_length=1)]
    lora_int_id: int | None = None
