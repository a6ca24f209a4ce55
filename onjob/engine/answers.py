"""What every answer of the engine shares, chat or legacy completion: its `usage`, and the
SSE framing of a stream (each chunk a `data:` event, then `[DONE]`); and the queue gauges
of `GET /metrics`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily


class PromptDetails(msgspec.Struct, kw_only=True):
    cached_tokens: int


class Usage(msgspec.Struct, kw_only=True):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptDetails | UnsetType = UNSET  # left out when none was cached


class TopLogprob(msgspec.Struct, kw_only=True):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(msgspec.Struct, kw_only=True):
    """A chat answer's token in `logprobs.content`, as OpenAI and vLLM send it."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct, kw_only=True):
    content: list[TokenLogprob]


class Message(msgspec.Struct, kw_only=True):
    """A whole answer's message."""

    role: str = "assistant"
    content: str | None
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET  # as `chat.parse_tool_calls` reads them


class Delta(msgspec.Struct, kw_only=True):
    """What one streamed event adds to a choice: the first its role, then text and calls
    (`chat.ToolCallStream`'s deltas)."""

    role: str | UnsetType = UNSET
    content: str | UnsetType = UNSET
    tool_calls: list[dict[str, Any]] | UnsetType = UNSET


class Choice(msgspec.Struct, kw_only=True):
    index: int
    message: Message
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | UnsetType = UNSET  # with `return_token_ids`


class ChunkChoice(msgspec.Struct, kw_only=True):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | UnsetType = UNSET


class ChatCompletion(msgspec.Struct, kw_only=True):
    """A whole chat answer, as vLLM sends it (`prompt_token_ids` with `return_token_ids`)."""

    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[Choice]
    usage: Usage
    prompt_token_ids: list[int] | UnsetType = UNSET


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    """One streamed event: a choice's delta, or the usage last (`choices` empty)."""

    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | UnsetType = UNSET
    prompt_token_ids: list[int] | UnsetType = UNSET  # on the first event, when asked


class LegacyLogprobs(msgspec.Struct, kw_only=True):
    """A legacy completion's `logprobs`, as vLLM sends them: each token's text, logprob,
    alternatives (None where none were asked for) and offset in the text."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


def usage(prompt: int, completion: int, cached: int = 0) -> Usage:
    """OpenAI's usage; `cached`: prompt tokens whose prefill was reused, reported as
    OpenAI and vLLM (`--enable-prompt-tokens-details`) report it, only when some were."""
    return Usage(
        prompt_tokens=prompt,
        completion_tokens=completion,
        total_tokens=prompt + completion,
        prompt_tokens_details=PromptDetails(cached_tokens=cached) if cached else UNSET,
    )


async def sse(chunks: AsyncIterator[object]) -> AsyncIterator[bytes]:
    async for c in chunks:
        yield b"data: " + msgspec.json.encode(c) + b"\n\n"
    yield b"data: [DONE]\n\n"


def queue_metrics(model: str, running: int, waiting: int) -> bytes:
    """vLLM's `vllm:num_requests_running` and `vllm:num_requests_waiting` gauges, in
    Prometheus' text format, labelled with the served model as vLLM labels them."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Queue(model, running, waiting))
    return generate_latest(registry)


class _Queue:
    def __init__(self, model: str, running: int, waiting: int) -> None:
        self.figures = (model, running, waiting)

    def collect(self):
        model, running, waiting = self.figures
        for name, value, what in (
            ("vllm:num_requests_running", running, "Number of requests in the batch."),
            ("vllm:num_requests_waiting", waiting, "Number of requests waiting for the batch."),
        ):
            gauge = GaugeMetricFamily(name, what, labels=["model_name"])
            gauge.add_metric([model], value)
            yield gauge
