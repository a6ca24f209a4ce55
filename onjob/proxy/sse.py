"""Server-sent events: splitting an upstream byte stream into events, and framing ours."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .errors import StreamCut

DONE = b"[DONE]"


async def data_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The `data:` payload of each event, as soon as the event is complete.

    Comments (keep-alives) and fields other than `data` are dropped; a multi-line
    `data` is joined with newlines, as the SSE spec says.
    """
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        while True:
            end = buffer.find(b"\n\n")
            if end < 0:
                break
            event, buffer = buffer[:end], buffer[end + 2 :]
            data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line[:5] == b"data:"]
            if data:
                yield b"\n".join(data)
    if buffer.strip():
        raise StreamCut("the engine's stream ended in the middle of an event")


def frame(payload: bytes) -> bytes:
    return b"data: " + payload + b"\n\n"
