"""The client that forwards requests to the engine, behind one small interface.

The hot-path client is `lean.LeanUpstream` (its own module: keep-alive HTTP/1.1 over
httptools, a tenth of aiohttp's client CPU per request). `AiohttpUpstream` was before it:
on these machines aiohttp's client costs about a third of the CPU per request of httpx's
transport under concurrency (DESIGN.md, facts; `bench/proxy_overhead.py` measures both),
and it stays a setting away (`proxy.upstream_client`). `HttpxUpstream`
wraps any `httpx.AsyncClient`, so tests (and users) can hand in a
`MockTransport` to script the engine's faults at the HTTP boundary.

Each translates its library's errors into the proxy's: `UpstreamUnreachable`
(no connection or it dropped before an answer), `UpstreamTimeout`, and
`StreamCut` (the connection dropped in the middle of a body). The lean and aiohttp
clients also bound a whole answer's time (`answer_timeout`: `UpstreamTimeout`) and any
body's size (`max_answer_bytes`: `AnswerTooLarge`); `HttpxUpstream` leaves both to the
caller's client.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx

from .errors import AnswerTooLarge, StreamCut, UpstreamTimeout, UpstreamUnreachable


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


_JSON = {"Content-Type": "application/json"}


class _AiohttpResponse:
    """As `lean.LeanResponse`: a whole answer complete within `answer_timeout` of its
    request, no body past `max_answer_bytes`."""

    def __init__(self, resp, upstream: AiohttpUpstream, sent: float) -> None:
        self._resp = resp
        self._upstream = upstream
        self._sent = sent  # the loop's time the request was sent
        self.status = resp.status
        self.content_type = resp.headers.get("Content-Type", "")

    async def read(self) -> bytes:
        seconds = self._upstream.answer_timeout
        parts = []
        try:
            async with asyncio.timeout_at(self._sent + seconds) as deadline:
                async for chunk in self.chunks():
                    parts.append(chunk)
        except TimeoutError:
            if not deadline.expired():
                raise
            why = f"the engine did not complete its answer within {seconds:g} s"
            raise UpstreamTimeout(f"{why} (answer_timeout_s)") from None
        finally:
            self._resp.release()  # closes the connection unless the body was read whole
        return b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        most, total = self._upstream.max_answer_bytes, 0
        if (self._resp.content_length or 0) > most:
            self._resp.close()
            raise _too_large(most, f"its Content-Length is {self._resp.content_length}")
        try:
            async for chunk in self._resp.content.iter_any():
                total += len(chunk)
                if total > most:
                    self._resp.close()
                    raise _too_large(most, f"{total} bytes and counting")
                yield chunk
        except AnswerTooLarge:
            raise
        except Exception as exc:
            raise _translate_aiohttp(exc, mid_body=True) from exc

    async def aclose(self) -> None:
        self._resp.close()


def _too_large(most: int, what: str) -> AnswerTooLarge:
    return AnswerTooLarge(
        f"the engine's answer is larger than {most} bytes ({what}; max_answer_bytes)"
    )


def _translate_aiohttp(exc: Exception, *, mid_body: bool) -> Exception:
    import aiohttp

    if isinstance(exc, asyncio.TimeoutError | aiohttp.ServerTimeoutError):
        return UpstreamTimeout("the engine did not answer in time")
    if mid_body and isinstance(exc, aiohttp.ClientError):
        return StreamCut(f"the engine cut the answer short: {exc!r}")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamUnreachable(f"cannot reach the engine: {exc!r}")
    return exc


class AiohttpUpstream:
    """Keeps one `aiohttp.ClientSession` (created on first use, inside the running loop)."""

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout: float = 5.0,
        read_timeout: float = 600.0,
        answer_timeout: float = 900.0,
        max_answer_bytes: int = 256 << 20,
        max_connections: int = 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self.answer_timeout = answer_timeout  # a whole answer, from its request to its end
        self.max_answer_bytes = max_answer_bytes  # a body, whole or streamed
        self._max_connections = max_connections
        self._session = None

    def _open(self):
        import aiohttp

        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._max_connections, ttl_dns_cache=300),
            # sock_read bounds the wait between two reads, so a long stream is fine while
            # an engine that goes silent is not.
            timeout=aiohttp.ClientTimeout(
                total=None, connect=self._connect_timeout, sock_read=self._read_timeout
            ),
            # No skip_auto_headers: naming any sends every request down aiohttp's slow
            # path for headers (a multidict built and sorted per request, ~6% of a request).
            auto_decompress=False,
        )
        return self._session

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping | None = None
    ) -> _AiohttpResponse:
        session = self._session or self._open()
        sent = asyncio.get_running_loop().time()
        try:
            resp = await session.request(
                method, self.base_url + path, data=body, headers=headers or _JSON
            )
        except Exception as exc:
            raise _translate_aiohttp(exc, mid_body=False) from exc
        return _AiohttpResponse(resp, self, sent)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _HttpxResponse:
    def __init__(self, resp: httpx.Response) -> None:
        self._resp = resp
        self.status = resp.status_code
        self.content_type = resp.headers.get("Content-Type", "")

    async def read(self) -> bytes:
        try:
            return await self._resp.aread()
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc, mid_body=True) from exc
        finally:
            await self._resp.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._resp.aiter_raw():
                yield chunk
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc, mid_body=True) from exc

    async def aclose(self) -> None:
        await self._resp.aclose()


def _translate_httpx(exc: httpx.HTTPError, *, mid_body: bool) -> Exception:
    if isinstance(exc, httpx.TimeoutException):
        return UpstreamTimeout("the engine did not answer in time")
    if mid_body and isinstance(exc, httpx.TransportError):
        return StreamCut(f"the engine cut the answer short: {exc!r}")
    if isinstance(exc, httpx.TransportError):
        return UpstreamUnreachable(f"cannot reach the engine: {exc!r}")
    return exc


class HttpxUpstream:
    """Wraps a caller's `httpx.AsyncClient` (its base_url is the engine's, e.g. .../v1)."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client
        self.base_url = str(client.base_url).rstrip("/")

    async def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping | None = None
    ) -> _HttpxResponse:
        req = self.client.build_request(
            method, self.base_url + path, content=body, headers=headers or _JSON
        )
        try:
            resp = await self.client.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise _translate_httpx(exc, mid_body=False) from exc
        return _HttpxResponse(resp)

    async def aclose(self) -> None:
        await self.client.aclose()
