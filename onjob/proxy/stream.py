"""The one relay for every streamed answer: the engine's SSE events in, the client's shape
out (chat and legacy completion chunks as they are, or the Responses API's typed events).

The relay owns the invariants; a `Shape` only says what each event becomes. The exchange
is logged before the stream's last bytes leave (durable before the client hears the
end), a failure mid-stream is logged and sent as the shape's error, and a client that
hangs up leaves its exchange logged as 499.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

import msgspec

from . import responses, sse, telemetry
from .errors import ProxyError, StreamCut
from .exchange import Exchange
from .front import Last
from .upstream import UpstreamResponse

CLIENT_CLOSED = 499  # nginx's code: the client went away before the answer was complete


class Shape(Protocol):
    """What the client hears of a stream."""

    def opening(self) -> bytes:
        """Sent before the engine's first event (may be empty)."""

    def event(self, payload: bytes) -> list[bytes]:
        """One engine event's frames (the exchange absorbs it)."""

    def closing(self) -> list[bytes]:
        """The frames after the engine's `[DONE]`; the exchange is logged after this is
        called and before they leave."""

    def failure(self, exc: ProxyError) -> bytes:
        """What a stream that failed midway ends with."""


class Chunks:
    """Chat and legacy completions: each chunk as the engine sent it (reshaped by the
    exchange only where the proxy answers for another name), then `[DONE]`."""

    __slots__ = ("exchange",)

    def __init__(self, exchange: Exchange) -> None:
        self.exchange = exchange

    def opening(self) -> bytes:
        return b""

    def event(self, payload: bytes) -> list[bytes]:
        shaped = self.exchange.chunk(payload)
        return [] if shaped is None else [sse.frame(shaped)]

    def closing(self) -> list[bytes]:
        return [sse.frame(sse.DONE)]

    def failure(self, exc: ProxyError) -> bytes:
        return sse.frame(msgspec.json.encode(exc.body()))


class ResponseEvents:
    """The Responses API: `response.created` first, typed events per chunk, the open items
    closed and `response.completed` (with the Response stored on the exchange) last."""

    def __init__(self, exchange: Exchange, call: responses.Call) -> None:
        self.exchange = exchange
        self.call = call
        self.events = responses.Events(exchange.id)

    def _response(self, status: str, **fields: Any) -> responses.ResponseObject:
        exchange = self.exchange
        return responses.response_object(
            self.call, exchange.id, exchange.route.alias, status=status, **fields
        )

    def _failed(self, message: str) -> list[bytes]:
        events = self.events
        error = {"code": "server_error", "message": message}
        return [
            events.event("error", code="server_error", message=message, param=None),
            events.event(
                "response.failed",
                response=self._response("failed", output=events.output, error=error),
            ),
        ]

    def opening(self) -> bytes:
        start = self._response("in_progress", output=[])
        return self.events.event("response.created", response=start) + self.events.event(
            "response.in_progress", response=start
        )

    def event(self, payload: bytes) -> list[bytes]:
        data = self.exchange.absorb(payload)
        if "error" in data:
            return self._failed(self.exchange.error or "the engine failed")
        return self.events.chunk(data)

    def closing(self) -> list[bytes]:
        exchange, events = self.exchange, self.events
        if exchange.status >= 400:  # the engine's error event came before
            return []
        out = events.close()
        final = self._response(
            "completed",
            output=events.output,
            usage=exchange.usage,
            finish_reason=events.finish_reason,
        )
        exchange.api_object = responses.stored(final, self.call)
        out.append(events.event(f"response.{final.status}", response=final))
        return out

    def failure(self, exc: ProxyError) -> bytes:
        return b"".join(self._failed(exc.message))


async def relay(
    exchange: Exchange,
    resp: UpstreamResponse,
    span: Any,
    shape: Shape,
    finish: Callable[[Exchange], None],
) -> AsyncIterator[bytes]:
    """The engine's stream in `shape`; `finish` logs the exchange (once, whatever ends it).
    What arrived in one read leaves in one write, and the stream's last bytes as `Last`
    (with the response's end)."""
    finished = False
    try:
        opening = shape.opening()
        if opening:
            yield opening
        async for payloads in sse.data_events(resp.chunks()):
            out: list[bytes] = []
            for payload in payloads:
                if payload == sse.DONE:
                    out += shape.closing()
                    # Logged before the last events leave, which go in one write (the
                    # usual case: the engine's last read holds them all).
                    finish(exchange)
                    finished = True
                    break
                out += shape.event(payload)
            if out:
                yield Last(b"".join(out)) if finished else b"".join(out)
            if finished:
                break
        else:
            raise StreamCut("the engine's stream ended without [DONE]")
    except ProxyError as exc:
        exchange.fail(exc.status, exc.message)
        finish(exchange)
        finished = True
        yield Last(shape.failure(exc))
    finally:
        await resp.aclose()
        if not finished:
            exchange.fail(CLIENT_CLOSED, "the client closed the stream before the end")
            finish(exchange)
        telemetry.end(span, exchange)
