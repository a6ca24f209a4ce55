"""Server-sent events: splitting an upstream byte stream into events, and framing ours
(the one framer for every streamed shape: chat chunks and the Responses API's events)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from .errors import StreamCut

DONE = b"[DONE]"


async def data_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """The `data:` payloads of the events each chunk completes, as soon as it arrives.

    Events come in lists so that what arrived together leaves together (one write to
    the client instead of one per token when the engine sends several at once).
    Comments (keep-alives) and fields other than `data` are dropped; a multi-line
    `data` is joined with newlines, as the SSE spec says.
    """
    buffer = b""
    async for chunk in chunks:
        buffer += chunk
        if b"\r" in buffer:
            buffer = buffer.replace(b"\r\n", b"\n")
        events = buffer.split(b"\n\n")
        buffer = events.pop()
        payloads = []
        for event in events:
            if event[:5] == b"data:" and b"\n" not in event:  # the usual: one data line
                payloads.append(event[5:].lstrip(b" "))
                continue
            data = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line[:5] == b"data:"]
            if data:
                payloads.append(b"\n".join(data))
        if payloads:
            yield payloads
    if buffer.strip():
        raise StreamCut("the engine's stream ended in the middle of an event")


def frame(payload: bytes, event: str | None = None) -> bytes:
    """One event: its `data` line, after an `event` line when it is named."""
    if event is None:
        return b"data: " + payload + b"\n\n"
    return b"event: " + event.encode() + b"\ndata: " + payload + b"\n\n"
