"""The interface of the client that forwards requests to the engine.

The one client is `lean.LeanUpstream` (keep-alive HTTP/1.1 over httptools; its A/B
against aiohttp's client is in docs/benchmarks.md). The interface stays small so that
tests can hand in another at the HTTP boundary (one over an httpx `MockTransport`
scripts an engine's faults), provided it raises the proxy's errors: `UpstreamUnreachable`
(no connection, or it dropped before an answer), `UpstreamTimeout`, `StreamCut` (the
connection dropped in the middle of a body), `AnswerTooLarge`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol


class UpstreamResponse(Protocol):
    status: int
    content_type: str

    async def read(self) -> bytes: ...

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""

    async def aclose(self) -> None: ...


class Upstream(Protocol):
    base_url: str

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping | None = None
    ) -> UpstreamResponse:
        """Send a request; return once the status and headers are in."""

    async def aclose(self) -> None: ...
