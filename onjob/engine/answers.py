"""What every answer of the engine shares, chat or legacy completion: its `usage`, and the
SSE framing of a stream (each chunk a `data:` event, then `[DONE]`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
from msgspec import UNSET, UnsetType


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
