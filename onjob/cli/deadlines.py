"""Deadlines on reading a request, for `onjob serve`'s connections.

uvicorn closes a connection left idle between requests (`timeout_keep_alive`), but waits
for a request's headers and body as long as the client likes: half the headers sent, or
a `Content-Length: 1000` with 8 bytes sent, held the connection open indefinitely, and
enough such connections would hold every slot of `proxy.max_client_connections`.
`protocol(header_s, body_s)` gives each request `header_s` from its first byte (or the
connection's opening) to the end of its headers, and `body_s` from there to its last
body byte. Past either the connection is closed: before the headers' end with a `408`,
after it with nothing (the app sees the client gone; nothing was answered, so nothing is
logged). Both are whole-request deadlines, not idle timers, so a client dripping a byte
at a time cannot stretch them.
"""

from __future__ import annotations

import asyncio
import logging

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("onjob.serve")

_TIMEOUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class _Deadlines(HttpToolsProtocol):
    header_s: float
    body_s: float

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._deadline: asyncio.TimerHandle | None = None
        super().connection_made(transport)
        self._arm(self.header_s, "headers")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # the next request on a kept-alive connection
            self._arm(self.header_s, "headers")

    def on_headers_complete(self) -> None:
        self._arm(self.body_s, "body")
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self, seconds: float, what: str) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired, seconds, what)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self, seconds: float, what: str) -> None:
        self._deadline = None
        host = self.client[0] if self.client else "?"
        log.warning(
            "closed a connection from %s: its request's %s took over %gs",
            host,
            what,
            seconds,
        )
        if what == "headers" and not self.transport.is_closing():
            self.transport.write(_TIMEOUT)
        self.transport.close()


def protocol(header_s: float, body_s: float) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with these deadlines (`uvicorn.Config(http=...)`)."""
    return type("DeadlineProtocol", (_Deadlines,), {"header_s": header_s, "body_s": body_s})
