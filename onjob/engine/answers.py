"""What every answer of the engine shares, chat or legacy completion: its `usage`, and the
SSE framing of a stream (each chunk a `data:` event, then `[DONE]`)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec


def usage(prompt: int, completion: int, cached: int = 0) -> dict:
    """OpenAI's usage; `cached`: prompt tokens whose prefill was reused, reported as
    OpenAI and vLLM (`--enable-prompt-tokens-details`) report it, only when some were."""
    out = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached:
        out["prompt_tokens_details"] = {"cached_tokens": cached}
    return out


async def sse(chunks: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    async for c in chunks:
        yield b"data: " + msgspec.json.encode(c) + b"\n\n"
    yield b"data: [DONE]\n\n"
